"""One generation as the decoding core runs it: a coroutine that yields a model's `Evaluate`
request wherever it needs logits (and receives them) and a `Chunk` after every round, and returns
the `Completion`. The scheduler (`runtime.scheduler`) drives it, alone or beside others; nothing
else does, so one seed gives one text whichever front end asked.
"""

from __future__ import annotations

import codecs
import time
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Generator, Sequence

import numpy as np

from ..backend import common_prefix
from ..backend.slot import ModelStats, Slot, prompt_calls
from ..core.constrained import Both, TokenMatcher
from ..core.decoding import Decoder, Evaluate, Origin, Phase, Together
from ..core.healing import Healing
from ..core.lookup import ContextIndex, LookupState, lookup_outcomes
from ..core.speedmodel import AutoGamma
from ..core.strategies import make_strategy
from ..core.text import TextAssembler
from ..grammar import Matcher
from ..stats import GenerationStats, ModelRunStats, plan_counts
from .completion import Completion, cancelled_completion

if TYPE_CHECKING:
    from .loaded import LoadedModels
    from .plan import Plan


@dataclass(frozen=True)
class TokenEvent:
    """A committed token: its id, its text on its own, and where it came from."""

    token: int
    text: str
    origin: Origin


@dataclass(frozen=True)
class Chunk:
    """What one round of decoding produced: the text that became final and the tokens committed
    (`tokenless`: text the byte and mixed levels sampled, which commit no tokens of one
    vocabulary)."""

    text: str
    tokens: tuple[TokenEvent, ...]
    tokenless: bool = False

    @property
    def pieces(self) -> tuple[TokenEvent, ...]:
        """What to show as it arrives, with where it came from: the tokens committed, or a
        tokenless chunk's text as one sampled piece."""
        if self.tokenless:
            return (TokenEvent(-1, self.text, SAMPLED),) if self.text else ()
        return self.tokens


SAMPLED = Origin("sample")  # a piece of byte-level text, as the chat colours it


Work = Generator["Evaluate | Together | Chunk", "np.ndarray | list[np.ndarray] | None", "Completion"]


def completion_rng(seed: int | None, index: int = 0) -> np.random.Generator:
    """The random stream of completion `index` of a request with `seed`: the same for completion
    k whatever else is generated, and whether the request came through `generate`, `stream`,
    `generate_many`, the command line or the server (None: fresh entropy)."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(index,)))


def cancelled(loaded: LoadedModels, plan: Plan, prompt_seconds: float = 0.0) -> Completion:
    """`plan`'s completion cancelled before it decoded anything (after `prompt_seconds` on its prompt)."""
    return cancelled_completion(loaded.run_names, plan.strategy.method, plan.combiner.description, prompt_tokens=len(plan.prompt),
                                prompt_seconds=prompt_seconds, seed=plan.config.seed)  # fmt: skip


class Generation:
    """One completion of `plan` in slot `slot` of every model: its random stream, its decoder
    once decoding starts (the tests check its invariants between rounds), and its coroutine
    (`run`). `fresh`: nothing else is in the models' caches, so it starts from an emptied cache
    with its prompt evaluated as a fresh process evaluates it (`Model.restore_prompt`), and its
    text depends on nothing that ran before; otherwise it shares what the cache holds of its
    prompt. `others()` says how many other sequences share its calls now (drafts are priced
    beside them)."""

    def __init__(
        self,
        loaded: LoadedModels,
        plan: Plan,
        rng: np.random.Generator,
        slot: int,
        cancelled: Callable[[], bool],
        others: Callable[[], int] = lambda: 0,
        *,
        fresh: bool = False,
    ) -> None:
        self.loaded = loaded
        self.plan = plan
        self.rng = rng
        self.slot = slot
        self.fresh = fresh
        self.cancelled = cancelled
        self.others = others
        self.decoder: Decoder | None = None
        self.prompt_evaluated = 0  # of the prompt's tokens, those the models evaluated (the most any member did)

    def run(self) -> Work:
        """The prompt in requests of up to each model's `prompt_chunk` tokens, then one decoding
        round after another. `cancelled()` is checked between requests of the prompt and between
        rounds; a cancelled generation leaves every cache holding exactly what it committed."""
        loaded, plan = self.loaded, self.plan
        slots = [member[self.slot] for member in loaded.member_slots]
        # what each member's calls cost: its own sequence's, and its lookahead branches'
        counted = [[s, *loaded.branch_slots(i, self.slot)] for i, s in enumerate(slots)]
        prompt = list(plan.prompt)
        prompts = [list(p) for p in plan.prompts]
        held = self._held(slots, prompt)  # before the prefill lets it go
        t_prompt = time.perf_counter()
        prompt_rows = yield from self._prefill(slots, prompts, bool(held))
        if prompt_rows is None:
            return cancelled(loaded, plan, time.perf_counter() - t_prompt)
        t0 = time.perf_counter()
        before = [[s.stats.snapshot() for s in member] for member in counted]
        # the decoder counts positions in the prompt's sequence: a member reading another prompt
        # is seen through where its own prompt ends
        views = [s if own == prompt else PromptShift(s, prompt, own) for s, own in zip(slots, prompts)]
        first = loaded.models[0]
        config = plan.config
        text = TextAssembler.timed(first.piece, config.stop, config.n_indent, config.t_max_predict_ms, t0, plan.cursor)
        token_text = _TokenText(first.piece)
        events: list[TokenEvent] = []

        def on_commit(token: int, origin: Origin) -> None:
            events.append(TokenEvent(token, token_text(token), origin))

        dec = self.decoder = self._decoder(views, prompt, prompt_rows, text, on_commit, held)
        rounds = make_strategy(dec, plan.strategy)
        while not dec.finished:
            if self.cancelled():
                # drafts in flight leave every cache, which then holds exactly prompt + completion
                dec.finish_reason = "cancelled"
                dec.pending.clear()
                dec.rollback(len(dec.committed))
                break
            yield from rounds.step()
            if dec.finished:
                text.finish()
            chunk_out = Chunk(text.take_final(), tuple(events))
            events.clear()
            if chunk_out.text or chunk_out.tokens:
                yield chunk_out
        text.finish()
        tail = text.take_final()
        if tail:
            yield Chunk(tail, ())
        finish_reason = dec.finish_reason or "cancelled"
        work = [reduce(ModelStats.plus, (s.stats.minus(b) for s, b in zip(member, earlier))) for member, earlier in zip(counted, before)]
        stats = self._stats(dec, work, time.perf_counter() - t0, t0 - t_prompt, finish_reason)
        return Completion(text.text, finish_reason, stats, token_ids=dec.generated, origins=dec.origins, end_token=dec.end_token,
                          stopped_by=text.ended_by, stop_word=text.word)  # fmt: skip

    def _prefill(self, slots: list, prompts: list[list[int]], held: bool) -> Generator[Evaluate | Together, Any, list[np.ndarray | None] | None]:
        """Each evaluated member's row after its prompt (`Plan.evaluated`; None for the others,
        which read nothing): kept from before where it can be (`restore_prompt`, `known_row`),
        else evaluated in calls of its `prompt_chunk` tokens, the members' calls side by side
        (one model's members share them); None where the generation was cancelled between two
        of them. With `held` tokens to draft first, a member that lacks only its prompt's last
        token is left so (its row None): the decoder's first catch-up evaluates that token in the
        call that scores the draft."""
        wanted = [i for i, needed in enumerate(self.plan.evaluated) if needed]
        # every model's cache emptied before any call (once: a model's second member shares what
        # its first holds of its prompt): a sequence admitted beside this one goes after; with
        # cache_prompt the cells held of the prompt are kept instead, whatever made them
        alone = self.fresh and not self.plan.config.cache_prompt
        fresh = {i: alone and all(slots[j].model is not slots[i].model for j in wanted if j < i) for i in wanted}
        rows: list[np.ndarray | None] = [None] * len(slots)
        for i in wanted:
            rows[i] = slots[i].model.restore_prompt(slots[i], prompts[i]) if fresh[i] else slots[i].known_row(prompts[i])
        # the others read nothing now: what one holds stays a prefix of its prompt, short of its last
        # token, whose row it evaluates if it drafts (under --gamma auto: `Plan.evaluated`)
        for i in set(range(len(slots))) - set(wanted):
            slots[i].truncate(min(common_prefix(slots[i].tokens, prompts[i]), len(prompts[i]) - 1))
        evaluated = [i for i in wanted if rows[i] is None]
        self.prompt_evaluated = max((len(prompts[i]) - len(slots[i].tokens) for i in evaluated), default=0)
        if held:
            own = self.plan.prompt
            evaluated = [i for i in evaluated if len(slots[i].tokens) < len(prompts[i]) - 1 or tuple(prompts[i]) != own]
        calls = {i: iter(prompt_calls(prompts[i], len(slots[i].tokens), slots[i].model.prompt_chunk)) for i in evaluated}
        while calls:
            if self.cancelled():  # a long prompt goes in several calls: a cancel stops between two
                return None
            requests = [Evaluate(i, list(part), n_logits, Phase.PREFILL) for i, (part, n_logits) in ((i, next(c)) for i, c in calls.items())]
            answers = [(yield requests[0])] if len(requests) == 1 else (yield Together(tuple(requests)))
            for request, logits in zip(requests, answers):
                if request.n_logits:  # the prompt's last call: the row after it
                    rows[request.model] = logits[0]
                    del calls[request.model]
        for i in evaluated:
            if fresh[i]:
                slots[i].model.keep_prompt(slots[i], prompts[i], rows[i])
            else:
                slots[i].remember_row(prompts[i], rows[i])
        return rows

    def _held(self, slots: list[Slot], prompt: list[int]) -> list[int]:
        """What the models' cells hold after the prompt now, where drafts are looked up and the
        cells of an earlier request are kept (`cache_prompt`): the longest continuation of it any
        sequence of a member's model holds (`LookupState.held`)."""
        if self.plan.lookup is None or not self.plan.config.cache_prompt:
            return []
        held: list[int] = []
        for sequence in {id(s): s for slot in slots for s in slot.model.slots}.values():
            if len(sequence.tokens) > len(prompt) + len(held) and sequence.tokens[: len(prompt)] == prompt:
                held = sequence.tokens[len(prompt) :]
        return list(held)

    def _decoder(self, slots: list, prompt: list[int], prompt_rows: list[np.ndarray | None], text: TextAssembler,
                 on_commit: Callable[[int, Origin], None], held: list[int]) -> Decoder:  # fmt: skip
        """The decoder of this generation, with what its strategy's auto plans learn started
        afresh: the calls a seeded generation makes, and so its text, depend on nothing that ran
        before (but for `held`, what the cells held after the prompt, drafted first)."""
        loaded, plan = self.loaded, self.plan
        lookup = None
        if plan.lookup is not None:
            lookup = LookupState(plan.lookup, ContextIndex(prompt, loaded.n_ctx), lookup_outcomes(), held=held, held_from=len(prompt))
        return Decoder(
            slots,
            plan.combiner,
            plan.sampler,
            self.rng,
            prompt,
            prompt_rows,
            max_length=plan.max_length,
            end_tokens=plan.end_tokens,
            banned=plan.banned,
            text=text,
            on_commit=on_commit,
            observer=AutoGamma(loaded.costs, used=plan.combiner.used) if plan.strategy.auto else None,
            lookup=lookup,
            # the profiles (lookup's auto mode): choices then depend on nothing timed during the
            # run (on one machine a seed pins the output)
            costs=loaded.costs,
            others=self.others,
            constraint=self._constraint(),
            together=True,  # the scheduler answers a round's catch-ups together: one model's members share a call
            branches=[[loaded.sequence(i, self.slot, j) for j in range(loaded.branches + 1)] for i in range(len(loaded.models))]
            if plan.strategy.lookahead is not None else (),
        )

    def _constraint(self) -> TokenMatcher | None:
        """What constrains this generation's tokens: the plan's grammar, the cursor's token
        healed, both or neither."""
        loaded, plan = self.loaded, self.plan
        grammar = Matcher(loaded.vocabulary(), plan.constraint) if plan.constraint is not None else None
        if plan.cursor is None or not plan.cursor.healed:
            return grammar
        healing = Healing(loaded.token_bytes(), plan.cursor.healed)
        return healing if grammar is None else Both(healing, grammar)

    def _stats(self, dec: Decoder, work: list, seconds: float, prompt_seconds: float, finish_reason: str) -> GenerationStats:
        loaded, plan, strategy = self.loaded, self.plan, self.plan.strategy
        spec = dec.speculation
        return GenerationStats(
            method=plan.strategy.method,
            combiner=plan.combiner.description,
            models=[ModelRunStats(name, w.calls, w.tokens, w.seconds) for name, w in zip(loaded.run_names, work)],
            tokens=len(dec.generated),
            seconds=seconds,
            prompt_tokens=len(plan.prompt),
            prompt_evaluated=self.prompt_evaluated,
            prompt_seconds=prompt_seconds,
            proposed=spec.proposed,
            accepted=spec.accepted,
            rejected=spec.rejected,
            verifications=spec.verifications,
            bonus=spec.bonus,
            lookup_proposed=spec.lookup_proposed,
            lookup_accepted=spec.lookup_accepted,
            held_proposed=spec.held_proposed,
            held_accepted=spec.held_accepted,
            gate_decided=dec.gate_decided,
            gate_opened=dec.gate_opened,
            looked_ahead=dec.branches.looked_ahead,
            lookahead_changed=dec.branches.changed,
            gamma=None if strategy.gammas is None or strategy.auto else list(strategy.gammas),  # None: chosen as it went
            proposer=strategy.proposer,
            plans=plan_counts(spec.plans),
            seed=plan.config.seed,
            ensemble_llama_seconds=loaded.costs.ensemble_seconds(len(dec.generated)),
            finish_reason=finish_reason,
            finish_reasons={finish_reason: 1},
        )


class PromptShift:
    """A member's sequence as the decoder counts positions, where the member reads another prompt
    than the request's: its tokens are the request's prompt, then what followed its own prompt
    (the same tokens for every member); truncating at a position of the request's sequence
    truncates at the same place after its own prompt."""

    def __init__(self, slot: Slot, prompt: Sequence[int], own: Sequence[int]) -> None:
        self.slot = slot
        self.model = slot.model
        self.name = slot.name
        self._prompt = list(prompt)
        self._shift = len(own) - len(prompt)

    @property
    def tokens(self) -> list[int]:
        return self._prompt + self.slot.tokens[len(self._prompt) + self._shift :]

    def truncate(self, n: int) -> None:
        self.slot.truncate(n + self._shift)


class _TokenText:
    """Text of each token on its own, decoding UTF-8 across token boundaries."""

    def __init__(self, piece: Callable[[int], bytes]) -> None:
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, token: int) -> str:
        return self._decoder.decode(self._piece(token))
