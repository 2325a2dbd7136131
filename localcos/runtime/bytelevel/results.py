"""What a byte-level generation is asked to do (`BytePlan`) and what it did (`ByteCompletion`,
its statistics the one `GenerationStats` at the byte or mixed level)."""

from __future__ import annotations

from dataclasses import dataclass

from ...config.specs import GenerationConfig
from ...core.combiners import BoundCombiner
from ...core.level import Level
from ...stats import GenerationStats


@dataclass
class ByteCompletion:
    """One completion generated at the byte level."""

    text: str
    data: bytes
    finish_reason: str  # "stop" (the end symbol or a stop string), "length" (max_tokens or the context), "cancelled"
    stats: GenerationStats
    end_token = None  # the byte level ends on its end symbol, not on one model's token
    token_ids = None  # its text is bytes, in no one model's tokens

    @property
    def length(self) -> int:
        """Its length in what max_tokens counts: the lead model's tokens."""
        return self.stats.tokens


@dataclass(frozen=True)
class BytePlan:
    """One byte-level completion to run (`ByteModels.plan` checks it): each model's prompt in its
    own tokens, the generation settings, the combination bound to the models, the method and the
    level (byte, or mixed)."""

    prompts: tuple[tuple[int, ...], ...]
    config: GenerationConfig
    combiner: BoundCombiner
    method: str  # "ensemble" or "cos"
    level: Level = Level.BYTE

    @property
    def prompt(self) -> tuple[int, ...]:
        """The first model's prompt tokens (what a server's usage counts)."""
        return self.prompts[0]
