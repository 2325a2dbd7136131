"""Fill-in-the-middle: a completion at an editor's cursor, read through the model's FIM tokens.

An editor sends the text before the cursor (`Infill.prefix`), the text after it (`suffix`), the
part of the cursor's line already typed (`typed`, llama-server's `prompt`) and, on llama-server's
/infill, other files as repository-level context (`extra`). The model reads them as its makers
trained it, token for token as the server its client was written for lays them out:

    [BOS] [PRE] prefix typed [SUF] suffix [MID]         no repository context (`extra` None)
    [REPO]myproject\\n [SEP]name\\n text ... [SEP]filename\\n [BOS] [PRE] prefix typed [SUF] suffix [MID]

the first the FIM prompt of the models' makers and of Ollama's templates (`.Prompt`, `.Suffix`),
the second llama-server's /infill (`format_prompt_infill` in the llama.cpp localcos runs on),
which writes the repository's header wherever the model has those tokens, extra chunks or not.
The typed part's tokens follow the prefix's (the model then goes on with the word the cursor is
in); the extra chunks are the tail of what the context leaves; only the prefix's last
`3 window / 4` and the suffix's first `window / 4 - 2 - len(typed)` tokens are read
(llama-server's n_batch is the window). The model then writes the middle and ends it with an
end-of-generation token (llama.cpp counts the FIM pad, repository and file-separator tokens
among them).

The FIM tokens are llama.cpp's: the GGUF header's `tokenizer.ggml.fim_*_token_id`, else found by
their text (`<|fim_prefix|>`, `<fim-prefix>`, `<PRE>`...), as llama.cpp finds them. No I/O here
besides the models' tokenizers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import ConfigError

if TYPE_CHECKING:
    from .backend import Model
    from .config.specs import GenerationConfig

# llama-server's constants: the repository's name, and the file the cursor is in
REPO_NAME = "myproject\n"
FILE_NAME = "filename\n"
EXTRA_FILE = "tmp"  # an extra chunk's name where it gives none
# between extra chunks where the model has no file-separator token ("\n\n--- snippet ---\n\n")
SNIPPET = "\n\n--- snippet ---\n\n"


@dataclass(frozen=True)
class ExtraChunk:
    """Another file's text, read before the prefix as repository-level context."""

    text: str
    filename: str = EXTRA_FILE


@dataclass(frozen=True)
class Infill:
    """What to fill in: the text before the cursor, after it, the cursor's line up to the cursor
    (`typed`: read after the prefix; an editor may also leave it in the prefix) and, for
    repository-level context as llama-server writes it, other files (`extra`, maybe none: its
    header then stands alone); None for none (the makers' FIM prompt)."""

    prefix: str
    suffix: str
    typed: str = ""
    extra: tuple[ExtraChunk, ...] | None = None


@dataclass(frozen=True)
class FimTokens:
    """A model's fill-in-the-middle tokens (pad, repository and file separator where it has them)."""

    prefix: int
    suffix: int
    middle: int
    pad: int | None = None
    repo: int | None = None
    sep: int | None = None

    @classmethod
    def of(cls, model: Model) -> FimTokens:
        """`model`'s FIM tokens as llama.cpp found them; a `ConfigError` naming the model and what
        it lacks where it has no prefix, suffix or middle token."""
        found = model.fim_tokens()
        missing = [name for name in ("prefix", "suffix", "middle") if found.get(name) is None]
        if missing:
            raise ConfigError(f"{model.label} has no fill-in-the-middle {', '.join(missing)} token (its GGUF names none and its vocabulary "
                              "holds no <|fim_prefix|> or <PRE> kind of token): infill needs a code model trained for it, such as "
                              "Qwen2.5-Coder", param="suffix")  # fmt: skip
        return cls(**found)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Budget:
    """How much of each part the prompt reads (llama-server's /infill): the prefix's last
    `3 window / 4` tokens, the suffix's first `suffix` tokens (default `window / 4 - 2 -
    len(typed)`), the extra chunks' last `context - window - 2 predict` tokens."""

    window: int  # llama-server's n_batch
    context: int  # the context a sequence holds
    predict: int  # the most tokens the middle may take
    suffix: int | None = None

    def suffix_tokens(self, typed: int) -> int:
        return max(0, self.window // 4 - (2 + typed)) if self.suffix is None else self.suffix


def fim_prompt(model: Model, infill: Infill, budget: Budget) -> list[int]:
    """The tokens `model` reads to fill `infill` in (see the module's docstring)."""
    fim = FimTokens.of(model)

    def tokens(text: str, special: bool = False) -> list[int]:
        return model.tokenize(text, add_bos=False, special=special) if text else []

    extra: list[int] = []
    if infill.extra is not None:
        if fim.repo is not None:
            extra += [fim.repo, *tokens(REPO_NAME)]
        for chunk in infill.extra:
            extra += [fim.sep, *tokens(chunk.filename + "\n")] if fim.sep is not None else tokens(SNIPPET)
            extra += tokens(chunk.text)
        if fim.sep is not None:
            extra += [fim.sep, *tokens(FILE_NAME)]
    typed = tokens(infill.typed, special=True)  # llama-server reads `prompt` with its special tokens
    prefix = tokens(infill.prefix)
    prefix = prefix[len(prefix) - min(len(prefix), 3 * (budget.window // 4)) :]
    suffix = tokens(infill.suffix)[: budget.suffix_tokens(len(typed))]
    n_extra = min(max(0, budget.context - budget.window - 2 * budget.predict), len(extra))
    bos = [model.bos] if model.add_bos else []
    return extra[len(extra) - n_extra :] + bos + [fim.prefix, *prefix, *typed, fim.suffix, *suffix, fim.middle]


def infill_tokens(model: Model, infill: Infill, config: GenerationConfig) -> list[int]:
    """`fim_prompt` under `config`: llama-server's budget with `model`'s batch as its window and
    its context, `config.max_tokens` kept free for the middle, `config.infill_suffix`. The FIM
    prompt is its own phrasing (the makers' way to run the model): `config.phrasing` raw or auto."""
    if config.phrasing not in ("raw", "auto"):
        raise ConfigError(f"phrasing {config.phrasing}: a fill-in-the-middle prompt is read through the model's FIM tokens, its makers' "
                          "way; leave phrasing out", param="phrasing")  # fmt: skip
    return fim_prompt(model, infill, Budget(model.n_batch, model.n_ctx, config.max_tokens, config.infill_suffix))
