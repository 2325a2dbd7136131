"""For tests and benchmarks that stand in for llama.cpp models (pure-NumPy fakes): not used by
localcos itself."""

from __future__ import annotations

from typing import Any, Sequence


class OwnSlot:
    """A fake model that is its own only sequence (slot), as the decoding core reads one:
    `slots`, `model`, and a prefill that evaluates every row afresh (`Model` reuses its cache).
    The class that mixes it in has `tokens` and `truncate(n)`."""

    tokens: list[int]

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
