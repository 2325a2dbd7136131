"""The decoder's state invariant, asserted between rounds (the tests' check on every method).

Every model's KV cache holds a prefix of committed + pending tokens (rejected tokens never stay in
any cache), drafts never reach past the length limit, and every kept softmax belongs to its
model's current row. `checked(ens)` generates as `Ensemble` does, through the same scheduler,
asserting the invariant after every round.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence

import numpy as np

from ..config.specs import GenerationConfig
from ..core.decoding import Decoder
from ..core.sampling import softmax
from ..runtime.completion import Completion
from ..runtime.loaded import LoadedModels
from ..runtime.plan import plan
from ..runtime.scheduler import Submission, run_completions


def assert_invariants(dec: Decoder) -> None:
    """Assert that every model's KV cache holds a prefix of committed + pending, that drafts
    never reach past the length limit (--max-tokens or the context), and that every kept
    softmax belongs to its model's current row."""
    seq = dec.sequence()
    assert len(seq) <= dec.max_length, f"{len(seq)} committed+pending tokens exceed the limit {dec.max_length}"
    for m in dec.slots:
        n = len(m.tokens)
        assert n <= len(seq), f"{m.name} holds {n} tokens, more than the {len(seq)} committed+pending"
        assert m.tokens == seq[:n], f"{m.name}'s KV cache holds tokens that are neither committed nor pending"
    for rows, probs in zip(dec.rows, dec.probs):
        for p, kept in probs.items():
            assert p in rows, f"a softmax is kept for position {p}, which has no row"
            fresh = softmax(rows[p], dec.sampler.softmax_temperature)
            assert np.array_equal(kept, fresh), f"the softmax kept for position {p} is stale"


def observe(sequence: Submission) -> None:
    """A scheduler's per-round observer asserting the invariant of a decoding sequence."""
    if sequence.decoder is not None:
        assert_invariants(sequence.decoder)


class checked:
    """`ens.generate` and `ens.generate_many`, asserting the invariant after every round."""

    def __init__(self, ens: LoadedModels) -> None:
        self.ens = ens

    def generate_many(self, prompt: str | Sequence[int], n: int, *, config: GenerationConfig | None = None, combiner: Any = None,
                      second_prompt: str | Sequence[int] | None = None, **settings: Any) -> list[Completion]:  # fmt: skip
        config = (config or GenerationConfig()).with_values(settings)
        return run_completions(self.ens, plan(self.ens, prompt, config, combiner, second_prompt=second_prompt), n, observe=observe)

    def generate(self, prompt: str | Sequence[int], **settings: Any) -> Completion:
        return self.generate_many(prompt, 1, **settings)[0]
