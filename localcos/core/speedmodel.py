"""Expected speed of the speculative methods (docs/algorithm.md section 6; CoS paper Theorems 3.1, 3.6),
and the online controller behind ``--gamma auto``.

Notation: alpha is the per-token acceptance rate, gamma the proposal length, c the cost of one
proposer call relative to one verifier call; the standard ensemble pays 1 + c per token.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol


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


# a call split off is counted at this fraction of a one-row call more than its profile says (the
# host's side of a call, and the profiles' noise): a split must save more than that
CALL_OVERHEAD = 0.05
_GROUP_WINDOW = 32  # requests one grouped call holds at most (bounds the search)


@dataclass(frozen=True)
class CallProfile:
    """What one llama_decode call of a model costs, by the rows it evaluates: seconds measured
    for some row counts (`runtime.profile` times them when the model is loaded).

    Call time is not linear in the rows: on a CPU one row runs matrix-vector kernels and two or
    more matrix-matrix ones, and some weight types have kernels for groups of rows (4 rows may
    cost what 2 do). Counts not measured are interpolated between measured neighbours, or
    extrapolated along the slope of the two largest (compute-bound: linear). No rows cost nothing.
    """

    seconds: Mapping[int, float]

    def __post_init__(self) -> None:
        if not self.seconds or 1 not in self.seconds or any(n < 1 or not t > 0 for n, t in self.seconds.items()):
            raise ValueError("a call profile needs positive seconds for 1 row and any others")

    @classmethod
    def flat(cls, seconds: float) -> CallProfile:
        """A model whose calls cost the same whatever their rows (an accelerator's regime)."""
        return cls({1: seconds})

    def __call__(self, n: int) -> float:
        if n <= 0:
            return 0.0
        table = self.seconds
        if n in table:
            return table[n]
        sizes = sorted(table)
        below = [m for m in sizes if m < n]
        above = [m for m in sizes if m > n]
        if below and above:
            lo, hi = below[-1], above[0]
            return table[lo] + (table[hi] - table[lo]) * (n - lo) / (hi - lo)
        if not below:
            return table[sizes[0]]
        lo = below[-1]
        if len(below) < 2:
            return table[lo]
        prev = below[-2]
        return table[lo] + max((table[lo] - table[prev]) / (lo - prev), 0.0) * (n - lo)

    def batch_cost(self, n: int) -> float:
        """b(n): a call of n rows in single-row calls."""
        return self(n) / self(1)

    @functools.cached_property
    def splits_pay(self) -> bool:
        """Whether some call costs more than two calls of its rows (up to twice the largest count
        measured; beyond that the extrapolation is linear): then `group` splits requests."""
        top = 2 * max(self.seconds)
        extra = CALL_OVERHEAD * self(1)
        return any(self(a + b) > self(a) + self(b) + extra for a in range(1, top) for b in range(a, top - a + 1))

    def group(self, tokens: Sequence[int], fits: Callable[[int, int], bool] = lambda i, j: True) -> list[range]:
        """Requests of `tokens` tokens each (in this order) grouped into consecutive calls that cost
        least here, each group one that `fits` (requests i..j-1 within a model's limits; a range
        that fits only holds ranges that fit); every request fits alone. One call for as many as
        fit where a call never costs more than its parts (a GPU, most CPU weight types); where it
        can (two rows of some CPU kernels cost more than two one-row calls), the split that costs
        least, a call counted at `CALL_OVERHEAD` more than its profile."""
        groups: list[range] = []
        if not self.splits_pay:
            start = 0
            for k in range(1, len(tokens)):
                if not fits(start, k + 1):
                    groups.append(range(start, k))
                    start = k
            return groups + ([range(start, len(tokens))] if tokens else [])
        ends = [0]
        for n in tokens:
            ends.append(ends[-1] + n)
        extra = CALL_OVERHEAD * self(1)
        best = [0.0] + [math.inf] * len(tokens)
        cut = [0] * (len(tokens) + 1)
        for k in range(1, len(tokens) + 1):
            first = k - 1
            while first > 0 and k - first < _GROUP_WINDOW and fits(first - 1, k):
                first -= 1
            for j in range(first, k):  # larger calls first: a tie keeps fewer calls
                cost = best[j] + self(ends[k] - ends[j]) + extra
                if cost < best[k]:
                    best[k], cut[k] = cost, j
        k = len(tokens)
        while k:
            groups.append(range(cut[k], k))
            k = cut[k]
        return groups[::-1]

    def least(self, tokens: Sequence[int]) -> float:
        """Seconds of requests of `tokens` tokens each, grouped into calls as `group` does."""
        key = tuple(tokens)
        cost = self._least.get(key)
        if cost is None:
            cost = sum(self(sum(tokens[i] for i in g)) for g in self.group(tokens))
            if len(self._least) < 4096:
                self._least[key] = cost
        return cost

    @functools.cached_property
    def _least(self) -> dict[tuple[int, ...], float]:
        return {}

    def to_dict(self) -> dict[str, float]:
        return {str(n): t for n, t in sorted(self.seconds.items())}

    @classmethod
    def from_dict(cls, data: Mapping[str, float]) -> CallProfile:
        return cls({int(n): float(t) for n, t in data.items()})


# How a plan reads what a model's calls took as they ran (`backend.slot.CallTimes`, which the
# model's `decode` keeps, `corrected`): a measured mean starts from `CALL_PRIOR` calls at the
# profile's own price, and must be beyond `PROFILE_BAND` of that price, and `PROFILE_GAP` seconds
# from it (a call of a model so small that the host's work is most of it says little about the
# model), before a plan takes it. Within them the profile alone decides (its choices then depend
# on nothing timed: on one machine a seed pins the output); beyond them the profile is wrong
# (measured with another job running, at other positions, with other kernels) and the run's own
# calls decide.
CALL_PRIOR = 2.0
PROFILE_BAND = 1.5
PROFILE_GAP = 0.005


class MeasuredCalls(Protocol):
    """What one model's calls took, by rows per call (decayed counts and seconds)."""

    calls: dict[int, float]
    seconds: dict[int, float]

    def mean(self, rows: int) -> float | None: ...


def corrected(profile: CallProfile, measured: MeasuredCalls, pace: float = 1.0) -> CallProfile:
    """`profile` as the calls measured it (`MeasuredCalls`, their seconds divided by `pace`, the
    machine's own pace against the profiles: a slowdown every model's calls share changes no
    choice), or `profile` itself where every row count measured costs within `PROFILE_BAND` of
    its price (or `PROFILE_GAP` seconds). Corrected, a measured count costs its measured mean
    (from `CALL_PRIOR` calls at the profile's price); a count below every
    measured one, its price, or the smallest measured count's mean where that is less (in doubt,
    the ensemble's one-row step is priced low, the drafts' larger calls high); above the largest,
    the measured slope goes on (where only one count was measured, the profile's prices scaled as
    it)."""
    means = {n: (measured.seconds[n] / pace + CALL_PRIOR * profile(n)) / (c + CALL_PRIOR) for n, c in measured.calls.items() if c > 0}
    if all(1 / PROFILE_BAND <= mean / profile(n) <= PROFILE_BAND or abs(mean - profile(n)) < PROFILE_GAP for n, mean in means.items()):
        return profile
    low, high = min(means), max(means)
    points = dict(means)
    points.update({n: min(profile(n), means[low]) for n in profile.seconds if n < low})
    if len(points) < 2:
        points.update({n: profile(n) * means[high] / profile(high) for n in profile.seconds if n > high})
    return CallProfile(points)


class Costs:
    """The call costs of an ensemble's models, from their profiles: `costs(model, rows)` in
    seconds. `under_load(rows)` is the view of one sequence among others whose calls already hold
    `rows[model]` rows of other sequences, one token each: the whole call less the others' share
    of a call where this sequence adds one row. Ranking choices by tokens per second in that view
    ranks them by the throughput of all the sequences together: a draft pays under load only when
    its rows add less to the call than the tokens they bring are worth at the current rate.

    `measured`, what each model's calls took (`MeasuredCalls`), corrects a profile where they
    cost beyond `PROFILE_BAND` of its price (`current`): the plans then follow what calls cost."""

    def __init__(self, profiles: Sequence[CallProfile], load: Sequence[int] = (), measured: Sequence[MeasuredCalls | None] = ()) -> None:
        self.profiles = list(profiles)
        self.load = tuple(load) or (0,) * len(self.profiles)
        self.measured = tuple(measured) or (None,) * len(self.profiles)

    @property
    def n_models(self) -> int:
        return len(self.profiles)

    def current(self) -> Costs:
        """These costs with each profile corrected by what its model's calls measured (a profile
        the calls agree with, within `PROFILE_BAND`, is kept as it is), at the machine's pace:
        the geometric mean over the models of their one-row calls' measured mean against the
        price (another job slowing every call alike is no reason to plan otherwise)."""
        means = [(None if m is None else m.mean(1), p(1)) for p, m in zip(self.profiles, self.measured)]
        singles = [mean / price for mean, price in means if mean is not None]
        pace = math.exp(sum(math.log(r) for r in singles) / len(singles)) if singles else 1.0
        profiles = [p if m is None else corrected(p, m, pace) for p, m in zip(self.profiles, self.measured)]
        return Costs(profiles, self.load, self.measured)

    def one_row(self, model: int) -> float | None:
        """A one-row call of `model` as its calls measured it (its profile's price where calls are
        not measured: fakes, a profile given to plan with; None before one was made)."""
        measured = self.measured[model]
        return self.profiles[model](1) if measured is None else measured.mean(1)

    def __call__(self, model: int, n_tokens: int) -> float:
        profile, others = self.profiles[model], self.load[model]
        if n_tokens <= 0 or not others:
            return profile(n_tokens)
        # the calls the scheduler makes of the others' rows and these (`CallProfile.group`)
        share = others * profile.least((1,) * (others + 1)) / (others + 1)
        return max(profile.least((1,) * others + (n_tokens,)) - share, 1e-3 * profile(1))

    def under_load(self, rows: Sequence[int]) -> Costs:
        return Costs(self.profiles, rows, self.measured)

    def ensemble_seconds(self, n_tokens: int) -> float | None:
        """llama.cpp seconds the standard ensemble needs for n_tokens after the prompt: one
        single-row call per model for every token but the first (its row comes with the prompt),
        at what one-row calls measured (None where a model made none yet: no estimate rests on a
        profile the calls may not agree with)."""
        singles = [self.one_row(i) for i in range(self.n_models)]
        return None if None in singles else max(n_tokens - 1, 0) * sum(s for s in singles if s is not None)


# Tuning shared by both auto plans (`AutoGamma`, `ByteAutoGamma`): acceptance varies widely from
# prompt to prompt, so estimates forget (a decay of 0.98 remembers ~50 verdicts and follows a new
# prompt within a few drafts); a prior of a few verdicts keeps the first choices sane; a choice
# is kept a few draft tokens (or rounds) because the estimates move slowly. Speculation is chosen
# only when expected `MARGIN` faster than the ensemble's step: the cost models leave out the host
# work drafting adds (verification, rollbacks, more rows to copy and normalise), so measured
# speedups run below the estimate at the same acceptance.
DECAY = 0.98
PRIOR_ALPHA = 0.7
PRIOR_WEIGHT = 8.0
MARGIN = 0.08
RECHOOSE_EVERY = 8


@dataclass
class Acceptance:
    """How often one proposer's drafts are accepted: verdict counts that decay by `decay` per
    verdict, read with a prior of `prior_weight` verdicts at `prior_alpha` (which never decays,
    so a few unlucky verdicts cannot drive the estimate to 0). The one estimator behind both auto
    plans and lookup drafts."""

    decay: float = DECAY
    prior_alpha: float = PRIOR_ALPHA
    prior_weight: float = PRIOR_WEIGHT
    accepted: float = 0.0
    tested: float = 0.0

    def observe(self, accepted: float, rejected: float) -> None:
        """Verdicts: counts, or expected counts (an acceptance probability measured without
        drafting)."""
        d = self.decay ** (accepted + rejected)
        self.accepted = d * self.accepted + accepted
        self.tested = d * self.tested + accepted + rejected

    @property
    def alpha(self) -> float:
        return (self.accepted + self.prior_alpha * self.prior_weight) / (self.tested + self.prior_weight)


@dataclass
class AutoGamma:
    """Chooses the default proposer and its proposal length online (``--gamma auto``).

    It keeps the acceptance rate of each proposer's draft tokens and uses `costs`, each model's
    call time against the rows of the call (its measured profile); before each new draft it
    takes the (proposer, gamma) with the highest expected tokens per second under the method's
    cost structure, re-evaluated once `rechoose_every` more draft tokens have been judged. With
    other sequences in the same calls (`others` rows per call), it prices a draft at what its
    rows add to those calls, so under load it backs off to the ensemble's step where drafts stop
    paying. Choices depend only on the past: the output distribution stays exact. Where the
    calls cost what the profiles say (within `PROFILE_BAND`), they depend on nothing timed, and
    on one machine the same requests in the same order give the same output; where they do not,
    the profiles are corrected by what the calls measured (`Costs.current`).

    gamma 0 is a choice too: no draft, every model r uses scores the next token (the standard
    ensemble's step). It wins where speculation does not pay (models that disagree, batches that
    cost much more than one token); while it runs, the decoder still measures every model's
    acceptance rate as a proposer (1 - TV(r, q), from the rows it has anyway), so the controller
    returns to speculation as soon as it would pay.
    """

    costs: Costs
    used: tuple[bool, ...] | None = None  # the models r depends on (default: all)
    gamma_max: int = 8
    rechoose_every: float = RECHOOSE_EVERY  # draft tokens judged between re-evaluations of a choice
    # it also prices rows at an empty cache's positions; in doubt, the ensemble's step is never
    # slower than itself
    margin: float = MARGIN
    acceptance: list[Acceptance] = field(default_factory=list)  # each proposer's
    judged: float = 0.0  # draft tokens judged so far
    # (method, proposers) -> (`judged` when chosen, the choice)
    choices: dict[tuple, tuple[float, tuple[int, int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.n_models = self.costs.n_models
        self.acceptance = [Acceptance() for _ in range(self.n_models)]
        if self.used is None:
            self.used = (True,) * self.n_models

    def observe_verdicts(self, proposer: int, accepted: float, rejected: float) -> None:
        """Verdicts on `proposer`'s draft tokens: counts, or expected counts (an acceptance
        probability measured without drafting)."""
        self.acceptance[proposer].observe(accepted, rejected)
        self.judged += accepted + rejected

    def alpha(self, proposer: int) -> float:
        return self.acceptance[proposer].alpha

    def tokens_per_second(
        self, method: str, proposer: int, gamma: int, cost: Callable[[int, int], float] | None = None
    ) -> float:
        """Expected tokens per second; `cost(model, n_tokens)` defaults to the profiled costs."""
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
        used = [i for i in range(n) if self.used is None or self.used[i]]
        # what the walk reads per model, read once (the estimates do not move during it)
        alpha = [self.alpha(i) for i in range(n)]
        one_row = [cost(i, 1) for i in range(n)]
        # stream index 0 is the token resampled at the last rejection, which no cache holds yet
        have = [0] * n  # stream tokens each model has evaluated
        alphas: list[float] = [1.0]  # per stream token: its proposer's acceptance rate
        verified = 0  # stream index of the newest verified token
        alive = 1.0  # probability that every verified token was accepted
        seconds = tokens = 0.0
        for turn in range(horizon * n):
            m = order[turn % n]
            streamed = len(alphas)
            seconds += alive * cost(m, streamed - have[m])
            have[m] = streamed
            # a token is verified once every model r uses has evaluated the token before it
            newest = min(min([have[i] for i in used]), streamed - 1)
            for i in range(verified + 1, newest + 1):
                tokens += alive  # accepted, or rejected and replaced: one token either way
                alive *= alphas[i]
            verified = newest
            drafts = gamma if m == proposer else 1
            seconds += alive * (drafts - 1) * one_row[m]  # the first reuses the catch-up row
            have[m] = streamed + drafts - 1
            alphas.extend([alpha[m]] * drafts)
            if alive < 1e-3:
                break
        return tokens / seconds if seconds > 0 else math.inf

    def choose(
        self, method: str, proposers: list[int] | None = None, others: int = 0, lag: Sequence[int] = (), remaining: int = 0
    ) -> tuple[int, int]:
        """The (proposer, gamma) with the best expected speed; proposers default to all models.
        gamma 0 means: no draft this time, the ensemble's own step. `others`: the rows other
        sequences put into each call of every model (0: this sequence decodes alone). `lag`: the
        tokens each model r does not use lacks (one that has read nothing lacks its prompt);
        a choice that sets such a model to work pays its catch-up once, beyond the one-row call
        a round prices, which the drafts must repay over the `remaining` tokens at most.

        A choice is kept until `rechoose_every` more draft tokens have been judged: the estimates
        move slowly, and evaluating every candidate costs about as much as a small model's call.
        """
        key = (method, None if proposers is None else tuple(proposers), others)
        kept = self.choices.get(key)
        if kept is not None and self.judged - kept[0] < self.rechoose_every:
            return kept[1]
        candidates = proposers if proposers is not None else list(range(self.n_models))
        current = self.costs.current()  # the profiles, corrected where the calls measured otherwise
        costs = current.under_load([others] * self.n_models) if others else current
        cost = functools.cache(costs.__call__)

        def catch_up(proposer: int) -> float:
            """The one-off cost of the lagging models a choice of `proposer` sets to work (cos:
            every model takes turns; otherwise the proposer alone of those r does not use)."""
            working = range(len(lag)) if method == "cos" else (proposer,) if lag else ()
            return sum(cost(i, lag[i]) - cost(i, 1) for i in working if lag[i] > 1)

        def speed(proposer: int, gamma: int) -> float:
            tokens_per_second = self.tokens_per_second(method, proposer, gamma, cost)
            once = catch_up(proposer)
            if once <= 0:
                return tokens_per_second
            return remaining / (remaining / tokens_per_second + once) if remaining > 0 else 0.0

        best = max((speed(p, g), -g, p) for p in candidates for g in range(1, self.gamma_max + 1))
        choice = (best[2], -best[1])
        if self.ensemble_tokens_per_second(cost) * (1 + self.margin) >= best[0]:
            choice = (best[2], 0)
        self.choices[key] = (self.judged, choice)
        return choice


@dataclass
class ByteAutoGamma:
    """Chooses, before each round of byte-level cos (``--byte-gamma auto``), whether to draft and
    who drafts how many bytes, from each model's measured call costs (`costs`) and what the
    generation has seen so far. Counted, never timed: the same prompt and seed give the same text
    on one machine.

    At the byte level a model calls llama.cpp only where one of its tokenisations reaches a token
    boundary, so the ensemble's step already costs each model about one call of a few rows per
    token of its own. A draft of g bytes by P costs P what the ensemble would for those bytes;
    each other model V scores them in one call over its likely tokenisations (its rows per draft
    byte, as measured in earlier scoring calls, plus the rows the call missed, each in a call of
    its own); a rejection (probability 1 - alpha^g) costs every model the residual byte as well.
    The draft brings expected_tokens(alpha, g) bytes. Where a call of k rows costs about k calls of
    one (a compute-bound CPU) this never beats the ensemble's step, and gamma 0 (that step) is
    chosen; where rows are cheap (an accelerator) drafts pay.

    alpha, each proposer's per-byte acceptance, comes from verdicts on its drafts and, at every
    ensemble step, from the distributions at hand (the probability min(q, r) summed, what its
    draft byte would have been accepted with), so the controller knows when drafting would pay
    before it drafts. Estimates decay, following a new prompt within a few dozen bytes.
    """

    costs: Costs
    gamma_max: int = 16
    margin: float = MARGIN  # as AutoGamma's: host work the model leaves out
    decay: float = DECAY  # the cost estimates' (acceptance decays as `Acceptance` does)
    prior_weight: float = PRIOR_WEIGHT  # bytes of evidence the cost priors weigh
    prior_calls_per_byte: float = 0.3  # about one call per token of 3-4 bytes
    prior_rows_per_call: float = 1.5
    prior_ahead_per_byte: float = 0.5  # a scoring call's rows per draft byte
    prior_missed_per_byte: float = 0.05
    rechoose_every: int = RECHOOSE_EVERY  # rounds a choice is kept
    round_decay: float = 0.9  # drafted rounds are few: their costs follow the last ten or so

    def __post_init__(self) -> None:
        n = self.costs.n_models
        w = self.prior_weight
        self.acceptance = [Acceptance() for _ in range(n)]  # each proposer's, per byte
        self.bytes = [w] * n  # bytes advanced outside drafts' scoring, and the calls and rows they took
        self.calls = [self.prior_calls_per_byte * w] * n
        self.rows = [self.prior_calls_per_byte * self.prior_rows_per_call * w] * n
        self.scored = [w] * n  # draft bytes scored as a verifier, the rows evaluated ahead and missed
        self.ahead = [self.prior_ahead_per_byte * w] * n
        self.missed = [self.prior_missed_per_byte * w] * n
        # rounds drafted: their estimated and their priced cost, each proposer's (the ratio
        # corrects the estimate; a prior of two rounds as estimated)
        self.planned = [2.0] * n
        self.spent = [2.0] * n
        self.could_pay = True  # whether a draft could beat the ensemble's step at all (acceptance 1)
        self._kept: tuple[tuple | None, int, tuple[int, int]] | None = None  # (candidates, rounds since, choice)

    @staticmethod
    def _mix(total: list[float], i: int, value: float, d: float) -> None:
        total[i] = d * total[i] + value

    def observe_advance(self, model: int, n_bytes: int, calls: int, rows: int) -> None:
        """`model` advanced `n_bytes` bytes the usual way, in `calls` calls of `rows` rows in all."""
        d = self.decay**n_bytes
        for total, value in ((self.bytes, n_bytes), (self.calls, calls), (self.rows, rows)):
            self._mix(total, model, value, d)

    def observe_scoring(self, model: int, n_bytes: int, ahead: int, missed: int) -> None:
        """`model` scored a draft of `n_bytes` bytes: `ahead` rows in its scoring call, `missed`
        rows evaluated after it."""
        d = self.decay**n_bytes
        for total, value in ((self.scored, n_bytes), (self.ahead, ahead), (self.missed, missed)):
            self._mix(total, model, value, d)

    def observe_verdicts(self, proposer: int, accepted: float, rejected: float) -> None:
        """Verdicts on `proposer`'s draft bytes: counts, or an expected count (a probability of
        acceptance measured without drafting)."""
        self.acceptance[proposer].observe(accepted, rejected)

    def alpha(self, proposer: int) -> float:
        return self.acceptance[proposer].alpha

    def _cost(self, model: int, rows: float) -> float:
        """A call of `rows` rows (fractional: between the two counts around it)."""
        lo = max(int(math.floor(rows)), 1)
        frac = max(rows - lo, 0.0)
        return (1 - frac) * self.costs(model, lo) + frac * self.costs(model, lo + 1) if frac else self.costs(model, lo)

    def byte_seconds(self, model: int) -> float:
        """What one byte costs `model` when it advances the usual way."""
        calls = self.calls[model] / self.bytes[model]
        return calls * self._cost(model, max(self.rows[model] / max(self.calls[model], 1e-9), 1.0))

    def ensemble_bytes_per_second(self) -> float:
        seconds = sum(self.byte_seconds(i) for i in range(self.costs.n_models))
        return 1.0 / seconds if seconds > 0 else math.inf

    def cos_bytes_per_second(self, proposer: int, gamma: int, alpha: float | None = None) -> float:
        """Expected bytes per second of rounds where `proposer` drafts `gamma` bytes (at its
        measured acceptance, or `alpha`), the estimate corrected by what such rounds cost."""
        a = self.alpha(proposer) if alpha is None else alpha
        seconds = self.round_seconds(proposer, gamma, a) * self.spent[proposer] / self.planned[proposer]
        return expected_tokens(a, gamma) / seconds if seconds > 0 else math.inf

    def round_seconds(self, proposer: int, gamma: int, alpha: float | None = None) -> float:
        """The estimate of what a round where `proposer` drafts `gamma` bytes costs, in seconds
        of the models' profiles."""
        a = self.alpha(proposer) if alpha is None else alpha
        seconds = gamma * self.byte_seconds(proposer)
        for v in range(self.costs.n_models):
            if v == proposer:
                continue
            rows = max(gamma * self.ahead[v] / self.scored[v], 1.0)
            seconds += self._cost(v, rows) + gamma * self.missed[v] / self.scored[v] * self.costs(v, 1)
        seconds += (1 - a**gamma) * sum(self.byte_seconds(i) for i in range(self.costs.n_models))
        return seconds

    def observe_round(self, proposer: int, planned: float, spent: float) -> None:
        """A round `proposer` drafted was estimated at `planned` seconds and its calls cost
        `spent` (priced at the same profiles): the work the estimate leaves out (sequences
        evaluated again after a rollback, rows a replay missed beyond the average, the proposer's
        rejected bytes) corrects its next estimates. Counted, not timed."""
        self._mix(self.planned, proposer, planned, self.round_decay)
        self._mix(self.spent, proposer, spent, self.round_decay)

    def choose(self, proposers: Sequence[int] | None = None) -> tuple[int, int]:
        """(proposer, gamma) with the best expected speed; gamma 0: the ensemble's step. A
        choice is kept for `rechoose_every` rounds."""
        key = None if proposers is None else tuple(proposers)
        if self._kept is not None and self._kept[0] == key and self._kept[1] < self.rechoose_every:
            self._kept = (key, self._kept[1] + 1, self._kept[2])
            return self._kept[2]
        candidates = range(self.costs.n_models) if proposers is None else proposers
        bar = self.ensemble_bytes_per_second() * (1 + self.margin)
        lengths = range(1, self.gamma_max + 1)
        self.could_pay = max(self.cos_bytes_per_second(p, g, alpha=1.0) for p in candidates for g in lengths) > bar
        choice = (candidates[0], 0)
        if self.could_pay:
            best = max((self.cos_bytes_per_second(p, g), -g, p) for p in candidates for g in lengths)
            choice = (best[2], -best[1] if best[0] > bar else 0)
        self._kept = (key, 1, choice)
        return choice
