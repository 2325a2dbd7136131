"""`localcos score`: how good is a combination? Perplexity of a text and accuracy on a
multiple-choice set, for the combined distribution r and for each model alone, over a grid of
combinations if asked (a sweep costs the models nothing more: every combination is scored on the
same rows of logits).

Perplexity windows are llama.cpp's `llama-perplexity`'s, so the figures compare: the text is
tokenised once (BOS added as the model says), cut into chunks of `n_ctx` tokens (a tail shorter
than a chunk is dropped), each chunk evaluated from an empty context with its first token
replaced by BOS where the model adds one, and the second half of each chunk scored: the tokens at
positions n_ctx/2 + 1 ... n_ctx - 1, each given everything before it in its chunk.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..core.combiners import Combiner
from ..errors import ConfigError
from ..scoring import continuation_scores, score_tokens

if TYPE_CHECKING:
    from ..ensemble import Ensemble


@dataclass
class NLL:
    """Negative log-likelihood sums (for a perplexity and llama-perplexity's error estimate)."""

    total: float = 0.0
    squares: float = 0.0
    count: int = 0

    def add(self, logprobs: np.ndarray) -> None:
        nll = -np.asarray(logprobs, dtype=np.float64)
        self.total += float(nll.sum())
        self.squares += float((nll * nll).sum())
        self.count += len(nll)

    @property
    def perplexity(self) -> float:
        return math.exp(self.total / self.count) if self.count else math.nan

    @property
    def error(self) -> float:
        """llama-perplexity's +/-: perplexity x the standard error of the mean log-likelihood."""
        if self.count < 2:
            return math.nan
        mean = self.total / self.count
        var = self.squares / self.count - mean * mean
        return math.sqrt(max(var, 0.0) / (self.count - 1)) * self.perplexity


@dataclass
class PerplexityResult:
    """Perplexity of a text under each combination and each model alone."""

    combined: list[NLL]  # one per combiner
    members: list[NLL]
    windows: int
    n_ctx: int
    tokens: int  # tokens in the text


def windows(tokens: Sequence[int], n_ctx: int, bos: int | None) -> list[list[int]]:
    """llama-perplexity's chunks: consecutive n_ctx tokens, the first one replaced by `bos`."""
    if n_ctx < 4:
        raise ConfigError(f"--ctx must be at least 4 tokens to make perplexity windows, got {n_ctx}")
    if len(tokens) < 2 * n_ctx:
        raise ConfigError(
            f"the text has {len(tokens)} tokens; perplexity with --ctx {n_ctx} needs at least {2 * n_ctx} "
            "(two windows): give a longer text or a smaller --ctx"
        )
    out = []
    for i in range(len(tokens) // n_ctx):
        chunk = list(tokens[i * n_ctx : (i + 1) * n_ctx])
        if bos is not None:
            chunk[0] = bos
        out.append(chunk)
    return out


def perplexity(
    ens: "Ensemble",
    text: str,
    combiners: Sequence[Combiner],
    *,
    n_ctx: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PerplexityResult:
    """Perplexity of `text` under each of `combiners` and each model, in llama-perplexity's windows."""
    if not text.strip():
        raise ConfigError("the text is empty")
    n_ctx = n_ctx or ens.n_ctx
    if n_ctx > ens.n_ctx:
        raise ConfigError(f"windows of {n_ctx} tokens do not fit the context of {ens.n_ctx}")
    tokens = ens.tokenize(text)
    first = ens.models[0]
    chunks = windows(tokens, n_ctx, first.bos if first.add_bos and first.bos >= 0 else None)
    combined = [NLL() for _ in combiners]
    members = [NLL() for _ in ens.models]
    for w, chunk in enumerate(chunks):
        s = score_tokens(ens, chunk, n_ctx // 2 + 1, combiners=combiners, members=True)
        for nll, logprobs in zip(combined, s.combined):
            nll.add(logprobs)
        assert s.members is not None
        for nll, logprobs in zip(members, s.members):
            nll.add(logprobs)
        if progress:
            progress(w + 1, len(chunks))
    return PerplexityResult(combined, members, len(chunks), n_ctx, len(tokens))


# --- multiple choice ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChoiceItem:
    context: str
    choices: tuple[str, ...]
    answer: int


def load_choices(path: str | Path) -> list[ChoiceItem]:
    """A multiple-choice set: one JSON object per line, {"context", "choices": [...], "answer": i}."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"choices file not found: {path}")
    items = []
    for number, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected an object with context, choices and answer")
        context, choices, answer = data.get("context"), data.get("choices"), data.get("answer")
        if not isinstance(context, str) or not context:
            raise ConfigError(f"{where}: context must be a non-empty string")
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
            raise ConfigError(f"{where}: choices must be a list of two or more non-empty strings")
        if not isinstance(answer, int) or isinstance(answer, bool) or not 0 <= answer < len(choices):
            raise ConfigError(f"{where}: answer must be the index of a choice (0 to {len(choices) - 1})")
        items.append(ChoiceItem(context, tuple(choices), answer))
    if not items:
        raise ConfigError(f"{path} holds no items")
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
    ens: "Ensemble",
    items: Sequence[ChoiceItem],
    combiners: Sequence[Combiner],
    *,
    progress: Callable[[int, int], None] | None = None,
) -> ChoiceScores:
    """Log-likelihood of every choice after its context: the context evaluated once per item,
    each choice after it (rolled back with seq_rm between them)."""
    n_models = len(ens.models)
    out = ChoiceScores([[] for _ in combiners], [[] for _ in range(n_models)], [], [it.answer for it in items])
    for number, item in enumerate(items):
        sums_c: list[list[float]] = [[] for _ in combiners]
        sums_m: list[list[float]] = [[] for _ in range(n_models)]
        counts = []
        try:
            scored = continuation_scores(ens, item.context, item.choices, combiners, what="choice")
        except ConfigError as e:
            raise ConfigError(f"item {number + 1}: {e}") from None
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


# --- sweeps --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sweep:
    """A grid over one combination parameter: weights (of the first of two models; the second
    gets the rest), mu or plausibility."""

    name: str
    values: tuple[float, ...] = field(default_factory=tuple)

    def settings(self) -> list[dict[str, object]]:
        """Option values for each point of the grid."""
        if self.name == "weights":
            return [{"weights": (v, 1.0 - v)} for v in self.values]
        return [{self.name: v} for v in self.values]


def parse_sweep(text: str) -> Sweep:
    """weights=0:1:0.1 (start:stop:step, both ends included), mu=0,0.05,0.1 or plausibility=..."""
    name, sep, spec = text.partition("=")
    name = name.strip()
    if not sep or name not in ("weights", "mu", "plausibility"):
        raise ConfigError(f"--sweep must look like weights=0:1:0.1, mu=0,0.1,0.2 or plausibility=0.05,0.1; got {text!r}")
    try:
        if ":" in spec:
            start, stop, step = (float(x) for x in spec.split(":"))
            if step <= 0 or stop < start:
                raise ValueError
            count = int(round((stop - start) / step)) + 1
            values = tuple(round(start + i * step, 10) for i in range(count) if start + i * step <= stop + 1e-9)
        else:
            values = tuple(float(x) for x in spec.split(","))
    except ValueError:
        raise ConfigError(f"--sweep {name}: values must be START:STOP:STEP or comma-separated numbers, got {spec!r}") from None
    if not values or any(not math.isfinite(v) for v in values):
        raise ConfigError(f"--sweep {name}: no values in {spec!r}")
    if name == "weights" and any(not 0 <= v <= 1 for v in values):
        raise ConfigError("--sweep weights takes the first model's weight, from 0 to 1")
    return Sweep(name, values)
