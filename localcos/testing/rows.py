"""The logits rows runs actually got from llama.cpp, to measure the batch noise between two runs.

llama.cpp is not batch-invariant: the same tokens give slightly different logits in calls of other
shapes (rows in a batch, sequences in a call, cells in the cache), and how much differs from CPU
to CPU (kernels chosen by the batch size, AMX, AVX-512). A tolerance for comparing two runs of
trained models is therefore measured on those two runs: `RowLog` records every row each run got,
keyed by the model and the tokens it followed, and `noise` is the largest difference between the
two runs' rows for the same model and tokens.
"""

from __future__ import annotations

from contextlib import contextmanager
from collections.abc import Iterator, Sequence

import numpy as np

from ..backend.model import Model
from ..backend.slot import Slot


# How far llama.cpp's rows after the same tokens differ from one run to another on a CPU (batch
# sizes and thread counts round differently): about one logit at most on a Q4_K_M model. A
# measured difference beyond it is a wrong row, not noise: a tolerance taken from the rows two
# runs got is bounded by it, so a run whose rows were wrong cannot widen its own tolerance.
BATCH_NOISE_BAND = 2.0


class RowLog:
    """Rows recorded per run: run name -> {(model path, tokens): row}."""

    def __init__(self) -> None:
        self.runs: dict[str, dict[tuple[str, tuple[int, ...]], np.ndarray]] = {}

    @contextmanager
    def recording(self, run: str) -> Iterator[None]:
        """Record every row any Model returns while the block runs, under `run` (one thread)."""
        log = self.runs.setdefault(run, {})
        decode = Model.decode

        def recorded(model: Model, parts: Sequence[tuple[Slot, Sequence[int], int, int]]) -> list[np.ndarray]:
            before = [list(slot.tokens) for slot, _, _, _ in parts]
            out = decode(model, parts)
            for prior, (_, tokens, out_from, out_to), rows in zip(before, parts, out):
                for i in range(out_from, out_to):
                    log[(str(model.path), tuple(prior) + tuple(int(t) for t in tokens[: i + 1]))] = np.array(rows[i - out_from])
            return out

        Model.decode = recorded  # type: ignore[method-assign, assignment]
        try:
            yield
        finally:
            Model.decode = decode  # type: ignore[method-assign]

    def noise(self, a: str, b: str) -> dict[str, float]:
        """model path -> the largest difference between run `a`'s and run `b`'s rows after the
        same tokens (0 where they share none); an `AssertionError` beyond `BATCH_NOISE_BAND`."""
        out: dict[str, float] = {}
        first, second = self.runs[a], self.runs[b]
        for key in first.keys() & second.keys():
            gap = float(np.abs(first[key] - second[key]).max())
            out[key[0]] = max(out.get(key[0], 0.0), gap)
        wrong = {path: gap for path, gap in out.items() if gap > BATCH_NOISE_BAND}
        assert not wrong, f"rows after the same tokens differ by more than llama.cpp's batch noise ({BATCH_NOISE_BAND} logits): {wrong}"
        return out

    def shared(self, a: str, b: str) -> int:
        """How many (model, tokens) both runs got a row for."""
        return len(self.runs[a].keys() & self.runs[b].keys())
