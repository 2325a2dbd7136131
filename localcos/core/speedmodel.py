"""Expected speed of the speculative methods (docs/algorithm.md section 6; CoS paper Theorems 3.1, 3.6),
and the online controller behind ``--gamma auto``.

Notation: alpha is the per-token acceptance rate, gamma the proposal length, c the cost of one
proposer call relative to one verifier call; the standard ensemble pays 1 + c per token.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable


def expected_tokens(alpha: float, n: int) -> float:
    """sum_{k<n} alpha^k: expected tokens from n draft tokens (accepted prefix + replacement)."""
    if alpha >= 1.0:
        return float(n)
    return (1.0 - alpha**n) / (1.0 - alpha)


def expected_speedup(method: str, alpha: float, gamma: int, c: float, batch_cost: float | None = None) -> float | None:
    """Speedup over the standard ensemble predicted by the paper's cost model (2 models).

    naive-cos: E (1 + c) / (gamma c + 1) with E = (1 - alpha^gamma) / (1 - alpha) (Theorem 3.1).
    cos:       as naive-cos, but the proposer skips a call whenever it carries a bonus token
               (probability alpha^gamma): E (1 + c) / ((gamma - alpha^gamma) c + 1) (Theorem 3.6).
    sd:        the target is the whole ensemble, drafter included (cost 1 + c per pass), and a
               fully accepted draft earns a bonus token: E' (1 + c) / (gamma c + 1 + c) with
               E' = (1 - alpha^(gamma+1)) / (1 - alpha).
    The paper counts a batched verification pass as one call. `batch_cost` b, when given, is
    what a verification pass really costs in single-token calls (on a CPU, several tokens cost
    more than one); the pass terms are then scaled by b.
    """
    if method == "ensemble":
        return 1.0
    if not (0.0 <= alpha <= 1.0) or gamma < 1 or c < 0:
        return None
    b = 1.0 if batch_cost is None else batch_cost
    if method == "naive-cos":
        return expected_tokens(alpha, gamma) * (1 + c) / (gamma * c + b)
    if method == "cos":
        return expected_tokens(alpha, gamma) * (1 + c) / ((gamma - alpha**gamma) * c + b)
    if method == "sd":
        return expected_tokens(alpha, gamma + 1) * (1 + c) / (gamma * c + (1 + c) * b)
    return None


# Before a batch size has been measured, an extra token in a batch is guessed to cost this share
# of a single-token call (the memory-bound regime of GPUs). Optimistic on CPUs, so the controller
# tries longer drafts once and then knows their real cost.
PRIOR_EXTRA_TOKEN = 0.1


def _prior_calls(n: int) -> float:
    """A call of n tokens in single-token calls, as guessed before any measurement."""
    return 1.0 + PRIOR_EXTRA_TOKEN * (n - 1)


@dataclass
class _CallCost:
    """Seconds per llama_decode call of one model, by batch size.

    Each batch size keeps its own exponentially forgetting mean: call time is not linear in the
    batch size (on CPUs one token runs matrix-vector kernels and two or more run matrix-matrix
    kernels, so the step from 1 to 2 tokens costs far more than each later one). Sizes not seen
    yet are interpolated between measured neighbours, or extrapolated from the largest ones.
    """

    decay: float = 0.98
    weight: dict[int, float] = field(default_factory=dict)
    mean: dict[int, float] = field(default_factory=dict)

    def observe(self, n: int, seconds: float) -> None:
        w = self.decay * self.weight.get(n, 0.0) + 1.0
        self.mean[n] = self.mean.get(n, seconds) + (seconds - self.mean.get(n, seconds)) / w
        self.weight[n] = w

    @property
    def known(self) -> bool:
        return bool(self.mean)

    def __call__(self, n: int) -> float:
        if n in self.mean:
            return self.mean[n]
        if not self.mean:
            return _prior_calls(n)
        sizes = sorted(self.mean)
        below = [m for m in sizes if m < n]
        above = [m for m in sizes if m > n]
        if below and above:
            lo, hi = below[-1], above[0]
            return self.mean[lo] + (self.mean[hi] - self.mean[lo]) * (n - lo) / (hi - lo)
        if below:
            lo = below[-1]
            if len(below) >= 2 and below[-2] >= 2:  # a slope between two batched sizes
                prev = below[-2]
                slope = max((self.mean[lo] - self.mean[prev]) / (lo - prev), 0.0)
            else:
                slope = PRIOR_EXTRA_TOKEN * self.mean[below[0]] / _prior_calls(below[0])
            return self.mean[lo] + slope * (n - lo)
        hi = above[0]
        return self.mean[hi] * _prior_calls(n) / _prior_calls(hi)


class CallCosts:
    """Per-model call cost models, shared by the --gamma auto controllers of one ensemble.

    Before a model's first measured call its cost is guessed from its parameter count, scaled to
    the measured cost of another model when there is one.
    """

    def __init__(self, n_params: list[int]) -> None:
        self.n_params = [max(1, p) for p in n_params]
        self.models = [_CallCost() for _ in n_params]

    def observe(self, model: int, n_tokens: int, seconds: float) -> None:
        self.models[model].observe(n_tokens, seconds)

    def measured(self, model: int, n_tokens: int) -> bool:
        """Whether calls of this model with this many tokens have been timed."""
        return n_tokens in self.models[model].mean

    def __call__(self, model: int, n_tokens: int) -> float:
        if self.models[model].known:
            return self.models[model](n_tokens)
        known = [k for k, c in enumerate(self.models) if c.known]
        unit = self.models[known[0]](1) / self.n_params[known[0]] if known else 1e-9
        return unit * self.n_params[model] * _prior_calls(n_tokens)

    def ensemble_seconds(self, n_tokens: int) -> float | None:
        """llama.cpp seconds the standard ensemble needs for n_tokens after the prompt: one
        single-token call per model for every token but the first (its row comes with the
        prompt), at the measured single-token call times; None until every model has some."""
        if not all(self.measured(i, 1) for i in range(len(self.models))):
            return None
        return max(n_tokens - 1, 0) * sum(self(i, 1) for i in range(len(self.models)))


# What an extra token in a batch costs, in single-token calls, where a plan cannot wait for
# measurements: on a CPU the step from a matrix-vector to a matrix-matrix call is steep and each
# later row still costs much (0.6-0.7 a row for a Q4_K_M model on an AVX2 CPU, benchmarks/
# batch_cost.py; less with BF16 instructions); planning with the dear end keeps lookup drafts to
# what pays there too. On a GPU an extra row is nearly free.
PLANNED_EXTRA_TOKEN_CPU = 0.7
PLANNED_EXTRA_TOKEN_GPU = PRIOR_EXTRA_TOKEN


class PlannedCosts:
    """Call costs known before any call: a model's parameter count times the calls a batch of n
    tokens is worth where it runs (CPU or GPU). Same interface as `CallCosts`, in arbitrary units.

    Decisions taken on these depend on nothing measured, so a seed still pins the output (choices
    taken on `CallCosts` depend on the machine's timing noise).
    """

    def __init__(self, n_params: list[int], on_gpu: list[bool]) -> None:
        self.n_params = [max(1, p) for p in n_params]
        self.extra = [PLANNED_EXTRA_TOKEN_GPU if gpu else PLANNED_EXTRA_TOKEN_CPU for gpu in on_gpu]

    def __call__(self, model: int, n_tokens: int) -> float:
        return self.n_params[model] * (1.0 + self.extra[model] * (max(n_tokens, 1) - 1))


@dataclass
class AutoGamma:
    """Chooses the default proposer and its proposal length online (``--gamma auto``).

    It keeps the acceptance rate of each proposer's draft tokens and uses `costs`, a model of
    each model's call time against batch size (measured on every llama_decode call); before each
    new draft it takes the (proposer, gamma) with the highest expected tokens per second under
    the method's cost structure, re-evaluated once `rechoose_every` more draft tokens have been
    judged. Choices depend only on the past, so the output distribution stays exact.

    gamma 0 is a choice too: no draft, every model r uses scores the next token (the standard
    ensemble's step). It wins where speculation does not pay (models that disagree, batches that
    cost much more than one token); while it runs, the decoder still measures every model's
    acceptance rate as a proposer (1 - TV(r, q), from the rows it has anyway), so the controller
    returns to speculation as soon as it would pay.
    """

    costs: CallCosts
    used: tuple[bool, ...] | None = None  # the models r depends on (default: all)
    gamma_max: int = 8
    prior_alpha: float = 0.7
    prior_weight: float = 8.0
    decay: float = 0.995
    rechoose_every: float = 16  # draft tokens judged between re-evaluations of a choice
    # speculation is chosen only when expected this much faster than the ensemble's step: the
    # model leaves out the host work that drafting adds (verification, rollbacks), and its cost
    # estimates carry noise; in doubt, the ensemble's step is never slower than itself
    margin: float = 0.03
    accepted: list[float] = field(default_factory=list)
    tested: list[float] = field(default_factory=list)
    judged: float = 0.0  # draft tokens judged so far
    # (method, proposers) -> (`judged` when chosen, the choice)
    choices: dict[tuple, tuple[float, tuple[int, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.n_models = len(self.costs.models)
        self.accepted = [0.0] * self.n_models
        self.tested = [0.0] * self.n_models
        if self.used is None:
            self.used = (True,) * self.n_models

    def observe_verdicts(self, proposer: int, accepted: float, rejected: float) -> None:
        """Verdicts on `proposer`'s draft tokens: counts, or expected counts (an acceptance
        probability measured without drafting)."""
        d = self.decay ** (accepted + rejected)
        self.accepted[proposer] = d * self.accepted[proposer] + accepted
        self.tested[proposer] = d * self.tested[proposer] + accepted + rejected
        self.judged += accepted + rejected

    def alpha(self, proposer: int) -> float:
        return (self.accepted[proposer] + self.prior_alpha * self.prior_weight) / (self.tested[proposer] + self.prior_weight)

    def tokens_per_second(
        self, method: str, proposer: int, gamma: int, cost: Callable[[int, int], float] | None = None
    ) -> float:
        """Expected tokens per second; `cost(model, n_tokens)` defaults to the measured costs."""
        a = self.alpha(proposer)
        cost = cost or self.costs
        assert self.used is not None
        others = [i for i in range(self.n_models) if i != proposer and self.used[i]]
        if method == "cos":
            return self._cos_tokens_per_second(proposer, gamma, cost)
        if method == "naive-cos":
            tokens = expected_tokens(a, gamma)
            seconds = gamma * cost(proposer, 1) + sum(cost(i, gamma) for i in others)
        else:  # sd: the drafter scores its draft again only when r uses it
            tokens = expected_tokens(a, gamma + 1)
            rerun = cost(proposer, gamma) if self.used[proposer] else 0.0
            seconds = gamma * cost(proposer, 1) + rerun + sum(cost(i, gamma + 1) for i in others)
        return tokens / seconds if seconds > 0 else math.inf

    def ensemble_tokens_per_second(self, cost: Callable[[int, int], float] | None = None) -> float:
        """Expected tokens per second of gamma 0: one single-token call of every model r uses."""
        cost = cost or self.costs
        assert self.used is not None
        seconds = sum(cost(i, 1) for i in range(self.n_models) if self.used[i])
        return 1.0 / seconds if seconds > 0 else math.inf

    def _cos_tokens_per_second(
        self, proposer: int, gamma: int, cost: Callable[[int, int], float], horizon: int = 12
    ) -> float:
        """Expected speed of `cos` with `proposer` drafting gamma tokens and the others one (their
        bonus tokens), as a renewal process from one rejection to the next.

        The turn schedule without rejections is deterministic (who evaluates how many tokens in
        each call, which tokens every model has scored and so are verified), so walking it turn by
        turn while tracking the probability that every token verified so far was accepted gives
        the expected seconds and committed tokens of a cycle. That captures what a closed form
        misses with more than two models: bonus tokens from every model, and tokens that wait
        n - 1 turns for their verification (and are wasted by a rejection meanwhile).
        """
        n = self.n_models
        order = [proposer] + [i for i in range(n) if i != proposer]
        # stream index 0 is the token resampled at the last rejection, which no cache holds yet
        have = [0] * n  # stream tokens each model has evaluated
        alphas: list[float] = [1.0]  # per stream token: its proposer's acceptance rate
        verified = 0  # stream index of the newest verified token
        alive = 1.0  # probability that every verified token was accepted
        seconds = tokens = 0.0
        for turn in range(horizon * n):
            m = order[turn % n]
            seconds += alive * cost(m, len(alphas) - have[m])
            have[m] = len(alphas)
            # a token is verified once every model r uses has evaluated the token before it
            newest = min(min(h for h, used in zip(have, self.used or ()) if used), len(alphas) - 1)
            for i in range(verified + 1, newest + 1):
                tokens += alive  # accepted, or rejected and replaced: one token either way
                alive *= alphas[i]
            verified = newest
            drafts = gamma if m == proposer else 1
            seconds += alive * (drafts - 1) * cost(m, 1)  # the first reuses the catch-up row
            have[m] = len(alphas) + drafts - 1
            alphas.extend([self.alpha(m)] * drafts)
            if alive < 1e-3:
                break
        return tokens / seconds if seconds > 0 else math.inf

    def choose(self, method: str, proposers: list[int] | None = None) -> tuple[int, int]:
        """The (proposer, gamma) with the best expected speed; proposers default to all models.
        gamma 0 means: no draft this time, the ensemble's own step.

        A choice is kept until `rechoose_every` more draft tokens have been judged: the estimates
        move slowly, and evaluating every candidate costs about as much as a small model's call.
        """
        key = (method, None if proposers is None else tuple(proposers))
        kept = self.choices.get(key)
        if kept is not None and self.judged - kept[0] < self.rechoose_every:
            return kept[1]
        candidates = proposers if proposers is not None else list(range(self.n_models))
        cost = functools.cache(self.costs.__call__)  # the costs stay fixed during one choice
        best = max(
            (self.tokens_per_second(method, p, g, cost), -g, p) for p in candidates for g in range(1, self.gamma_max + 1)
        )
        choice = (best[2], -best[1])
        if self.ensemble_tokens_per_second(cost) * (1 + self.margin) >= best[0]:
            choice = (best[2], 0)
        self.choices[key] = (self.judged, choice)
        return choice


class AutoGammaControllers:
    """The ``--gamma auto`` controllers of one ensemble: one per sampling setting (acceptance
    depends on it), all sharing the ensemble's call costs. Kept across generations, so the
    controllers keep learning."""

    def __init__(self, costs: CallCosts) -> None:
        self.costs = costs
        self._controllers: dict[tuple, AutoGamma] = {}

    def __len__(self) -> int:
        return len(self._controllers)

    def get(self, key: tuple, used: tuple[bool, ...] | None = None) -> AutoGamma:
        if key not in self._controllers:
            self._controllers[key] = AutoGamma(self.costs, used=used)
        return self._controllers[key]
