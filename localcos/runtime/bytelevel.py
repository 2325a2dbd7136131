"""Byte-level collaborative decoding: models with different tokenizers combined exactly, one byte
at a time.

Each model reads the prompt in its own tokens (and its own chat template) and keeps a
`core.bytelevel.ByteView` of its distribution over the next byte; its paths live in its own
llama.cpp sequences (`ByteMember`), a new path sharing its parent's cache cells (seq_cp) and all
new paths of one byte evaluated in one llama_decode call. A model whose paths are all inside a
token makes no call for that byte. The combiner takes the models' byte distributions as log
probabilities (a [1, 257] row each: bytes, then the end symbol), so WE, CD, logit mixing and user
functions combine at the byte level unchanged; r is sampled byte by byte, restricted to bytes
that keep the text valid UTF-8, and text is emitted as characters complete.
"""

from __future__ import annotations

import codecs
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

import numpy as np

from ..backend import Model, shared_vocab_size
from ..config.specs import GenerationConfig
from ..backend.model import common_prefix
from ..core.bytelevel import END, SYMBOLS, Advance, ByteView, ByteVocab, Path, Row, Unreachable, Utf8State, ViewState, check_prune, replay
from ..core.combiners import BoundCombiner
from ..core.decoding import Origin
from ..core.hostmem import keep_freed_memory
from ..core.sampling import Sampler
from ..core.speedmodel import ByteAutoGamma, CallProfile, Costs
from ..core.verify import verify
from ..errors import ConfigError, TokenizerMismatchError
from ..grammar import Matcher, byte_symbols, unpack
from .generation import Chunk, TokenEvent, completion_rng
from .profile import call_groups, profile as call_profile

if TYPE_CHECKING:
    from ..config.specs import LoadSpec, Settings
    from ..core.combiners import Combiner

def byte_vocab(model: Model) -> ByteVocab:
    """The model's vocabulary as byte strings (built once per model)."""
    vocab = getattr(model, "_byte_vocab", None)
    if vocab is None:
        pieces = [model.piece(t) for t in range(model.n_vocab)]
        ends = [t for t in range(model.n_vocab) if model.is_eog(t)]
        vocab = ByteVocab(pieces, ends, model.name)
        model._byte_vocab = vocab  # type: ignore[attr-defined]
    return vocab


def shares_tokenizer(models: Sequence[Model]) -> bool:
    """Whether the models can decode at the token level together (one tokenizer)."""
    try:
        shared_vocab_size(models)
    except TokenizerMismatchError:
        return False
    return True


def uses_byte_level(spec: "LoadSpec") -> bool:
    """Whether the models of `spec` decode at the byte level: asked for, or (auto) their
    tokenizers differ (read from their vocabularies only, before anything loads)."""
    if spec.level != "auto":
        return spec.level == "byte"
    models = [Model(p, vocab_only=True) for p in spec.paths]
    try:
        return not shares_tokenizer(models)
    finally:
        for m in models:
            m.close()


BYTE_OPTIONS = ("byte_paths", "byte_prune", "byte_gamma")  # read by the byte level only


def decodes_bytes(settings: "Settings", also_given: Sequence[str] = ()) -> bool:
    """Whether the models of `settings` decode at the byte level (`uses_byte_level`). An option
    given (in `settings`, or `also_given`: options a front end took itself) that the level chosen
    would not read is refused in one line: the byte level's own for models that decode at the
    token level; at the byte level --chat-template-model (each model reads a conversation in its
    own template there) and --parallel above 1 (a byte-level generation takes every model's
    sequences: one at a time)."""
    if uses_byte_level(settings.load):
        if (settings.load.parallel or 1) > 1:
            raise ConfigError("--parallel: the byte level decodes one generation at a time (models with different tokenizers)", param="parallel")
        if "chat_template_model" in settings.given:
            raise ConfigError("--chat-template-model: at the byte level each model reads the conversation in its own chat template",
                              param="chat_template_model")  # fmt: skip
        return True
    refuse_byte_options([*settings.given, *also_given])
    return False


def refuse_byte_options(given: Iterable[str], *, json: bool = False, remedy: str = "add --level byte") -> None:
    """The one rule for models that decode at the token level: an option only the byte level
    reads (`BYTE_OPTIONS`), among the options `given`, is a `ConfigError` (named as a flag, or
    with `json` as a request's field or a keyword), saying how to decode at the byte level
    (`remedy`)."""
    from ..config.options import OPTIONS

    unread = [name for name in BYTE_OPTIONS if name in given]
    if unread:
        raise ConfigError(f"{OPTIONS[unread[0]].what(json)}: these models share a tokenizer and decode at the token level, where "
                          f"it does nothing; {remedy} to decode them at the byte level", param=unread[0])  # fmt: skip


def byte_level_settings(settings: "Settings", method: str | None) -> "Settings":
    """`settings` as the byte level runs them: the method given (`method`), else cos, whose
    `--byte-gamma auto` (the default) drafts only where the models' call costs say a draft pays
    and otherwise takes the ensemble's own step (docs/algorithm.md, section 10)."""
    from dataclasses import replace

    return replace(settings, generation=replace(settings.generation, method=method or "cos"))


# Models of different tokenizers rule out different symbols (one may end where the other cannot).
# A logit-level combiner (cd, logit-mix, a user's function) would turn log 0 into an infinite
# preference (cd's -mu * log p_amateur), so a symbol one model rules out and another allows gets
# this probability in the first one's row; a probability-level combiner (we) sees the exact rows.
RULED_OUT = 1e-9


def floor_ruled_out(dists: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The models' symbol distributions with `RULED_OUT` where a model rules out a symbol another
    allows (symbols every model rules out stay at 0)."""
    allowed = np.logical_or.reduce([d > 0 for d in dists])
    return [np.where(allowed & (d == 0), RULED_OUT, d) for d in dists]


def combine_symbols(combiner: BoundCombiner, dists: Sequence[np.ndarray], temperature: float) -> np.ndarray:
    """r over the 257 symbols from the models' symbol distributions (`RULED_OUT` where a
    logit-level combiner needs it), float64."""
    if not combiner.mixes_probs:
        dists = floor_ruled_out(dists)
    with np.errstate(divide="ignore"):
        logits = [np.log(d)[None, :] for d in dists]
    return np.asarray(combiner.combine(logits, temperature)[0], dtype=np.float64)


class ByteMember:
    """One model at the byte level: its view and the llama.cpp sequences that hold its paths
    (one per path, `max_paths` at most; a new path takes over its parent's sequence when the
    parent is let go, else a free one sharing the parent's cells).

    A sequence let go keeps its cells until it is taken again (a rollback may want them back);
    whoever takes it keeps what it shares with the new path (`_seat`)."""

    def __init__(self, model: Model, *, max_paths: int, prune: float, price: CallProfile | None = None) -> None:
        if len(model.slots) < max_paths:
            raise ValueError(f"{model.name} holds {len(model.slots)} sequences; the byte level needs {max_paths}")
        self.model = model
        self.view = ByteView(byte_vocab(model), max_paths=max_paths, prune=prune)
        self.free = list(model.slots[1:])
        self.calls = 0
        self.price = price  # the model's call cost by rows (its profile)
        self.spent = 0.0  # its calls priced at `price`: what --byte-gamma auto checks its plan against
        self.tree_rows = 0  # rows evaluated ahead for drafts (`score`)
        self.missed = 0  # rows a draft's replay asked for that were not evaluated ahead
        self.prompt: list[int] = []
        self._anchored: set[int] = set()  # sequences a snapshot or a draft's replay may come back to

    def start(self, prompt: Sequence[int]) -> None:
        """Evaluate the prompt (its own tokens) in the first sequence, as a fresh process does
        (`Slot.start_prompt`: the text then depends on nothing that ran before); the view starts
        there."""
        home = self.model.slots[0]
        self.prompt = list(prompt)
        row = home.start_prompt(self.prompt)
        self.free = list(self.model.slots[1:])
        self._anchored = set()
        self.view.start(row, handle=home)
        self.calls = self.tree_rows = self.missed = 0
        self.spent = 0.0

    def advance(self, byte: int) -> None:
        """Append a byte; the new paths' rows come from one call (or a few, within the model's
        limits). A byte the held paths cannot produce (pruning dropped the paths that could, and
        another model chose it) rebuilds the paths from this model's own tokenisation of the text."""
        try:
            change = self.view.advance(byte)
        except Unreachable:
            self._restart(bytes(self.view.text) + bytes([byte]))
            return
        self._step(change)

    def _step(self, change: Advance) -> None:
        """The new paths' rows, then the paths the view folds away let go of their sequences."""
        self._evaluate(self._place(change))
        folded = self.view.settle()
        held = {id(p.handle) for p in self.view.paths}
        for path in folded:
            if path.handle is not None and id(path.handle) not in held:
                self._free(path.handle)
            path.handle = None

    def rebuild(self, ahead: bytes) -> None:
        """Hold one tokenisation of the text so far again: the model's own tokenisation of the
        text and the bytes `ahead` of it (what `advance` does with a byte the held paths rule
        out), as far as the text goes. The paths then reach the bytes ahead."""
        text = bytes(self.view.text)
        self._restart(text + ahead, until=len(text))

    # --- drafts: score bytes ahead in one call, come back to where the view was ----------------
    def snapshot(self) -> ViewState:
        """Where the view stands; its paths' sequences are kept from being taken over while the
        view goes on (a rollback to it then finds their cells)."""
        self._anchored.update(id(p.handle) for p in self.view.paths if p.handle is not None)
        return self.view.snapshot()

    def rollback(self, state: ViewState) -> None:
        """Back to an earlier snapshot; each held path's sequence holds its tokens again."""
        self.view.restore(state)
        self._hold()

    def score(self, draft: bytes) -> tuple[list[np.ndarray], list[ViewState]]:
        """The view's distribution at each position of `draft` (see `core.bytelevel.replay`),
        its rows evaluated ahead in one call along the view's likely tokenisations of the draft.
        The view ends after the draft; `rollback` to one of the states (the last one included)
        makes its sequences consistent again."""
        known = self._evaluate_ahead(draft)
        return replay(self.view, draft, known, self._evaluate_missing)

    def _evaluate_ahead(self, draft: bytes) -> dict[tuple[int, ...], Row]:
        model = self.model
        limit = min(model.max_logit_rows, model.n_batch)
        chains = self.view.lattice(draft, limit)
        parts = []
        taken: set[int] = set()
        for base, tokens in chains:
            target = self.prompt + list(base.tokens)
            slot = base.handle if base.handle is not None and id(base.handle) not in taken else None
            if slot is None:
                spare = [s for s in self.free if id(s) not in taken]
                if not spare:
                    break
                slot = min(spare, key=lambda s: id(s) in self._anchored)
                self._seat(slot, target)
            taken.add(id(slot))
            parts.append((slot, tokens, 0, len(tokens)))
        if not parts:
            return {}
        # the replay's paths take their rows from these chains, and their cells stay here until
        # the round's rollback re-seats them: rows a replay still misses go elsewhere
        self._anchored.update(id(slot) for slot, _, _, _ in parts)
        known = {}
        for k, chain_rows in self._calls(parts):
            base, tokens = chains[k]
            for i in range(len(tokens)):
                known[base.tokens + tuple(tokens[: i + 1])] = self.view.normalise(chain_rows[i])
        self.tree_rows += sum(len(t) for _, t in chains[: len(parts)])
        return known

    def _evaluate_missing(self, paths: list[Path]) -> None:
        """Rows a replay needs that were not evaluated ahead: each path's tokens but the last
        seated in a sequence (sharing what any holds), the last evaluated there."""
        self.missed += len(paths)
        slots = self._seats([self.prompt + list(p.tokens[:-1]) for p in paths])
        for path, slot in zip(paths, slots):
            path.handle = slot
        self._evaluate(list(zip(paths, slots)))

    def _hold(self) -> None:
        """Make each held path's sequence hold exactly the prompt and its tokens (after a
        rollback or a replay moved things around); the other sequences become free."""
        paths = self.view.paths
        slots = self._seats([self.prompt + list(p.tokens) for p in paths])
        for path, slot in zip(paths, slots):
            path.handle = slot
        used = {id(s) for s in slots}
        self.free = [s for s in self.model.slots if id(s) not in used]
        self._anchored = set()  # no snapshot is pending after a rollback

    def _seats(self, targets: list[list[int]]) -> list:
        """A distinct sequence holding exactly each of `targets`: one that holds it already (or
        more after it) where there is one, else the sequence that shares most of it, the rest
        copied from whichever sequence holds it (seq_cp) and, failing that, evaluated."""
        chosen: list = [None] * len(targets)
        taken: set[int] = set()
        order = sorted(range(len(targets)), key=lambda i: -len(targets[i]))
        for i in order:  # holders first, so copying below never takes a holder's sequence
            t = targets[i]
            holders = [s for s in self.model.slots if id(s) not in taken and s.tokens[: len(t)] == t]
            if holders:
                chosen[i] = min(holders, key=lambda s: len(s.tokens))
                taken.add(id(chosen[i]))
        for i in order:
            if chosen[i] is None:
                spare = [s for s in self.model.slots if id(s) not in taken]
                # a sequence nothing pending relies on (its cells are copied from wherever they are),
                # else the one that shares most
                slot = max(spare, key=lambda s: (id(s) not in self._anchored, common_prefix(s.tokens, targets[i])))
                chosen[i] = slot
                taken.add(id(slot))
        holders = {id(chosen[i]) for i in order if chosen[i].tokens[: len(targets[i])] == targets[i]}
        missing = []
        # copies first: a holder cut down to its own target may hold what another one copies
        for slot, t in sorted(zip(chosen, targets), key=lambda st: id(st[0]) in holders):
            rest = self._seat(slot, t)
            if rest:
                missing.append((slot, rest, 0, 0))
        if missing:  # cells nobody held any more: evaluate them again, no rows asked
            self._decode(missing)
        return chosen

    def _seat(self, slot, target: list[int]) -> list[int]:
        """Make `slot` hold the longest prefix of `target` any sequence holds; what it still
        lacks."""
        slot.share_prefix(target)
        keep = common_prefix(slot.tokens, target)
        slot.truncate(keep)
        return target[keep:]

    def _restart(self, data: bytes, until: int | None = None) -> None:
        """One path again: the model's own tokens of `data` but the last (as far as they spell
        it: a tokenizer may replace invalid UTF-8; the longest tokens after that), evaluated in
        the first sequence; then the bytes after them again up to `until` (default: the end),
        one by one, followed even where the row gives them no probability (`ByteView.advance`'s
        force)."""
        tokens: list[int] = []
        pos = 0
        for t in self.model.tokenize(data, add_bos=False):
            piece = self.model.piece(t)
            if not piece or not data.startswith(piece, pos):
                break
            tokens.append(t)
            pos += len(piece)
        tokens += self.view.vocab.cover(data[pos:])
        start = len(data) - len(self.model.piece(tokens.pop()))
        home = self.model.slots[0]
        row = home.prefill(self.prompt + tokens)  # shares what any sequence holds of it
        self.calls += 1
        if self.price is not None:
            self.spent += self.price(max(len(self.prompt) + len(tokens) - len(home.tokens), 1))
        for path in self.view.paths:
            path.handle = None
        self.free = [s for s in self.model.slots if s is not home]
        self.view.restart(tokens, start, row, handle=home)
        for b in data[start:until]:
            self._step(self.view.advance(b, force=True))

    def _decode(self, parts: list) -> list:
        """One llama.cpp call, counted (`calls`) and priced at the model's profile (`spent`)."""
        rows = self.model.decode(parts)
        self.calls += 1
        if self.price is not None:
            self.spent += self.price(sum(len(tokens) for _, tokens, _, _ in parts))
        return rows

    def _calls(self, parts: list) -> Iterator[tuple[int, np.ndarray]]:
        """Each part's rows (see `Model.decode`): (its index, its rows), in the calls the model's
        profile says cost least (`runtime.profile.call_groups`). A call's rows are valid until
        the next call, which is made when they have been read."""
        for group in call_groups(self.model, self.price, parts):
            yield from zip(group, self._decode([parts[i] for i in group]))

    def _evaluate(self, parts: list) -> None:
        """Each path's row (`_calls`): `parts` are (path, sequence) or (path, sequence, tokens its
        sequence still lacks before the path's own)."""
        calls = []
        for path, slot, *lacking in parts:
            tokens = [*(lacking[0] if lacking else ()), path.token]
            calls.append((slot, tokens, len(tokens) - 1, len(tokens)))
        for i, row in self._calls(calls):
            self.view.set_row(parts[i][0], row[0])

    def _place(self, change: Advance) -> list[tuple[Path, object, list[int]]]:
        """A sequence for each new path, holding its parent's tokens (the path's own token is
        evaluated there next): the parent's sequence when the parent is let go, else a free one
        sharing the parent's cells. Sequences of paths let go are freed. A parent a snapshot
        may come back to keeps its sequence while free ones last; past that a child takes it
        over (a rollback to the snapshot then evaluates those cells again).

        Sequences, not path objects, are what parents and children have in common (a path kept
        and then pruned is a copy of the parent its children name). Returns (path, sequence,
        tokens the sequence still lacks: cells nobody held any more)."""
        new_ids = {id(p) for p in change.new}
        kept = {id(p.handle) for p in self.view.paths if id(p) not in new_ids and p.handle is not None}
        parent_slots = {id(p.parent.handle) for p in change.new if p.parent is not None}
        loose: dict[int, object] = {}  # sequences of paths let go that no kept path holds
        for path in change.gone:
            if path.handle is not None and id(path.handle) not in kept:
                loose[id(path.handle)] = path.handle
        for key, slot in loose.items():
            if key not in parent_slots:
                self._free(slot)
        heirs: dict[int, Path] = {}  # a loose parent sequence -> the new path that takes it over
        for path in change.new:
            key = id(path.parent.handle)  # type: ignore[union-attr]
            if key in loose and key not in heirs and key not in self._anchored:
                heirs[key] = path
        short = len(change.new) - len(heirs) - len(self.free)
        for path in change.new:
            key = id(path.parent.handle)  # type: ignore[union-attr]
            if short > 0 and key in loose and key not in heirs:
                heirs[key] = path
                short -= 1
        out = []
        for path in change.new:
            parent = path.parent
            assert parent is not None and parent.handle is not None
            slot = parent.handle if heirs.get(id(parent.handle)) is path else self._free_slot()
            out.append((path, slot, self._seat(slot, self.prompt + list(parent.tokens))))
        for path, slot, _ in out:
            path.handle = slot
        for path in change.gone:
            path.handle = None
        for key, slot in loose.items():
            if key in parent_slots and key not in heirs:
                self._free(slot)
        return out

    def _free_slot(self):
        """A free sequence, one no snapshot's path holds where there is one."""
        for i in range(len(self.free) - 1, -1, -1):
            if id(self.free[i]) not in self._anchored:
                return self.free.pop(i)
        return self.free.pop()

    def _free(self, slot) -> None:
        if all(slot is not other for other in self.free):
            self.free.append(slot)

    @property
    def longest(self) -> int:
        """The most tokens one of its sequences holds."""
        return max(len(p.handle.tokens) for p in self.view.paths if p.handle is not None)


@dataclass
class ByteStats:
    """What a byte-level generation did."""

    bytes: int = 0
    chars: int = 0
    seconds: float = 0.0
    prompt_seconds: float = 0.0
    calls: list[int] = field(default_factory=list)  # llama_decode calls per model
    rows: list[int] = field(default_factory=list)  # path rows evaluated per model
    most_paths: list[int] = field(default_factory=list)
    restarts: list[int] = field(default_factory=list)  # paths rebuilt from the model's tokenisation
    dropped: list[float] = field(default_factory=list)  # each model's probability mass pruned
    folded: list[int] = field(default_factory=list)  # paths folded into a heavier one at their position
    finish_reason: str = ""
    method: str = "ensemble"
    combiner: str = ""  # its description
    names: list[str] = field(default_factory=list)  # the models'
    drafted: int = 0  # draft symbols judged (cos)
    accepted: int = 0
    missed: list[int] = field(default_factory=list)  # rows a draft's scoring had not evaluated ahead
    ensemble_steps: int = 0  # cos: rounds where no model drafted (--byte-gamma auto's choice, or no room)
    completions: int = 1
    finish_reasons: dict[str, int] = field(default_factory=dict)  # of several completions (`aggregate`)

    @classmethod
    def aggregate(cls, stats: Sequence["ByteStats"]) -> "ByteStats":
        """Totals over completions of one request (the most paths held: the largest)."""
        if not stats:
            raise ValueError("no stats")

        def total(name: str) -> list:
            return [sum(values) for values in zip(*(getattr(s, name) for s in stats))]

        reasons: dict[str, int] = {}
        for s in stats:
            for reason, count in (s.finish_reasons or {s.finish_reason: 1}).items():
                reasons[reason] = reasons.get(reason, 0) + count
        return cls(
            bytes=sum(s.bytes for s in stats), chars=sum(s.chars for s in stats), seconds=sum(s.seconds for s in stats),
            prompt_seconds=sum(s.prompt_seconds for s in stats), calls=total("calls"), rows=total("rows"),
            most_paths=[max(values) for values in zip(*(s.most_paths for s in stats))], restarts=total("restarts"),
            dropped=total("dropped"), folded=total("folded"), finish_reason=stats[0].finish_reason if len(reasons) == 1 else "", method=stats[0].method, combiner=stats[0].combiner, names=stats[0].names,
            drafted=sum(s.drafted for s in stats), accepted=sum(s.accepted for s in stats), missed=total("missed"),
            ensemble_steps=sum(s.ensemble_steps for s in stats),
            completions=sum(s.completions for s in stats), finish_reasons=reasons,
        )  # fmt: skip

    @property
    def chars_per_second(self) -> float:
        return self.chars / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "level": "byte",
            "bytes": self.bytes,
            "chars": self.chars,
            "seconds": round(self.seconds, 4),
            "prompt_seconds": round(self.prompt_seconds, 4),
            "chars_per_second": round(self.chars_per_second, 2),
            "calls_per_char": [round(c / max(self.chars, 1), 3) for c in self.calls],
            "calls": self.calls,
            "rows": self.rows,
            "most_paths": self.most_paths,
            "restarts": self.restarts,
            "dropped_mass": [float(f"{d:.3g}") for d in self.dropped],
            "folded": self.folded,
            "finish_reason": self.finish_reason,
            **({"completions": self.completions, "finish_reasons": self.finish_reasons} if self.completions > 1 else {}),
            "method": self.method,
            "combiner": self.combiner,
            **({"drafted": self.drafted, "accepted": self.accepted, "missed_rows": self.missed, "ensemble_steps": self.ensemble_steps}
               if self.method == "cos" else {}),
        }

    def summary(self, names: Sequence[str]) -> str:
        per_model = ", ".join(
            f"{n}: {c / max(self.chars, 1):.2f} calls/char, {p} paths at most, {d:.2g} mass dropped, {f} folded, {r} restarts"
            for n, c, p, d, f, r in zip(names, self.calls, self.most_paths, self.dropped, self.folded, self.restarts)
        )
        drafts = f"; {self.accepted}/{self.drafted} draft symbols accepted, {self.ensemble_steps} ensemble steps" if self.method == "cos" else ""
        return f"byte level: {self.chars} chars in {self.seconds:.2f} s ({self.chars_per_second:.1f} chars/s); {per_model}{drafts}"


@dataclass
class ByteCompletion:
    """One completion generated at the byte level."""

    text: str
    data: bytes
    finish_reason: str  # "stop" (the end symbol or a stop string), "length" (max_chars or the context), "cancelled"
    stats: ByteStats
    end_token = None  # the byte level ends on its end symbol, not on one model's token

    @property
    def length(self) -> int:
        """Its length in what max_tokens counts at the byte level: characters."""
        return len(self.text)

    def to_dict(self) -> dict:
        return {"text": self.text, "finish_reason": self.finish_reason}


@dataclass(frozen=True)
class BytePlan:
    """One byte-level completion to run (`ByteModels.plan` checks it): each model's prompt in its
    own tokens, the generation settings, the combination bound to the models, the method."""

    prompts: tuple[tuple[int, ...], ...]
    config: GenerationConfig
    combiner: BoundCombiner
    method: str  # "ensemble" or "cos"

    @property
    def prompt(self) -> tuple[int, ...]:
        """The first model's prompt tokens (what a server's usage counts)."""
        return self.prompts[0]


@dataclass
class _Round:
    """What one step decided: the symbols committed (END last when the text ended) and, after a
    draft every symbol of which was accepted, the model whose turn it is to propose."""

    symbols: list[int]
    next_proposer: int | None = None


class ByteGeneration:
    """One completion at the byte level: `run()` yields text as characters complete and returns
    the `ByteCompletion`.

    Args:
        members: the models' byte views over their sequences (`ByteMember`, or a test's stand-in
            with its `view`, `start`, `advance`, `calls`, and for `cos` `snapshot`, `rollback`,
            `score`).
        prompts: each model's prompt, in its own tokens.
        combiner: bound to the members; it receives [1, 257] log probabilities per model.
        sampler: temperature and truncations, applied to r over the 257 symbols.
        max_chars: characters (UTF-8) to generate at most.
        stop: strings that end the text (not included).
        method: "ensemble" (every model advances every byte, r sampled) or "cos" (the models take
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
    """

    def __init__(
        self,
        members: Sequence,
        prompts: Sequence[Sequence[int]],
        combiner: BoundCombiner,
        sampler: Sampler,
        rng: np.random.Generator,
        *,
        max_chars: int,
        stop: Sequence[str] = (),
        n_ctx: int | None = None,
        ignore_end: bool = False,
        method: str = "ensemble",
        gamma: int | str = 8,
        costs: Costs | None = None,
        cancelled: Callable[[], bool] | None = None,
        names: Sequence[str] = (),
        constraint: Matcher | None = None,
    ) -> None:
        self.members = list(members)
        self.constraint = constraint
        self.names = list(names)
        self.cancelled = cancelled
        self.ignore_end = ignore_end
        self.prompts = [list(p) for p in prompts]
        self.combiner = combiner
        self.sampler = sampler
        self.rng = rng
        self.max_chars = max_chars
        self.stop = tuple(s for s in stop if s)
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

    def symbol_distribution(self, dists: Sequence[np.ndarray] | None = None) -> np.ndarray:
        """r over the 257 symbols from the models' distributions (default: now), before UTF-8
        and sampling settings."""
        if dists is None:
            dists = [m.view.distribution() for m in self.members]
        return combine_symbols(self.combiner, dists, self.sampler.softmax_temperature)

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

    def _target(self, dists: Sequence[np.ndarray], allowed: np.ndarray) -> np.ndarray:
        return self._finish(self.symbol_distribution(dists), allowed)

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

    def _ensemble_step(self, utf8: Utf8State) -> _Round:
        dists = [m.view.distribution() for m in self.members]
        allowed = self._allowed(utf8)
        r = self._target(dists, allowed)
        if self.auto is not None and self.auto.wants_acceptance:  # what each model's draft byte would have been accepted with
            for i, dist in enumerate(dists):
                accept = float(np.minimum(self._proposal(dist, allowed), r).sum())
                self.auto.observe_verdicts(i, accept, 1.0 - accept)
        symbol = self.sampler.draw(r, self.rng)
        self._consume(symbol)
        if symbol != END:
            for i, member in enumerate(self.members):
                self._advance(i, member, symbol)
        return _Round([symbol])

    def _spent(self) -> float | None:
        """The members' calls so far, priced at their profiles (None: a member that does not
        price its calls, a test's stand-in)."""
        spent = [getattr(m, "spent", None) for m in self.members]
        return None if None in spent else float(sum(spent))

    def _advance(self, i: int, member, symbol: int) -> None:
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
        before = [(getattr(m, "tree_rows", 0), getattr(m, "missed", 0)) for m in others]
        scored = [m.score(data) for m in others]
        if self.auto is not None:
            for m, (ahead, missed) in zip(others, before):
                self.auto.observe_scoring(self.members.index(m), len(data), m.tree_rows - ahead, m.missed - missed)
        reached = min(len(dists) for dists, _ in scored)  # positions every model has a distribution at
        judged = min(len(draft), reached)
        targets = []
        for j in range(judged):
            dists = [d[j] for d, _ in scored]
            dists.insert(proposer, drafter_dists[j])
            targets.append(self._target(dists, allowed_at[j]))
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
            self._consume(verdict.resample)
            if verdict.resample != END:
                for i, member in enumerate(self.members):
                    self._advance(i, member, verdict.resample)
            return _Round(symbols)
        if judged == len(draft) and (not draft or draft[-1] != END):
            return _Round(symbols, (proposer + 1) % len(self.members))  # CoS: the next model goes on
        return _Round(symbols)

    def run(self) -> Iterator[str]:
        t_prompt = time.perf_counter()
        for member, prompt in zip(self.members, self.prompts):
            member.start(prompt)
        self.drafted = self.accepted = 0
        t0 = time.perf_counter()
        utf8 = Utf8State()
        decoder = codecs.getincrementaldecoder("utf-8")()
        data = bytearray()
        text = ""
        emitted = 0  # characters of `text` already yielded
        hold = max((len(s) for s in self.stop), default=1) - 1  # a stop string may still begin here
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
            if gamma:
                # the plan's estimate of this round, and the members' priced calls before it
                check = (self.auto.round_seconds(proposer, gamma), self._spent()) if self.auto is not None else None
                step = self._cos_round(utf8, proposer, gamma)
                if check is not None and check[1] is not None:
                    self.auto.observe_round(proposer, check[0], self._spent() - check[1])  # type: ignore[union-attr, operator]
            else:
                step = self._ensemble_step(utf8)
                self.ensemble_steps += cos
            passed = step.next_proposer is not None
            proposer = step.next_proposer if passed else 0
            for symbol in step.symbols:
                if symbol == END:
                    finish = "stop"
                    break
                data.append(symbol)
                utf8.push(symbol)
                piece = decoder.decode(bytes([symbol]))
                if not piece:
                    continue
                text += piece
                hit = _find_stop(text, self.stop, len(text) - len(piece))
                if hit is not None:
                    text = text[:hit]
                    finish = "stop"
                    break
                if len(text) >= self.max_chars:
                    finish = "length"
                    break
                if self.n_ctx is not None and any(m.longest >= self.n_ctx for m in self.members):
                    finish = "length"
                    break
            safe = len(text) - hold if self.stop else len(text)
            if not finish and safe > emitted:
                yield text[emitted:safe]
                emitted = safe
        if len(text) > emitted:
            yield text[emitted:]
        stats = ByteStats(
            bytes=len(data),
            chars=len(text),
            seconds=time.perf_counter() - t0,
            prompt_seconds=t0 - t_prompt,
            calls=[m.calls for m in self.members],
            rows=[m.view.rows for m in self.members],
            most_paths=[m.view.most_paths for m in self.members],
            restarts=[m.view.restarts for m in self.members],
            dropped=[m.view.dropped for m in self.members],
            folded=[m.view.folded for m in self.members],
            finish_reason=finish,
            method="cos" if cos else "ensemble",
            combiner=self.combiner.description,
            names=self.names,
            drafted=self.drafted,
            accepted=self.accepted,
            missed=[getattr(m, "missed", 0) for m in self.members],
            ensemble_steps=self.ensemble_steps,
        )
        self.completion = ByteCompletion(text, bytes(data), finish, stats)
        return self.completion


SAMPLED = Origin("sample")  # a piece of byte-level text, as the chat colours it


class ByteStream:
    """A byte-level completion streamed as the chat reads a token-level `Stream`: `chunks()`
    yields each new piece of text (one event per piece: the byte level has no tokens), `cancel()`
    stops it at the next byte, `completion` is set once it ends."""

    def __init__(self, models: "ByteModels", plan: BytePlan, rng: np.random.Generator) -> None:
        self._cancelled = False
        self.generation = models.start(plan, rng, cancelled=lambda: self._cancelled)
        self.completion: ByteCompletion | None = None

    def cancel(self) -> None:
        self._cancelled = True

    def chunks(self) -> Iterator[Chunk]:
        for piece in self.generation.run():
            yield Chunk(piece, (TokenEvent(-1, piece, SAMPLED),))
        self.completion = self.generation.completion

    def __iter__(self) -> Iterator[str]:
        for chunk in self.chunks():
            yield chunk.text


def _find_stop(text: str, stops: Sequence[str], new_from: int) -> int | None:
    """Where the first stop string in `text` begins, looking only where new text could complete one."""
    best = None
    for s in stops:
        i = text.find(s, max(0, new_from - len(s) + 1))
        if i >= 0 and (best is None or i < best):
            best = i
    return best


def run_to_end(generation: ByteGeneration) -> ByteCompletion:
    """Drive a generation to its end; its completion."""
    for _ in generation.run():
        pass
    return generation.completion


class ByteModels:
    """Models loaded for byte-level decoding: each with `max_paths` sequences in one unified KV
    cache, and its byte vocabulary."""

    def __init__(
        self, models: Sequence[Model], combiner: BoundCombiner, *, max_paths: int, prune: float, profiles: Sequence[CallProfile] | None = None
    ) -> None:
        keep_freed_memory()  # every row's vocabulary-sized arrays come and go (see core.hostmem)
        self.models = list(models)
        self.combiner = combiner
        # each model's call cost by rows (`runtime.profile`): what --byte-gamma auto plans with
        self.costs = Costs(list(profiles) if profiles is not None else [call_profile(m) for m in self.models])
        self.members = [ByteMember(m, max_paths=max_paths, prune=prune, price=p) for m, p in zip(self.models, self.costs.profiles)]
        self.n_ctx = min(m.n_ctx for m in self.models)

    @classmethod
    def load(
        cls,
        spec: "LoadSpec",
        combiner,
        *,
        progress: Callable[[int, int, str], None] | None = None,
    ) -> "ByteModels":
        """Load every model of `spec` with `spec.byte_paths` sequences; paths pruned at
        `spec.byte_prune`."""
        import os

        from .loaded import model_options

        if any(spec.rpc):  # a model on RPC servers decodes one sequence; its paths need byte_paths of them
            raise ConfigError("--rpc: not available at the byte level (each model holds --byte-paths sequences here; "
                              "a model on RPC servers decodes one)", param="rpc")  # fmt: skip
        models: list[Model] = []
        profiles: list[CallProfile] = []
        try:
            for i, path in enumerate(spec.paths):
                if progress:
                    progress(i, len(spec.paths), os.fspath(path))
                models.append(Model(path, n_seq=spec.byte_paths, **model_options(spec, i, max(32, spec.byte_paths))))
                profiles.append(call_profile(models[-1], spec.calibrate))
                models[-1].warm_up(timed_calls=0)
            bound = combiner.bind(len(models), [m.n_params for m in models])
            for m in models:
                byte_vocab(m)
            return cls(models, bound, max_paths=spec.byte_paths, prune=spec.byte_prune, profiles=profiles)
        except BaseException:
            for m in models:
                m.close()
            raise

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.models]

    def document_starts(self) -> list[list[int]]:
        """Each model's context for a text of its own: its BOS, or where it has none its
        end-of-text token (what its training put between documents)."""
        return [[m.bos if m.bos >= 0 else m.eos] for m in self.models]

    def prompts(self, text: str) -> list[list[int]]:
        """The prompt text in each model's own tokens (each adds BOS as its metadata says)."""
        return [m.tokenize(text) for m in self.models]

    @property
    def combiner(self) -> BoundCombiner:
        """The default combination, bound to the models (a `Combiner` set here is bound)."""
        return self._combiner

    @combiner.setter
    def combiner(self, combiner: "BoundCombiner | Combiner") -> None:
        if not isinstance(combiner, BoundCombiner):
            combiner = combiner.bind(len(self.models), [m.n_params for m in self.models])
        self._combiner = combiner

    def stream(self, prompts: Sequence[Sequence[int]], *, config: GenerationConfig) -> "ByteStream":
        """A completion of `prompts` (each model's own tokens) as a stream of text pieces, drawing
        from random stream 0 of `config.seed` (as `generate` does)."""
        return ByteStream(self, self.plan(prompts, config), completion_rng(config.seed, 0))

    @property
    def parallel(self) -> int:
        """Generations decoded at once: one (its paths take the models' sequences)."""
        return 1

    def plan(
        self,
        prompts: Sequence[Sequence[int]],
        config: GenerationConfig,
        *,
        combiner: "Combiner | None" = None,
        param: str = "prompt",
    ) -> BytePlan:
        """A byte-level completion of `prompts` (each model's own tokens) under `config`, checked
        once here for every front end: its method ensemble or cos; `combiner` bound to the
        models (default the loaded one); token-counted drafts (gamma), a proposer, lookup on
        and a prompt longer than a model's context are refused (`ConfigError`, naming `param`)."""
        config = config.for_models(len(self.models))
        method = config.method
        if config.gamma != "auto":
            raise ConfigError("gamma counts tokens; at the byte level drafts are counted in bytes: --byte-gamma N", param="gamma")
        if method not in ("ensemble", "cos"):
            raise ConfigError(f"method {method}: not available at the byte level yet (models with different tokenizers, or level byte); "
                              "ensemble or cos", param="method")  # fmt: skip
        if config.proposer is not None or config.lookup == "on":  # drafts looked up in token ids; proposers take turns
            param = "proposer" if config.proposer is not None else "lookup"
            raise ConfigError(f"{param}: not available at the byte level (models take turns drafting bytes; lookup drafts are "
                              "token ids)", param=param)  # fmt: skip
        for m, p in zip(self.models, prompts):
            if len(p) >= m.n_ctx:
                raise ConfigError(f"the prompt is {len(p)} tokens for {m.name}, which holds {m.n_ctx}", param=param)
        bound = self.combiner if combiner is None else combiner.bind(len(self.models), [m.n_params for m in self.models])
        return BytePlan(tuple(tuple(p) for p in prompts), config, bound, method)

    def cancelled_completion(self, plan: BytePlan) -> ByteCompletion:
        """The completion of a generation cancelled before it started."""
        n = len(self.models)
        stats = ByteStats(calls=[0] * n, rows=[0] * n, most_paths=[0] * n, restarts=[0] * n, dropped=[0.0] * n, folded=[0] * n, missed=[0] * n,
                          finish_reason="cancelled", method=plan.method, combiner=plan.combiner.description, names=self.names)  # fmt: skip
        return ByteCompletion("", b"", "cancelled", stats)

    def start(self, plan: BytePlan, rng: np.random.Generator, cancelled: Callable[[], bool] | None = None) -> ByteGeneration:
        """The generation of `plan` drawing from `rng` (`run()` drives it); one at a time."""
        config = plan.config
        return ByteGeneration(self.members, plan.prompts, plan.combiner, config.sampler(), rng, max_chars=config.max_tokens,
                              stop=config.stop, n_ctx=self.n_ctx, ignore_end=config.ignore_eos, method=plan.method,
                              gamma=config.byte_gamma, costs=self.costs, cancelled=cancelled, names=self.names,
                              constraint=None if config.constraint is None else Matcher(byte_symbols(), config.constraint))  # fmt: skip

    @contextmanager
    def pruning(self, prune: float) -> Iterator[None]:
        """Every model's paths pruned (and folded) at `prune` inside the block, as loaded after
        it: scoring a given text keeps every tokenisation (prune 0), whatever generation uses."""
        prune = check_prune(prune)
        loaded = [m.view.prune for m in self.members]
        for m in self.members:
            m.view.prune = prune
        try:
            yield
        finally:
            for m, p in zip(self.members, loaded):
                m.view.prune = p

    def close(self) -> None:
        for m in self.models:
            m.close()

    def __enter__(self) -> "ByteModels":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
