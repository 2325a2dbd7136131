"""One byte-level completion (`ByteGeneration`): the ensemble's step or a round of CoS across
tokenizers, byte by byte, text emitted as characters complete."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol
from collections.abc import Callable, Generator, Sequence

import numpy as np

from ...core.bytelevel import END, SYMBOLS, ByteView, Utf8State, ViewState
from ...core.combiners import BoundCombiner, Gated
from ...core.level import Level
from ...core.sampling import Sampler
from ...core.speedmodel import ByteAutoGamma, CallProfile, Costs
from ...core.text import TextAssembler
from ...core.verify import verify
from ...grammar import Matcher, unpack
from ...stats import GenerationStats, ModelRunStats
from ..completion import Completion
from .symbols import combine_symbols, gate_opens



class Member(Protocol):
    """What a byte-level generation drives for each model: `ByteMember` (its paths in llama.cpp
    sequences), or a test's NumPy stand-in."""

    view: ByteView
    calls: int  # llama.cpp calls made
    tree_rows: int  # rows evaluated ahead for drafts (`score`)
    missed: int  # rows a draft's replay asked for that were not evaluated ahead
    price: CallProfile | None  # its calls' cost by rows; None: its calls are not priced
    spent: float  # its calls priced at `price`

    @property
    def llama_seconds(self) -> float: ...  # seconds in its model's llama.cpp calls so far

    @property
    def model(self) -> object: ...  # the model it reads: members of one model share its calls
    @property
    def longest(self) -> int: ...
    @property
    def call_rows(self) -> int: ...  # the most rows one call returns
    def start(self, prompt: Sequence[int]) -> None: ...
    def advance(self, byte: int) -> None: ...
    def take_token(self, k: int, log_p: float | None = None) -> None: ...
    def snapshot(self) -> ViewState: ...
    def rollback(self, state: ViewState) -> None: ...
    def score(self, draft: bytes, extend: int | None = None, distributions: bool = True) -> tuple[list[np.ndarray], list[ViewState]]: ...
    @staticmethod
    def advance_together(members: Sequence[Any], data: Sequence[int]) -> None: ...  # members of one model (its own kind), rows in shared calls


@dataclass
class _Round:
    """What one step decided: the symbols committed (END last when the text ended), whether a
    gated combiner's gate opened at each (None without a gate) and, after a draft every symbol of
    which was accepted, the model whose turn it is to propose."""

    symbols: list[int]
    next_proposer: int | None = None
    gates: list[bool | None] = field(default_factory=list)
    # the mixed level's token step: the symbols are the bytes of the lead's token (its sorted
    # position and log-probability, where known), which the lead takes once they are in and the
    # text goes on: a text ending inside it needs no call for it
    token: tuple[int, float | None] | None = None

    @property
    def whole(self) -> bool:
        return self.token is not None


class ByteGeneration:
    """One completion at the byte level: `run()` yields text as characters complete and returns
    the `Completion`. Its ensemble step and cos are its own, not strategies of `core.decoding`'s
    decoder (whose unit is a token of one vocabulary): here the unit is one of 257 symbols, r
    marginalised over each model's paths (docs/architecture.md, "Two levels, one face").

    Args:
        members: the models' byte views over their sequences (`Member`).
        prompts: each model's prompt, in its own tokens.
        combiner: bound to the members; it receives [1, 257] log probabilities per model.
        sampler: temperature and truncations, applied to r over the 257 symbols.
        max_chars: characters (UTF-8) to generate at most (None: no such limit).
        max_tokens, count_tokens: the length a user sets (`--max-tokens`, the same meaning at
            every level): the text ends at a character's end once it holds `max_tokens` of the
            lead's tokens: the whole tokens the mixed level took, then `count_tokens` (the lead's
            tokenizer) on the bytes since (all of them at the byte level). So where every step
            is a whole token the text is the lead's own, token for token, cut where it would
            cut alone. Counted only where it could have (a token is a byte at least: a count of
            c is taken again `max_tokens - c` bytes later), so a text is tokenized a few times,
            not at every byte; where each byte adds a token at most, the count at the end is
            `max_tokens` plus at most the bytes of the last character but one.
        stop: strings that end the text (not included).
        method: "ensemble" (r sampled at every byte) or "cos" (the models take
            turns drafting `gamma` bytes from their own byte distribution; the others score the
            draft in one call each and it is verified against r, byte by byte: `core.verify`).
        gamma: bytes per draft (cos), or "auto": before each round `costs` (the models' call
            costs) and what the generation has seen choose who drafts how many bytes, or no draft
            (the ensemble's step; `core.speedmodel.ByteAutoGamma`).
        cancelled: asked between rounds; when it turns true the text so far is the completion
            (finish reason "cancelled").
        names: the models' names (for the stats).
        constraint: structured output over the 257 symbols (`grammar.byte_symbols`): its mask
            applies to r and to every draft distribution at the same position, so cos stays exact
            for the constrained r (as at the token level).
        level: BYTE (the byte level's step at every byte) or MIXED: with the combination's gate
            (`Gated`: the mixed level needs one, `config.levels.check_level`), where the lead's view is
            one tokenisation ending with the text on a character boundary and the gate is shut
            for its likeliest whole token, the next unit is a whole token of the lead's own
            distribution (one row; the others skip its bytes); elsewhere the byte level's step
            (docs/algorithm.md, section 12). Greedy, where the gate opens at such a boundary,
            r chooses the first byte and the lead spells it with one whole token, descending its
            distribution greedily from that byte (`_lead_spells`).

    Lazy members: at the ensemble's step a model r does not ask for (one it does not use; with a
    gate, any but the lead where the gate stays shut) is not evaluated; it takes the bytes it
    skipped in as few calls as it can when r next asks for it, or before a draft
    (`_catch_up`), so the text is the one every model advancing at every byte would give.
    """

    def __init__(
        self,
        members: Sequence[Member],
        prompts: Sequence[Sequence[int]],
        combiner: BoundCombiner,
        sampler: Sampler,
        rng: np.random.Generator,
        *,
        max_chars: int | None = None,
        max_tokens: int | None = None,
        count_tokens: Callable[[bytes], int] | None = None,
        stop: Sequence[str] = (),
        n_indent: int = 0,
        t_max_predict_ms: float = 0.0,
        n_ctx: int | None = None,
        ignore_end: bool = False,
        method: str = "ensemble",
        gamma: int | str = 8,
        costs: Costs | None = None,
        cancelled: Callable[[], bool] | None = None,
        names: Sequence[str] = (),
        constraint: Matcher | None = None,
        level: Level = Level.BYTE,
    ) -> None:
        self.members = list(members)
        self.level = level
        # the mixed level's gate of whole tokens: the combination's own, deciding tokens as it decides bytes
        self.token_gate: Gated | None = None
        if level is Level.MIXED:
            if not isinstance(combiner.combiner, Gated):
                raise ValueError("the mixed level decodes with a gated combination (config.levels.check_level refuses others)")
            self.token_gate = combiner.combiner
        self.token_bytes = 0  # bytes decoded as whole tokens (the mixed level)
        self._token_probs = np.empty(0)  # the lead's whole-token distribution, reused every token
        self.constraint = constraint
        self.names = list(names)
        self.cancelled = cancelled
        self.ignore_end = ignore_end
        self.prompts = [list(p) for p in prompts]
        self.combiner = combiner
        self.sampler = sampler
        self.rng = rng
        if max_chars is None and (max_tokens is None or count_tokens is None):
            raise ValueError("a byte-level generation needs a length: max_chars, or max_tokens and count_tokens")
        self.max_chars = max_chars
        self.max_tokens = max_tokens
        self.count_tokens = count_tokens
        self._count_from = 0  # the text's length in bytes at which its tokens are counted next
        self._taken = (0, 0)  # (bytes, tokens) of the text the lead took as whole tokens, up to its last token step
        self.stop = tuple(s for s in stop if s)
        self.n_indent = n_indent  # an editor's rules on the text (`core.text.TextAssembler`)
        self.t_max_predict_ms = t_max_predict_ms
        self.n_ctx = n_ctx
        self.method = method
        self.gamma = gamma
        if gamma == "auto" and costs is None:
            raise ValueError("gamma auto needs the models' call costs")
        self.costs = costs
        self.auto: ByteAutoGamma | None = None
        self.ensemble_steps = 0
        self.drafted = 0
        self.accepted = 0
        self.gate_decided = 0  # with a gated combiner: symbols it decided, and where it opened
        self.gate_opened = 0
        # lazy members (the ensemble's step): the models r does not ask for at every byte (not
        # used by it; with a gate, all but the lead), and the bytes each has yet to take
        self.lazy = [not asked for asked in combiner.asks(opened=False)]
        self.behind = [bytearray() for _ in self.members]

    def symbol_distribution(self, dists: Sequence[np.ndarray | None] | None = None, opened: bool | None = None) -> np.ndarray:
        """r over the 257 symbols from the models' distributions (None for a model r does not ask
        for there; default: now) and, with a gate, whether it opens there (decided once per
        position: `symbols.gate_opens`), before UTF-8 and sampling settings."""
        if dists is None:
            dists, opened = self._distributions()
        return combine_symbols(self.combiner, dists, self.sampler.softmax_temperature, opened)

    def _allowed(self, utf8: Utf8State) -> np.ndarray:
        """The symbols that may come next: valid UTF-8, and what the constraint allows after the
        symbols it consumed."""
        if self.constraint is None:
            return utf8.allowed
        return utf8.allowed & unpack(self.constraint.mask(), SYMBOLS)

    def _finish(self, p: np.ndarray, allowed: np.ndarray) -> np.ndarray:
        """A distribution over symbols as it is sampled: the `allowed` symbols only, END unless
        ignored, then the sampler's settings. A distribution without mass on the allowed symbols
        (pruned paths, or the models' own zeros, where r is not defined) is uniform over them;
        each model then follows the symbol drawn by a restart (`ByteMember.advance`)."""
        p = p * allowed
        if self.ignore_end:
            p[END] = 0.0
        total = p.sum()
        if total <= 0:  # the models' views give the allowed symbols nothing: r is not defined here
            if not allowed.any():
                raise ValueError("no symbol keeps the text valid UTF-8" + (" and inside the constraint" if self.constraint else ""))
            p, total = allowed.astype(np.float64), float(allowed.sum())
        return self.sampler.finalize((p / total).astype(np.float32))

    def _target(self, dists: Sequence[np.ndarray | None], opened: bool | None, allowed: np.ndarray) -> np.ndarray:
        return self._finish(self.symbol_distribution(dists, opened), allowed)

    def _proposal(self, dist: np.ndarray, allowed: np.ndarray) -> np.ndarray:
        """A proposer's own distribution as it drafts: at the temperature r is computed at."""
        t = self.sampler.softmax_temperature
        if t != 1.0:
            with np.errstate(divide="ignore"):
                z = np.log(dist) / t
            dist = np.exp(z - z.max())
        return self._finish(dist, allowed)

    def _consume(self, symbol: int) -> None:
        """The constraint follows the text (END is not text)."""
        if self.constraint is not None and symbol != END and not self.constraint.consume(symbol):
            raise RuntimeError(f"the constraint refused byte {symbol}, which its own mask allowed")

    def _distributions(self) -> tuple[list[np.ndarray | None], bool | None]:
        """The members' distributions r asks for here (None for the others) and whether a gate
        opens here (None without one): every model r uses; with a gate, the lead's, and the
        others' only where the gate opens (a lazy member catches up first)."""
        # a model r uses at every byte first catches up on the whole tokens the mixed level took
        dists = [
            None if lazy else self._caught_up(i) if self.behind[i] else m.view.distribution()
            for i, (m, lazy) in enumerate(zip(self.members, self.lazy))
        ]
        opened = gate_opens(self.combiner, dists)
        if opened:
            for i, asked in enumerate(self.combiner.asks(opened=True)):
                if asked and dists[i] is None:
                    dists[i] = self._caught_up(i)
        return dists, opened

    def _caught_up(self, i: int) -> np.ndarray:
        """Member i's distribution here, after it takes the bytes it skipped."""
        self._catch_up(i)
        return self.members[i].view.distribution()

    def _catch_up(self, i: int) -> None:
        """A lazy member takes the bytes it skipped: pieces of as many bytes as one call has rows
        (a piece's tokens fit one call), each scored ahead along its likeliest tokenisation
        (`Member.score`); its view is then exactly where advancing byte by byte would have
        brought it. A byte its held paths rule out is taken the usual way (a rebuild)."""
        data, member = bytes(self.behind[i]), self.members[i]
        self.behind[i].clear()
        done = 0
        while done < len(data):
            piece = data[done : done + member.call_rows]
            _, states = member.score(piece, extend=1, distributions=False)
            member.rollback(states[-1])
            done += len(states) - 1
            if len(states) <= len(piece):
                member.advance(data[done])
                done += 1

    def _longest(self, i: int) -> int:
        """Member i's tokens in its longest path; a lazy member catches up first when the bytes
        it skipped could take it to the context's end (each byte at most a token)."""
        member = self.members[i]
        if self.n_ctx is not None and self.behind[i] and member.longest + len(self.behind[i]) >= self.n_ctx:
            self._catch_up(i)
        return member.longest

    def _ensemble_step(self, utf8: Utf8State) -> _Round:
        # what each model's draft byte would have been accepted with, where drafts could pay at all
        observe = self.auto is not None and self.auto.could_pay
        dists, opened = self._distributions()
        allowed = self._allowed(utf8)
        r = self._target(dists, opened, allowed)
        if observe:  # every model then advances at every byte
            assert self.auto is not None
            for i, dist in enumerate(dists):
                dist = self._caught_up(i) if dist is None else dist
                accept = float(np.minimum(self._proposal(dist, allowed), r).sum())
                self.auto.observe_verdicts(i, accept, 1.0 - accept)
        symbol = self.sampler.draw(r, self.rng)
        self._consume(symbol)
        if symbol != END:
            spelled = self._lead_spells(symbol, utf8) if not observe else None
            if spelled is not None:
                # the token gate opened here (one model's byte steps have no gate of their own)
                return self._whole_token(spelled, None, True if opened is None else opened)
            if observe:
                for i, member in enumerate(self.members):
                    self._advance(i, member, symbol)
            else:
                self._advance_byte_step(symbol, [dist is not None for dist in dists])
        return _Round([symbol], gates=[opened])

    def _lead_spells(self, first: int, utf8: Utf8State) -> int | None:
        """The mixed level's greedy step where the gate opened at the lead's token boundary: r
        chose the byte `first`; the lead spells it with the token its greedy descent from that
        byte reaches (`ByteView.greedy_spelling`: each further byte by the mass of the tokens
        that begin with it, within one token) and the others skip its bytes, so the text comes
        back to a boundary of the lead's own tokens after every step. Greedy over bytes across
        tokens can run away: inside a run of whitespace that the lead's tokens spell in many
        lengths, another space stays the likeliest byte at every step. The token's sorted
        position, or None where the rule does not apply (sampling, a constraint, within a
        character, no such token): the byte goes in alone."""
        if self.token_gate is None or not self.sampler.greedy or self.constraint is not None or utf8.need:
            return None
        lead = self.token_gate.lead
        assert lead is not None
        view = self.members[lead].view
        if view.boundary() is None:
            return None
        return view.greedy_spelling(first)

    def _advance_byte_step(self, symbol: int, read: Sequence[bool]) -> None:
        """After an ensemble step: every member r always asks for takes `symbol`; a lazy one
        takes it too where r read it here (it is caught up) and its model advances anyway (a
        second prompt's member of the lead's model: its rows join that call, where catching up
        later would be a call of its own); the other lazy members fall behind by it."""
        models = {id(m.model) for m, lazy in zip(self.members, self.lazy) if not lazy}
        groups: dict[int, list[int]] = {}  # the members taking it, by model
        for i, member in enumerate(self.members):
            if not self.lazy[i] or (read[i] and id(member.model) in models):
                groups.setdefault(id(member.model), []).append(i)
            else:
                self.behind[i].append(symbol)
        for group in groups.values():
            if len(group) == 1 or self.auto is not None:  # the auto plan counts each member's own calls
                for i in group:
                    self._advance(i, self.members[i], symbol)
            else:
                type(self.members[group[0]]).advance_together([self.members[i] for i in group], [symbol] * len(group))

    def _token_step(self, utf8: Utf8State) -> _Round | None:
        """The mixed level's step where it applies (see `level`): a whole token of the lead's
        distribution over the tokens that may follow a character boundary whole, and END; None
        where the byte level's step applies."""
        assert self.token_gate is not None and self.token_gate.lead is not None
        lead = self.token_gate.lead
        view = self.members[lead].view
        if utf8.need or view.boundary() is None:
            return None
        log_p = None
        if self.sampler.greedy:  # the likeliest alone, read from the logits (no distribution over the vocabulary)
            likeliest = view.likeliest_token(self.ignore_end)
            if likeliest is None or not self.token_gate.shut(likeliest[1]):  # nothing whole may follow, or the gate opens
                return None
            k, _, log_p = likeliest
        else:
            if len(self._token_probs) != view.vocab.size + 1:
                self._token_probs = np.empty(view.vocab.size + 1)
            q = view.token_probs(self._token_probs)
            if self.ignore_end:
                q[-1] = 0.0
                total = q.sum()
                if total <= 0:  # all its mass on the end: the byte level's step decides
                    return None
                q /= total
            if not self.token_gate.shut(float(q.max())):
                return None
            t = self.sampler.softmax_temperature
            if t != 1.0:
                np.power(q, 1.0 / t, out=q)
                q /= q.sum()
            k = self.sampler.draw(self.sampler.finalize(q) if self.sampler.transforms else q, self.rng)
        if k == view.vocab.size:
            return _Round([END], gates=[None])
        return self._whole_token(k, log_p, False)  # one decision: shut, for the token

    def _whole_token(self, k: int, log_p: float | None, opened: bool) -> _Round:
        """The mixed level's step of the lead's whole token at sorted position `k` (its bytes, one
        gate decision for them all); the others skip its bytes. The lead takes it in `_take`."""
        assert self.token_gate is not None and self.token_gate.lead is not None
        piece = self.members[self.token_gate.lead].view.vocab.pieces[k]
        for i in range(len(self.members)):
            if i != self.token_gate.lead:
                self.behind[i] += piece
        return _Round(list(piece), gates=[opened] + [None] * (len(piece) - 1), token=(k, log_p))

    def _long_enough(self, chars: int, data: bytearray, tokens: bool) -> bool:
        """Whether the text has reached the length asked for: `max_chars` characters, or (where
        `tokens` may be counted) `max_tokens` of the lead's tokens (counted once the text could
        hold that many, and then again only once it could hold the rest: each token is a byte at
        least)."""
        if self.max_chars is not None and chars >= self.max_chars:
            return True
        if not tokens or self.max_tokens is None or self.count_tokens is None or len(data) < self._count_from:
            return False
        counted = self._tokens(data)
        self._count_from = len(data) + self.max_tokens - counted
        return counted >= self.max_tokens

    def _tokens(self, data: bytearray) -> int:
        """The text's length in the lead's tokens: those it took whole, then its tokenizer's."""
        assert self.count_tokens is not None
        taken_bytes, taken_tokens = self._taken
        return taken_tokens + (self.count_tokens(bytes(data[taken_bytes:])) if len(data) > taken_bytes else 0)

    def _spent(self) -> float | None:
        """The members' calls so far, priced at their profiles (None: a member that does not
        price its calls, a test's stand-in)."""
        if any(m.price is None for m in self.members):
            return None
        return float(sum(m.spent for m in self.members))

    def _advance(self, i: int, member: Member, symbol: int) -> None:
        """`member` takes a byte the usual way (the auto plan counts what that cost)."""
        if self.auto is None:
            member.advance(symbol)
            return
        calls, rows = member.calls, member.view.rows
        member.advance(symbol)
        self.auto.observe_advance(i, 1, member.calls - calls, member.view.rows - rows)

    def _cos_round(self, utf8: Utf8State, proposer: int, gamma: int) -> _Round:
        """One round of CoS at the byte level (docs/algorithm.md, sections 3-4, with bytes for
        tokens): `proposer` drafts up to `gamma` symbols from its own distribution, every other
        model scores the draft's bytes in one call, the draft is verified against r."""
        drafter = self.members[proposer]
        others = [m for i, m in enumerate(self.members) if i != proposer]
        drafter_states = [drafter.snapshot()]
        drafter_dists: list[np.ndarray] = []
        utf8 = utf8.copy()
        allowed_at: list[np.ndarray] = []  # the symbols allowed at each draft position
        draft: list[int] = []
        proposals: list[np.ndarray] = []
        while len(draft) < gamma:
            dist = drafter.view.distribution()
            drafter_dists.append(dist)
            allowed_at.append(self._allowed(utf8))
            q = self._proposal(dist, allowed_at[-1])
            symbol = self.sampler.draw(q, self.rng)
            draft.append(symbol)
            proposals.append(q)
            if symbol == END:
                break
            self._consume(symbol)
            self._advance(proposer, drafter, symbol)
            drafter_states.append(drafter.snapshot())
            utf8.push(symbol)
        data = bytes(s for s in draft if s != END)
        before = [(m.tree_rows, m.missed) for m in others]
        scored = [m.score(data) for m in others]
        if self.auto is not None:
            for m, (ahead, missed) in zip(others, before):
                self.auto.observe_scoring(self.members.index(m), len(data), m.tree_rows - ahead, m.missed - missed)
        reached = min(len(dists) for dists, _ in scored)  # positions every model has a distribution at
        judged = min(len(draft), reached)
        targets, opened_at = [], []
        for j in range(judged):
            dists: list[np.ndarray | None] = [d[j] for d, _ in scored]
            dists.insert(proposer, drafter_dists[j])
            opened_at.append(gate_opens(self.combiner, dists))
            targets.append(self._target(dists, opened_at[-1], allowed_at[j]))
        verdict = verify(draft[:judged], np.stack(proposals[:judged]), np.stack(targets), self.rng)
        self.drafted += judged
        self.accepted += verdict.accepted
        if self.auto is not None:
            self.auto.observe_verdicts(proposer, verdict.accepted, float(verdict.resample is not None))
        kept = draft[: verdict.accepted]
        position = len([s for s in kept if s != END])  # bytes of the draft kept
        if self.constraint is not None:
            self.constraint.rollback(len(data) - position)
        drafter.rollback(drafter_states[position])
        for member, (_, states) in zip(others, scored):
            if position < len(states):
                member.rollback(states[position])
            else:  # its held paths could not take the last kept byte: it takes it the usual way
                member.rollback(states[-1])
                member.advance(data[position - 1])
        symbols = list(kept)
        if verdict.resample is not None:
            symbols.append(verdict.resample)
        gates = opened_at[: len(symbols)]
        if verdict.resample is not None:
            self._consume(verdict.resample)
            if verdict.resample != END:
                for i, member in enumerate(self.members):
                    self._advance(i, member, verdict.resample)
            return _Round(symbols, gates=gates)
        if judged == len(draft) and (not draft or draft[-1] != END):
            return _Round(symbols, (proposer + 1) % len(self.members), gates)  # CoS: the next model goes on
        return _Round(symbols, gates=gates)

    def _step(self, utf8: Utf8State, proposer: int, gamma: int, cos: bool) -> _Round:
        """The next step: the mixed level's whole token where it applies, else a round of CoS
        where `gamma` bytes are to be drafted, else the ensemble's step."""
        token = self._token_step(utf8) if self.token_gate is not None else None
        if token is not None:
            return token
        if not gamma:
            self.ensemble_steps += cos
            return self._ensemble_step(utf8)
        for i in range(len(self.members)):  # a draft is scored by every model where it stands
            self._catch_up(i)
        # the plan's estimate of this round, and the members' priced calls before it
        check = (self.auto.round_seconds(proposer, gamma), self._spent()) if self.auto is not None else None
        step = self._cos_round(utf8, proposer, gamma)
        if check is not None and check[1] is not None:
            self.auto.observe_round(proposer, check[0], self._spent() - check[1])  # type: ignore[union-attr, operator]
        return step

    def _take(self, step: _Round, utf8: Utf8State, data: bytearray, text: TextAssembler) -> str:
        """Commit a step's symbols to the text, one by one, until one ends it: the finish reason
        ("stop", "length"), or "" where the text goes on."""
        last = len(step.symbols) - 1
        for j, (symbol, opened) in enumerate(zip(step.symbols, step.gates, strict=True)):
            if symbol == END:
                return "stop"
            if opened is not None:
                self.gate_decided += 1
                self.gate_opened += opened
            data.append(symbol)
            self.token_bytes += step.whole
            utf8.push(symbol)
            if text.push(symbol):  # a stop string; an editor's indentation or time rule cuts it as a limit would
                return "stop" if text.ended_by == "word" else "length"
            if step.whole and j == last:  # the lead's whole token is in and the text goes on: the lead takes it
                assert self.token_gate is not None and self.token_gate.lead is not None and step.token is not None
                lead = self.token_gate.lead
                self.members[lead].take_token(*step.token)
                self._taken = (len(data), self.members[lead].longest - len(self.prompts[lead]))
            # at a character's end: characters, or the lead's tokens (of a whole token: at its last byte)
            if not utf8.need and self._long_enough(len(text.text), data, tokens=not step.whole or j == last):
                return "length"
            if self.n_ctx is not None and any(self._longest(i) >= self.n_ctx for i in range(len(self.members))):
                return "length"
        return ""

    def _llama_seconds(self) -> list[float]:
        """Seconds in each member's model's llama.cpp calls so far, each model counted once (a
        second prompt's member reads the lead's model: its calls are the model's, counted there)."""
        seen: set[int] = set()
        seconds = []
        for m in self.members:
            seconds.append(0.0 if id(m.model) in seen else m.llama_seconds)
            seen.add(id(m.model))
        return seconds

    def _stats(self, data: bytearray, text: TextAssembler, finish: str, cos: bool, seconds: float, prompt_seconds: float,
               llama_seconds: list[float]) -> GenerationStats:  # fmt: skip
        names = [self.names[i] if i < len(self.names) else str(i) for i in range(len(self.members))]
        return GenerationStats(
            method="cos" if cos else "ensemble",
            combiner=self.combiner.description,
            models=[ModelRunStats(name, m.calls, m.view.rows, s) for name, m, s in zip(names, self.members, llama_seconds)],
            level=self.level,
            bytes=len(data),
            chars=len(text.text),
            tokens=self._tokens(data) if self.count_tokens is not None else 0,
            seconds=seconds,
            prompt_seconds=prompt_seconds,
            most_paths=[m.view.most_paths for m in self.members],
            restarts=[m.view.restarts for m in self.members],
            dropped_mass=[m.view.dropped for m in self.members],
            folded=[m.view.folded for m in self.members],
            missed_rows=[m.missed for m in self.members],
            finish_reason=finish,
            drafted=self.drafted,
            accepted=self.accepted,
            ensemble_steps=self.ensemble_steps,
            gate_decided=self.gate_decided,
            gate_opened=self.gate_opened,
            token_bytes=self.token_bytes,
        )

    def run(self) -> Generator[str, None, Completion]:
        t_prompt = time.perf_counter()
        for member, prompt, behind in zip(self.members, self.prompts, self.behind):
            member.start(prompt)
            behind.clear()
        self.drafted = self.accepted = self.gate_decided = self.gate_opened = self.token_bytes = 0
        self._count_from = self.max_tokens or 0  # n bytes hold n tokens at most
        self._taken = (0, 0)
        t0 = time.perf_counter()
        llama0 = self._llama_seconds()
        utf8 = Utf8State()
        data = bytearray()
        # the token level's UTF-8 assembly, stop search, hold-back and an editor's rules
        text = TextAssembler.timed(_one_byte, self.stop, self.n_indent, self.t_max_predict_ms, t0)
        finish = ""
        proposer = 0
        passed = False  # the last draft was accepted whole: the next model in turn proposes (CoS)
        cos = self.method == "cos" and len(self.members) > 1
        self.auto = ByteAutoGamma(self.costs) if cos and self.gamma == "auto" and self.costs is not None else None
        self.ensemble_steps = 0
        longest_draft = 0 if not cos else self.auto.gamma_max if self.auto is not None else int(self.gamma)
        while not finish:
            if self.cancelled is not None and self.cancelled():
                finish = "cancelled"
                break
            room = self.n_ctx is None or all(m.longest + longest_draft < self.n_ctx for m in self.members)
            gamma = 0
            if cos and room:
                if self.auto is not None:
                    proposer, gamma = self.auto.choose([proposer] if passed else None)
                else:
                    gamma = int(self.gamma)
            step = self._step(utf8, proposer, gamma, cos)
            passed = step.next_proposer is not None
            proposer = step.next_proposer if step.next_proposer is not None else 0
            finish = self._take(step, utf8, data, text)
            piece = "" if finish else text.take_final()  # the rest goes once the text is finished
            if piece:
                yield piece
        text.finish()
        tail = text.take_final()
        if tail:
            yield tail
        llama = [now - then for now, then in zip(self._llama_seconds(), llama0)]
        stats = self._stats(data, text, finish, cos, time.perf_counter() - t0, t0 - t_prompt, llama)
        self.completion = Completion(text.text, finish, stats, data=bytes(data), stopped_by=text.ended_by, stop_word=text.word)
        return self.completion


def _one_byte(symbol: int) -> bytes:
    """A byte symbol's text, as `TextAssembler` reads a token's."""
    return bytes((symbol,))


def run_to_end(generation: ByteGeneration) -> Completion:
    """Drive a generation to its end; its completion."""
    for _ in generation.run():
        pass
    return generation.completion
