"""Tokenizer compatibility: can these models form an ensemble, and do they tokenise alike?"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import TokenizerMismatchError
from .model import Model
from .slot import common_prefix
from .tokenizers import table_of, tokenizer_mismatch


def shared_vocab_size(models: Sequence[Model]) -> int:
    """The vocabulary the models of an ensemble share (the ids below the smallest vocabulary), or
    `TokenizerMismatchError` (`tokenizer_mismatch`)."""
    if not models:
        raise ValueError("no models")
    first = table_of(models[0])
    for other in models[1:]:
        why = tokenizer_mismatch(first, table_of(other))
        if why is not None:
            raise TokenizerMismatchError(f"tokenizer mismatch: {why}")
    return min(m.n_vocab for m in models)


def tokenize_alike(models: Sequence[Model], text: str, *, what: str = "the prompt", **options: object) -> list[int]:
    """The tokens of `text`, which every model must produce identically (`TokenizerMismatchError`
    otherwise). `options` go to `Model.tokenize` (add_bos, special)."""
    first = models[0]
    tokens = first.tokenize(text, **options)  # type: ignore[arg-type]
    for m in models[1:]:
        other = m.tokenize(text, **options)  # type: ignore[arg-type]
        if other != tokens:
            raise TokenizerMismatchError(
                f"tokenizer mismatch: {first.path} and {m.path} tokenize {what} differently "
                f"(first difference at token {common_prefix(tokens, other)})"
            )
    return tokens
