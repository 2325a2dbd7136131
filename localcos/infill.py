"""Fill-in-the-middle: a completion at an editor's cursor, read through the model's FIM tokens.

An editor sends the text before the cursor (`Infill.prefix`), the text after it (`suffix`), the
part of the cursor's line already typed (`typed`, llama-server's `prompt`) and, on llama-server's
/infill, other files as repository-level context (`extra`). The prompt is laid out in one of
three ways (`INFILL_LAYOUTS`, the setting `infill_layout`):

- `makers`: as the models' makers trained them, token for token as the server an editor's client
  was written for lays them out:

    [BOS] [PRE] prefix typed [SUF] suffix [MID]         no repository context (`extra` None)
    [REPO]myproject\\n [SEP]name\\n text ... [SEP]filename\\n [BOS] [PRE] prefix typed [SUF] suffix [MID]

  the first the FIM prompt of the models' makers and of Ollama's templates (`.Prompt`, `.Suffix`),
  the second llama-server's /infill (`format_prompt_infill` in the llama.cpp localcos runs on),
  which writes the repository's header wherever the model has those tokens, extra chunks or not.
  The typed part's tokens follow the prefix's (the model then goes on with the word the cursor is
  in); the extra chunks are the tail of what the context leaves; only the prefix's last
  `3 window / 4` and the suffix's first `window / 4 - 2 - len(typed)` tokens are read
  (llama-server's n_batch is the window).
- `makers-healed`: the same, with the cursor's token healed (below).
- `cached`: the prefix up to the cursor's block, the suffix, then the cursor's block, which the
  model goes on from (after the same repository header):

    [BOS] [PRE] prefix-above [SUF] suffix [MID] block typed

  The prefix and the typed part are one text, cut at the last whole line that begins a block
  (`middle_start`: a line whose text, with the line before it, hashes to a multiple of
  `MIDDLE_BLOCK`); with no such line, all of it follows the middle token (the joint SPM order
  StarCoder and Code Llama read). So the model reads most of the prefix where its makers
  trained it to, before the suffix, and goes on from a middle begun a few lines up (where the
  whole prefix follows the middle token, its middles are worse). Everything a keystroke changes
  is then at the prompt's end, so a server that keeps the cells of the last request evaluates
  only what was typed; the suffix is read again only when an ended line begins a new block. Because the model does not read the
  suffix right after the cursor, a middle that runs into it is cut where it begins (`core.text`).
  At most `3 window / 4` tokens of the text are read, from the start of a line that is a block's
  first (`block_start`, blocks of `Budget.block` lines), so that the start moves about once every
  `block` lines while an editor's window of lines slides down the file; the suffix's first
  `window / 4 - 2` tokens are read, whatever is typed.

The cursor's token healed: the last token before the cursor is taken back and the middle must
begin with its bytes (`core.healing`: a mask on the first tokens' rows), so the model, not the
tokenizer, cuts the text at the cursor into tokens (a prefix ending in indentation, a word half
typed); those bytes are the prefix's, not the middle's (`FimPrompt.cursor`). The cached layout
takes back the tokens before it too while they cut the word the cursor is in (`WORD_TOKENS` at
most): the model then writes that word from its start. Reading the prefix last, it otherwise
often takes the word's first tokens for the whole word (`retur` + ` True`).

The model then writes the middle and ends it with an end-of-generation token (llama.cpp counts the
FIM pad, repository and file-separator tokens among them). The FIM tokens are llama.cpp's: the
GGUF header's `tokenizer.ggml.fim_*_token_id`, else found by their text (`<|fim_prefix|>`,
`<fim-prefix>`, `<PRE>`...), as llama.cpp finds them. No I/O here besides the models' tokenizers.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .core.text import Cursor
from .errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

    from .backend import Model

# llama-server's constants: the repository's name, and the file the cursor is in
REPO_NAME = "myproject\n"
FILE_NAME = "filename\n"
EXTRA_FILE = "tmp"  # an extra chunk's name where it gives none
# between extra chunks where the model has no file-separator token ("\n\n--- snippet ---\n\n")
SNIPPET = "\n\n--- snippet ---\n\n"
INFILL_LAYOUTS = ("makers", "makers-healed", "cached")
# the cached layout heals back to the start of the cursor's word, over at most this many tokens
WORD_TOKENS = 8
# the cached layout's middle begins with the lines of the cursor's block: blocks of this many lines
# on average (the suffix is read again when a new block begins)
MIDDLE_BLOCK = 4


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
    len(typed)`; in the cached layout `window / 4 - 2`), the extra chunks' last `context - window
    - 2 predict` tokens; in the cached layout the prefix starts at a block's first line (`block`
    lines a block, on average)."""

    window: int  # llama-server's n_batch
    context: int  # the context a sequence holds
    predict: int  # the most tokens the middle may take
    suffix: int | None = None
    block: int = 16

    def suffix_tokens(self, typed: int) -> int:
        return max(0, self.window // 4 - (2 + typed)) if self.suffix is None else self.suffix


@dataclass(frozen=True)
class FimPrompt:
    """The tokens a model reads to fill a middle in, and what the middle's text needs to know of
    its cursor (None in the makers' layout: nothing healed, no cut at the suffix)."""

    tokens: list[int]
    cursor: Cursor | None = None


def fim_prompt(model: Model, infill: Infill, budget: Budget, layout: str = "makers") -> FimPrompt:
    """What `model` reads to fill `infill` in, laid out as `layout` says (see the module's
    docstring)."""
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
    n_extra = min(max(0, budget.context - budget.window - 2 * budget.predict), len(extra))
    head = extra[len(extra) - n_extra :] + ([model.bos] if model.add_bos else [])
    most = 3 * (budget.window // 4)  # the prefix's tokens
    if layout == "cached":
        text = block_start(infill.prefix + infill.typed, most, budget.block, tokens)
        at = middle_start(text, MIDDLE_BLOCK)
        begun = _last_tokens(tokens(text[at:]), most)
        above = _last_tokens(tokens(text[:at]), most - len(begun))
        before, healed = _healed(model, begun, WORD_TOKENS)
        suffix = tokens(infill.suffix)[: budget.suffix_tokens(0)]
        return FimPrompt(head + [fim.prefix, *above, fim.suffix, *suffix, fim.middle, *before], Cursor(healed, infill.suffix))
    typed = tokens(infill.typed, special=True)  # llama-server reads `prompt` with its special tokens
    prefix = _last_tokens(tokens(infill.prefix), most)
    suffix = tokens(infill.suffix)[: budget.suffix_tokens(len(typed))]
    if layout == "makers":
        return FimPrompt(head + [fim.prefix, *prefix, *typed, fim.suffix, *suffix, fim.middle])
    before, healed = _healed(model, prefix + typed)
    return FimPrompt(head + [fim.prefix, *before, fim.suffix, *suffix, fim.middle], Cursor(healed))


def _last_tokens(tokens: list[int], n: int) -> list[int]:
    return tokens[len(tokens) - min(len(tokens), n) :]


def _healed(model: Model, tokens: list[int], most: int = 1) -> tuple[list[int], bytes]:
    """The tokens before the cursor with the last taken back, and more before it while the two
    cut a word (at most `most` in all), and their bytes (none taken back where a token writes no
    text: a special token typed)."""
    n, healed = 0, b""
    while n < min(len(tokens), most):
        piece = model.piece(tokens[-1 - n])
        if not piece or n and not (_in_word(piece[-1]) and _in_word(healed[0])):
            break
        n, healed = n + 1, piece + healed
    return tokens[: len(tokens) - n], healed


def _in_word(byte: int) -> bool:
    """Whether a byte can be inside a word (a letter, a digit, `_`, any byte of a character
    beyond ASCII)."""
    return byte >= 0x80 or chr(byte).isalnum() or byte == ord("_")


def block_start(text: str, most: int, block: int, tokens: Callable[[str], list[int]]) -> str:
    """`text` whole where its tokens are at most `most`; else from the earliest line that
    begins a block (`_block_firsts`) and leaves at most that many, so that the start stays put
    while lines are added at the end or dropped at the start before it; where none does, the
    text itself (whose last `most` tokens are read)."""
    if len(tokens(text)) <= most:
        return text
    starts = _block_firsts(text, block)
    lo, hi = 0, len(starts)  # the earliest start that leaves few enough tokens (fewer the later it starts)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokens(text[starts[mid] :])) <= most:
            hi = mid
        else:
            lo = mid + 1
    return text[starts[lo] :] if lo < len(starts) else text


def middle_start(text: str, block: int) -> int:
    """Where the cached layout's middle begins in `text`, the prefix and the typed part: at the
    last whole line that begins a block (of `block` lines on average), the cursor's line being
    still typed; 0 (all of it) where none does. It moves only when a line is ended, and then
    about once every `block` lines."""
    whole = text.rfind("\n") + 1  # where the cursor's line begins
    return max((at for at in _block_firsts(text, block) if at < whole), default=0)


def _block_firsts(text: str, block: int) -> list[int]:
    """Where the lines of `text` that begin a block begin: a line whose text and the text of the
    line before it hash to a multiple of `block` (about one line in `block`, the same line
    whatever comes after it)."""
    lines = text.split("\n")
    firsts, at = [], 0
    for i, line in enumerate(lines[:-1]):
        at += len(line) + 1
        if zlib.crc32(f"{line}\n{lines[i + 1]}".encode()) % block == 0:
            firsts.append(at)  # line i + 1 begins a block
    return firsts


class InfillSettings(Protocol):
    """What `infill_prompt` reads of a request's settings (`config.specs.GenerationConfig`, which
    declares them: the settings layer sits above this module)."""

    @property
    def phrasing(self) -> str: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def infill_suffix(self) -> int | None: ...
    @property
    def infill_block(self) -> int: ...
    @property
    def infill_layout(self) -> str: ...


def infill_prompt(model: Model, infill: Infill, config: InfillSettings) -> FimPrompt:
    """`fim_prompt` under `config`: llama-server's budget with `model`'s batch as its window and
    its context, `config.max_tokens` kept free for the middle, `config.infill_suffix`, laid out
    as `config.infill_layout` says, in blocks of `config.infill_block` lines. The FIM prompt is its
    own phrasing: `config.phrasing` raw or auto."""
    if config.phrasing not in ("raw", "auto"):
        raise ConfigError(f"phrasing {config.phrasing}: a fill-in-the-middle prompt is read through the model's FIM tokens, its makers' "
                          "way; leave phrasing out", param="phrasing")  # fmt: skip
    budget = Budget(model.n_batch, model.n_ctx, config.max_tokens, config.infill_suffix, config.infill_block)
    return fim_prompt(model, infill, budget, config.infill_layout)
