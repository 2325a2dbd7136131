"""What `generate --json` reports, in one shape at every level: its completions' texts, token ids
(null at the byte and mixed levels, whose text is bytes) and finish reasons, and the one
statistics document (`GenerationStats.to_dict`: the same keys at every level, null where a level
does not count a value; the server's `localcos` object is that document too,
`server.protocol.statistics`)."""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence

from ..core.level import Level
from ..stats import GenerationStats
from .completion import Completion


def completion_json(completion: Completion) -> dict[str, Any]:
    """A completion's text, token ids (null at the byte and mixed levels) and finish reason."""
    return {"text": completion.text, "token_ids": completion.token_ids, "finish_reason": completion.finish_reason}


def generation_json(completions: Sequence[Completion], level: Level, seed: int | None, combiner: str) -> dict[str, Any]:
    """`generate --json`'s document, one shape at every level."""
    return {"completions": [completion_json(c) for c in completions], "stats": GenerationStats.aggregate([c.stats for c in completions]).to_dict(),
            "seed": seed, "combiner": combiner, "level": level.value}  # fmt: skip
