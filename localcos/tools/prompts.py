"""Built-in benchmark prompts, written for localcos in the four task styles of the CoS paper.

The paper measures code completion (HumanEval), math word problems (GSM8K), multiple-choice
knowledge questions (MMLU) and summarisation (CNN/DailyMail). These prompts imitate those styles;
they are short so that a benchmark spends its time generating, not reading the prompt.
"""

from __future__ import annotations

from pathlib import Path

BUILTIN_PROMPTS: dict[str, list[str]] = {
    "code": [
        'def is_palindrome(text: str) -> bool:\n    """Return True if text reads the same forwards and backwards,\n    ignoring case and spaces."""\n',
        'def running_mean(values: list[float]) -> list[float]:\n    """Return the mean of values[:i + 1] for every i."""\n',
        'def count_words(sentence: str) -> dict[str, int]:\n    """Count how often each word occurs in the sentence."""\n',
        'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number, with fibonacci(0) == 0."""\n',
        'def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n    """Merge two sorted lists into one sorted list."""\n',
        'def flatten(nested: list) -> list:\n    """Flatten a list of lists of any depth into a single list."""\n',
    ],
    "math": [
        "Question: A baker makes 24 loaves of bread every morning and sells three quarters of them by noon. How many "
        "loaves are left at noon?\nAnswer: Let's think step by step.",
        "Question: Tom has 5 boxes with 12 pencils in each box. He gives 17 pencils to his friends. How many pencils "
        "does he have now?\nAnswer: Let's think step by step.",
        "Question: A train travels 60 kilometres per hour for 2.5 hours and then 80 kilometres per hour for 1 hour. "
        "How far does it travel in total?\nAnswer: Let's think step by step.",
        "Question: Sara reads 15 pages of her book every day. The book has 240 pages. After how many days will she "
        "finish it?\nAnswer: Let's think step by step.",
        "Question: A shirt costs 40 dollars and is on sale for 25 percent off. What is the sale price?\nAnswer: Let's think step by step.",
        "Question: There are 3 times as many cats as dogs in a shelter, and 48 animals in all. How many dogs are there?\nAnswer: Let's think step by step.",
    ],
    "knowledge": [
        "Which gas makes up most of the Earth's atmosphere?\nA. Oxygen\nB. Nitrogen\nC. Carbon dioxide\nD. Argon\nAnswer:",
        "Which organ pumps blood through the human body?\nA. The liver\nB. The lungs\nC. The heart\nD. The kidneys\nAnswer:",
        "What is the boiling point of water at sea level?\nA. 90 degrees Celsius\nB. 100 degrees Celsius\nC. 110 "
        "degrees Celsius\nD. 120 degrees Celsius\nAnswer:",
        "Who wrote the play Romeo and Juliet?\nA. Charles Dickens\nB. Jane Austen\nC. William Shakespeare\nD. Mark Twain\nAnswer:",
        "Which planet is closest to the Sun?\nA. Venus\nB. Mercury\nC. Mars\nD. Earth\nAnswer:",
        "What is the largest ocean on Earth?\nA. The Atlantic Ocean\nB. The Indian Ocean\nC. The Arctic Ocean\nD. The Pacific Ocean\nAnswer:",
    ],
    "summary": [
        "Article: The city council voted on Tuesday to extend the opening hours of the central library. From next "
        "month the library will stay open until nine in the evening on weekdays, and it will open on Sunday afternoons "
        "for the first time. Council members said the change followed a survey in which most residents asked for later hours.\nSummary:",
        "Article: A small team of volunteers has restored the old railway bridge over the river. The work took two "
        "years and was paid for by local donations. The bridge, which was closed in 1998, will now carry walkers and "
        "cyclists between the two villages.\nSummary:",
        "Article: Scientists studying a lake in the mountains found that its water has warmed by almost two degrees "
        "over thirty years. They say the change affects the fish that live there and the plants along its shores, and "
        "they plan to measure the lake every month from now on.\nSummary:",
        "Article: The football club announced that its new stadium will be ready for the start of next season. The "
        "stadium has room for twenty thousand fans, solar panels on its roof and a new tram stop at its entrance. Tickets go on sale in June.\nSummary:",
        "Article: A school in the north of the country has started teaching its pupils to grow vegetables. Each class "
        "looks after a garden bed, and the harvest is cooked in the school kitchen. Teachers say the pupils now eat more vegetables at lunch.\nSummary:",
        "Article: After a week of heavy rain the river rose above its banks and flooded several streets near the "
        "harbour. No one was hurt, but shops had to close for two days. The town is now discussing a new wall along the river.\nSummary:",
    ],
}


def builtin_prompts() -> list[tuple[str, str]]:
    """All built-in prompts as (task, prompt) pairs, interleaving the four tasks."""
    tasks = list(BUILTIN_PROMPTS)
    rows = max(len(v) for v in BUILTIN_PROMPTS.values())
    return [(task, BUILTIN_PROMPTS[task][i]) for i in range(rows) for task in tasks if i < len(BUILTIN_PROMPTS[task])]


def load_prompts(spec: str) -> list[tuple[str, str]]:
    """Prompts for a benchmark: ``builtin`` or a text file.

    A file holds prompts separated by lines that contain only ``---``; a line ``# task: NAME``
    at the top of a prompt names its task (default ``file``).
    """
    if spec == "builtin":
        return builtin_prompts()
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file not found: {spec}")
    prompts: list[tuple[str, str]] = []
    for block in path.read_text(encoding="utf-8").split("\n---\n"):
        task = "file"
        lines = block.strip("\n").splitlines()
        if lines and lines[0].startswith("# task:"):
            task = lines[0].split(":", 1)[1].strip() or "file"
            lines = lines[1:]
        text = "\n".join(lines).strip("\n")
        if text:
            prompts.append((task, text))
    if not prompts:
        raise ValueError(f"no prompts in {spec}")
    return prompts
