"""Structured output: what an ensemble may write, as a token mask that depends on the tokens so far.

A `Constraint` is a JSON schema, a GBNF grammar (as llama.cpp reads it), or "any JSON object".
llguidance compiles it and, fed with the GGUF's own vocabulary, computes at each position the set
of tokens that keep the text inside the language (a bitmask, one bit per token); its matcher
consumes tokens one by one and rolls back, as speculative decoding needs. The decoding core applies
the mask to r (renormalised) and to every proposer's draft distribution at every draft position
(`core.decoding`), so the accept/residual step stays exact for the constrained r. An end-of-
generation token is allowed where the text is complete, and only there.

Why llguidance: a well-kept engine made for this (llama.cpp's own optional grammar backend,
vLLM's and SGLang's), with no dependencies of its own, a matcher with rollback, and GBNF, JSON
schema and Lark front ends; xgrammar, the other such engine, needs PyTorch.
"""

from __future__ import annotations

import functools
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Sequence

import numpy as np

from .errors import ConfigError, LocalcosError, param_of

if TYPE_CHECKING:
    from .backend import Model

# JSON as json.dumps writes it: whitespace between tokens would otherwise be free, and a model
# may write it forever (llama.cpp's grammars bound it too)
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Constraint:
    """A checked constraint: its kind, its source as given (a JSON schema's text, a GBNF
    grammar) and llguidance's compiled grammar."""

    kind: str
    source: str
    grammar: str

    def describe(self) -> str:
        return {"json_schema": "JSON schema", "grammar": "grammar", "json_object": "JSON object", "tools": "tool calls"}[self.kind]


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as e:  # pragma: no cover - a dependency of the package
        raise LocalcosError(f"structured output needs llguidance ({e}); pip install llguidance") from None
    return llguidance


def _checked(kind: str, source: str, grammar: str, what: str) -> Constraint:
    llguidance = _llguidance()
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ConfigError(f"{what}: {' '.join(messages[0].split())}", param=param_of(what))
    return Constraint(kind, source, grammar)


def json_schema(value: Any, what: str = "the JSON schema") -> Constraint:
    """A constraint from a JSON schema: a dict, or its JSON text."""
    if isinstance(value, str):
        try:
            schema = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{what} is not valid JSON: {e}", param=param_of(what)) from None
    else:
        schema = value
    if not isinstance(schema, dict):
        raise ConfigError(f"{what} must be a JSON object (a schema), got {type(schema).__name__}", param=param_of(what))
    text = json.dumps(schema)
    try:
        grammar = _llguidance().LLMatcher.grammar_from_json_schema(text, overrides=JSON_LAYOUT)
    except ValueError as e:
        raise ConfigError(f"{what}: {e}", param=param_of(what)) from None
    return _checked("json_schema", text, grammar, what)


@functools.cache
def json_object() -> Constraint:
    """Any JSON object (OpenAI's response_format {"type": "json_object"})."""
    text = '{"type": "object"}'
    return _checked("json_object", text, _llguidance().LLMatcher.grammar_from_json_schema(text, overrides=JSON_LAYOUT), "the JSON object grammar")


def gbnf(text: str, what: str = "the grammar") -> Constraint:
    """A constraint from a GBNF grammar (llama.cpp's format; its start rule is `root`)."""
    llguidance = _llguidance()
    try:
        grammar = llguidance.grammar_from("gbnf", text)
    except (ValueError, Exception) as e:  # the converter raises plain exceptions on bad input
        raise ConfigError(f"{what}: {' '.join(str(e).split())}", param=param_of(what)) from None
    return _checked("grammar", text, grammar, what)


def read_source(value: Any, what: str) -> str:
    """A file's text when `value` names a file, else `value` itself (inline text)."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what} must be a file or text, got {value!r}", param=param_of(what))
    path = Path(value).expanduser()
    if len(value) < 4096 and "\n" not in value and path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"{what}: cannot read {path}: {e.strerror}", param=param_of(what)) from None
    return value


class Vocabulary:
    """llguidance's view of a vocabulary: an ensemble's (`of_model`: the first model's tokens, up
    to the shared size), built once per ensemble since reading every token's bytes takes about a
    second at 152k, or the byte level's 257 symbols (`byte_symbols`)."""

    def __init__(self, tokenizer: Any, n_vocab: int) -> None:
        self.tokenizer = tokenizer
        self.n_vocab = n_vocab

    @classmethod
    def of_model(cls, model: Any, n_vocab: int, end_tokens: Sequence[int]) -> Vocabulary:
        """A model's vocabulary; a model without a llama.cpp vocabulary (a test's fake) gives its
        tokens' bytes instead."""
        eos = sorted(end_tokens) or None
        if getattr(model, "_vocab", None) is None:
            # an end token id inside the vocabulary, as llguidance needs one
            return cls.of_pieces([model.token_text(t) for t in range(n_vocab)] + [b""], eos or [n_vocab], n_vocab)
        from llguidance.llamacpp import lltokenizer_from_vocab

        _llguidance()
        with warnings.catch_warnings():  # it reads attributes through a deprecated llama.cpp call
            warnings.simplefilter("ignore", DeprecationWarning)
            return cls(lltokenizer_from_vocab(model._vocab, eos_token=eos), n_vocab)

    @classmethod
    def of_pieces(cls, pieces: Sequence[bytes], end_tokens: Sequence[int], n_vocab: int | None = None) -> Vocabulary:
        """Tokens given by their bytes (`end_tokens` among them), tokenised longest match first."""
        llguidance = _llguidance()
        eos = sorted(end_tokens)
        wrapper = llguidance.TokenizerWrapper(_Greedy(pieces, eos[0]))
        return cls(llguidance.LLTokenizer(wrapper, eos_token=eos), len(pieces) if n_vocab is None else n_vocab)


@functools.cache
def byte_symbols() -> Vocabulary:
    """The byte level's alphabet as constraints see it: symbol b < 256 is the byte b, symbol 256
    the end of the text (`core.bytelevel.END`), so a mask over it masks a byte distribution."""
    return Vocabulary.of_pieces([bytes([b]) for b in range(256)] + [b""], [256])


class _Greedy:
    """A tokenizer over given token bytes (longest match first), as llguidance's wrapper reads one."""

    def __init__(self, tokens: Sequence[bytes], eos: int) -> None:
        self.tokens = list(tokens)
        self.eos_token_id = eos
        self.bos_token_id = None
        self._ids = {t: i for i, t in enumerate(self.tokens) if t}
        self._longest = max((len(t) for t in self.tokens), default=1)

    def __call__(self, text: bytes) -> list[int]:
        out, i = [], 0
        while i < len(text):
            for k in range(min(self._longest, len(text) - i), 0, -1):
                token = self._ids.get(text[i : i + k])
                if token is not None:
                    out.append(token)
                    i += k
                    break
            else:
                i += 1  # a byte no token holds
        return out


class Matcher:
    """The constraint's state over one completion: the tokens it has consumed, and the mask of
    tokens allowed next."""

    def __init__(self, vocabulary: Vocabulary, constraint: Constraint) -> None:
        llguidance = _llguidance()
        self.vocabulary = vocabulary
        self.kind = constraint.kind  # the option it came from, which errors name
        self._matcher = llguidance.LLMatcher(vocabulary.tokenizer, constraint.grammar, log_level=0)
        if self._matcher.is_error():
            raise ConfigError(f"the {constraint.describe()} does not fit this vocabulary: {self._matcher.get_error()}", param=constraint.kind)
        self.consumed: list[int] = []

    def mask(self) -> np.ndarray:
        """The tokens allowed after what was consumed: one bit per token id, in int32 words."""
        words = np.empty((self.vocabulary.tokenizer.vocab_size + 31) // 32, dtype=np.int32)
        self._matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        return words

    def consume(self, token: int) -> bool:
        """Consume a token; False (and nothing consumed) when the constraint refuses it."""
        if self._matcher.try_consume_tokens([int(token)]) != 1:
            return False
        self.consumed.append(int(token))
        return True

    def rollback(self, n: int) -> None:
        if n > 0:
            if not self._matcher.rollback(n):
                raise RuntimeError(f"the constraint could not roll back {n} tokens: {self._matcher.get_error()}")
            del self.consumed[-n:]

    def binds(self) -> bool:
        """A grammar constrains every position (its end included)."""
        return True


def unpack(mask: np.ndarray, n_vocab: int, out: np.ndarray | None = None) -> np.ndarray:
    """A bitmask as one bool per token id below n_vocab (into `out`, a reused buffer)."""
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little", count=n_vocab)
    if out is None:
        return bits.astype(bool)
    np.not_equal(bits, 0, out=out)
    return out


# --- tool calls (OpenAI's tools on /v1/chat/completions) -------------------------------------------


@dataclass(frozen=True)
class ToolCallFormat:
    """How a chat template has the model write a tool call: Hermes' and Qwen2.5's
    `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`; the markers are single special
    tokens in such models' vocabularies (`special`), or text."""

    open: str = "<tool_call>"
    close: str = "</tool_call>"
    special: bool = True


def tool_call_format(model: Model) -> ToolCallFormat | None:
    """The tool-call format of `model`'s chat template, or None when it has none localcos knows."""
    template = model.chat_template or ""
    fmt = ToolCallFormat()
    if fmt.open not in template or "tools" not in template:
        return None
    ids = [model.tokenize(marker, add_bos=False, special=True) for marker in (fmt.open, fmt.close)]
    special = all(len(i) == 1 for i in ids)
    return ToolCallFormat(fmt.open, fmt.close, special)


def tool_grammar(fmt: ToolCallFormat, tools: Sequence[dict[str, Any]], choice: str, parallel: bool) -> Constraint:
    """What the reply may be, given OpenAI's `tools` (function definitions) and `choice`: "none"
    (text), "auto" (text, or tool calls), "required" (tool calls), or a tool's name (calls of it):
    each call is a JSON object with the function's name and arguments valid under its
    parameters' schema."""
    llguidance = _llguidance()
    names = [t["function"]["name"] for t in tools]
    chosen = [t for t in tools if choice in ("auto", "required") or t["function"]["name"] == choice]
    if choice not in ("none", "auto", "required") and not chosen:
        raise ConfigError(f"tool_choice names {choice!r}, which is not one of the tools ({', '.join(names)})", param="tool_choice")
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": t["function"]["name"]}, "arguments": t["function"].get("parameters") or {"type": "object"}},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in chosen
    ]
    schema = {**(variants[0] if len(variants) == 1 else {"anyOf": variants}), "x-guidance": JSON_LAYOUT} if variants else None

    def marker(text: str) -> str:
        return text if fmt.special else json.dumps(text)

    # text never holds a special token; literal markers are kept out of it explicitly
    text_rule = 'TEXT: /(.|\\n)+/' if fmt.special else f'TEXT: /(.|\\n)+/ & ~/(.|\\n)*{fmt.open}(.|\\n)*/'
    calls = "call+" if parallel else "call"
    start = {"none": "TEXT", "auto": f"TEXT | {calls}"}.get(choice, calls)
    lines = [f"start: {start}", text_rule]
    if schema is not None:
        lines += [f'call: {marker(fmt.open)} "\\n" tool "\\n" {marker(fmt.close)} "\\n"?', f"tool: %json {json.dumps(schema)}"]
    lark = "\n".join(lines) + "\n"
    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    return _checked("tools", lark, grammar, "the tools")
