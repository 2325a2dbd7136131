"""The decoding methods over one `Decoder` (`core.decoding`): the standard ensemble, SD,
Naive-CoS, CoS and the context as the only proposer; each a small class whose `step()` is one
round of its loop, yielding the model calls it needs. And how a request's method, proposer and
proposal lengths become one of them (`choose_strategy`, `make_strategy`).

The algorithms are stated in docs/algorithm.md (sections 2-5, 9, 11; CoS paper, Fu et al. 2025).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence

import numpy as np

from .decoding import Decoder, Evaluate, Origin, Phase, Step, Together
from .sizes import cheapest

class Strategy:
    """One decoding method; `step()` is one round of its loop (a generator of its requests)."""

    name = "strategy"

    def __init__(self, dec: Decoder) -> None:
        self.dec = dec

    def step(self) -> Step:
        raise NotImplementedError


def verify_with_bonus(dec: Decoder) -> Step:
    """The target pass of a draft: every model r needs scores the pending tokens (one batched call
    each), they are verified against r, and a fully accepted draft earns a bonus token from r at
    the position after it."""
    yield from dec.consult(phase=Phase.VERIFYING)
    if dec.verify_pending(len(dec.pending)) or dec.finished:
        return
    r = dec.combined([len(dec.committed)])[0]
    dec.commit([dec.sampler.draw(r, dec.rng)], [Origin("bonus")])


def ensemble_step(dec: Decoder) -> Step:
    """One token the standard way: every model r needs evaluates it (with a gate: the others only
    where it opens); the token is drawn from r.

    Under --gamma auto (an observer is set) this also measures, for free, how often each model
    would have its draft token accepted here: alpha_i = sum_y min(r(y), q_i(y)) = 1 - TV(r, q_i),
    from rows the step has anyway, so the controller knows when speculation would pay again.
    """
    position = len(dec.committed)
    yield from dec.consult()
    r = dec.combined([position])[0]
    token = dec.sampler.draw(r, dec.rng)
    if dec.observer is not None:
        for i, used in enumerate(dec.used):
            if not used or position not in dec.rows[i]:  # a member the gate left out
                continue
            if dec.sampler.greedy:  # one-hot r and q: accepted iff the model's argmax is r's
                alpha = float(int(np.argmax(dec.rows[i][position])) == token)
            else:
                alpha = min(1.0, float(np.minimum(r, dec.own(i, position)).sum(dtype=np.float64)))
            dec.observer.observe_verdicts(i, alpha, 1.0 - alpha)
    dec.commit([token], [Origin("sample")])


class EnsembleDecoding(Strategy):
    """Standard collaborative decoding: every model evaluates every token; sample from r."""

    name = "ensemble"

    def step(self) -> Step:
        yield from ensemble_step(self.dec)


class _DrafterStrategy(Strategy):
    """A method with one drafter and proposal length gamma (with --gamma auto: both chosen
    before every draft by the decoder's observer)."""

    def __init__(self, dec: Decoder, drafter: int, gamma: int, auto: bool = False) -> None:
        super().__init__(dec)
        self.drafter = drafter
        self.gamma = gamma
        self.auto = auto

    def choose(self) -> bool:
        """Pick drafter and gamma (--gamma auto); False when this round is an ensemble step."""
        dec = self.dec
        if self.auto and dec.observer is not None:
            self.drafter, self.gamma = dec.observer.choose(self.name, others=dec.others(), lag=dec.lags(), remaining=dec.budget())
            dec.speculation.planned(self.drafter, self.gamma)
            if self.gamma == 0:
                return False
        return True


class SpeculativeDecoding(_DrafterStrategy):
    """`sd`: the drafter proposes gamma tokens; the whole ensemble, drafter included, scores the
    draft in one batched pass each and verifies it against r; a bonus token from r follows a
    fully accepted draft. The target is treated as a black box, so the drafter re-runs its draft
    in its target role; when r does not use the drafter (weight 0: plain speculative decoding of
    the other models), it does not."""

    name = "sd"

    def step(self) -> Step:
        if not self.choose():
            yield from ensemble_step(self.dec)
            return
        dec, d = self.dec, self.drafter
        n0 = len(dec.committed)
        yield from dec.draft(d, min(self.gamma, dec.budget() - 1))
        if dec.used[d]:
            # target pass: the drafter forgets its draft and scores it again, batched, like the others
            dec.rollback_model(d, n0)
        yield from verify_with_bonus(dec)


class NaiveCoS(_DrafterStrategy):
    """`naive-cos`: like sd, but the drafter's draft-time distributions are its share of r (no
    re-run) and there is no bonus token; the others score the draft positions only."""

    name = "naive-cos"

    def step(self) -> Step:
        if not self.choose():
            yield from ensemble_step(self.dec)
            return
        dec, d = self.dec, self.drafter
        yield from dec.draft(d, min(self.gamma, dec.budget()))
        upto = len(dec.committed) + len(dec.pending) - 1  # rows at the draft positions, no further
        yield from dec.consult(upto, Phase.VERIFYING)  # the drafter has its rows there
        dec.verify_pending(len(dec.pending))


class CoS(Strategy):
    """`cos`: the alternate proposal framework (2 models) and its n-model generalisation.

    Models take turns in `order` (the default proposer first). On its turn a model scores, in one
    batched pass, every token it has not evaluated; the oldest pending tokens that every model has
    now scored are verified against r; then, unless that rejected something, the model proposes:
    its first token comes from the distribution after the last pending token (a *bonus* when it
    just scored others' drafts), then gamma_i - 1 more. A rejection commits the residual sample,
    discards all pending tokens, rolls back every cache and hands the turn to the default proposer.
    With two models this is exactly Algorithm 1 of the paper; with n models, Algorithm 2.
    With --gamma auto, the default proposer and its gamma are chosen at the start of each cycle.
    """

    name = "cos"

    def __init__(self, dec: Decoder, order: Sequence[int], gammas: Sequence[int], auto: bool = False) -> None:
        super().__init__(dec)
        self.order = list(order)
        self.gammas = list(gammas)
        self.turn = 0
        self.auto = auto

    def step(self) -> Step:
        dec = self.dec
        n = len(dec.slots)
        if self.auto and self.turn == 0 and dec.observer is not None:
            # at a cycle's start the plan is made; within one (no rejection ends a cycle where
            # drafts are always accepted) it is looked at again only to stop drafting
            proposer, gamma = dec.observer.choose("cos", others=dec.others(), lag=dec.lags(), remaining=dec.budget())
            dec.speculation.planned(proposer, gamma)
            if gamma == 0:  # no model drafts: the drafts pending, or what the cells held after the prompt, verified in one call
                yield from verify_with_bonus(dec) if dec.pending or dec.lookup_draft(None, held_only=True) else ensemble_step(dec)
                return
            if not dec.pending:
                self.order = [proposer] + [m for m in range(n) if m != proposer]
                self.gammas = [gamma if m == proposer else 1 for m in range(n)]
        i = self.order[self.turn]
        dec.lookup_draft(i)  # looked-up tokens ride along in the call this model makes anyway
        scored_others = bool(dec.pending)
        yield from dec.catch_up(i, phase=Phase.VERIFYING if scored_others else Phase.DRAFTING)
        k = dec.scored_by_all()
        if k and dec.verify_pending(k):
            self.turn = 0
            return
        if dec.finished:
            return
        yield from dec.draft(i, min(self.gammas[i], dec.draft_room()), bonus=scored_others)
        self.turn = (self.turn + 1) % len(self.order)


class LookupDecoding(Strategy):
    """`--proposer lookup`: the context is the only proposer. When it holds a continuation of the
    text (`core.lookup`), every model r uses scores those tokens in one batched call and they are
    verified against r, a fully accepted draft earning a bonus token from r at the position after
    it; without one (or when it would not pay), the ensemble's own step."""

    name = "lookup"

    def step(self) -> Step:
        dec = self.dec
        if dec.lookup_draft(None) == 0:
            yield from ensemble_step(dec)
            return
        yield from verify_with_bonus(dec)


class Lookahead(Strategy):
    """Greedy decoding of r that looks ahead where r is unsure (AdaDec, He et al. 2025): at a
    position whose top probability under r is below `threshold`, the `candidates` likeliest
    tokens each start a branch, and every branch is rolled out `length` tokens greedily under r,
    side by side: each step one call per model holding one row per branch (llama.cpp sequences
    beside the completion's, sharing its cells). The branch whose tokens r gives the highest mean
    log-probability is kept: the completion's sequence takes its cells, its rolled-out tokens are
    committed too (no call wasted), and every branch's sequence is emptied; of equal scores the
    likelier first token wins. A branch ends at an end token. Elsewhere, and where fewer than two tokens
    may still come, the ensemble's greedy step: where r is sure the text is greedy decoding's.

    Exact in its own terms: every choice is the greedy choice of r or of the branches' scores
    (docs/algorithm.md, section 13)."""

    name = "lookahead"

    def __init__(self, dec: Decoder, candidates: int, length: int, threshold: float) -> None:
        super().__init__(dec)
        self.candidates = candidates
        self.length = length
        self.threshold = threshold

    def step(self) -> Step:
        dec = self.dec
        position = len(dec.committed)
        yield from dec.consult()
        r = dec.distribution(position)
        if float(r.max()) >= self.threshold or dec.budget() < 2:
            dec.commit([dec.sampler.draw(dec.combined([position])[0], dec.rng)], [Origin("sample")])
            return
        members = [i for i, used in enumerate(dec.used) if used]
        yield from dec.catch_up_members(members)  # a gate's lazy members too: every branch starts from the committed tokens
        first = top_tokens(r, self.candidates)
        branches = [[int(t)] for t in first]
        scores = np.log(r[first].astype(np.float64))
        dec.branches.out(len(first))
        live = [j for j, t in enumerate(first) if not dec.is_end(int(t))]
        for _ in range(min(self.length, dec.budget() - 1)):
            if not live:
                break
            requests = tuple(Evaluate(i, [branches[j][-1]], 1, Phase.LOOKAHEAD, branch=j + 1) for i in members for j in live)
            answers = yield Together(requests)
            rows: list[np.ndarray | None] = [None] * len(dec.used)
            for n, i in enumerate(members):
                rows[i] = np.concatenate(answers[n * len(live) : (n + 1) * len(live)])
            r_rows = dec.branch_rows(rows)
            chosen = np.argmax(r_rows, axis=1)
            for row, (j, token) in enumerate(zip(live, chosen.tolist())):
                branches[j].append(token)
                scores[j] += np.log(np.float64(r_rows[row, token]))
            live = [j for j in live if not dec.is_end(branches[j][-1])]
        best = int(np.argmax(scores / np.array([len(b) for b in branches])))
        dec.branches.keep(best + 1)
        dec.commit(branches[best], [Origin("lookahead" if best else "sample")] * len(branches[best]))


def top_tokens(r: np.ndarray, k: int) -> np.ndarray:
    """The k likeliest tokens of distribution `r`, likeliest first (of equals, the lower id)."""
    k = min(k, r.shape[-1])
    top = np.argpartition(-r, k - 1)[:k]
    return top[np.lexsort((top, -r[top]))]


# --- choosing a strategy ---------------------------------------------------------------------------


def proposal_lengths(gamma: int | Sequence[int], proposer: int, n_models: int) -> list[int]:
    """Proposal length per model: one value sets the proposer's (the others propose 1, their bonus
    token); one per model sets all (their count is the settings layer's to check)."""
    if isinstance(gamma, (int, np.integer)):
        return [int(gamma) if i == proposer else 1 for i in range(n_models)]
    if len(gamma) == 1:
        return [int(gamma[0]) if i == proposer else 1 for i in range(n_models)]
    return [int(g) for g in gamma]


@dataclass(frozen=True)
class StrategyChoice:
    """The decoding method a generation runs and its shape: the default proposer and the proposal
    lengths (None for the standard ensemble and for the context as the only proposer), and
    whether the proposer and its gamma are planned as it goes (--gamma auto)."""

    method: str
    proposer: int | None = None
    gammas: tuple[int, ...] | None = None
    auto: bool = False
    lookup_only: bool = False  # --proposer lookup: drafts come from the context only
    lookahead: tuple[int, int] | None = None  # greedy, method ensemble: (candidates, tokens each rolls out)
    lookahead_threshold: float = 0.5

    @property
    def models_draft(self) -> bool:
        """Whether models propose drafts (sd, naive-cos, cos): then any member may draft, whether
        or not r uses it (a model r gives no weight drafting for the others is speculative
        decoding)."""
        return self.method != "ensemble" and not self.lookup_only

    @property
    def lookup_in_cos(self) -> bool:
        """Whether looked-up drafts may ride along (cos, or the context as the proposer)."""
        return self.method == "cos" or self.lookup_only


def choose_strategy(method: str, gamma: int | Sequence[int] | str | None, proposer: int | str | None, n_params: Sequence[int],
                    lookahead: tuple[int, int] | None = None, threshold: float = 0.5) -> StrategyChoice:  # fmt: skip
    """The strategy of `method` for models of these sizes (the settings are checked already):
    the default proposer is the cheapest model; gamma "auto" (the default, also for None) is
    planned before each draft, a fixed gamma is taken as it is; the ensemble's step with
    `lookahead` (candidates, length) looks ahead below `threshold`."""
    if method == "ensemble":
        return StrategyChoice(method, lookahead=lookahead, lookahead_threshold=threshold)
    auto = gamma is None or gamma == "auto"
    if proposer == "lookup":
        return StrategyChoice(method, auto=auto, lookup_only=True)
    proposer = cheapest(n_params) if proposer is None else int(proposer)
    # auto's first plan replaces these before any draft
    gammas = [1] * len(n_params) if auto else proposal_lengths(gamma, proposer, len(n_params))  # type: ignore[arg-type]
    if method in ("sd", "naive-cos"):
        return StrategyChoice(method, proposer, (gammas[proposer],), auto)
    return StrategyChoice(method, proposer, tuple(gammas), auto)


def make_strategy(dec: Decoder, choice: StrategyChoice) -> Strategy:
    """The strategy object that runs `choice` over `dec`."""
    if choice.method == "ensemble":
        if choice.lookahead is not None:
            return Lookahead(dec, *choice.lookahead, choice.lookahead_threshold)
        return EnsembleDecoding(dec)
    if choice.lookup_only:
        return LookupDecoding(dec)
    assert choice.proposer is not None and choice.gammas is not None
    if choice.method == "sd":
        return SpeculativeDecoding(dec, choice.proposer, choice.gammas[0], choice.auto)
    if choice.method == "naive-cos":
        return NaiveCoS(dec, choice.proposer, choice.gammas[0], choice.auto)
    n = len(choice.gammas)
    order = [choice.proposer] + [i for i in range(n) if i != choice.proposer]
    return CoS(dec, order, choice.gammas, choice.auto)
