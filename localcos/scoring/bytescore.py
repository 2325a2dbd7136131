"""Bits per byte of a text, and multiple-choice log-likelihoods, for the byte-level combination r
and for each model alone: the measures that compare models of different tokenizers (each model's byte distribution from
`core.bytelevel`, marginalised over its tokenisations).

Windows follow `scoring.perplexity` in bytes: the text's UTF-8 bytes are cut into windows of
`window` bytes (cut on character boundaries; a tail shorter than a window is dropped unless it is
the only one), each scored from an empty context (each model's BOS, as its metadata says), the
second half of each window scored, each byte given everything before it in its window.

The text is known before scoring starts, so windows go through the models side by side: each
loaded model's sequences are split into lanes (`ByteModels.lanes`), a window per lane, and the
lanes advance a byte at a time together, every new tokenisation's row of every lane in the same
calls (`ByteMember.advance_together`): calls of many rows, which cost a CPU less per row than the
few rows one text's byte needs. Each window's figures are what scoring it alone gives (up to
llama.cpp's rounding in calls of another shape). Multiple-choice items go the same way, their
choices side by side after the context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from collections.abc import Callable, Sequence

from ..core.combiners import Combiner
from ..errors import ConfigError
from ..runtime.bytelevel import RULED_OUT, combine_symbols
from ..runtime.bytelevel.scoring import paths_lost, start_lanes, walk_together

if TYPE_CHECKING:
    from ..runtime.bytelevel import ByteModels
    from .choices import ChoiceItem, ChoiceScores

@dataclass
class Bits:
    """Bits summed over scored bytes."""

    total: float = 0.0
    count: int = 0

    def add(self, p: float) -> None:
        self.total -= math.log2(p) if p > 0 else -math.inf
        self.count += 1

    @property
    def per_byte(self) -> float:
        return self.total / self.count if self.count else math.nan


@dataclass
class ByteScore:
    """Bits per byte under each combination and each model alone."""

    combined: list[Bits]
    members: list[Bits]
    windows: int
    window: int  # bytes per window
    bytes: int  # bytes in the text
    unreachable: list[int] = field(default_factory=list)  # bytes each model's held paths ruled out (scored after a rebuild)
    dropped: list[float] = field(default_factory=list)  # each model's mass pruned over a window's bytes, mean of the windows


def windows_of(data: bytes, window: int) -> list[tuple[int, int]]:
    """[start, end) of each window: `window` bytes, moved back to character boundaries."""
    def boundary(i: int) -> int:
        while 0 < i < len(data) and (data[i] & 0xC0) == 0x80:  # a continuation byte: back to its lead
            i -= 1
        return i

    if len(data) <= window:
        return [(0, len(data))]
    out = []
    start = 0
    while start + window <= len(data):
        end = boundary(start + window)
        out.append((start, end))
        start = end
    return out


def bits_per_byte(
    models: ByteModels,
    text: str,
    combiners: Sequence[Combiner],
    *,
    window: int,
    progress: Callable[[int, int], None] | None = None,
) -> ByteScore:
    """Score `text` (see the module's doc) under each of `combiners` and each model alone."""
    data = text.encode("utf-8")
    if len(data) < 2:
        raise ConfigError("the text has fewer than 2 bytes: nothing to score", param="file")
    bound = [c.bind(len(models.models), [m.n_params for m in models.models]) for c in combiners]
    spans = windows_of(data, window)
    lanes = models.lanes()
    n = len(lanes[0])
    combined = [Bits() for _ in bound]
    alone = [Bits() for _ in range(n)]
    unreachable = [0] * n
    dropped = [0.0] * n
    prompts = models.document_starts()
    walked = 0
    for g in range(0, len(spans), len(lanes)):
        pieces = [data[lo:hi] for lo, hi in spans[g : g + len(lanes)]]
        used = lanes[: len(pieces)]

        def visit(lane: int, j: int, dists: list) -> None:
            byte = pieces[lane][j]
            for i, d in enumerate(dists):
                alone[i].add(max(float(d[byte]), RULED_OUT))
            for c, bits in zip(bound, combined):
                # END keeps its share; a byte every model's paths rule out is scored as each
                # model's is there (RULED_OUT), not as infinitely unlikely
                bits.add(max(float(combine_symbols(c, dists, 1.0)[byte]), RULED_OUT))

        start_lanes(used, prompts)
        walk_together(used, pieces, visit, lambda lane, j: j >= len(pieces[lane]) // 2)
        for lane in used:
            for i, (restarts, mass) in enumerate(paths_lost(lane)):
                unreachable[i] += restarts
                dropped[i] += mass
        walked += sum(map(len, pieces))
        if progress:
            progress(walked, len(data))
    dropped = [d / len(spans) for d in dropped]
    return ByteScore(combined, alone, len(spans), window, len(data), unreachable, dropped)


def byte_choices(
    models: ByteModels,
    items: Sequence[ChoiceItem],
    combiners: Sequence[Combiner],
    *,
    progress: Callable[[int, int], None] | None = None,
) -> ChoiceScores:
    """Each choice's log-likelihood at the byte level: every model reads the context in its own
    tokens (as a generation's prompt), and the choice's bytes are scored as its reply would be,
    under each combination and each model alone. `ChoiceScores.tokens` counts bytes."""
    from .choices import ChoiceScores

    bound = [c.bind(len(models.models), [m.n_params for m in models.models]) for c in combiners]
    lanes = models.lanes()
    n = len(lanes[0])
    out = ChoiceScores([[] for _ in bound], [[] for _ in range(n)], [], [it.answer for it in items])
    for number, item in enumerate(items):
        prompts = models.prompts(item.context)
        for m, p in zip(models.models, prompts):
            if len(p) + len(max(item.choices, key=len).encode()) >= m.n_ctx:
                raise ConfigError(f"item {number + 1}: its context and longest choice do not fit {m.name}'s context of {m.n_ctx}; "
                                  "raise --ctx", param="choices")  # fmt: skip
        texts = [choice.encode("utf-8") for choice in item.choices]
        logs_c = [[0.0] * len(texts) for _ in bound]
        logs_m = [[0.0] * len(texts) for _ in range(n)]
        for g in range(0, len(texts), len(lanes)):
            group = texts[g : g + len(lanes)]

            def visit(lane: int, j: int, dists: list) -> None:
                byte = group[lane][j]
                for i, d in enumerate(dists):
                    logs_m[i][g + lane] += math.log(max(float(d[byte]), RULED_OUT))
                for k, c in enumerate(bound):
                    logs_c[k][g + lane] += math.log(max(float(combine_symbols(c, dists, 1.0)[byte]), RULED_OUT))

            used = lanes[: len(group)]
            start_lanes(used, prompts)  # the context evaluated once for the choices side by side
            walk_together(used, group, visit, lambda lane, j: True)
        for k in range(len(bound)):
            out.combined[k].append(logs_c[k])
        for i in range(n):
            out.members[i].append(logs_m[i])
        out.tokens.append([len(t) for t in texts])
        if progress:
            progress(number + 1, len(items))
    return out
