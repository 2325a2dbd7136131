"""Second prompts derived from a code task's own (`eval --contrast-prompt NAME`), read by a second
member of the lead model: the task without its examples (the "lame" prompt of selective
self-contrast, USCD, arXiv 2409.05923), or the task phrased as a chat instruction. A transform
that finds nothing to change in a task says so (None), and that problem is decoded without it."""

from __future__ import annotations

import re
from collections.abc import Callable

from ..config.options import CONTRAST_PROMPTS

# where an example begins: an interpreter prompt, a heading that introduces examples (alone on
# its line, or with the example after its colon: MBPP's "For example: assert ..."), a worked input
_PROMPT_LINE = re.compile(r"^\s*>>>")
_HEADING_ALONE = re.compile(r"^\s*(?:for\s+example|examples?|example\s*\d+|\[input/output\]\s+samples)\s*:?\s*$", re.IGNORECASE)
_HEADING_WITH = re.compile(r"^\s*(?:for\s+example|examples?|example\s*\d+)\s*:\s*\S", re.IGNORECASE)
_INPUT_LINE = re.compile(r"^\s*input\s*:", re.IGNORECASE)
_OUTPUT_LINE = re.compile(r"^\s*output\s*:", re.IGNORECASE)
_DOCSTRING_END = re.compile(r"^\s*(?:\"\"\"|\'\'\')\s*$")


def drop_examples(prompt: str) -> str | None:
    """The task's prompt without its examples: `>>>` lines and the output lines after them,
    example headings ("Examples", "For example:", MBPP's "For example: assert ...") and the
    lines under them up to a blank line or the docstring's end, lines that call the function
    (`name(...) == ...`, `name(...) ➞ ...`) and worked "Input: ... Output: ..." pairs; the rest
    kept as it is. None where there is no example to drop."""
    names = re.findall(r"^\s*def\s+(\w+)\s*\(", prompt, re.MULTILINE)
    call = re.compile(r"^\s*(?:{})\s*\(".format("|".join(map(re.escape, names)))) if names else None
    kept: list[str] = []
    dropping = after_input = False
    for line in prompt.split("\n"):
        if _PROMPT_LINE.match(line) or _HEADING_ALONE.match(line):
            dropping = True
            continue
        if _HEADING_WITH.match(line) or (call is not None and call.match(line) and not line.lstrip().startswith("def ")):
            continue
        if _INPUT_LINE.match(line) or (after_input and _OUTPUT_LINE.match(line)):
            after_input = bool(_INPUT_LINE.match(line))
            continue
        after_input = False
        if dropping:
            if _DOCSTRING_END.match(line) or not line.strip():
                dropping = False  # the docstring's end, or a blank line, ends the example (and is kept)
            else:
                continue  # the example's output
        kept.append(line)
    out = "\n".join(kept)
    return None if out == prompt else out


TRANSFORMS: dict[str, Callable[[str], str | None]] = {"drop-examples": drop_examples}
CHAT_TRANSFORMS = ("instruct",)  # the task read as --phrasing instruct reads a prompt (localcos.phrasing), by the lead model
assert set(TRANSFORMS) | set(CHAT_TRANSFORMS) == set(CONTRAST_PROMPTS)
