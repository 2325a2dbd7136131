"""A pure-NumPy stand-in for `localcos.backend.Model`, for fast statistical tests of the algorithms.

Its next-token logits are a fixed random function of the last two tokens, so the exact
distribution of any continuation can be computed in closed form. It is used *in addition to* the
llama.cpp tests, never instead of them.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from localcos.backend import ModelStats
from localcos.testing.fakes import OwnSlot


class FakeModel(OwnSlot):
    """Same interface as `Model` as far as the ensemble and the decoder use it."""

    def __init__(self, seed: int, n_vocab: int = 10, n_params: int = 1000, sharpness: float = 1.5, n_ctx: int = 256) -> None:
        rng = np.random.default_rng(seed)
        self.table = (rng.standard_normal((n_vocab + 1, n_vocab + 1, n_vocab)) * sharpness).astype(np.float32)
        self.n_vocab = n_vocab
        self.logits_vocab = n_vocab
        self.n_params = n_params
        self.n_ctx = self.n_batch = n_ctx
        self.name = f"fake{seed}"
        self.path = Path(f"/fake/{self.name}.gguf")
        self.bos = n_vocab  # outside the vocabulary: never sampled
        self.eos = n_vocab + 1
        self.tokens: list[int] = []
        self.stats = ModelStats()

    # what a model computes
    def logits_after(self, context: Sequence[int]) -> np.ndarray:
        a = context[-2] if len(context) >= 2 else self.n_vocab
        b = context[-1] if context else self.n_vocab
        return self.table[min(a, self.n_vocab), min(b, self.n_vocab)]

    def evaluate(self, tokens: Sequence[int], n_logits: int | None = None) -> np.ndarray:
        n_logits = len(tokens) if n_logits is None else n_logits
        start = len(self.tokens)
        assert start + len(tokens) <= self.n_ctx
        self.tokens.extend(int(t) for t in tokens)
        rows = [self.logits_after(self.tokens[: start + k + 1]) for k in range(len(tokens) - n_logits, len(tokens))]
        self.stats.calls += 1
        self.stats.tokens += len(tokens)
        return np.array(rows, dtype=np.float32).reshape(n_logits, self.n_vocab)[:, : self.logits_vocab]


    def reset(self) -> None:
        self.tokens.clear()

    # vocabulary
    def is_eog(self, token: int) -> bool:
        return token == self.eos

    def token_text(self, token: int) -> bytes:
        """Letters: token 0 is "a", 1 "b", ... (one byte each: a grammar reads them)."""
        return bytes([ord("a") + token])

    def vocab_fingerprint(self, n: int | None = None) -> str:
        return f"fake-{self.n_vocab if n is None else n}"

    def piece(self, token: int, special: bool = False) -> bytes:
        return f" t{token}".encode()

    def tokenize(self, text: str, **_: object) -> list[int]:
        return [int(w) for w in text.split()]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return "".join(self.piece(t).decode() for t in tokens)

    def close(self) -> None:
        pass


def exact_joint(
    models: Sequence[FakeModel], combiner, sampler, prompt: Sequence[int], length: int, allowed: Callable[[tuple, int], bool] | None = None
) -> dict[tuple, float]:
    """Exact probability of every continuation of `length` tokens under r; with `allowed`
    (whether a token may follow a prefix), under r restricted to the allowed tokens and
    renormalised, as a constraint restricts it."""
    probs: dict[tuple, float] = {}
    for seq in itertools.product(range(models[0].n_vocab), repeat=length):
        p = 1.0
        ctx = list(prompt)
        for k, t in enumerate(seq):
            rows = [m.logits_after(ctx)[None, :] for m in models]
            r = combiner.combine(rows, sampler.softmax_temperature)[0].astype(np.float64)
            if allowed is not None:
                r = np.where([allowed(seq[:k], x) for x in range(len(r))], r, 0.0)
                r /= r.sum()
            r = sampler.finalize(r)
            p *= r[t]
            if p == 0:
                break
            ctx.append(t)
        if p > 0:
            probs[seq] = p
    return probs
