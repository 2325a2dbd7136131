"""The level a generation decodes at: one value (`Level`), chosen where the settings are read and
carried by the plan, the statistics and eval's configurations."""

from __future__ import annotations

from enum import Enum


class Level(str, Enum):
    """Which level decodes (docs/algorithm.md, sections 10-12):

    - TOKEN: the models' next-token distributions combined, one tokenizer for all;
    - MIXED: whole tokens of the lead model where its likeliest has probability --gate or more,
      the byte level elsewhere;
    - BYTE: the models' next-byte distributions combined, each model on its own tokens.
    """

    TOKEN = "token"
    MIXED = "mixed"
    BYTE = "byte"

    @property
    def in_bytes(self) -> bool:
        """Whether the models decode through their byte views (the mixed and byte levels)."""
        return self is not Level.TOKEN

    @property
    def unit(self) -> str:
        """What a generation's length is counted in for people: tokens, or characters where the
        models decode through their byte views (their tokens are not one vocabulary's)."""
        return "chars" if self.in_bytes else "tokens"

    @property
    def draft_length(self) -> str:
        """The setting that says how long a draft is at this level: gamma (tokens of the one
        vocabulary) or, where the models decode through their byte views, byte_gamma (bytes)."""
        return "byte_gamma" if self.in_bytes else "gamma"
