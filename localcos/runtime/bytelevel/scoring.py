"""The byte level's scorer: given texts walked a byte at a time through every model's paths, side
by side in lanes of sequences (`ByteModels.lanes`), every new tokenisation's row of every lane in
the same calls (`ByteMember.advance_together`); what `scoring.bytescore` measures bits per byte
and choices' log-likelihoods with, as `runtime.scoring` is the token level's."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .member import ByteMember


def start_lanes(lanes: Sequence[Sequence[ByteMember]], prompts: Sequence[Sequence[int]]) -> None:
    """Every lane's members at the start of `prompts` (one per model): the first lane's evaluated
    as a generation's prompt is, the others sharing its cells and rows."""
    for i, prompt in enumerate(prompts):
        lanes[0][i].start(prompt)
        for lane in lanes[1:]:
            lane[i].start_beside(lanes[0][i])


def walk_together(lanes: Sequence[Sequence[ByteMember]], texts: Sequence[bytes], visit: Callable[[int, int, list], None],
                  wanted: Callable[[int, int], bool]) -> None:  # fmt: skip
    """Advance each lane's members (one per model, on sequences of their own) through its text
    (lane l: texts[l]) a byte of every lane at a time, each model's new rows for all lanes in
    shared calls (`advance_together`), calling `visit(l, j, dists)` with every model's
    distribution over byte j of texts[l] (given the bytes before it) where `wanted(l, j)`.

    A byte a model's held paths rule out (the cap on paths dropped the ones the text goes on
    with) is scored as in a generation: its paths are rebuilt from its own tokenisation of the
    text (`ByteMember.rebuild`) and the byte is scored from those (`ByteView.restarts` counts it)."""
    for j in range(max(len(t) for t in texts)):
        live = [lane for lane, text in enumerate(texts) if j < len(text)]
        for lane in live:
            if wanted(lane, j):
                byte = texts[lane][j]
                dists = []
                for member in lanes[lane]:
                    dist = member.view.distribution()
                    if dist[byte] <= 0:
                        member.rebuild(bytes([byte]))
                        dist = member.view.distribution()
                    dists.append(dist)
                visit(lane, j, dists)
        for i, member in enumerate(lanes[0]):
            member.advance_together([lanes[lane][i] for lane in live], [texts[lane][j] for lane in live])


def paths_lost(lane: Sequence[ByteMember]) -> list[tuple[int, float]]:
    """Each member's walk so far: the bytes its held paths ruled out (scored after a rebuild from
    its own tokenisation) and the probability mass it pruned."""
    return [(member.view.restarts, member.view.dropped) for member in lane]
