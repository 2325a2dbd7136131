"""A pure-NumPy stand-in for `localcos.backend.Model`, for fast statistical tests of the algorithms.

Its next-token logits are a fixed random function of the last two tokens, so the exact
distribution of any continuation can be computed in closed form. It is used *in addition to* the
llama.cpp tests, never instead of them.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from collections.abc import Callable, Sequence

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
    models: Sequence[FakeModel], combiner, sampler, prompt: Sequence[int], length: int, allowed: Callable[[tuple, int], bool] | None = None,
    prompts: Sequence[Sequence[int]] | None = None,
) -> dict[tuple, float]:
    """Exact probability of every continuation of `length` tokens under r; with `allowed`
    (whether a token may follow a prefix), under r restricted to the allowed tokens and
    renormalised, as a constraint restricts it. `prompts`: each member's own (a member reading
    a second prompt), default `prompt` for every one."""
    probs: dict[tuple, float] = {}
    prompts = [list(prompt)] * len(models) if prompts is None else [list(p) for p in prompts]
    for seq in itertools.product(range(models[0].n_vocab), repeat=length):
        p = 1.0
        ctx: list[int] = []
        for k, t in enumerate(seq):
            rows = [m.logits_after(own + ctx)[None, :] for m, own in zip(models, prompts)]
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


class FakeSeq:
    """One sequence of a `FakeSequences` model: its tokens, evaluated by the model's table."""

    def __init__(self, model: FakeSequences, seq_id: int) -> None:
        self.model = model
        self.seq_id = seq_id
        self.tokens: list[int] = []
        self.stats = ModelStats()

    @property
    def name(self) -> str:
        return self.model.name

    def evaluate(self, tokens: Sequence[int], n_logits: int | None = None) -> np.ndarray:
        n_logits = len(tokens) if n_logits is None else n_logits
        start = len(self.tokens)
        self.tokens.extend(int(t) for t in tokens)
        rows = [self.model.logits_after(self.tokens[: start + k + 1]) for k in range(len(tokens) - n_logits, len(tokens))]
        self.stats.calls += 1
        self.stats.tokens += len(tokens)
        return np.array(rows, dtype=np.float32).reshape(n_logits, self.model.n_vocab)[:, : self.model.logits_vocab]

    def truncate(self, n: int) -> None:
        del self.tokens[n:]

    def hold(self, other: FakeSeq, n: int | None = None) -> None:
        self.tokens = list(other.tokens[: len(other.tokens) if n is None else n])

    def known_row(self, prompt: Sequence[int]) -> None:
        self.truncate(0)

    def remember_row(self, prompt: Sequence[int], row: object) -> None:
        pass


class FakeSequences(FakeModel):
    """A `FakeModel` with several sequences (a model that serves two members: one under the
    prompt, one under a second prompt); every call that reaches it is counted (`calls`), with
    the sequences each took part for (`call_parts`): members of one model share its calls."""

    def __init__(self, seed: int, n_seq: int = 2, **kwargs: object) -> None:
        super().__init__(seed, **kwargs)  # type: ignore[arg-type]
        self._slots = [FakeSeq(self, i) for i in range(n_seq)]
        self.call_parts: list[tuple[int, ...]] = []

    @property
    def slots(self) -> list:  # type: ignore[override]
        return self._slots

    def restore_prompt(self, slot: object, prompt: Sequence[int]) -> None:
        for s in self._slots:
            s.truncate(0)

    def decode(self, parts):  # type: ignore[no-untyped-def]
        self.call_parts.append(tuple(slot.seq_id for slot, *_ in parts))
        self.stats.calls += 1
        return [slot.evaluate(tokens, out_to - out_from) for slot, tokens, out_from, out_to in parts]
