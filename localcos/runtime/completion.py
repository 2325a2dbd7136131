"""What one generation produced, at every level: the one `Completion` that `generate`, `stream`,
the schedulers, the server, the chat and eval read, whichever level decoded it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.decoding import Origin
from ..stats import GenerationStats


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
    stopped_by: str | None = None  # where a rule on the text ended it: "word" (`stop_word`), "indent" or "time" (`core.text`)
    stop_word: str | None = None

    @property
    def length(self) -> int:
        """Its length in what max_tokens counts: tokens (the lead model's at the byte and mixed levels)."""
        return self.stats.tokens

    def measured(self, unit: str) -> int:
        """Its length in `unit` (`Level.unit`): "tokens" (`length`), or "chars" (characters of
        the text), whichever level decoded it: how eval counts every configuration of one run."""
        return len(self.text) if unit == "chars" else self.length
