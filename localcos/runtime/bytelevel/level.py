"""A model's vocabulary as the byte level reads it: its tokens' bytes."""

from __future__ import annotations

from ...backend import Model
from ...core.bytelevel import ByteVocab


def byte_vocab(model: Model) -> ByteVocab:
    """The model's vocabulary as byte strings (built once per model)."""
    vocab = getattr(model, "_byte_vocab", None)
    if vocab is None:
        pieces = model.pieces()
        ends = [t for t in range(model.n_vocab) if model.is_eog(t)]
        vocab = ByteVocab(pieces, ends, model.name)
        model._byte_vocab = vocab  # type: ignore[attr-defined]
    return vocab
