"""Which model plays a role by its size, where the settings name none: the largest leads (a
gate's lead, the member that also reads a second prompt, what an ensemble is weighed against),
the cheapest drafts (the default proposer)."""

from __future__ import annotations

from collections.abc import Sequence


def largest(n_params: Sequence[int]) -> int:
    """The model with the most parameters (the last of equals)."""
    return max(range(len(n_params)), key=lambda i: (n_params[i], i))


def cheapest(n_params: Sequence[int]) -> int:
    """The model with the fewest parameters (the first of equals)."""
    return min(range(len(n_params)), key=lambda i: (n_params[i], i))
