"""The state every decoding method shares (the methods themselves: `core.strategies`).

`Decoder` holds the state of one completion and the operations every strategy is made of:
catching a model up on the tokens its KV cache lacks (one batched llama_decode), the combined
distribution r at given positions, proposing a draft token, verifying pending drafts (the one
verifier in `verify.py`), committing tokens (stop conditions, text), and rolling every KV cache
back after a rejection.

A constraint (structured output, `localcos.grammar`; the cursor's token healed, `core.healing`) is
a token mask that depends on the tokens so far: it is applied to r (renormalised) and to every proposer's distribution at every draft
position, the matcher following the committed and pending tokens and rolling back with them
(`core.constrained`), so the accept/residual step is exact for the constrained r, for every
method.

The core never calls llama.cpp itself: a step is a generator that yields an `Evaluate` (model i,
these tokens, logits for the last n) wherever it needs a model's logits, and receives them. A
driver fulfils the request: at once for one completion (`Ensemble.stream`), or together with
other completions' requests to the same model in one llama_decode call (`core.batch`). Which rows
share a call never changes what is sampled.

Positions: the token at position p is predicted by the logits a model computes after evaluating
token p-1; we call those logits the model's *row* at p. A model whose cache holds n tokens has
its row at every position up to n that decoding still needs.

State invariant (the tests check it every round: `localcos.testing.invariants`): every model's cache holds a prefix of
`committed + pending` (the committed tokens, then provisional draft tokens it has evaluated);
rejected tokens never stay in any cache.

The algorithms are stated in docs/algorithm.md (sections 2-5; CoS paper, Fu et al. 2025).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Generator, Sequence
from collections.abc import Set as AbstractSet

import numpy as np

from .branches import Branches
from .combiners import BoundCombiner
from .constrained import SequenceConstraint, TokenMatcher
from .lookup import LookupState
from .sampling import Sampler, softmax
from .speedmodel import AutoGamma, Costs
from .text import ENDS, TextAssembler
from .verify import verify

if TYPE_CHECKING:  # a model's sequence, as the core reads it: its tokens, truncate(n), name
    from ..backend import Slot

METHODS = ("ensemble", "sd", "naive-cos", "cos")
LOOKUP = -1  # the proposer of a draft looked up in the context (core/lookup.py)
HELD = -2  # the proposer of a draft the cells held after the prompt (`LookupState.held`)


class Phase(Enum):
    """What a generation is doing: the state its model requests name (`Evaluate.phase`)."""

    PREFILL = "prefill"  # its prompt goes in, chunk by chunk
    DRAFTING = "drafting"  # a proposer catches up and drafts
    VERIFYING = "verifying"  # models score pending drafts for their verification
    DECODING = "decoding"  # the standard ensemble's step: every model r uses scores the next token
    LOOKAHEAD = "lookahead"  # branches rolled out side by side (`strategies.Lookahead`)


@dataclass(frozen=True)
class Evaluate:
    """A request to the driver: model `model` appends `tokens` to its sequence (`branch` 0) or to
    the sequence of one of its lookahead branches (1 on: `core.branches.Branches`) and answers
    with the logits after the last `n_logits` of them ([n_logits, vocab]); `phase` says what for.
    A driver puts a generation's branch requests to one model in one call."""

    model: int
    tokens: list[int]
    n_logits: int
    phase: Phase = Phase.DECODING
    branch: int = 0

    @property
    def prefill(self) -> bool:
        """A chunk of the prompt (before decoding starts)."""
        return self.phase is Phase.PREFILL


@dataclass(frozen=True)
class Together:
    """Requests a driver answers together, with their logits in order: the catch-ups of every
    member r asks for, so that members of one model (one model under two prompts) share its
    llama_decode call. Only for a decoder made with `together` (a driver that answers them)."""

    requests: tuple[Evaluate, ...]


Step = Generator["Evaluate | Together", "np.ndarray | list[np.ndarray]", None]  # a round of decoding: its requests, their logits


def one_answer(answer: np.ndarray | list[np.ndarray]) -> np.ndarray:
    """The logits a driver answers one `Evaluate` with (a `Together` gets a list)."""
    assert isinstance(answer, np.ndarray), "one request, one array of rows"
    return answer


@dataclass(frozen=True)
class Origin:
    """Where a committed token came from.

    kind: "sample" (drawn from r directly), "draft" (a proposer's draft token, accepted),
    "bonus" (sampled by a model from its own distribution right after scoring others' tokens,
    then accepted; for sd: the bonus drawn from r), "lookup" (looked up in the context or held
    by the cells after the prompt, accepted),
    "resample" (drawn from the residual after a rejection). model: index of the model that
    proposed it, if any.
    """

    kind: str
    model: int | None = None


@dataclass
class Draft:
    """A pending (not yet verified) token and the distribution its proposer sampled it from
    (None for a looked-up or held token: a point mass, proposer LOOKUP or HELD)."""

    token: int
    proposer: int
    q: np.ndarray | None
    bonus: bool = False


@dataclass
class SpeculationStats:
    """Counters of the speculative methods (all zero for `ensemble`); the rates derived from
    them live in `localcos.stats.GenerationStats`."""

    proposed: int = 0  # draft tokens submitted to verification
    accepted: int = 0  # draft tokens accepted
    rejected: int = 0  # draft tokens rejected (each rolls the caches back and resamples a token)
    verifications: int = 0
    bonus: int = 0  # bonus tokens committed
    lookup_proposed: int = 0  # of the draft tokens: looked up in the context
    lookup_accepted: int = 0
    held_proposed: int = 0  # of the draft tokens: those the cells held after the prompt
    held_accepted: int = 0
    # --gamma auto: how often each plan was chosen, (proposer, gamma) -> count (gamma 0: no draft,
    # the ensemble's step or a verification of what is pending)
    plans: dict[tuple[int, int], int] = field(default_factory=dict)

    def planned(self, proposer: int, gamma: int) -> None:
        self.plans[(proposer, gamma)] = self.plans.get((proposer, gamma), 0) + 1


class Decoder:
    """State of one completion, shared by all strategies; `slots` are the completion's sequence
    in each model's KV cache."""

    def __init__(
        self,
        slots: Sequence[Slot],
        combiner: BoundCombiner,
        sampler: Sampler,
        rng: np.random.Generator,
        prompt: Sequence[int],
        prompt_rows: Sequence[np.ndarray | None],
        max_length: int,
        end_tokens: AbstractSet[int],
        text: TextAssembler,
        on_commit: Callable[[int, Origin], None] | None = None,
        observer: AutoGamma | None = None,
        banned: Sequence[int] = (),
        lookup: LookupState | None = None,
        costs: Costs | None = None,
        constraint: TokenMatcher | None = None,
        others: Callable[[], int] | None = None,
        together: bool = False,
        branches: Sequence[Sequence[Slot]] = (),
    ) -> None:
        if not isinstance(combiner, BoundCombiner):
            raise TypeError("the decoder takes a combiner bound to its models (Combiner.bind)")
        self.slots = list(slots)
        self.together = together  # the driver answers `Together`: members' catch-ups in one round
        self.combiner = combiner
        self.sampler = sampler
        self.rng = rng
        self.committed: list[int] = list(prompt)
        self.n_prompt = len(prompt)
        self.pending: list[Draft] = []
        # rows[i][p]: model i's logits row at position p (only positions decoding still needs)
        # Banned tokens (--ignore-eos) get logit -inf in every model, as a llama.cpp logit bias
        # would: no model proposes them and r gives them no mass, for every method alike.
        self.banned = list(banned)
        # a member the request does not evaluate (`Plan.evaluated`) has no row
        self.rows: list[dict[int, np.ndarray]] = [{len(prompt): self._ban(row.copy())} if row is not None else {} for row in prompt_rows]
        # probs[i][p]: softmax of rows[i][p] at the sampling temperature, once computed: a draft
        # token's proposal and the combination at its position share it (see Combiner.mixes_probs)
        self.probs: list[dict[int, np.ndarray]] = [{} for _ in self.slots]
        self.max_length = max_length
        self.end_tokens = end_tokens
        self.text = text
        self.on_commit = on_commit
        self.observer = observer
        self.lookup = lookup
        # costs(model, rows): a call's cost from the models' profiles; lookup's auto mode weighs
        # the rows of a draft against the tokens it saves (as if alone: with a fixed gamma a seed
        # then pins the text whatever else shares the calls)
        self.costs = costs
        # others(): rows other sequences put into each call right now (the scheduler's load);
        # --gamma auto prices its drafts at what they add to those calls
        self.others = others or (lambda: 0)
        self.spent = 0.0  # the estimated cost of the calls this completion asked for
        # the constraint's matcher follows committed + pending (`core.constrained`)
        self.constraint = None if constraint is None else SequenceConstraint(constraint, len(prompt), self.sequence, lambda: len(self.committed))
        self.origins: list[Origin] = []
        self.finish_reason: str | None = None
        self.end_token: int | None = None  # the end-of-generation token that ended the completion
        self.speculation = SpeculationStats()
        # models r depends on; the others are evaluated only to draft (see Combiner.uses)
        self.used = combiner.used
        # gated combiners (`Gated`): whether the gate opens at a position, from the lead's row
        # there; of the committed tokens, how many r was gated for and where it opened
        self.gates: dict[int, bool] = {}
        self.gate_decided = 0
        self.gate_opened = 0
        # lookahead: each member's own sequence (itself, not a view) and its branches' after it
        self.branches = Branches(branches)
        if len(self.committed) >= max_length:
            self.finish_reason = "length"

    # --- state ---------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def generated(self) -> list[int]:
        return self.committed[self.n_prompt :]

    def sequence(self) -> list[int]:
        """Committed tokens followed by the pending draft tokens."""
        return self.committed + [d.token for d in self.pending]

    def budget(self) -> int:
        """How many more tokens may be committed."""
        return self.max_length - len(self.committed)

    def is_end(self, token: int) -> bool:
        return token in self.end_tokens

    # --- model work ----------------------------------------------------------------------------
    def catch_up(self, i: int, upto: int | None = None, phase: Phase = Phase.DECODING) -> Step:
        """Model i evaluates, in one batched call, every token of sequence()[:upto] its cache lacks
        (by default all of them, except a final end token: nothing follows it), for `phase`."""
        request = self._request(i, upto, phase)
        if request is not None:
            self._take_rows(request, one_answer((yield request)))

    def _request(self, i: int, upto: int | None, phase: Phase) -> Evaluate | None:
        """What model i must evaluate to catch up to `upto` (see `catch_up`), or None."""
        seq = self.sequence()
        if upto is None:
            upto = len(seq) - (1 if self.draft_room() == 0 and self.pending else 0)
        have = len(self.slots[i].tokens)
        if have >= upto:
            return None
        # rows are needed for positions >= len(committed): the token at index k gives row k+1
        n_logits = upto - max(have, len(self.committed) - 1)
        if self.costs is not None:
            self.spent += self.costs(i, upto - have)
        return Evaluate(i, seq[have:upto], n_logits, phase)

    def _take_rows(self, request: Evaluate, logits: np.ndarray) -> None:
        """The rows a catch-up's call returned, each at its position."""
        i, n_logits = request.model, request.n_logits
        first = len(self.slots[i].tokens) - n_logits + 1
        self._ban(logits)
        rows, probs = self.rows[i], self.probs[i]
        lead = self.combiner.gate is not None and i == self.combiner.gate.lead
        for j in range(n_logits):
            rows[first + j] = logits[j]
            probs.pop(first + j, None)
            if lead:
                self.gates.pop(first + j, None)

    def consult(self, upto: int | None = None, phase: Phase = Phase.DECODING) -> Step:
        """Every model r needs at the positions up to `upto` catches up (`catch_up`; default:
        the whole sequence). With a gate the lead goes first, and the other models only as far
        as the last position where the gate opens: a model r does not need is not evaluated
        (lazy members), and catches up on what it skipped in one call when it is needed or
        drafts."""
        always = self.combiner.asks(opened=False)
        yield from self._catch_up_all([i for i, asked in enumerate(always) if asked], upto, phase)
        gate = self.combiner.gate
        if gate is None:
            return
        assert gate.lead is not None, "a bound gate names its lead"
        last = len(self.slots[gate.lead].tokens) if upto is None else upto
        opened = [p for p in range(len(self.committed), last + 1) if self.gate_opens(p)]
        if opened:
            yield from self._catch_up_all([i for i, asked in enumerate(self.combiner.asks(opened=True)) if asked and not always[i]], opened[-1], phase)

    def catch_up_members(self, members: Sequence[int]) -> Step:
        """Every one of `members` catches up on the whole sequence (`catch_up`), together."""
        yield from self._catch_up_all(members, None, Phase.DECODING)

    def _catch_up_all(self, members: Sequence[int], upto: int | None, phase: Phase) -> Step:
        """`catch_up` of each of `members`: together in one request where the driver takes it."""
        if not self.together:
            for i in members:
                yield from self.catch_up(i, upto, phase)
            return
        requests = [r for r in (self._request(i, upto, phase) for i in members) if r is not None]
        if len(requests) == 1:
            self._take_rows(requests[0], one_answer((yield requests[0])))
        elif requests:
            for request, logits in zip(requests, (yield Together(tuple(requests)))):
                self._take_rows(request, logits)

    def gate_opens(self, position: int) -> bool:
        """Whether r combines the models at `position` (the gate opens there), from the lead's
        row there (once per row)."""
        opened = self.gates.get(position)
        if opened is None:
            gate = self.combiner.gate
            assert gate is not None and gate.lead is not None
            opened = self.gates[position] = bool(gate.opens(self.rows[gate.lead][position][None, :])[0])
        return opened

    def _ban(self, logits: np.ndarray) -> np.ndarray:
        if self.banned:
            logits[..., self.banned] = -np.inf
        return logits

    def rollback_model(self, i: int, length: int) -> None:
        """Drop model i's cache entries and rows beyond `length` tokens."""
        self.slots[i].truncate(length)
        lead = self.combiner.gate is not None and i == self.combiner.gate.lead
        for cache in (self.rows[i], self.probs[i], *((self.gates,) if lead else ())):
            for p in [p for p in cache if p > length]:
                del cache[p]

    def rollback(self, length: int) -> None:
        """Roll every model back to the first `length` tokens (a rejection at position `length`)."""
        for i in range(len(self.slots)):
            self.rollback_model(i, length)
        if self.constraint is not None:
            self.constraint.forget(after=length)

    def scored_by_all(self) -> int:
        """How many of the oldest pending tokens every model r needs there has a row for (with a
        gate: the lead, and the others where the gate opens)."""
        n0 = len(self.committed)
        always = self.combiner.asks(opened=False)
        rows = [len(m.tokens) for m in self.slots]  # model i has rows up to position rows[i]
        always_last = min(n for n, asked in zip(rows, always) if asked)
        if self.combiner.gate is None:
            return max(0, min(always_last - n0 + 1, len(self.pending)))
        opened_last = min((n for n, asked, a in zip(rows, self.combiner.asks(opened=True), always) if asked and not a), default=always_last)
        k = 0
        while k < len(self.pending) and n0 + k <= always_last and (n0 + k <= opened_last or not self.gate_opens(n0 + k)):
            k += 1
        return k

    # --- lookahead's branches ------------------------------------------------------------------
    def branch_rows(self, rows: Sequence[np.ndarray | None]) -> np.ndarray:
        """r (temperature 1, before the sampler's transforms) from each member's rows of the
        branches ([branches, vocab]; None for a member r does not use): the combiner's own
        definition, every member evaluated on every branch (no gate spares one there)."""
        return self.combiner.combine([None if row is None else self._ban(row) for row in rows], 1.0)

    def distribution(self, position: int) -> np.ndarray:
        """r at `position` as a new array (temperature 1 where greedy), before the sampler's
        transforms and without a constraint."""
        return self._combine_at(self.combiner, [position])[0]

    # --- distributions -------------------------------------------------------------------------
    def combined(self, positions: Sequence[int]) -> np.ndarray:
        """r at the given positions, [len(positions), vocab], sampler transforms applied."""
        single = self.combiner.single
        if single is not None and self.sampler.greedy:  # r is one model's own distribution: its argmax
            rows = np.stack([self.rows[single][p] for p in positions])
            return self.sampler.finalize(self._constrain(rows, positions, logits=True), copy=False)
        return self.sampler.finalize(self._constrain(self._combine_at(self.combiner, positions), positions), copy=False)

    def _combine_at(self, combiner: BoundCombiner, positions: Sequence[int]) -> np.ndarray:
        """r at `positions` as a new array, before the sampler's transforms. Gated: the lead's own
        distribution where the gate is shut, the inner combination where it opens (only there do
        the other models have rows)."""
        gate = combiner.gate
        if gate is not None:
            assert gate.lead is not None
            return gate.compose(np.stack([self.softmax(gate.lead, p) for p in positions]), np.array([self.gate_opens(p) for p in positions]),
                                lambda opened: self._combine_at(combiner.inner, [p for p, o in zip(positions, opened) if o]))  # fmt: skip
        if combiner.single is not None:  # r is one model's own softmax(l / T): no combining
            return np.stack([self.softmax(combiner.single, p) for p in positions])
        if combiner.mixes_probs:
            probs = [np.stack([self.softmax(i, p) for p in positions]) if used else None for i, used in enumerate(combiner.used)]
            return combiner.mix(probs)
        logits = [np.stack([rows[p] for p in positions]) if used else None for rows, used in zip(self.rows, combiner.used)]
        return combiner.combine(logits, self.sampler.softmax_temperature)

    def softmax(self, i: int, position: int) -> np.ndarray:
        """softmax(model i's row at `position` / T), computed once per row; do not change it."""
        p = self.probs[i].get(position)
        if p is None:
            p = self.probs[i][position] = softmax(self.rows[i][position], self.sampler.softmax_temperature)
        return p

    def own(self, i: int, position: int) -> np.ndarray:
        """Model i's own distribution at `position` (what it proposes from), constrained."""
        if self.sampler.greedy:  # one-hot at the argmax, which the logits have already
            row = self.rows[i][position]
            if self.constraint is not None and self.constraint.binds(position):
                row = self._constrain(row[None, :].copy(), [position], logits=True)[0]
            return self.sampler.finalize(row, copy=True)
        q = self.softmax(i, position)
        if self.constraint is not None and self.constraint.binds(position):
            q = self._constrain(q[None, :].copy(), [position])[0]
        return self.sampler.finalize(q, copy=True)

    # --- the constraint -------------------------------------------------------------------------
    def allows(self, token: int, position: int) -> bool:
        """Whether the constraint (if any) allows `token` at `position`."""
        return self.constraint is None or self.constraint.allows(token, position)

    def _constrain(self, rows: np.ndarray, positions: Sequence[int], logits: bool = False) -> np.ndarray:
        """Rows restricted to what the constraint allows at `positions` (`SequenceConstraint.restrict`), in place."""
        return rows if self.constraint is None else self.constraint.restrict(rows, positions, logits)

    # --- proposing, verifying, committing ------------------------------------------------------
    def propose(self, i: int, bonus: bool = False) -> int:
        """Model i samples the next draft token from its own distribution; returns it."""
        position = len(self.committed) + len(self.pending)
        q = self.own(i, position)
        token = self.sampler.draw(q, self.rng)
        self.pending.append(Draft(token, i, q, bonus))
        return token

    def draft(self, i: int, n: int, bonus: bool = False) -> Step:
        """Model i proposes up to n draft tokens, one at a time, catching up on each; it stops
        after an end token. With `bonus`, the first one counts as a bonus token."""
        for j in range(n):
            yield from self.catch_up(i, phase=Phase.DRAFTING)
            if self.is_end(self.propose(i, bonus=bonus and j == 0)):
                break

    def lookup_draft(self, caller: int | None, held_only: bool = False) -> int:
        """Append draft tokens looked up in the context (`core.lookup`) after the pending ones;
        returns how many. The tokens the cells held after the prompt go first, all of them,
        while the text follows them (`LookupState.held_after`; with `held_only`, those alone).
        In auto mode only as many as pay: their expected saving against what
        their rows add to the next calls of `caller` (the model about to catch up and draft on
        after them; None: every model r uses, no model drafting) and of the others. An accepted
        looked-up token saves what the alternative would spend on it: in cos, a single-token
        draft call of `caller` (every model scores a row for it either way); with no model
        drafting, this completion's cost per token."""
        if self.lookup is None:
            return 0

        def saving() -> float:
            return self._token_cost() if caller is None or self.costs is None else self.costs(caller, 1)

        pending = [d.token for d in self.pending]
        held = self.lookup.held_after(len(self.committed), pending)[: self.draft_room()]
        source, candidate = HELD, held
        if not held and not held_only:
            source, candidate = LOOKUP, self.lookup.drafts(len(self.committed), pending, self.draft_room(), lambda: self._rows_cost(caller), saving)
        appended = 0
        for token in candidate:
            if not self.allows(token, len(self.committed) + len(self.pending)):
                break  # r gives it nothing: the draft ends before it
            self.pending.append(Draft(token, source, None))
            appended += 1
            if self.is_end(token):
                break
        return appended

    def _rows_cost(self, caller: int | None) -> Callable[[int], float]:
        """What k more rows add to the calls that will score them (estimated costs)."""
        costs = self.costs
        if costs is None:
            return lambda k: 0.0
        seq = len(self.committed) + len(self.pending)
        lacking = [seq - len(slot.tokens) for slot in self.slots]
        users = [i for i, used in enumerate(self.used) if used or i == caller]

        def extra(k: int) -> float:
            return sum(costs(i, lacking[i] + k) - costs(i, max(lacking[i], 1)) for i in users)

        return extra

    def _token_cost(self) -> float:
        """Estimated cost per token of this completion so far (before any: the standard
        ensemble's, one single-token call of every model r uses)."""
        made = len(self.committed) - self.n_prompt
        if made > 0 and self.spent > 0:
            return self.spent / made
        if self.costs is None:
            return 1.0
        return sum(self.costs(i, 1) for i, used in enumerate(self.used) if used)

    def lags(self) -> list[int]:
        """The tokens of the sequence each member r does not use lacks (0 for the others): what a
        plan that sets it to work must first evaluate (under --gamma auto such a member reads
        nothing, its prompt included, until a draft of its own is planned)."""
        seq = len(self.committed) + len(self.pending)
        return [0 if used else seq - len(slot.tokens) for slot, used in zip(self.slots, self.used)]

    def draft_room(self) -> int:
        """How many more draft tokens are worth proposing (none after an end token)."""
        if self.pending and self.is_end(self.pending[-1].token):
            return 0
        return self.budget() - len(self.pending)

    def verify_pending(self, k: int) -> bool:
        """Verify the k oldest pending tokens against r; commit the result. True on a rejection."""
        if k == 0:
            return False
        drafts = self.pending[:k]
        n0 = len(self.committed)
        r = self.combined(range(n0, n0 + k))
        verdict = verify([d.token for d in drafts], [d.q for d in drafts], r, self.rng)
        self.speculation.verifications += 1
        self.speculation.proposed += k
        self.speculation.accepted += verdict.accepted
        judged = drafts[: verdict.accepted + (verdict.resample is not None)]
        for j, d in enumerate(judged):
            ok = j < verdict.accepted
            if d.proposer == LOOKUP:
                assert self.lookup is not None
                self.lookup.outcomes.observe(int(ok), int(not ok))
                self.speculation.lookup_proposed += 1
                self.speculation.lookup_accepted += int(ok)
            elif d.proposer == HELD:
                self.speculation.held_proposed += 1
                self.speculation.held_accepted += int(ok)
            elif self.observer is not None:
                self.observer.observe_verdicts(d.proposer, int(ok), int(not ok))
        self.speculation.lookup_proposed += sum(d.proposer == LOOKUP for d in drafts[len(judged) :])
        self.speculation.held_proposed += sum(d.proposer == HELD for d in drafts[len(judged) :])
        accepted = drafts[: verdict.accepted]
        tokens = [d.token for d in accepted]
        origins = [Origin("lookup", None) if d.proposer in (LOOKUP, HELD) else Origin("bonus" if d.bonus else "draft", d.proposer) for d in accepted]
        if verdict.resample is None:
            del self.pending[:k]
            self.commit(tokens, origins)
            return False
        self.speculation.rejected += 1
        self.pending.clear()
        self.rollback(n0 + verdict.accepted)
        self.commit(tokens + [verdict.resample], origins + [Origin("resample")])
        return True

    def commit(self, tokens: Sequence[int], origins: Sequence[Origin]) -> None:
        """Append tokens to the completion, in order, until one of them ends it."""
        for token, origin in zip(tokens, origins):
            if self.finished:
                break
            if self.is_end(token):
                self.finish_reason = "stop"
                self.end_token = token
                break
            if self.lookup is not None:
                self.lookup.committed(len(self.committed), token)
                self.lookup.index.extend((token,))
            if self.combiner.gate is not None:
                self.gate_decided += 1
                self.gate_opened += self.gates.get(len(self.committed), False)
            self.committed.append(token)
            self.origins.append(origin)
            if origin.kind == "bonus":
                self.speculation.bonus += 1
            if self.on_commit is not None:
                self.on_commit(token, origin)
            if self.text.push(token):
                self.finish_reason = "stop" if self.text.ended_by in ENDS else "length"
            elif len(self.committed) >= self.max_length:
                self.finish_reason = "length"
        n = len(self.committed)
        if self.finished:
            # tokens scored past the end (after a stop string, an end token) leave every cache,
            # so each holds exactly the completion
            self.pending.clear()
            self.rollback(n)
        # rows before the first uncommitted position are no longer needed
        caches: list[dict[int, Any]] = [*self.rows, *self.probs, self.gates]
        for cache in caches:
            for p in [p for p in cache if p < n]:
                del cache[p]
        if self.constraint is not None:
            self.constraint.forget(before=n)
