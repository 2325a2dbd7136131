"""What a byte-level generation is asked to do (`BytePlan`); what it did is the one `Completion`."""

from __future__ import annotations

from dataclasses import dataclass

from ...config.specs import GenerationConfig
from ...core.combiners import BoundCombiner
from ...core.level import Level


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
