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


def member_params(n_params: Sequence[int], second_prompt: bool) -> list[int]:
    """The parameter counts a combination chooses roles by, one per member: each model's, then,
    where the largest model also reads a second prompt, that member's at one fewer than its
    model, so the member reading the prompt is the expert, the lead and the positive member."""
    counts = list(n_params)
    return [*counts, counts[largest(counts)] - 1] if second_prompt else counts
