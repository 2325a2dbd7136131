"""For tests and benchmarks that stand in for llama.cpp models (pure-NumPy fakes)."""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence

from ..backend.slot import PROMPT_CHUNK
from ..core.speedmodel import CallProfile


class OwnSlot:
    """A fake model that is its own only sequence (slot), as the runtime reads one: `slots`,
    `model`, a prefill that evaluates every row afresh (`Model` reuses its cache), and `decode`,
    the scheduler's call. The class that mixes it in has `tokens`, `evaluate(tokens, n_logits)`
    (the logits after the last n_logits tokens) and `truncate(n)`."""

    tokens: list[int]
    seq_id = 0
    max_logit_rows = 1 << 30  # no limit on the rows of a call
    prompt_chunk = PROMPT_CHUNK

    @property
    def call_profile(self) -> CallProfile:
        """Calls cost by parameter count, whatever their rows (a fake stands for a model on an
        accelerator); a test sets its own to plan for another machine."""
        return getattr(self, "_call_profile", None) or CallProfile.flat(max(getattr(self, "n_params", 1), 1) * 1e-9)

    @call_profile.setter
    def call_profile(self, profile: CallProfile) -> None:
        self._call_profile = profile

    def truncate(self, n: int) -> None:
        del self.tokens[n:]

    @property
    def slots(self) -> list[Any]:
        return [self]

    @property
    def model(self) -> Any:
        return self

    def known_row(self, prompt: Sequence[int]) -> None:
        self.truncate(0)

    def remember_row(self, prompt: Sequence[int], row: Any) -> None:
        pass

    def restore_prompt(self, slot: Any, prompt: Sequence[int]) -> None:
        """Nothing kept: every start evaluates the prompt from an empty cache."""
        self.truncate(0)

    def keep_prompt(self, slot: Any, prompt: Sequence[int], row: Any) -> None:
        pass

    def decode(self, parts: Sequence[tuple[Any, Sequence[int], int, int]]) -> list[Any]:
        """One call: each part (slot, tokens, out_from, out_to) appends tokens and asks for the
        rows after tokens[out_from:out_to] (the scheduler asks for a suffix)."""
        out = []
        for slot, tokens, out_from, out_to in parts:
            assert out_to == len(tokens), "a fake answers the rows of a suffix of the tokens"
            out.append(slot.evaluate(tokens, out_to - out_from))
        return out
