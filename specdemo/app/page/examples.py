"""What the page offers to start from: example prompts (one per kind of task) and model choices."""
from __future__ import annotations

from specdemo.target import EMBEDDED

MODEL_CHOICES = (
    EMBEDDED,
    "HuggingFaceTB/SmolLM2-360M-Instruct",
    "HuggingFaceTB/SmolLM2-1.7B-Instruct",
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "Qwen/Qwen2.5-1.5B-Instruct",
)

EXAMPLES = (  # (category, prompt): the first is the default
    ("Summarisation", "Summarise this paragraph in two sentences:\nThe Eiffel Tower is a wrought-iron lattice tower "
                      "on the Champ de Mars in Paris, France. It is named after the engineer Gustave Eiffel, whose "
                      "company designed and built the tower from 1887 to 1889. Locally nicknamed \"La dame de fer\", "
                      "it was constructed as the centrepiece of the 1889 World's Fair. Although initially criticised "
                      "by some of France's leading artists and intellectuals for its design, it has since become a "
                      "global cultural icon of France and one of the most recognisable structures in the world."),
    ("Code edit", "Rename the function `calc` to `average` in this code and return the whole code.\n```python\n"
                  "def calc(values):\n    if not values:\n        return 0.0\n    return sum(values) / len(values)\n\n"
                  "print(calc([1, 2, 3]))\n```"),
    ("Code", "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces."),
    ("Explanation", "Explain how a hash table works, in simple terms."),
    ("Writing", "Write a short story about a robot who learns to paint."),
    ("Maths", "A train travels 60 km in 45 minutes. What is its average speed in km/h? Show each step."),
)

HOW_TO_READ = """
**How to read the race.** Both decoders get the same prompt and settings. The one that has used less compute so far
always runs next, so each pane grows at its true speed. On the right, **shaded** text is draft tokens the model
accepted: several tokens for the price of one forward pass (the shade alternates per step; hover for details). Plain
text is the model's own token. At the end: speedup, τ (tokens per forward pass) and whether both outputs are
identical, as they must be. **Step by step** below replays every verification.
"""
