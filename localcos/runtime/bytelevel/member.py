"""One model at the byte level: its byte view over its tokenisations, and the llama.cpp sequences
that hold them (`ByteMember`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import cast

import numpy as np

from ...backend import Model
from ...backend.slot import Slot, common_prefix
from ...core.bytelevel import Advance, ByteView, TokenPath, Row, Unreachable, ViewState, replay
from ...core.speedmodel import CallProfile
from ..profile import call_groups
from .level import byte_vocab


class ByteMember:
    """One model at the byte level: its view and the llama.cpp sequences that hold its paths
    (one per path, `max_paths` at most; a new path takes over its parent's sequence when the
    parent is let go, else a free one sharing the parent's cells).

    A sequence let go keeps its cells until it is taken again (a rollback may want them back);
    whoever takes it keeps what it shares with the new path (`_seat`).

    `slots`: the model's sequences this member uses (default all of them); members of one model
    on disjoint slots score several texts at once, their rows in shared calls (`advance_together`)."""

    def __init__(self, model: Model, *, max_paths: int, prune: float, price: CallProfile | None = None, slots: Sequence[Slot] | None = None) -> None:
        self.slots = list(model.slots if slots is None else slots)
        if len(self.slots) < max_paths:
            raise ValueError(f"{model.name} holds {len(self.slots)} sequences; the byte level needs {max_paths}")
        self.model = model
        self.view = ByteView(byte_vocab(model), max_paths=max_paths, prune=prune)
        self.free = list(self.slots[1:])
        self.calls = 0
        self.price = price  # the model's call cost by rows (its profile)
        self.spent = 0.0  # its calls priced at `price`: what --byte-gamma auto checks its plan against
        self.tree_rows = 0  # rows evaluated ahead for drafts (`score`)
        self.missed = 0  # rows a draft's replay asked for that were not evaluated ahead
        self.prompt: list[int] = []
        self.prompt_row: Row | None = None  # the row after the prompt, as the view reads it
        self._anchored: set[int] = set()  # sequences a snapshot or a draft's replay may come back to

    def start(self, prompt: Sequence[int]) -> None:
        """Evaluate the prompt (its own tokens) in the first sequence, as a fresh process does
        (`Slot.start_prompt`: the text then depends on nothing that ran before); the view starts
        there."""
        self._begin(prompt, self.slots[0].start_prompt(list(prompt)))

    def start_beside(self, other: ByteMember) -> None:
        """Begin where `other`, a member of the same model on other slots, has just started: its
        prompt's cells shared and its row after the prompt (one prompt, evaluated once)."""
        home = self.slots[0]
        home.truncate(0)
        home.share_prefix(other.prompt)
        if home.tokens != other.prompt:
            raise RuntimeError(f"{self.model.name}: the prompt to share is no longer in the cache")
        assert other.prompt_row is not None, "a member begun has its row after the prompt"
        self._begin(other.prompt, other.prompt_row)

    def _begin(self, prompt: Sequence[int], row: np.ndarray | Row) -> None:
        home = self.slots[0]
        self.prompt = list(prompt)
        self.free = list(self.slots[1:])
        self._anchored = set()
        self.prompt_row = self.view.start(row, handle=home).row
        self.calls = self.tree_rows = self.missed = 0
        self.spent = 0.0

    def advance(self, byte: int) -> None:
        """Append a byte; the new paths' rows come from one call (or a few, within the model's
        limits). A byte the held paths cannot produce (pruning dropped the paths that could, and
        another model chose it) rebuilds the paths from this model's own tokenisation of the text."""
        self.advance_together([self], [byte])

    @staticmethod
    def advance_together(members: Sequence[ByteMember], data: Sequence[int]) -> None:
        """`advance` of members of one model, each on its own slots and text, by a byte each
        (`data[i]` for members[i]): their new paths' rows in shared calls."""
        requests = [(m, m._begin_advance(b)) for m, b in zip(members, data)]
        evaluate_together([(m, parts) for m, parts in requests if parts])
        for m, parts in requests:
            if parts is not None:
                m._settle()

    def _begin_advance(self, byte: int) -> list[tuple[TokenPath, Slot, list[int]]] | None:
        """`advance` up to its rows: the new paths placed in sequences (`_place`), to evaluate
        and then `_settle`; None after a rebuild, which evaluated and settled its own."""
        try:
            change = self.view.advance(byte)
        except Unreachable:
            self._restart(bytes(self.view.text) + bytes([byte]))
            return None
        return self._place(change)

    @property
    def llama_seconds(self) -> float:
        """Seconds in its model's llama.cpp calls so far (the model's own count)."""
        return self.model.stats.seconds

    def take_token(self, k: int, log_p: float | None = None) -> None:
        """At a boundary of the view (`ByteView.boundary`): append the token at sorted position
        `k` whole (`log_p` its log-probability, where known), its row from one call on the
        path's own sequence."""
        self._step(self.view.take_token(k, log_p))

    def _step(self, change: Advance) -> None:
        """The new paths' rows, then the paths the view folds away let go of their sequences."""
        self._evaluate(self._place(change))
        self._settle()

    def _settle(self) -> None:
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

    def score(self, draft: bytes, extend: int | None = None, distributions: bool = True) -> tuple[list[np.ndarray], list[ViewState]]:
        """The view's distribution at each position of `draft` (see `core.bytelevel.replay`;
        none without `distributions`), its rows evaluated ahead in one call along the view's
        likely tokenisations of the draft (`ByteView.lattice`: the `extend` heaviest through the
        whole draft, default all). The view ends after the draft; `rollback` to one of the
        states (the last one included) makes its sequences consistent again."""
        known = self._evaluate_ahead(draft, extend)
        return replay(self.view, draft, known, self._evaluate_missing, distributions)

    @property
    def call_rows(self) -> int:
        """The most rows one call of this model returns."""
        return min(self.model.max_logit_rows, self.model.n_batch)

    def _evaluate_ahead(self, draft: bytes, extend: int | None) -> dict[tuple[int, ...], Row]:
        chains = self.view.lattice(draft, self.call_rows, extend)
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

    def _evaluate_missing(self, paths: list[TokenPath]) -> None:
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
        self.free = [s for s in self.slots if id(s) not in used]
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
            holders = [s for s in self.slots if id(s) not in taken and s.tokens[: len(t)] == t]
            if holders:
                chosen[i] = min(holders, key=lambda s: len(s.tokens))
                taken.add(id(chosen[i]))
        for i in order:
            if chosen[i] is None:
                spare = [s for s in self.slots if id(s) not in taken]
                # a sequence nothing pending relies on (its cells are copied from wherever they are),
                # else the one that shares most
                slot = max(spare, key=lambda s: (id(s) not in self._anchored, common_prefix(s.tokens, targets[i])))
                chosen[i] = slot
                taken.add(id(slot))
        holding = {id(chosen[i]) for i in order if chosen[i].tokens[: len(targets[i])] == targets[i]}
        missing = []
        # copies first: a holder cut down to its own target may hold what another one copies
        for slot, t in sorted(zip(chosen, targets), key=lambda st: id(st[0]) in holding):
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
        home = self.slots[0]
        row = home.prefill(self.prompt + tokens)  # shares what any sequence holds of it
        self._count(max(len(self.prompt) + len(tokens) - len(home.tokens), 1))
        for path in self.view.paths:
            path.handle = None
        self.free = [s for s in self.slots if s is not home]
        self.view.restart(tokens, start, row, handle=home)
        for b in data[start:until]:
            self._step(self.view.advance(b, force=True))

    def _decode(self, parts: list) -> list:
        """One llama.cpp call, counted (`calls`) and priced at the model's profile (`spent`)."""
        rows = self.model.decode(parts)
        self._count(sum(len(tokens) for _, tokens, _, _ in parts))
        return rows

    def _count(self, tokens: int) -> None:
        """A call this member took part in with `tokens` of its own: counted (`calls`) and priced
        at the model's profile (`spent`)."""
        self.calls += 1
        if self.price is not None:
            self.spent += self.price(tokens)

    def _calls(self, parts: list) -> Iterator[tuple[int, np.ndarray]]:
        """Each part's rows (see `Model.decode`): (its index, its rows), in the calls the model's
        profile says cost least (`runtime.profile.call_groups`). A call's rows are valid until
        the next call, which is made when they have been read."""
        for group in call_groups(self.model, self.price, parts):
            yield from zip(group, self._decode([parts[i] for i in group]))

    def _evaluate(self, parts: list) -> None:
        """Each path's row: `parts` are (path, sequence) or (path, sequence, tokens its sequence
        still lacks before the path's own)."""
        evaluate_together([(self, parts)])

    def _place(self, change: Advance) -> list[tuple[TokenPath, Slot, list[int]]]:
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
        heirs: dict[int, TokenPath] = {}  # a loose parent sequence -> the new path that takes it over
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
            slot = cast(Slot, parent.handle) if heirs.get(id(parent.handle)) is path else self._free_slot()
            out.append((path, slot, self._seat(slot, self.prompt + list(parent.tokens))))
        for path, slot, _ in out:
            path.handle = slot
            path.parent = None  # placed: holding on to it would keep every ancestor's row alive
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
        return max(len(cast(Slot, p.handle).tokens) for p in self.view.paths if p.handle is not None)


def evaluate_together(requests: Sequence[tuple[ByteMember, list]]) -> None:
    """New paths' rows for members of one model (each on its own slots), in the calls its profile
    says cost least (`runtime.profile.call_groups`): each request is (member, parts), parts as
    `ByteMember._evaluate` takes them. Each member counts the calls it took part in, priced at
    its own rows."""
    if not requests:
        return
    first = requests[0][0]
    calls, owners = [], []
    for member, parts in requests:
        for path, slot, *lacking in parts:
            tokens = [*(lacking[0] if lacking else ()), path.token]
            calls.append((slot, tokens, len(tokens) - 1, len(tokens)))
            owners.append((member, path))
    for group in call_groups(first.model, first.price, calls):
        rows = first.model.decode([calls[i] for i in group])
        evaluated: dict[int, int] = {}
        for i, row in zip(group, rows):
            member, path = owners[i]
            member.view.set_row(path, row[0])
            evaluated[id(member)] = evaluated.get(id(member), 0) + len(calls[i][1])
        for member, _ in requests:
            if id(member) in evaluated:
                member._count(evaluated.pop(id(member)))

