"""How a member reads a text prompt (`--phrasing`): as it is (raw), or, for a prompt that is code
to complete, as its chat template's instruction (instruct): the user's turn asks "Complete this
Python function." with the code, and the assistant's turn repeats the code, so the model goes on
writing the same code as a completion of the raw prompt would, as the instruction-tuned model it
is. A member is a model and the prompt it reads; this makes the second half of that pair."""

from __future__ import annotations

from typing import Sequence

from .config.options import PHRASINGS
from .errors import ConfigError

INSTRUCTION = "Complete this Python function."


def instruct_phrasing(code: str) -> str:
    """The user's turn of the instruct phrasing: the instruction with the code."""
    return f"{INSTRUCTION}\n```python\n{code}```"


def instruct_text(template: str, code: str, bos: str) -> str:
    """The code as the chat `template` renders its instruct phrasing: the user's turn, the
    generation prompt, and the assistant's turn opening a code block that repeats the code."""
    from .chat import Message, render

    return render(template, [Message("user", instruct_phrasing(code))], bos_token=bos, eos_token="", add_generation_prompt=True) + "```python\n" + code


def phrased_tokens(models: Sequence, code: str, phrasing: str, lead: int = 0) -> list[int]:
    """The tokens `models` (one vocabulary: they must tokenize alike) read for the text prompt
    `code` under `phrasing` (raw: the text itself, BOS as their metadata says), instruct rendered
    by model `lead`'s chat template with its special tokens. A `ConfigError` where that model has
    no chat template."""
    from .backend import tokenize_alike

    assert phrasing in PHRASINGS, phrasing
    if phrasing == "raw":
        return tokenize_alike(models, code)
    model = models[lead]
    if not model.chat_template:
        raise ConfigError(f"--phrasing instruct: {model.name} has no chat template in its GGUF metadata to phrase the prompt with",
                          param="phrasing")  # fmt: skip
    from .chat import add_bos_after, special_text

    bos = special_text(model, model.bos)
    text = instruct_text(model.chat_template, code, bos)
    return tokenize_alike(models, text, what="the phrased prompt", add_bos=add_bos_after(text, bos), special=True)
