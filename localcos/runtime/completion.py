"""What one generation produced, at every level: the one `Completion` that `generate`, `stream`,
the schedulers, the server, the chat and eval read, whichever level decoded it."""

from __future__ import annotations

from dataclasses import dataclass, field

from collections.abc import Sequence

from ..core.decoding import Origin
from ..core.level import Level
from ..stats import GenerationStats, ModelRunStats


@dataclass
class Completion:
    """One generated completion.

    `token_ids`, `origins` and `end_token` are the token level's: ids of the shared vocabulary
    (None at the byte and mixed levels, whose text is bytes in no one model's tokens), where each
    came from, and the end-of-generation token that ended it (not part of `token_ids`). `data` is
    the byte and mixed levels' raw bytes (None at the token level)."""

    text: str
    finish_reason: str  # "stop" (an end token or symbol, or a stop string), "length" (max tokens or the context), "cancelled"
    stats: GenerationStats
    token_ids: list[int] | None = None
    origins: list[Origin] = field(default_factory=list)
    end_token: int | None = None
    data: bytes | None = None
    stopped_by: str | None = None  # where a rule on the text ended it: "word" (`stop_word`), "suffix", "block", "indent" or "time" (`core.text`)
    stop_word: str | None = None

    @property
    def length(self) -> int:
        """Its length in what max_tokens counts: tokens (the lead model's at the byte and mixed levels)."""
        return self.stats.tokens

    def measured(self, unit: str) -> int:
        """Its length in `unit` (`Level.unit`): "tokens" (`length`), or "chars" (characters of
        the text), whichever level decoded it: how eval counts every configuration of one run."""
        return len(self.text) if unit == "chars" else self.length


def cancelled_completion(names: Sequence[str], method: str, combiner: str, level: Level = Level.TOKEN, *, prompt_tokens: int = 0,
                         prompt_seconds: float = 0.0, seed: int | None = None) -> Completion:  # fmt: skip
    """The completion of a generation cancelled before it decoded anything, at any level: no text,
    its statistics naming each member (`names`) and, at the byte and mixed levels, each member's
    counters at zero."""
    stats = GenerationStats(method, combiner, [ModelRunStats(name) for name in names], level=level, prompt_tokens=prompt_tokens,
                            prompt_seconds=prompt_seconds, seed=seed, finish_reason="cancelled", finish_reasons={"cancelled": 1})  # fmt: skip
    if level.in_bytes:
        zeros = [0] * len(names)
        stats.most_paths, stats.restarts, stats.folded, stats.missed_rows = list(zeros), list(zeros), list(zeros), list(zeros)
        stats.dropped_mass = [0.0] * len(names)
    return Completion("", "cancelled", stats, token_ids=None if level.in_bytes else [], data=b"" if level.in_bytes else None)
