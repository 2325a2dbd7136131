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
        """The first model's prompt tokens (the plans' common shape; token ids mean one
        vocabulary's only at the token level, which the paths that read them need)."""
        return self.prompts[0]

    @property
    def prompt_length(self) -> int:
        """The prompt's length as usage counts it: the longest of the models' own (what fills a
        context)."""
        return max(len(p) for p in self.prompts)
