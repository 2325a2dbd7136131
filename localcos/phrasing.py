"""How a member reads a text prompt (`--phrasing`): as it is (raw), or, for a prompt that is code
to complete, through its chat template, as the instruction-tuned model it is:
- instruct: the user's turn asks "Complete this Python function." with the code, and the
  assistant's turn repeats the code, so the model goes on writing the same code as a completion
  of the raw prompt would;
- evalplus: the instruction EvalPlus gives a chat model (which model cards report with): the
  user's turn asks for a self-contained script solving the problem, the assistant's turn opens
  its code block after EvalPlus's response prefix, and the model writes the whole script;
- auto: how the model's makers run it: through its template (`AUTO`) where its GGUF has one, raw
  where it has none (a base model).
A member is a model and the prompt it reads; this makes the second half of that pair.
"""

from __future__ import annotations

from collections.abc import Sequence

from .config.options import PHRASINGS
from .errors import ConfigError

INSTRUCTION = "Complete this Python function."
# EvalPlus's instruction and response prefix for chat models (evalplus/codegen.py)
EVALPLUS_INSTRUCTION = "Please provide a self-contained Python script that solves the following problem in a markdown code block:"
EVALPLUS_RESPONSE = "Below is a Python script with a self-contained function that solves the problem and passes corresponding tests:"
AUTO = "instruct"  # what auto reads a prompt as where the model has a chat template (chosen on MBPP's validation split)
WHOLE_SCRIPTS = ("evalplus",)  # phrasings whose completion is a whole script, not the prompt's continuation


def instruct_phrasing(code: str) -> str:
    """The user's turn of the instruct phrasing: the instruction with the code."""
    return f"{INSTRUCTION}\n```python\n{code}```"


def instruct_text(template: str, code: str, bos: str, phrasing: str = "instruct") -> str:
    """The code as the chat `template` renders `phrasing` (instruct or evalplus): the user's
    turn, the generation prompt, and the assistant's turn opening a code block (instruct:
    repeating the code; evalplus: after EvalPlus's response prefix)."""
    from .chat import Message, render

    if phrasing == "evalplus":
        user, answer = f"{EVALPLUS_INSTRUCTION}\n```\n{code.strip()}\n```\n", f"{EVALPLUS_RESPONSE}\n```python\n"
    else:
        user, answer = instruct_phrasing(code), "```python\n" + code
    return render(template, [Message("user", user)], bos_token=bos, eos_token="", add_generation_prompt=True) + answer


def resolved(phrasing: str, model: object) -> str:
    """The phrasing `model` reads a prompt with: auto as its makers run it (`AUTO` where its GGUF
    has a chat template, raw where not), the others as they are."""
    if phrasing != "auto":
        return phrasing
    return AUTO if getattr(model, "chat_template", None) else "raw"


def phrased_tokens(models: Sequence, code: str, phrasing: str, lead: int = 0) -> list[int]:
    """The tokens `models` (one vocabulary: they must tokenize alike) read for the text prompt
    `code` under `phrasing` (`resolved` by model `lead`; raw: the text itself, BOS as their
    metadata says), instruct or evalplus rendered by model `lead`'s chat template with its
    special tokens. A `ConfigError` where that model has no chat template."""
    from .backend import tokenize_alike

    assert phrasing in PHRASINGS, phrasing
    model = models[lead]
    phrasing = resolved(phrasing, model)
    if phrasing == "raw":
        return tokenize_alike(models, code)
    if not model.chat_template:
        raise ConfigError(f"--phrasing {phrasing}: {model.name} has no chat template in its GGUF metadata to phrase the prompt with",
                          param="phrasing")  # fmt: skip
    from .chat import add_bos_after, special_text

    bos = special_text(model, model.bos)
    text = instruct_text(model.chat_template, code, bos, phrasing)
    return tokenize_alike(models, text, what="the phrased prompt", add_bos=add_bos_after(text, bos), special=True)
