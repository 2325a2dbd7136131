"""Multiple-choice accuracy of the combined distribution r and of each model alone: every
choice's log-likelihood after its context (the context evaluated once per item)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from collections.abc import Callable, Sequence

import numpy as np

from ..core.combiners import Combiner
from ..errors import ConfigError
from ..jsonlines import json_objects
from ..runtime.scoring import continuation_scores

if TYPE_CHECKING:
    from ..runtime.loaded import LoadedModels


@dataclass(frozen=True)
class ChoiceItem:
    context: str
    choices: tuple[str, ...]
    answer: int


def load_choices(path: str | Path) -> list[ChoiceItem]:
    """A multiple-choice set: one JSON object per line, {"context", "choices": [...], "answer": i}."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"choices file not found: {path}", param="choices")
    items = []
    for where, data in json_objects(p.read_text(encoding="utf-8"), str(path), "choices", "context, choices and answer"):
        context, choices, answer = data.get("context"), data.get("choices"), data.get("answer")
        if not isinstance(context, str) or not context:
            raise ConfigError(f"{where}: context must be a non-empty string", param="choices")
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
            raise ConfigError(f"{where}: choices must be a list of two or more non-empty strings", param="choices")
        if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(choices):
            raise ConfigError(f"{where}: answer must be the index of a choice (0 to {len(choices) - 1})", param="choices")
        items.append(ChoiceItem(context, tuple(choices), answer))
    if not items:
        raise ConfigError(f"{path} holds no items", param="choices")
    return items


@dataclass
class ChoiceScores:
    """Each choice's log-likelihood (summed; and its token count) under each combination and
    each model: [item][choice]."""

    combined: list[list[list[float]]]  # [combiner][item][choice]
    members: list[list[list[float]]]  # [model][item][choice]
    tokens: list[list[int]]  # [item][choice]
    answers: list[int]

    def accuracy(self, sums: list[list[float]], per_token: bool = False) -> float:
        right = 0
        for item, choice_scores in enumerate(sums):
            values = [s / n for s, n in zip(choice_scores, self.tokens[item])] if per_token else choice_scores
            right += int(np.argmax(values)) == self.answers[item]
        return right / len(sums)


def score_choices(
    ens: LoadedModels,
    items: Sequence[ChoiceItem],
    combiners: Sequence[Combiner],
    *,
    progress: Callable[[int, int], None] | None = None,
    second_prompt: str | None = None,
) -> ChoiceScores:
    """Log-likelihood of every choice after its context: the context evaluated once per item,
    each choice after it (rolled back with seq_rm between them); a second prompt's member reads
    `second_prompt` in place of each context."""
    n_models = len(ens.models)
    out = ChoiceScores([[] for _ in combiners], [[] for _ in range(n_models)], [], [it.answer for it in items])
    for number, item in enumerate(items):
        sums_c: list[list[float]] = [[] for _ in combiners]
        sums_m: list[list[float]] = [[] for _ in range(n_models)]
        counts = []
        try:
            scored = continuation_scores(ens, item.context, item.choices, combiners, what="choice", second_prompt=second_prompt)
        except ConfigError as e:
            raise ConfigError(f"item {number + 1}: {e}", param=e.param or "choices") from None
        for s in scored:
            for k, logprobs in enumerate(s.combined):
                sums_c[k].append(float(logprobs.sum()))
            assert s.members is not None
            for i in range(n_models):
                sums_m[i].append(float(s.members[i].sum()))
            counts.append(len(s.tokens))
        for k in range(len(combiners)):
            out.combined[k].append(sums_c[k])
        for i in range(n_models):
            out.members[i].append(sums_m[i])
        out.tokens.append(counts)
        if progress:
            progress(number + 1, len(items))
    return out
