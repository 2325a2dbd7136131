"""Whether models share a tokenizer, the one rule (`tokenizer_mismatch`), over a model's tokenizer
as it reads it (`TokenTable`): from a loaded model, or from a GGUF header before anything loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Sequence


@dataclass(frozen=True)
class TokenTable:
    """One model's tokenizer as the rule that joins models at the token level reads it: its size,
    BOS and EOS ids, each token's text by id, and a fingerprint of the texts of ids [0, n).
    Made from a loaded model (`table_of`) or from a GGUF header before anything loads
    (`GGUFInfo.token_table`)."""

    name: str
    size: int
    bos: int | None
    eos: int | None
    text: Callable[[int], bytes]
    fingerprint: Callable[[int], str]


def table_of(model: Any) -> TokenTable:
    """A loaded model's tokenizer (a `Model`, or anything that reads its vocabulary alike)."""
    return TokenTable(str(model.path), model.n_vocab, model.bos, model.eos, model.token_text, model.vocab_fingerprint)


def tokenizer_mismatch(a: TokenTable, b: TokenTable) -> str | None:
    """Why two models cannot decode together at the token level, or None where they share a
    tokenizer: the ids below the smaller vocabulary carry the same texts in both (models of one
    family often pad their embedding matrix to different sizes), and BOS and EOS are the same
    ids. The one rule: loading (`shared_vocab_size`) and `localcos models list` read it."""
    for what, x, y in (("BOS", a.bos, b.bos), ("EOS", a.eos, b.eos)):
        if x != y:
            return f"{a.name} and {b.name} have different {what} ids ({x} vs {y})"
    shared = min(a.size, b.size)
    if a.fingerprint(shared) == b.fingerprint(shared):
        return None
    t = next(t for t in range(shared) if a.text(t) != b.text(t))
    return f"{a.name} and {b.name} differ at token id {t} ({a.text(t)!r} vs {b.text(t)!r}); an ensemble needs models with one tokenizer"


def tokenizer_groups(vocabularies: Sequence[TokenTable]) -> list[int]:
    """A group per model, numbered from 0 in order of first appearance: models of one group share
    a tokenizer with its first model (`tokenizer_mismatch`), and decode together at the token level."""
    firsts: list[TokenTable] = []
    groups = []
    for v in vocabularies:
        group = next((i for i, first in enumerate(firsts) if tokenizer_mismatch(first, v) is None), None)
        if group is None:
            group = len(firsts)
            firsts.append(v)
        groups.append(group)
    return groups
