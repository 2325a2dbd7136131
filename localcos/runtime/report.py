"""What a generation reports, in one shape at every level (`generate --json`, the server's
`localcos` object): every counter and rate of the token level's statistics (`GenerationStats`)
and of the byte and mixed levels' (`ByteStats`), null where it does not apply, and the level."""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence

from ..core.level import Level
from ..stats import GenerationStats
from .bytelevel.results import ByteCompletion, ByteStats
from .generation import Completion

# every key of both statistics' documents: a byte-level one with everything it may say (cos, a
# gate, the mixed level, several completions), and the token level's
_BYTE_KEYS = ByteStats(level=Level.MIXED, method="cos", gate_decided=1, completions=2).to_dict().keys()
KEYS: tuple[str, ...] = tuple(sorted({*GenerationStats("", "", []).to_dict(), *_BYTE_KEYS, "level"}))


def stats_json(stats: GenerationStats | ByteStats, level: Level) -> dict[str, Any]:
    """`stats` (one completion's or several's, aggregated) as the one document: `KEYS`, each
    null where this level does not count it."""
    own = {**stats.to_dict(), "level": level.value}
    return {key: own.get(key) for key in KEYS}


def aggregate(stats: Sequence[GenerationStats | ByteStats]) -> GenerationStats | ByteStats:
    """The statistics of several completions of one request, at one level."""
    byte = [s for s in stats if isinstance(s, ByteStats)]
    if byte:
        return ByteStats.aggregate(byte)
    return GenerationStats.aggregate([s for s in stats if isinstance(s, GenerationStats)])


def completion_json(completion: Completion | ByteCompletion) -> dict[str, Any]:
    """A completion's text, token ids (null at the byte and mixed levels, whose text is bytes)
    and finish reason."""
    return {"text": completion.text, "token_ids": getattr(completion, "token_ids", None), "finish_reason": completion.finish_reason}


def generation_json(completions: Sequence[Completion] | Sequence[ByteCompletion], level: Level, seed: int | None, combiner: str) -> dict[str, Any]:
    """`generate --json`'s document, one shape at every level."""
    return {"completions": [completion_json(c) for c in completions], "stats": stats_json(aggregate([c.stats for c in completions]), level),
            "seed": seed, "combiner": combiner, "level": level.value}  # fmt: skip
