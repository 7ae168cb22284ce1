"""specdemo: speculative decoding made visible (REST, S4C, SDSAT, prompt lookup) on one lossless tree engine."""
from pathlib import Path

__version__ = "0.1.0"
ASSETS = Path(__file__).resolve().parent.parent / "assets"  # the shipped artifacts, prompts and page style
