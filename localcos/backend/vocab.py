"""Tokenizer compatibility: can these models form an ensemble, and do they tokenise alike?"""

from __future__ import annotations

from typing import Sequence

from ..errors import TokenizerMismatchError
from .model import Model
from .slot import common_prefix


def shared_vocab_size(models: Sequence[Model]) -> int:
    """The vocabulary the models of an ensemble share, or `TokenizerMismatchError`.

    Models of one family often pad their embedding matrix to different sizes; then the shared ids
    are those below the smallest vocabulary, and must carry the same token text in every model.
    BOS and EOS must agree too.
    """
    if not models:
        raise ValueError("no models")
    first = models[0]
    shared = min(m.n_vocab for m in models)
    for other in models[1:]:
        for what, a, b in (("BOS", first.bos, other.bos), ("EOS", first.eos, other.eos)):
            if a != b:
                raise TokenizerMismatchError(
                    f"tokenizer mismatch: {first.path} and {other.path} have different {what} ids ({a} vs {b})"
                )
        if first.vocab_fingerprint(shared) == other.vocab_fingerprint(shared):
            continue
        for t in range(shared):
            if first.token_text(t) != other.token_text(t):
                raise TokenizerMismatchError(
                    f"tokenizer mismatch: {first.path} and {other.path} differ at token id {t} "
                    f"({first.token_text(t)!r} vs {other.token_text(t)!r}); an ensemble needs models "
                    "with one tokenizer"
                )
    return shared


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
