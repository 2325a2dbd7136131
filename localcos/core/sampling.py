"""Sampling from next-token distributions: temperature, top-k, top-p, min-p, seeded draws.

Everything works on NumPy rows ([positions, vocab] or [vocab]); there is no Python loop over the
vocabulary. Temperature is applied where distributions are made (`softmax(logits / T)`, in the
combiners and for a proposer's own distribution); `Sampler.finalize` then applies greedy one-hot,
the truncations and the banned tokens to a distribution, and `Sampler.draw` samples from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable

import numpy as np

from ..errors import LocalcosError, check_range


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax(logits / temperature) as a new float32 array; -inf logits get 0.

    float32 keeps a 152k-vocabulary row at ~50 microseconds (float64 costs ten times more);
    sums use NumPy's pairwise summation, so rows still sum to 1 within ~1e-7.
    """
    z = np.asarray(logits, dtype=np.float32)
    z = z - z.max(axis=-1, keepdims=True)  # the one new array; the rest is in place
    if temperature != 1.0:
        z *= np.float32(1.0 / temperature)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


_BLOCK = 1024


def draw(probs: np.ndarray, u: float) -> int:
    """The token at quantile `u` in [0, 1) of a (possibly unnormalised) distribution row.

    Inverse CDF with float64 accumulation, done in two levels (block sums, then one block) so a
    152k row costs one pass instead of a full float64 cumsum. Tokens with zero probability are
    never returned.
    """
    n = len(probs)
    m = n // _BLOCK
    if m < 4:
        return _draw_flat(probs, u * float(probs.sum(dtype=np.float64)), 0.0)
    sums = np.empty(m + 1, dtype=np.float64)
    sums[:m] = probs[: m * _BLOCK].reshape(m, _BLOCK).sum(axis=1, dtype=np.float64)
    sums[m] = probs[m * _BLOCK :].sum(dtype=np.float64)
    cdf = np.cumsum(sums)
    x = u * cdf[-1]
    b = min(int(np.searchsorted(cdf, x, side="right")), m)
    while sums[b] <= 0:  # x rounded onto an empty block's edge
        b -= 1
    start = b * _BLOCK
    return start + _draw_flat(probs[start : start + _BLOCK], x, cdf[b - 1] if b else 0.0)


def _draw_flat(probs: np.ndarray, x: float, base: float) -> int:
    cdf = base + np.cumsum(probs, dtype=np.float64)
    i = int(np.searchsorted(cdf, x, side="right"))
    if i >= len(cdf):  # rounding put x at or past the end: the last token with mass
        i = int(np.flatnonzero(probs)[-1])
    return i


# below this, logits / T overflows float32 (the row would become NaN): such a temperature is greedy
GREEDY_BELOW = 1e-6


SAMPLING_SETTINGS = ("temperature", "top_k", "top_p", "min_p")
# the samplers a chain may name (llama-server's names), in the one order they are applied in:
# temperature where distributions are made, then the truncations, then llama.cpp's infill sampler
SAMPLERS = ("temperature", "top_k", "top_p", "min_p", "infill")


@dataclass(frozen=True)
class InfillSampler:
    """llama.cpp's infill sampler (`llama_sampler_infill`), which editors' completion plugins put
    last in their chain, over a vocabulary: where the end-of-generation tokens hold enough of the
    mass (3 n p_end > p_text over the n candidates left) only they stay; otherwise a candidate
    whose text begins another's takes that one's mass (the likelier of the two keeps it), the
    text candidates under 0.2, then under 1 / (texts + 1), are dropped, the end tokens always
    kept; where no text candidate is left, `fallback` (its EOT, else EOS) alone. It reads the
    candidates the truncations left (top-k's: a few dozen), never the whole vocabulary's texts."""

    end: np.ndarray  # bool, [vocab]: the end-of-generation tokens
    piece: Callable[[int], bytes]
    fallback: int

    def apply(self, row: np.ndarray) -> None:
        """Apply it in place to a normalised distribution row."""
        kept = np.flatnonzero(row)
        ends = self.end[kept]
        p_end, p_text = float(row[kept[ends]].sum()), float(row[kept[~ends]].sum())
        if 3 * p_end * len(kept) > p_text:
            row[kept[~ends]] = 0.0
            row /= p_end
            return
        order = kept[np.lexsort((kept, -row[kept]))]  # likeliest first, as llama.cpp sorts them
        texts = {int(t): self.piece(int(t)) for t in order}
        p = {int(t): float(row[t]) for t in order}
        alive = dict.fromkeys(p, True)
        for a in p:
            for b in p:
                if not alive[a]:
                    break
                if a == b or not alive[b]:
                    continue
                if texts[a] and texts[b].startswith(texts[a]):  # a's text begins b's: the likelier takes both
                    keep, drop = (b, a) if p[b] > p[a] else (a, b)
                    p[keep] += p[drop]
                    p[drop], alive[drop] = 0.0, False
        row[kept] = 0.0
        if not any(v >= 0.2 for t, v in p.items() if not self.end[t]):
            row[self.fallback] = 1.0
            return
        p = self._kept(p, 0.2)
        p = self._kept(p, 1.0 / (sum(not self.end[t] for t in p) + 1))
        for t, v in p.items():
            row[t] = v

    def _kept(self, p: dict[int, float], threshold: float) -> dict[int, float]:
        """The end tokens and the text candidates of `threshold` or more, renormalised."""
        kept = {t: v for t, v in p.items() if v > 0 and (self.end[t] or v >= threshold)}
        total = sum(kept.values())
        return {t: v / total for t, v in kept.items()}


def check_setting(name: str, value: float, what: str) -> float:
    """The one rule of each sampling setting's range (`ConfigError` naming it as `what`):
    temperature >= 0, top_k >= 0, 0 < top_p <= 1, 0 <= min_p <= 1. The settings layer's options
    check their values with it too."""
    if name == "top_p":
        return check_range(value, what, above=0, maximum=1)
    return check_range(value, what, minimum=0, maximum=1 if name == "min_p" else None)


@dataclass(frozen=True)
class Sampler:
    """Sampling settings applied to every distribution a method samples from.

    Args:
        temperature: 0 means greedy (one-hot at the argmax, ties to the lowest id); distributions
            are then computed as at temperature 1 before the argmax is taken. A temperature below
            `GREEDY_BELOW` is greedy too (it would be in exact arithmetic; in float32 it overflows).
        top_k: keep the k most likely tokens (0 = off); tokens tied with the k-th are kept too.
        top_p: keep the smallest set of most likely tokens whose mass reaches top_p (1 = off).
        min_p: keep tokens with probability >= min_p * the largest probability (0 = off).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    infill: InfillSampler | None = field(default=None, compare=False)  # llama.cpp's, after the truncations

    def __post_init__(self) -> None:
        for name in SAMPLING_SETTINGS:
            check_setting(name, getattr(self, name), name)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def softmax_temperature(self) -> float:
        """The temperature distributions are computed at (1 when greedy)."""
        return 1.0 if self.greedy else self.temperature

    @property
    def transforms(self) -> bool:
        """Whether `finalize` changes a normalised distribution at all."""
        return self.greedy or bool(self.top_k) or self.top_p < 1.0 or self.min_p > 0.0 or self.infill is not None

    def finalize(self, probs: np.ndarray, copy: bool = True) -> np.ndarray:
        """Apply greedy or the truncations to normalised distributions.

        Accepts [vocab] or [positions, vocab] and returns float32 of the same shape whose rows
        sum to 1; without any transform that is `probs` itself. With `copy=False` a float32
        input is changed in place (the decoder passes arrays it has just made).
        """
        if not self.transforms:
            return np.asarray(probs, dtype=np.float32)
        if copy:
            p = np.array(probs, dtype=np.float32, ndmin=2)
        else:
            p = np.asarray(probs, dtype=np.float32)
            p = p[None, :] if p.ndim == 1 else p
        if self.greedy:
            best = p.argmax(axis=1)
            p = np.zeros_like(p)
            p[np.arange(len(p)), best] = 1.0
            return p if np.ndim(probs) == 2 else p[0]
        if self.top_k and self.top_k < p.shape[1]:
            kth = -np.partition(-p, self.top_k - 1, axis=1)[:, self.top_k - 1 : self.top_k]
            p[p < kth] = 0.0
        if self.top_p < 1.0:
            for row in p:
                _top_p_inplace(row, self.top_p)
        if self.min_p > 0.0:
            p[p < self.min_p * p.max(axis=1, keepdims=True)] = 0.0
        total = p.sum(axis=1, keepdims=True)
        if np.any(total <= 0):
            raise LocalcosError("every token was excluded by the sampling settings", code="invalid_value")
        p /= total
        if self.infill is not None:
            for row in p:
                self.infill.apply(row)
        return p if np.ndim(probs) == 2 else p[0]

    def draw(self, probs: np.ndarray, rng: np.random.Generator) -> int:
        """Sample one token from a finalized distribution row."""
        if self.greedy:
            return int(np.argmax(probs))
        return draw(probs, float(rng.random()))


def _top_p_inplace(row: np.ndarray, top_p: float) -> None:
    """Zero every token outside the nucleus of mass `top_p` (ties at the cut are kept)."""
    total = row.sum()
    k = min(64, len(row))
    while True:
        # The nucleus of a peaked distribution is small: sort only the k largest, grow if needed.
        top = np.argpartition(-row, k - 1)[:k] if k < len(row) else np.arange(len(row))
        vals = np.sort(row[top])[::-1]
        csum = np.cumsum(vals)
        n = int(np.searchsorted(csum, top_p * total, side="left"))
        if n < len(vals) or k == len(row):
            cut = vals[min(n, len(vals) - 1)]
            row[row < cut] = 0.0
            return
        k = min(len(row), k * 8)
