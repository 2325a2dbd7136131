"""Log-probabilities of given tokens under the combined distribution r and under each model.

Scoring is decoding's other half: instead of drawing the next token from r, it reads off how
likely r found the token that came. It uses the very code decoding uses to make r
(`Combiner.combine` / `Combiner.mix`, at temperature 1), on rows of logits handed over a slice at
a time, so host memory stays bounded however long the text (see `localcos.runtime.scoring`).

Member log-probabilities are computed in log space, log p_i(x) = l_i(x) - logsumexp(l_i), as
llama.cpp's perplexity tool does; log r(x) is log of r(x) as decoding computes it (float32). One
exp pass per model and slice gives both a model's softmax and its log-sum-exp.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence

import numpy as np

from .combiners import BoundCombiner


@dataclass
class SliceScores:
    """Scores of k rows: one target token per row."""

    combined: list[np.ndarray]  # per combiner: log r(target), float64 [k]
    greedy: list[np.ndarray]  # per combiner: whether the target is r's argmax, bool [k]
    members: np.ndarray | None  # [n_models, k] log p_i(target) (nan for a model not evaluated)
    top: list[list[tuple[int, float]]] | None  # per row: the `top` most likely tokens under the first combiner's r


class Scratch:
    """Reusable float32 buffers, one per model, for scoring slice after slice."""

    def __init__(self) -> None:
        self._buffers: dict[int, np.ndarray] = {}

    def buffer(self, model: int, shape: tuple[int, ...]) -> np.ndarray:
        """A [rows, vocab] buffer for `model` (a view of a larger one when fewer rows are asked)."""
        rows, vocab = shape
        buf = self._buffers.get(model)
        if buf is None or buf.shape[0] < rows or buf.shape[1] != vocab:
            buf = self._buffers[model] = np.empty((rows, vocab), dtype=np.float32)
        return buf[:rows]


def softmax_and_logsumexp(logits: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rows' softmax (float32, exactly `sampling.softmax`'s arithmetic) and log-sum-exp (float64),
    from one exp pass over the vocabulary: scoring needs both, and the exp is its main cost.
    `out` (float32, the shape of `logits`) receives the softmax: a reused buffer spares the
    page faults of a fresh vocabulary-sized array per slice."""
    m = logits.max(axis=1, keepdims=True)
    z = np.subtract(logits, m, out=out)
    np.exp(z, out=z)
    total = z.sum(axis=1, keepdims=True)
    z /= total
    return z, m[:, 0].astype(np.float64) + np.log(total[:, 0].astype(np.float64))


def score_rows(
    rows: Sequence[np.ndarray | None],
    targets: np.ndarray,
    combiners: Sequence[BoundCombiner],
    *,
    members: bool = True,
    top: int = 0,
    scratch: Scratch | None = None,
) -> SliceScores:
    """Score k target tokens given each model's logits rows at their positions ([k, vocab], None
    for a model not evaluated). `combiners` are bound; every one of them gets the same rows.
    `scratch` lends buffers for the models' softmax, reused from slice to slice."""
    k = len(targets)
    idx = np.arange(k)
    n = len(rows)
    # each model's softmax, where a member score or a probability-level combination needs it
    wanted = [members or any((c.mixes_probs or c.single == i) and c.used[i] for c in combiners) for i in range(n)]
    probs: list[np.ndarray | None] = [None] * n
    logprobs: list[np.ndarray | None] = [None] * n  # log p_i(target), in log space
    for i, x in enumerate(rows):
        if x is not None and wanted[i]:
            out = scratch.buffer(i, x.shape) if scratch is not None else None
            probs[i], lse = softmax_and_logsumexp(x, out)
            logprobs[i] = x[idx, targets].astype(np.float64) - lse
    member_scores = None
    if members:
        member_scores = np.full((n, k), np.nan)
        for i, lp in enumerate(logprobs):
            if lp is not None:
                member_scores[i] = lp
    combined, greedy = [], []
    top_rows: list[list[tuple[int, float]]] | None = None
    for c, combiner in enumerate(combiners):
        used = combiner.used
        single = combiner.single
        if single is not None:  # r is that model's p: its log space score, as llama-perplexity's
            r, own = probs[single], logprobs[single]
            assert r is not None and own is not None, "r's own model is scored"
            combined.append(own)
        else:
            if combiner.mixes_probs:
                r = combiner.mix([p if u else None for p, u in zip(probs, used)])
            else:
                r = combiner.combine([x if u else None for x, u in zip(rows, used)], 1.0)
            with np.errstate(divide="ignore"):
                combined.append(np.log(r[idx, targets].astype(np.float64)))
        greedy.append(r.argmax(axis=1) == targets)
        if c == 0 and top > 0:
            n_top = min(top, r.shape[1])
            best = np.argpartition(-r, n_top - 1, axis=1)[:, :n_top]
            with np.errstate(divide="ignore"):
                logs = np.log(np.take_along_axis(r, best, axis=1).astype(np.float64))
            order = np.argsort(-logs, axis=1, kind="stable")
            top_rows = [
                [(int(best[j, o]), float(logs[j, o])) for o in order[j]] for j in range(k)
            ]
    return SliceScores(combined, greedy, member_scores, top_rows)
