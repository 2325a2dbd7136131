"""Bits per byte of a text, and multiple-choice log-likelihoods, for the byte-level combination r
and for each model alone: the measures that compare models of different tokenizers (each model's byte distribution from
`core.bytelevel`, marginalised over its tokenisations).

Windows follow `eval.perplexity` in bytes: the text's UTF-8 bytes are cut into windows of
`window` bytes (cut on character boundaries; a tail shorter than a window is dropped unless it is
the only one), each scored from an empty context (each model's BOS, as its metadata says), the
second half of each window scored, each byte given everything before it in its window. Within a
window the bytes go through each model in chunks: its rows for a chunk come from one llama.cpp
call over the chunk's likely tokenisations (`ByteMember.score`), so a model makes about one call
per chunk rather than one per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from ..core.combiners import Combiner
from ..errors import ConfigError
from ..runtime.bytelevel import RULED_OUT, combine_symbols

if TYPE_CHECKING:
    from ..runtime.bytelevel import ByteModels
    from .choices import ChoiceItem, ChoiceScores

CHUNK_BYTES = 32  # bytes scored per call of each model


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


def walk(members: Sequence, data: bytes, visit: Callable[[int, list], None]) -> list[int]:
    """Advance every member's view through `data`, a chunk of `CHUNK_BYTES` per call of each
    model (`ByteMember.score`), calling `visit(j, dists)` with every model's distribution over
    byte j of `data` (given the bytes before it), in order. Returns how many times each model's
    paths were rebuilt (bytes its held paths ruled out)."""
    rebuilds = [0] * len(members)
    pos = 0
    while pos < len(data):
        chunk = data[pos : pos + CHUNK_BYTES]
        scored = [m.score(chunk) for m in members]
        reached = min(len(d) for d, _ in scored) - 1  # bytes every model got through
        taken = min(reached + 1, len(chunk))
        stuck = [len(states) <= taken for _, states in scored]
        for i, (member, (dists, states), rebuilt) in enumerate(zip(members, scored, stuck)):
            if rebuilt:
                rebuilds[i] += 1
                # its held paths rule out byte `reached` (pruning dropped the ones the text goes
                # on with): as in a generation, its paths are rebuilt from its own tokenisation of
                # the text, and the byte is scored from those
                member.rollback(states[-1])
                member.rebuild(chunk[reached : reached + 1])
                dists[reached] = member.view.distribution()
        for j in range(taken):
            visit(pos + j, [d[j] for d, _ in scored])
        for member, (_, states), rebuilt in zip(members, scored, stuck):
            if rebuilt:
                member.advance(chunk[taken - 1])
            else:
                member.rollback(states[taken])
        pos += taken
    return rebuilds


def bits_per_byte(
    models: "ByteModels",
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
    members = models.members
    combined = [Bits() for _ in bound]
    alone = [Bits() for _ in members]
    unreachable = [0] * len(members)
    dropped = [0.0] * len(members)
    prompts = models.document_starts()
    for w, (lo, hi) in enumerate(spans):
        piece = data[lo:hi]
        first_scored = len(piece) // 2

        def visit(j: int, dists: list) -> None:
            if j < first_scored:
                return
            byte = piece[j]
            for i, d in enumerate(dists):
                alone[i].add(max(float(d[byte]), RULED_OUT))
            for c, bits in zip(bound, combined):
                # END keeps its share; a byte every model's paths rule out is scored as each
                # model's is there (RULED_OUT), not as infinitely unlikely
                bits.add(max(float(combine_symbols(c, dists, 1.0)[byte]), RULED_OUT))

        for member, prompt in zip(members, prompts):
            member.start(prompt)
        for i, n in enumerate(walk(members, piece, visit)):
            unreachable[i] += n
        for i, member in enumerate(members):
            dropped[i] += member.view.dropped
        if progress:
            progress(w + 1, len(spans))
    dropped = [d / len(spans) for d in dropped]
    return ByteScore(combined, alone, len(spans), window, len(data), unreachable, dropped)


def byte_choices(
    models: "ByteModels",
    items: Sequence["ChoiceItem"],
    combiners: Sequence[Combiner],
    *,
    progress: Callable[[int, int], None] | None = None,
) -> "ChoiceScores":
    """Each choice's log-likelihood at the byte level: every model reads the context in its own
    tokens (as a generation's prompt), and the choice's bytes are scored as its reply would be,
    under each combination and each model alone. `ChoiceScores.tokens` counts bytes."""
    from .choices import ChoiceScores

    bound = [c.bind(len(models.models), [m.n_params for m in models.models]) for c in combiners]
    members = models.members
    out = ChoiceScores([[] for _ in bound], [[] for _ in members], [], [it.answer for it in items])
    for number, item in enumerate(items):
        prompts = models.prompts(item.context)
        for m, p in zip(models.models, prompts):
            if len(p) + len(max(item.choices, key=len).encode()) >= m.n_ctx:
                raise ConfigError(f"item {number + 1}: its context and longest choice do not fit {m.name}'s context of {m.n_ctx}; "
                                  "raise --ctx", param="choices")  # fmt: skip
        sums_c: list[list[float]] = [[] for _ in bound]
        sums_m: list[list[float]] = [[] for _ in members]
        counts = []
        for choice in item.choices:
            data = choice.encode("utf-8")
            logs_c = [0.0] * len(bound)
            logs_m = [0.0] * len(members)

            def visit(j: int, dists: list) -> None:
                byte = data[j]
                for i, d in enumerate(dists):
                    logs_m[i] += math.log(max(float(d[byte]), RULED_OUT))
                for k, c in enumerate(bound):
                    logs_c[k] += math.log(max(float(combine_symbols(c, dists, 1.0)[byte]), RULED_OUT))

            for member, prompt in zip(members, prompts):
                member.start(prompt)  # the context's cells are kept from the choice before
            walk(members, data, visit)
            for k in range(len(bound)):
                sums_c[k].append(logs_c[k])
            for i in range(len(members)):
                sums_m[i].append(logs_m[i])
            counts.append(len(data))
        for k in range(len(bound)):
            out.combined[k].append(sums_c[k])
        for i in range(len(members)):
            out.members[i].append(sums_m[i])
        out.tokens.append(counts)
        if progress:
            progress(number + 1, len(items))
    return out
