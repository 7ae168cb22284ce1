"""The hand-written texts behind the self-distillation prompt set: topics, tasks, templates and passages, every string
written for this project (nothing taken from HumanEval, MT-Bench or Spec-Bench).  project_prompts.py combines them
into prompts; edit these lists there only by appending, so that the ids of existing prompts keep their answers.
"""
from __future__ import annotations

# --------------------------------------------------------------------------------------------------------------------
# Coding: Python function stubs to complete (name, signature, docstring lines, examples as (call, result)).
# --------------------------------------------------------------------------------------------------------------------
STUBS: list[tuple[str, str, str, list[tuple[str, str]]]] = [
    ("count_vowels", "text: str) -> int", "Return how many vowels (a, e, i, o, u, either case) appear in text.",
     [("count_vowels('Banana')", "3"), ("count_vowels('xyz')", "0")]),
    ("reverse_words", "sentence: str) -> str", "Return the sentence with the order of its words reversed.",
     [("reverse_words('one two three')", "'three two one'")]),
    ("is_palindrome_number", "n: int) -> bool", "Return True if the decimal digits of n read the same backwards.",
     [("is_palindrome_number(1221)", "True"), ("is_palindrome_number(123)", "False")]),
    ("running_total", "values: List[int]) -> List[int]", "Return the list of cumulative sums of values.",
     [("running_total([1, 2, 3])", "[1, 3, 6]"), ("running_total([])", "[]")]),
    ("second_largest", "values: List[int]) -> Optional[int]",
     "Return the second largest distinct value, or None if there is no such value.",
     [("second_largest([4, 1, 4, 3])", "3"), ("second_largest([7])", "None")]),
    ("chunk_list", "items: list, size: int) -> List[list]", "Split items into consecutive chunks of length size; "
     "the last chunk may be shorter.", [("chunk_list([1, 2, 3, 4, 5], 2)", "[[1, 2], [3, 4], [5]]")]),
    ("flatten_once", "nested: List[list]) -> list", "Flatten one level of nesting.",
     [("flatten_once([[1, 2], [3], []])", "[1, 2, 3]")]),
    ("word_lengths", "sentence: str) -> Dict[str, int]", "Map each word of the sentence to its length.",
     [("word_lengths('hi there')", "{'hi': 2, 'there': 5}")]),
    ("celsius_to_fahrenheit", "celsius: float) -> float", "Convert a temperature from Celsius to Fahrenheit.",
     [("celsius_to_fahrenheit(100)", "212.0"), ("celsius_to_fahrenheit(0)", "32.0")]),
    ("digit_sum", "n: int) -> int", "Return the sum of the decimal digits of the absolute value of n.",
     [("digit_sum(1234)", "10"), ("digit_sum(-56)", "11")]),
    ("capitalize_words", "text: str) -> str", "Capitalize the first letter of every word in text.",
     [("capitalize_words('good morning world')", "'Good Morning World'")]),
    ("remove_duplicates_keep_order", "items: List[int]) -> List[int]",
     "Remove repeated values, keeping the first occurrence of each in its original order.",
     [("remove_duplicates_keep_order([3, 1, 3, 2, 1])", "[3, 1, 2]")]),
    ("count_words", "text: str) -> int", "Return the number of whitespace-separated words in text.",
     [("count_words('a  quick test')", "3"), ("count_words('')", "0")]),
    ("max_gap", "values: List[int]) -> int", "Return the largest difference between two neighbouring values "
     "after sorting; 0 for fewer than two values.", [("max_gap([9, 1, 5])", "4"), ("max_gap([2])", "0")]),
    ("is_leap_year", "year: int) -> bool", "Return True if year is a leap year in the Gregorian calendar.",
     [("is_leap_year(2000)", "True"), ("is_leap_year(1900)", "False")]),
    ("factorial", "n: int) -> int", "Return n! for a non-negative integer n.",
     [("factorial(5)", "120"), ("factorial(0)", "1")]),
    ("fibonacci_list", "n: int) -> List[int]", "Return the first n Fibonacci numbers, starting 0, 1.",
     [("fibonacci_list(6)", "[0, 1, 1, 2, 3, 5]")]),
    ("gcd", "a: int, b: int) -> int", "Return the greatest common divisor of a and b.",
     [("gcd(12, 18)", "6"), ("gcd(7, 3)", "1")]),
    ("lcm", "a: int, b: int) -> int", "Return the least common multiple of two positive integers.",
     [("lcm(4, 6)", "12")]),
    ("prime_check", "n: int) -> bool", "Return True if n is a prime number.",
     [("prime_check(13)", "True"), ("prime_check(1)", "False")]),
    ("primes_below", "limit: int) -> List[int]", "Return all primes smaller than limit, in increasing order.",
     [("primes_below(12)", "[2, 3, 5, 7, 11]")]),
    ("binary_string", "n: int) -> str", "Return the binary representation of a non-negative integer without a prefix.",
     [("binary_string(10)", "'1010'"), ("binary_string(0)", "'0'")]),
    ("count_char", "text: str, ch: str) -> int", "Count how often the character ch occurs in text.",
     [("count_char('mississippi', 's')", "4")]),
    ("longest_word", "sentence: str) -> str", "Return the longest word; the first one wins a tie.",
     [("longest_word('the quick brown fox')", "'quick'")]),
    ("average", "values: List[float]) -> float", "Return the arithmetic mean of values, or 0.0 for an empty list.",
     [("average([2, 4, 9])", "5.0"), ("average([])", "0.0")]),
    ("middle_value", "values: List[float]) -> float", "Return the median of a non-empty list of numbers.",
     [("middle_value([3, 1, 2])", "2"), ("middle_value([4, 1, 3, 2])", "2.5")]),
    ("clamp", "x: float, low: float, high: float) -> float", "Limit x to the closed range [low, high].",
     [("clamp(12, 0, 10)", "10"), ("clamp(-3, 0, 10)", "0")]),
    ("rotate_left", "items: list, k: int) -> list", "Rotate the list k places to the left.",
     [("rotate_left([5, 6, 7, 8], 1)", "[6, 7, 8, 5]")]),
    ("merge_sorted", "a: List[int], b: List[int]) -> List[int]", "Merge two sorted lists into one sorted list.",
     [("merge_sorted([1, 4], [2, 3, 5])", "[1, 2, 3, 4, 5]")]),
    ("is_anagram", "first: str, second: str) -> bool", "Return True if the two words use exactly the same letters, "
     "ignoring case.", [("is_anagram('Listen', 'Silent')", "True"), ("is_anagram('abc', 'abd')", "False")]),
    ("char_frequencies", "text: str) -> Dict[str, int]", "Count each character of text.",
     [("char_frequencies('abca')", "{'a': 2, 'b': 1, 'c': 1}")]),
    ("title_case_keep_small", "title: str) -> str", "Capitalize every word except 'a', 'an', 'the', 'of' and 'and', "
     "unless it is the first word.", [("title_case_keep_small('the lord of the rings')", "'The Lord of the Rings'")]),
    ("pairs_with_sum", "values: List[int], target: int) -> List[Tuple[int, int]]",
     "Return all index pairs (i, j) with i < j whose values add up to target.",
     [("pairs_with_sum([1, 3, 2, 2], 4)", "[(0, 1), (2, 3)]")]),
    ("matrix_transpose", "matrix: List[List[int]]) -> List[List[int]]", "Return the transpose of a rectangular matrix.",
     [("matrix_transpose([[1, 2, 3], [4, 5, 6]])", "[[1, 4], [2, 5], [3, 6]]")]),
    ("dot_product", "a: List[float], b: List[float]) -> float", "Return the dot product of two equal-length vectors.",
     [("dot_product([1, 2, 3], [4, 5, 6])", "32")]),
    ("to_snake_case", "name: str) -> str", "Convert a CamelCase identifier to snake_case.",
     [("to_snake_case('HttpRequestHandler')", "'http_request_handler'")]),
    ("to_camel_case", "name: str) -> str", "Convert a snake_case identifier to camelCase.",
     [("to_camel_case('parse_input_file')", "'parseInputFile'")]),
    ("count_uppercase", "text: str) -> int", "Return the number of uppercase letters in text.",
     [("count_uppercase('Hello World')", "2")]),
    ("balanced_brackets", "text: str) -> bool", "Return True if every (, [ and { in text is closed in the right order.",
     [("balanced_brackets('a[b(c)]{}')", "True"), ("balanced_brackets('(]')", "False")]),
    ("compress_runs", "text: str) -> str", "Run-length encode text: each run of a character becomes the character "
     "followed by the run length.", [("compress_runs('aaabcc')", "'a3b1c2'")]),
    ("nth_largest", "values: List[int], n: int) -> int", "Return the n-th largest value (1 = the largest).",
     [("nth_largest([5, 9, 1, 7], 2)", "7")]),
    ("sum_of_squares", "n: int) -> int", "Return 1*1 + 2*2 + ... + n*n.", [("sum_of_squares(3)", "14")]),
    ("even_numbers", "values: List[int]) -> List[int]", "Return the even values, in their original order.",
     [("even_numbers([1, 2, 3, 4, 6])", "[2, 4, 6]")]),
    ("safe_divide", "a: float, b: float) -> Optional[float]", "Return a / b, or None when b is zero.",
     [("safe_divide(6, 3)", "2.0"), ("safe_divide(1, 0)", "None")]),
    ("hamming_distance", "a: str, b: str) -> int", "Return the number of positions at which two equal-length "
     "strings differ.", [("hamming_distance('karolin', 'kathrin')", "3")]),
    ("most_common_word", "text: str) -> str", "Return the most frequent lowercase word; the earliest wins a tie.",
     [("most_common_word('b a b a c b')", "'b'")]),
    ("group_by_length", "words: List[str]) -> Dict[int, List[str]]", "Group words by their length.",
     [("group_by_length(['hi', 'yo', 'hey'])", "{2: ['hi', 'yo'], 3: ['hey']}")]),
    ("vowel_positions", "word: str) -> List[int]", "Return the indices of the vowels in word.",
     [("vowel_positions('house')", "[1, 2, 4]")]),
    ("seconds_to_hms", "seconds: int) -> str", "Format a number of seconds as H:MM:SS.",
     [("seconds_to_hms(3725)", "'1:02:05'")]),
    ("parse_key_values", "text: str) -> Dict[str, str]", "Parse 'key=value' pairs separated by semicolons.",
     [("parse_key_values('a=1;b=two')", "{'a': '1', 'b': 'two'}")]),
    ("initials", "full_name: str) -> str", "Return the uppercase initials of a full name, joined by dots.",
     [("initials('ada lovelace')", "'A.L.'")]),
    ("cumulative_max", "values: List[int]) -> List[int]", "Return the running maximum of values.",
     [("cumulative_max([1, 3, 2, 5, 4])", "[1, 3, 3, 5, 5]")]),
    ("interleave", "a: list, b: list) -> list", "Alternate elements of a and b; leftovers go at the end.",
     [("interleave([1, 2, 3], ['x'])", "[1, 'x', 2, 3]")]),
    ("count_in_range", "values: List[int], low: int, high: int) -> int",
     "Count values v with low <= v <= high.", [("count_in_range([1, 5, 8, 10], 4, 9)", "2")]),
    ("mask_email", "email: str) -> str", "Hide all but the first character of the part before the @ with '*'.",
     [("mask_email('robert@example.com')", "'r*****@example.com'")]),
    ("non_decreasing", "values: List[int]) -> bool", "Return True if values are in non-decreasing order.",
     [("non_decreasing([1, 2, 2, 5])", "True"), ("non_decreasing([3, 1])", "False")]),
    ("product_of_list", "values: List[int]) -> int", "Return the product of all values; 1 for an empty list.",
     [("product_of_list([2, 3, 4])", "24")]),
    ("triangle_kind", "a: float, b: float, c: float) -> str", "Classify a triangle by its sides as 'equilateral', "
     "'isosceles', 'scalene', or 'invalid'.", [("triangle_kind(2, 2, 2)", "'equilateral'"),
                                              ("triangle_kind(1, 2, 5)", "'invalid'")]),
    ("roman_to_int", "numeral: str) -> int", "Convert a Roman numeral to an integer.",
     [("roman_to_int('XIV')", "14"), ("roman_to_int('MCM')", "1900")]),
    ("int_to_roman", "number: int) -> str", "Convert an integer from 1 to 3999 to a Roman numeral.",
     [("int_to_roman(9)", "'IX'"), ("int_to_roman(44)", "'XLIV'")]),
    ("caesar_shift", "text: str, shift: int) -> str", "Shift every letter of text by shift places in the "
     "alphabet, wrapping around and keeping case; other characters stay.", [("caesar_shift('abz', 1)", "'bca'")]),
    ("count_islands_row", "row: str) -> int", "Count groups of consecutive '#' characters in a row like '##..#'.",
     [("count_islands_row('##..#.##')", "3")]),
    ("days_in_month", "month: int, year: int) -> int", "Return the number of days in the month of the year.",
     [("days_in_month(2, 2024)", "29"), ("days_in_month(4, 2023)", "30")]),
    ("distinct_count", "values: list) -> int", "Return how many different values there are.",
     [("distinct_count([1, 1, 2, 3, 3])", "3")]),
    ("longest_run", "values: List[int]) -> int", "Return the length of the longest run of equal adjacent values.",
     [("longest_run([1, 1, 2, 2, 2, 3])", "3")]),
    ("strip_punctuation", "text: str) -> str", "Remove every punctuation character from text.",
     [("strip_punctuation('Hi, there!')", "'Hi there'")]),
    ("zip_to_dict", "keys: List[str], values: list) -> dict", "Build a dictionary pairing keys with values; extra "
     "items on either side are ignored.", [("zip_to_dict(['a', 'b'], [1, 2, 3])", "{'a': 1, 'b': 2}")]),
    ("bmi", "weight_kg: float, height_m: float) -> float", "Return the body mass index rounded to one decimal.",
     [("bmi(70, 1.75)", "22.9")]),
    ("invert_dict", "mapping: Dict[str, int]) -> Dict[int, str]", "Swap keys and values of a dictionary.",
     [("invert_dict({'a': 1, 'b': 2})", "{1: 'a', 2: 'b'}")]),
    ("starts_with_vowel", "words: List[str]) -> List[str]", "Return the words that start with a vowel.",
     [("starts_with_vowel(['apple', 'pear', 'orange'])", "['apple', 'orange']")]),
    ("sum_even_digits", "n: int) -> int", "Return the sum of the even digits of a non-negative integer.",
     [("sum_even_digits(123456)", "12")]),
    ("percent_change", "old: float, new: float) -> float", "Return the percentage change from old to new.",
     [("percent_change(50, 75)", "50.0")]),
    ("window_sums", "values: List[int], k: int) -> List[int]", "Return the sums of every window of k consecutive "
     "values.", [("window_sums([1, 2, 3, 4], 2)", "[3, 5, 7]")]),
    ("is_power_of_two", "n: int) -> bool", "Return True if n is a positive power of two.",
     [("is_power_of_two(16)", "True"), ("is_power_of_two(12)", "False")]),
    ("split_even_odd", "values: List[int]) -> Tuple[List[int], List[int]]",
     "Return (evens, odds), each in the original order.", [("split_even_odd([1, 2, 3, 4])", "([2, 4], [1, 3])")]),
    ("first_repeated_char", "text: str) -> Optional[str]", "Return the first character that appears a second time, "
     "or None.", [("first_repeated_char('abcba')", "'b'"), ("first_repeated_char('abc')", "None")]),
    ("wrap_text", "text: str, width: int) -> List[str]", "Greedily wrap words into lines of at most width "
     "characters.", [("wrap_text('the cat sat on the mat', 7)", "['the cat', 'sat on', 'the mat']")]),
]

STUB_WRAPPERS = [
    "Complete this Python function:\n```python\n{code}```",
    "Implement the body of the following Python function:\n```python\n{code}```",
    "Fill in this function so that it passes its doctests:\n```python\n{code}```",
]

CODE_TASKS = [
    "reverses a linked list", "checks whether a string is a valid IPv4 address", "reads a CSV file and returns the "
    "average of one column", "finds the most frequent element in a list", "validates an email address with a regular "
    "expression", "implements binary search on a sorted list", "counts the lines, words and characters of a text file",
    "removes all whitespace from a string", "computes the n-th triangular number", "converts a dictionary to a JSON "
    "string and back", "implements a stack with push, pop and peek", "implements a queue using two stacks",
    "sorts a list of dictionaries by one key", "finds all files with a given extension in a folder", "returns the "
    "intersection of two lists", "checks whether two rectangles overlap", "generates a random password of a given "
    "length", "memoizes a recursive function", "computes the edit distance between two strings", "parses a date string "
    "in ISO format", "merges two dictionaries, summing values of shared keys", "implements bubble sort",
    "implements merge sort", "implements quicksort", "counts word frequencies in a paragraph", "finds the longest common "
    "prefix of a list of strings", "converts a number of bytes to a human-readable size", "checks whether a number is "
    "an Armstrong number", "transposes a matrix", "flattens an arbitrarily nested list", "returns the k smallest numbers "
    "in a list", "groups a list of words by their first letter", "retries a function call up to three times",
    "measures how long a function takes to run", "implements a simple LRU cache", "checks whether a Sudoku row is "
    "valid", "converts a Roman numeral to an integer", "finds the maximum subarray sum", "rotates a matrix by 90 "
    "degrees", "removes duplicate lines from a text file",
]
CODE_LANGS = ["Python", "JavaScript", "Java", "C", "Go", "Rust", "C++", "TypeScript"]
CODE_ASKS = [
    "Write a {lang} function that {task}.",
    "How do I write a {lang} program that {task}? Show the code.",
    "Show me a short {lang} example that {task}, with comments.",
]

CODE_CONCEPTS = [
    "list comprehensions in Python", "Python decorators", "generators and the yield keyword", "Python's with "
    "statement", "the difference between a list and a tuple in Python", "exceptions and try/except in Python",
    "recursion", "Big-O notation", "hash tables", "binary search trees", "object-oriented programming", "inheritance "
    "and composition", "unit testing", "version control with git", "REST APIs", "SQL joins", "regular expressions",
    "the difference between a process and a thread", "async and await in Python", "type hints in Python",
    "dynamic programming", "garbage collection", "pointers in C", "closures in JavaScript", "virtual environments in "
    "Python", "the Python global interpreter lock", "dependency injection", "immutability", "lambda functions",
    "Python's *args and **kwargs",
]
CODE_SNIPPETS = [
    "def f(xs):\n    return [x * x for x in xs if x % 2 == 0]\n",
    "total = 0\nfor i in range(1, 11):\n    total += i\nprint(total)\n",
    "def g(s):\n    return s == s[::-1]\n",
    "import collections\ncounts = collections.Counter(open('words.txt').read().split())\nprint(counts.most_common(3))\n",
    "def h(n):\n    if n < 2:\n        return n\n    return h(n - 1) + h(n - 2)\n",
    "data = {'b': 2, 'a': 1}\nfor key in sorted(data):\n    print(key, data[key])\n",
    "def find(items, target):\n    for i, item in enumerate(items):\n        if item == target:\n            return i\n"
    "    return -1\n",
    "with open('log.txt') as f:\n    errors = [line for line in f if 'ERROR' in line]\nprint(len(errors))\n",
    "class Counter:\n    def __init__(self):\n        self.n = 0\n\n    def tick(self):\n        self.n += 1\n"
    "        return self.n\n",
    "def avg(nums):\n    return sum(nums) / len(nums)\n",
    "words = sentence.split()\nlongest = max(words, key=len)\n",
    "squares = {n: n ** 2 for n in range(5)}\n",
]
CODE_SNIPPET_ASKS = [
    "Explain what this Python code does:\n```python\n{code}```",
    "Is there a bug in this code? How would you improve it?\n```python\n{code}```",
    "Add type hints and a docstring to this code:\n```python\n{code}```",
]

# --------------------------------------------------------------------------------------------------------------------
# Writing, explanation, QA, maths, summarisation, rewriting
# --------------------------------------------------------------------------------------------------------------------
WRITING_FORMS = [
    "a short poem", "a haiku", "a four-sentence story", "a short blog post introduction", "a product description",
    "a polite email to a colleague", "a motivational message", "a short speech", "a limerick", "a diary entry",
    "a tweet", "a thank-you note",
]
WRITING_TOPICS = [
    "the first day of spring", "a lost umbrella", "learning to ride a bicycle", "a rainy afternoon in the city",
    "a robot who wants to paint", "the ocean at night", "moving to a new town", "a cup of morning coffee",
    "a friendly dragon", "finishing a marathon", "an old library", "a garden full of bees", "a snowy mountain village",
    "the last day of school", "a cat that sleeps all day", "a trip to the market", "a broken clock", "starting a new job",
]

EXPLAIN_ASKS = [
    "Explain {x} in simple terms.", "What is {x}? Give an example.", "Explain {x} to a ten-year-old.",
    "Why does {x} matter? Answer in a short paragraph.",
]
EXPLAIN_TOPICS = [
    "photosynthesis", "inflation", "the water cycle", "gravity", "compound interest", "the immune system",
    "climate change", "supply and demand", "how vaccines work", "black holes", "the greenhouse effect", "democracy",
    "plate tectonics", "DNA", "the internet", "electricity", "evolution by natural selection", "the stock market",
    "machine learning", "renewable energy", "the scientific method", "how a bill becomes law", "the moon's phases",
    "opportunity cost", "how airplanes fly", "the placebo effect", "recycling", "encryption", "tides",
    "the French Revolution",
]
COMPARE_PAIRS = [
    ("a virus", "a bacterium"), ("weather", "climate"), ("a simile", "a metaphor"), ("speed", "velocity"),
    ("an atom", "a molecule"), ("saving", "investing"), ("a comet", "an asteroid"), ("RAM", "storage"),
    ("a democracy", "a monarchy"), ("mitosis", "meiosis"), ("an acid", "a base"), ("a lake", "a sea"),
]

QA_QUESTIONS = [
    "What are three tips for getting better sleep?", "How can I improve my public speaking?", "What should I pack for "
    "a weekend hiking trip?", "How do I start learning a new language?", "What are the health benefits of walking "
    "every day?", "How can I save money on groceries?", "What is a good way to organise my week?", "How do I make a "
    "simple vegetable soup?", "What are some ways to reduce stress?", "How do I write a good cover letter?",
    "What are the main causes of air pollution?", "How do plants get water from their roots to their leaves?",
    "What is the tallest mountain in the world and how tall is it?", "Why is the sky blue?", "How many continents are "
    "there and what are they?", "What are the planets of the solar system?", "How do I care for a houseplant?",
    "What are good habits for studying?", "How can I be more productive when working from home?", "What is the "
    "difference between baking soda and baking powder?", "How do I change a flat bicycle tyre?", "What are the "
    "primary colours?", "Why do leaves change colour in autumn?", "How does a refrigerator keep food cold?",
    "What should I consider when buying a used car?", "How can I make my passwords more secure?", "What are some "
    "fun activities for a rainy day?", "How do I prepare for a job interview?", "What is a balanced diet?",
    "How do bees make honey?", "What causes thunder?", "How can I become a better listener?", "What are some good "
    "questions to ask a mentor?", "How do I start running if I am a beginner?", "What is the best way to learn to "
    "type faster?", "How do I plan a birthday party on a budget?",
]

MATH_TEMPLATES = [
    "A shop sells pencils at {a} cents each. How much do {b} pencils cost in dollars? Show your steps.",
    "A train travels {a} kilometres in {b} hours. What is its average speed?",
    "What is {a} multiplied by {b}? Explain how you got the answer.",
    "If a rectangle is {a} cm long and {b} cm wide, what are its area and perimeter?",
    "Tom has {a} apples and gives away {b}. Then he buys twice as many as he has left. How many apples does he have?",
    "What is {b} percent of {a}?",
    "Solve for x: {b}x + {a} = {c}.",
    "A recipe needs {b} eggs for {a} cookies. How many eggs are needed for {c} cookies?",
    "What is the sum of all whole numbers from 1 to {a}?",
    "A car uses {b} litres of fuel per 100 km. How much fuel does it need for {a} km?",
]
MATH_NUMBERS = [(12, 5, 47), (36, 4, 52), (150, 3, 90), (48, 6, 120), (25, 8, 73), (64, 7, 99), (90, 10, 130),
                (15, 2, 41), (240, 12, 300), (72, 9, 108)]
MATH_CONCEPTS = [
    "How do you find the area of a circle?", "What is a prime number? List the first ten.", "Explain the "
    "Pythagorean theorem with an example.", "How do you convert a fraction to a decimal?", "What is the difference "
    "between mean, median and mode?", "How do you solve a quadratic equation?", "What is a derivative in calculus?",
    "Explain how long division works.", "What is a logarithm?", "How do you calculate simple interest?",
]

PASSAGES = [
    "The city council met on Tuesday to discuss plans for a new public park on the site of an old factory. Residents "
    "spoke in favour of more green space, but some worried about the cost and about parking. The council agreed to "
    "ask an architect for three designs and to hold a public vote next spring.",
    "Honeybees communicate the location of flowers through a movement called the waggle dance. The angle of the dance "
    "shows the direction of the food relative to the sun, and the length of the waggle shows the distance. Other bees "
    "watch the dance and then fly straight to the flowers.",
    "Our company will move to a four-day work week for a six-month trial starting in March. Employees will work the "
    "same number of hours over four days, and managers will track productivity and wellbeing. At the end of the trial "
    "we will decide whether to keep the new schedule.",
    "The first bicycles, built in the early nineteenth century, had no pedals: riders pushed themselves along with "
    "their feet. Pedals attached to the front wheel came later, leading to huge front wheels for speed. The modern "
    "design with a chain and two equal wheels made cycling safer and popular around the world.",
    "A new study found that people who spent at least two hours a week in nature reported better health and "
    "wellbeing. The benefit did not depend on whether the time was spent in one visit or several shorter ones. The "
    "researchers say that parks and green spaces are important for public health.",
    "The library will close for renovations from June to August. During this time, books can be borrowed from the "
    "mobile library van, which will visit each neighbourhood once a week. The renovated library will have a larger "
    "children's section, more computers and a quiet study room.",
    "Volcanoes form when molten rock, called magma, rises from deep inside the Earth. When pressure builds up, the "
    "magma can erupt through the surface as lava, ash and gas. Some volcanoes erupt often, while others stay quiet for "
    "thousands of years.",
    "Our team finished the mobile app two weeks late because of problems with the payment system. Testing found "
    "several bugs, which were fixed before launch. In the first week, more than five thousand people downloaded the "
    "app, and most reviews were positive.",
]
SUMMARY_ASKS = [
    "Summarise this text in one sentence:\n\n{p}", "List the key points of this text as bullet points:\n\n{p}",
    "Write a short headline for this text:\n\n{p}", "Summarise this for a busy manager in two sentences:\n\n{p}",
]

REWRITE_SENTENCES = [
    "hey can u send me the report by tomorow thx", "The meeting was postponed due to the fact that the manager was "
    "sick.", "I think that maybe we should possibly consider changing the plan.", "Their going to the park later, "
    "do you wanna come?", "The results of the experiment was surprising to everyone.", "We regret to inform you that "
    "your application has not been successful.", "The food at the restaurant was good and the service was good too.",
    "In my opinion I believe the new policy is a bad idea.", "Please be advised that the office will be closed on "
    "Monday.", "The dog run quickly across the yard and jump over the fence.", "Due to unforeseen circumstances the "
    "event has been cancelled.", "This product is very very good and I like it a lot.",
]
REWRITE_STYLES = [
    "Rewrite this sentence in a formal tone: {s}", "Fix the grammar and spelling: {s}", "Make this sentence more "
    "concise: {s}", "Rewrite this in a friendly, casual tone: {s}", "Paraphrase this sentence: {s}",
]
