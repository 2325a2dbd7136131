"""Byte-level views of tokenised models: each model's distribution over the next byte of its output.

A model generates tokens until an end token; its output is the concatenation of the tokens'
bytes. For a byte string s its output has begun with, p(b | s) is the probability that the output
continues s with byte b, or ends right there (the end symbol `END`), marginalised over every token
sequence whose bytes begin with s (Phan et al. 2024; Hayase et al. 2025). Two models with different
tokenizers then speak one alphabet of 257 symbols, where any combiner can combine them exactly.

The token sequences that matter are kept as *paths*: a path is a token sequence T whose bytes are
s[:start], with its probability P(T) and its next-token distribution (one logits row of the
model, after prompt + T). The tokens that may follow it are those whose bytes begin with its
*pending* bytes s[start:] and reach past the end of s; a token whose bytes are exactly the pending
bytes ends at the end of s and makes a new path, whose row the model must compute. Every way the
model can produce s passes through exactly one path's pending token (or ends exactly on a path,
which is then at the end of s), so

    P(s b) = sum over paths of P(T) * P(next token's bytes begin with s[start:] b | T)

summed over the paths' distributions in the vocabulary sorted by bytes, in which the tokens
beginning with any byte string form one contiguous range. Nothing done per byte or per token loops
over the vocabulary in Python (what `ByteVocab` builds once per model does: the sort, which tokens
may follow a boundary whole); a path's row is read once over the whole vocabulary (its 256-way
split by first byte, in one vectorised pass) and after that over ever smaller ranges.

Paths whose mass falls below `prune` times the largest are dropped (0 keeps every one: exact), at
most `max_paths` are kept, and the mass dropped is counted (`ByteView.dropped`). Paths that reach
one position by different tokenisations tend to stay in step (the same tokens follow each of
them) and to predict alike: once their rows are known, a lighter one whose mass times the total
variation between its row and the heaviest's is below `prune` times the heaviest's mass is folded
into it (`ByteView.settle`: its mass kept, its row no longer asked for; with prune 0 never).

This module is NumPy only: a `ByteView` says which new paths need a row (`ByteView.advance`), and
whoever owns the model evaluates them (`runtime.bytelevel` with llama.cpp, or a test's fake).
"""

from __future__ import annotations

import bisect
import codecs
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from ..errors import ConfigError, check_range

END = 256  # the end symbol's index in a byte distribution
FORCED = 1e-300  # the probability a forced advance gives a token the row gives 0
SYMBOLS = 257  # 256 byte values and END
_DEEP = 4  # byte columns precomputed for the whole vocabulary; deeper ones are read per range
_ALL_SYMBOLS = np.arange(SYMBOLS)


def check_prune(value: float, what: str = "prune") -> float:
    """The one rule of the pruning threshold: 0 <= prune < 1 (0 keeps every path: exact)."""
    value = check_range(value, what, minimum=0)
    if value >= 1:
        raise ConfigError(f"{what} must be below 1 (a path is dropped when its mass is below prune x the largest), got {value:g}", param="byte_prune")
    return value


class ByteVocab:
    """A model's vocabulary as byte strings, sorted so that the tokens beginning with any byte
    string form one contiguous range.

    Args:
        pieces: each token id's bytes in generated text (empty for control tokens).
        end_tokens: the model's end-of-generation tokens: they make the end symbol.
        name: the model as error messages name it.
    Tokens with no bytes that do not end generation (control tokens) are never generated at the
    byte level: each row's distribution is renormalised over the byte tokens and the end tokens.
    """

    def __init__(self, pieces: Sequence[bytes], end_tokens: Iterable[int], name: str = "the model") -> None:
        self.n_vocab = len(pieces)
        self.end_tokens = np.array(sorted(set(end_tokens)), dtype=np.int64)
        if len(self.end_tokens) == 0:
            raise ConfigError(f"{name} has no end-of-generation token, so its output never ends at the byte level", param="models")
        ends = set(self.end_tokens.tolist())
        ids = [t for t, p in enumerate(pieces) if p and t not in ends]
        ids.sort(key=lambda t: pieces[t])
        self.order = np.array(ids, dtype=np.int32)  # sorted position -> token id (int32: gathered every row)
        self.pieces: list[bytes] = [pieces[t] for t in ids]  # sorted
        self.size = len(ids)
        self.lengths = np.array([len(p) for p in self.pieces], dtype=np.int64)
        self._longest_piece = int(self.lengths.max(initial=0))
        deep = np.full((self.size, _DEEP), -1, dtype=np.int16)  # -1: the token is shorter
        for d in range(_DEEP):
            has = self.lengths > d
            deep[has, d] = [p[d] for p, h in zip(self.pieces, has) if h]
        self._columns = deep
        self.root_bounds = np.searchsorted(deep[:, 0], _ALL_SYMBOLS)  # ranges by first byte

    @cached_property
    def position(self) -> np.ndarray:
        """Each token id's sorted position (-1: not a byte token)."""
        out = np.full(self.n_vocab, -1, dtype=np.int64)
        out[self.order] = np.arange(self.size)
        return out

    @cached_property
    def whole_penalty(self) -> np.ndarray:
        """0 for the ids of the tokens that may follow a character boundary whole (`whole`), -inf
        for the others (float32, added to a logits row)."""
        out = np.full(self.n_vocab, -np.inf, dtype=np.float32)
        out[self.order[self.whole]] = 0.0
        return out

    @cached_property
    def partial(self) -> np.ndarray:
        """The ids of the byte tokens that may not follow a character boundary whole."""
        return self.order[~self.whole].astype(np.int64)

    @cached_property
    def whole(self) -> np.ndarray:
        """Which tokens (sorted positions) may follow a character boundary whole: their bytes
        are valid UTF-8 from there (they may end inside a character); where a mixed-level
        generation takes whole tokens."""
        decoder = codecs.getincrementaldecoder("utf-8")
        ok = np.ones(self.size, dtype=bool)
        for k, piece in enumerate(self.pieces):
            try:
                decoder().decode(piece, final=False)
            except UnicodeDecodeError:
                ok[k] = False
        return ok

    def exact(self, piece: bytes) -> tuple[int, int]:
        """The sorted positions lo..hi of the tokens whose bytes are exactly `piece` (duplicates,
        such as a byte-fallback token beside a merged one, are neighbours)."""
        lo = bisect.bisect_left(self.pieces, piece)
        return lo, bisect.bisect_right(self.pieces, piece, lo)

    def longest(self, data: bytes) -> tuple[int, int] | None:
        """The longest token that `data` begins with: (token id, its length), or None."""
        for n in range(min(len(data), self._longest_piece), 0, -1):
            lo, hi = self.exact(data[:n])
            if lo < hi:
                return int(self.order[lo]), n
        return None

    def cover(self, data: bytes) -> list[int]:
        """Tokens that spell `data`, the longest first at each point (how a tokenizer would
        most likely go); `Unreachable` for a byte no token holds."""
        tokens: list[int] = []
        pos = 0
        while pos < len(data):
            step = self.longest(data[pos:])
            if step is None:
                raise Unreachable(f"no token of this vocabulary holds byte {data[pos]}")
            tokens.append(step[0])
            pos += step[1]
        return tokens

    def column(self, depth: int, lo: int, hi: int) -> np.ndarray:
        """Byte `depth` of the sorted tokens lo..hi (all longer than `depth`)."""
        if depth < _DEEP:
            return self._columns[lo:hi, depth]
        return np.frombuffer(bytes(p[depth] for p in self.pieces[lo:hi]), dtype=np.uint8)


class Row:
    """A path's next-token distribution as the byte level reads it: the probabilities of the byte
    tokens in sorted order (`probs`, unnormalised; times `scale` they sum with `end` to 1) and
    the end tokens' probability `end`, both renormalised over the tokens that can be generated.

    Made from a logits row (`logits`, its own copy), whose sorted probabilities are computed,
    once, where the byte level first reads them: a whole-token step of the mixed level reads the
    logits alone (`ByteView.likeliest_token`), so a row only such steps read is never sorted or
    exponentiated over the vocabulary in float64.

    Ranges are summed directly (never as differences of prefix sums), so a token far less likely
    than the tokens sorted before it keeps its probability."""

    __slots__ = ("logits", "vocab", "_probs", "_scale", "_end")

    def __init__(self, logits: np.ndarray, vocab: ByteVocab) -> None:
        self.logits = logits
        self.vocab = vocab
        self._probs: np.ndarray | None = None
        self._scale = self._end = 0.0

    def _materialise(self) -> np.ndarray:
        if self._probs is None:
            vocab, logits = self.vocab, self.logits
            top = logits.max()
            # gathered in the logits' own type (float32 from llama.cpp: half the memory traffic),
            # exponentiated in float64
            probs = np.subtract(logits.take(vocab.order), top, dtype=np.float64)
            np.exp(probs, out=probs)
            end = float(np.exp(np.subtract(logits[vocab.end_tokens], top, dtype=np.float64)).sum())
            total = float(probs.sum()) + end
            self._probs, self._scale, self._end = probs, 1.0 / total, end / total
        return self._probs

    @property
    def probs(self) -> np.ndarray:
        return self._materialise()

    @property
    def scale(self) -> float:
        self._materialise()
        return self._scale

    @property
    def end(self) -> float:
        self._materialise()
        return self._end

    def prob(self, k: int) -> float:
        """The probability of the token at sorted position k."""
        return float(self.probs[k]) * self.scale

    def mass(self, lo: int, hi: int) -> float:
        """The probability of the tokens at sorted positions lo..hi."""
        return float(self.probs[lo:hi].sum()) * self.scale

    def split(self, bounds: np.ndarray) -> np.ndarray:
        """The probability of each range between consecutive `bounds` (sorted positions,
        non-decreasing): len(bounds) - 1 values, one pass over bounds[0]..bounds[-1]."""
        starts, ends = bounds[:-1], bounds[1:]
        out = np.zeros(len(starts))
        filled = starts < ends
        if filled.any():
            # consecutive non-empty ranges meet (the empty ones between them have no length),
            # so reduceat over their starts sums exactly each of them, the last up to bounds[-1]
            lo = int(bounds[0])
            out[filled] = np.add.reduceat(self.probs[lo : int(bounds[-1])], starts[filled] - lo)
        return out * self.scale

    def distance(self, other: Row) -> float:
        """Total variation between this distribution and `other` (rows of one vocabulary)."""
        gap = self.probs * self.scale
        gap -= other.probs * other.scale
        return 0.5 * (float(np.abs(gap, out=gap).sum()) + abs(self.end - other.end))


@dataclass(eq=False)
class TokenPath:
    """One token sequence whose bytes are the text so far up to `start` (see the module's doc).

    `lo`..`hi` are the sorted positions of the tokens that may still follow it (their bytes begin
    with the pending bytes and reach past them); `bounds` splits that range by the next byte and
    `split` is the probability of each part. `row` is its next-token distribution, None until
    the model has computed it. `handle` is the evaluator's (a llama.cpp slot holding prompt +
    tokens); `parent`, the path it grew from, is for the evaluator to place it and may be let go
    after that (it would keep every ancestor's row alive)."""

    tokens: tuple[int, ...]
    start: int
    log_mass: float
    lo: int
    hi: int
    parent: TokenPath | None = None
    row: Row | None = None
    bounds: np.ndarray | None = field(default=None, repr=False)
    split: np.ndarray | None = field(default=None, repr=False)
    handle: object = None

    @property
    def token(self) -> int:
        """The last token (the one the row after `parent` is needed for)."""
        return self.tokens[-1]


class Unreachable(ValueError):
    """The byte has no mass under the paths the view holds (pruning dropped the ones that led
    there, or no token has it): the view is unchanged; `restart` it from another tokenisation."""


@dataclass
class Advance:
    """What one byte changed: the new paths (each needs the row after its tokens; its parent's
    handle holds all but the last) and the paths let go (their handles may be reused, after the
    new paths took what they need of them)."""

    new: list[TokenPath]
    gone: list[TokenPath]


@dataclass(frozen=True)
class ViewState:
    """A `ByteView` at one point of its text (see `ByteView.snapshot`)."""

    length: int
    paths: tuple[TokenPath, ...]
    kept: float


class ByteView:
    """One model's distribution over the next byte, given the bytes generated so far.

    Start it with the row after the prompt (`start`), then alternate `distribution` and
    `advance(byte)`, giving each new path its row (`set_row`) and then calling `settle` before
    the next `distribution`.
    """

    def __init__(self, vocab: ByteVocab, *, max_paths: int = 8, prune: float = 0.0) -> None:
        self.vocab = vocab
        self.max_paths = max_paths
        self.prune = prune
        self.text = bytearray()
        self.paths: list[TokenPath] = []
        self.dropped = 0.0  # the model's probability mass given up by pruning, of all strings
        self._kept = 1.0  # fraction of the mass kept, over every step
        self.most_paths = 0  # the most paths held at once
        self.rows = 0  # rows asked for (the prompt's excluded)
        self.restarts = 0  # times the paths were rebuilt from a tokenisation of the text
        self.folded = 0  # paths folded into a heavier one at the same position (`settle`)
        self._scratch: tuple[np.ndarray, np.ndarray] | None = None  # `likeliest_token`'s buffers

    def start(self, row: np.ndarray | Row, handle: object = None) -> TokenPath:
        """Begin at the end of the prompt, whose next-token logits are `row` (or its `Row`, as
        another view of the same model read it)."""
        root = TokenPath((), 0, 0.0, 0, self.vocab.size, handle=handle)
        self.set_row(root, row)
        self.text.clear()
        self.paths = [root]
        self.most_paths = 1
        self.restarts = self.rows = self.folded = 0
        self.dropped, self._kept = 0.0, 1.0
        return root

    def restart(self, tokens: Sequence[int], start: int, row: np.ndarray, handle: object = None) -> TokenPath:
        """Hold one path again: `tokens`, whose bytes are the text's first `start` bytes, with
        the row after them; the text after `start` is dropped (the caller advances through it
        again). What the other paths held is counted as dropped."""
        root = TokenPath(tuple(tokens), start, 0.0, 0, self.vocab.size, handle=handle)
        self.set_row(root, row)
        del self.text[start:]
        self.paths = [root]
        self.restarts += 1
        return root

    def set_row(self, path: TokenPath, row: np.ndarray | Row) -> None:
        """The next-token logits after `path`'s tokens (or their `Row`)."""
        path.row = row if isinstance(row, Row) else self.normalise(row)

    def normalise(self, row: np.ndarray) -> Row:
        """A logits row as a path keeps it (`Row`: its own copy; `row` may be llama.cpp's
        buffer, valid until the next call)."""
        return Row(np.array(row[: self.vocab.n_vocab], dtype=np.float32), self.vocab)

    def snapshot(self) -> ViewState:
        """Where the view stands now; `restore` comes back to it after advancing further (paths
        are never changed once made, so this holds no copies)."""
        return ViewState(len(self.text), tuple(self.paths), self._kept)

    def restore(self, state: ViewState) -> None:
        """Back to an earlier `snapshot` of this view (the bytes after it are forgotten)."""
        del self.text[state.length :]
        self.paths = list(state.paths)
        self._kept = state.kept
        self.dropped = 1.0 - state.kept

    def _split(self, path: TokenPath) -> np.ndarray:
        """The probability under `path`'s row of each next byte (256 values), over the tokens
        that may follow it."""
        if path.split is None:
            assert path.row is not None, "give every new path its row first"
            path.split = path.row.split(self._bounds(path)[: END + 1])
        return path.split

    def _bounds(self, path: TokenPath) -> np.ndarray:
        """Where the tokens that may follow `path` split by their next byte: SYMBOLS entries, the
        first sorted position of each byte value's tokens, then `hi`."""
        if path.bounds is None:
            depth = len(self.text) - path.start
            if depth == 0:
                path.bounds = self.vocab.root_bounds
            else:
                path.bounds = path.lo + np.searchsorted(self.vocab.column(depth, path.lo, path.hi), _ALL_SYMBOLS)
        return path.bounds

    def distribution(self) -> np.ndarray:
        """p(next symbol | text): SYMBOLS float64 probabilities (bytes, then END), summing to 1."""
        masses = np.zeros(SYMBOLS)
        top = max(p.log_mass for p in self.paths)
        for path in self.paths:
            weight = math.exp(path.log_mass - top)
            masses[:END] += weight * self._split(path)
            if path.start == len(self.text):
                masses[END] += weight * path.row.end  # type: ignore[union-attr]
        total = masses.sum()
        if total <= 0:
            raise ValueError("the byte view holds no mass (every path was dropped)")
        return masses / total

    def boundary(self) -> TokenPath | None:
        """The one path where the view holds one and the text ends where its tokens end (no
        bytes pending): a whole token may follow there (`take_token`); else None."""
        if len(self.paths) == 1 and self.paths[0].start == len(self.text):
            return self.paths[0]
        return None

    def token_probs(self, out: np.ndarray) -> np.ndarray:
        """At a boundary: the one path's next-token distribution into `out` (size + 1 float64:
        the byte tokens in sorted order, then the end tokens together), the tokens that would
        not follow a character boundary whole (`ByteVocab.whole`) given 0, renormalised."""
        path = self.boundary()
        assert path is not None and path.row is not None, "at a boundary only, its row given"
        row, size = path.row, self.vocab.size
        np.multiply(row.probs, row.scale, out=out[:size])
        out[:size] *= self.vocab.whole
        out[size] = row.end
        out /= out.sum()
        return out

    def likeliest_token(self, ignore_end: bool = False) -> tuple[int, float, float] | None:
        """At a boundary, what a greedy whole-token step needs of the one path's next-token
        distribution over the tokens that may follow a character boundary whole and the end
        tokens together (as `token_probs`, the end left out with `ignore_end`): (the likeliest's
        sorted position, `vocab.size` for the end; its probability there; its log-probability
        among every token). Read from the logits in float32 (pairwise sums: the gate's decision
        as the float64 distribution's, but within about 1e-6 of its threshold); None where
        nothing may follow."""
        path = self.boundary()
        assert path is not None and path.row is not None, "at a boundary only, its row given"
        vocab, logits = self.vocab, path.row.logits
        if self._scratch is None:  # reused: two vocabulary-sized buffers per view, not per token
            self._scratch = (np.empty(vocab.n_vocab, dtype=np.float32), np.empty(vocab.n_vocab, dtype=bool))
        e, tied = self._scratch
        np.add(logits, vocab.whole_penalty, out=e)  # -inf but for the tokens that may follow whole
        likeliest = int(e.argmax())
        partial = logits[vocab.partial]  # the other byte tokens (few)
        ends = logits[vocab.end_tokens]
        top = max(float(e[likeliest]), float(partial.max(initial=-np.inf)), -math.inf if ignore_end else float(ends.max()))
        if top == -math.inf:
            return None
        np.subtract(e, np.float32(top), out=e)
        np.exp(e, out=e)
        allowed = float(e.sum())  # numpy sums float32 pairwise: to about 1e-7, as the float64 path's
        every = allowed + float(np.exp(np.subtract(partial, top, dtype=np.float64)).sum())  # the byte tokens'
        best = float(e[likeliest])
        end = float(np.exp(np.subtract(ends, top, dtype=np.float64)).sum())
        total = every + end
        if not ignore_end and end > best:  # the end, where its tokens together are likelier than any whole token
            return vocab.size, end / (allowed + end), math.log(end / total)
        if best <= 0:
            return None
        np.equal(e, np.float32(best), out=tied)
        k = int(vocab.position[np.flatnonzero(tied)].min())  # ties: the first in sorted order, as argmax over `token_probs`
        return k, best / (allowed + (0.0 if ignore_end else end)), math.log(best / total)

    def greedy_spelling(self, first: int) -> int | None:
        """At a boundary: the token a greedy descent of the one path's next-token distribution
        spells from byte `first`, over the tokens that may follow a character boundary whole.
        At each prefix, the token of exactly those bytes ends the descent if it is at least as
        likely as the tokens going on with any one next byte together; else the descent goes on
        with that byte (ties: the first in sorted order). So each byte is decided as greedy over
        bytes decides it, by the mass of every token that begins with it, but within one token of
        the lead. Its sorted position; None where no such token begins with `first`."""
        path = self.boundary()
        assert path is not None and path.row is not None, "at a boundary only, its row given"
        vocab = self.vocab
        lo, hi = int(vocab.root_bounds[first]), int(vocab.root_bounds[first + 1])
        p = path.row.probs[lo:hi] * vocab.whole[lo:hi]
        if not p.any():
            return None
        a, b, depth = 0, hi - lo, 1
        while True:  # tokens a..b (of the range) share `depth` bytes; those of exactly `depth` sort first
            exact = a + int(np.count_nonzero(vocab.lengths[lo + a : lo + b] == depth))
            stop = float(p[a:exact].sum())
            if exact < b:
                starts = np.flatnonzero(np.diff(vocab.column(depth, lo + exact, lo + b))) + 1
                bounds = np.concatenate(([0], starts, [b - exact])) + exact
                mass = np.add.reduceat(p[exact:b], bounds[:-1] - exact)
                g = int(mass.argmax())
                if mass[g] > stop:
                    a, b, depth = int(bounds[g]), int(bounds[g + 1]), depth + 1
                    continue
            return lo + a + int(p[a:exact].argmax())

    def take_token(self, k: int, log_p: float | None = None) -> Advance:
        """At a boundary: append the token at sorted position `k` whole. Its bytes join the text
        and it makes the one new path (its row needed); no other tokenisation of its bytes is
        held (a mixed-level generation's token step, where r is the token's own distribution).
        `log_p`: the token's log-probability, where the caller read it already."""
        path = self.boundary()
        assert path is not None and path.row is not None, "at a boundary only, its row given"
        piece = self.vocab.pieces[k]
        log_p = path.log_mass + (math.log(max(path.row.prob(k), FORCED)) if log_p is None else log_p)
        child = TokenPath(path.tokens + (int(self.vocab.order[k]),), len(self.text) + len(piece), log_p, 0, self.vocab.size, parent=path)
        self.text += piece
        self.paths = [child]
        self.rows += 1
        return Advance([child], [path])

    def advance(self, byte: int, force: bool = False) -> Advance:
        """Append `byte` (not END) to the text; returns the paths that need a row and those let go.

        `force`: the text is given (a restart replays it along the model's own tokenisation), so
        a token that spells it is followed even where its probability is 0 in float64 (exp
        underflows some 745 nats below the likeliest token, and a model may rule a token out):
        it gets `FORCED`, which the view's renormalisation makes relative. The path with the
        earliest start (the restart's one path, whose pending token spells the bytes replayed)
        is kept whatever pruning says: the lighter paths beside it may lack the bytes that come
        next."""
        if not 0 <= byte < END:
            raise ValueError(f"not a byte: {byte}")
        vocab = self.vocab
        survivors: list[tuple[TokenPath, float]] = []  # (path, log of the mass it carries now)
        new: list[TokenPath] = []
        gone: list[TokenPath] = []
        n = len(self.text) + 1
        for path in self.paths:
            bounds = self._bounds(path)
            lo, hi = int(bounds[byte]), int(bounds[byte + 1])
            if lo == hi:
                gone.append(path)
                continue
            depth = n - path.start
            exact = lo
            while exact < hi and vocab.lengths[exact] == depth:  # tokens ending exactly here
                exact += 1
            row = path.row
            assert row is not None
            for k in range(lo, exact):
                p = row.prob(k)
                if p > 0 or force:
                    child = TokenPath(path.tokens + (int(vocab.order[k]),), n, path.log_mass + math.log(max(p, FORCED)), 0, vocab.size, parent=path)
                    new.append(child)
            rest = row.mass(exact, hi) if exact < hi else 0.0
            if exact < hi and (rest > 0 or force):
                # a new object: the old one stays valid for a snapshot taken before this byte
                survivor = replace(path, lo=exact, hi=hi, bounds=None, split=None)
                survivors.append((survivor, path.log_mass + math.log(max(rest, FORCED))))
            else:
                gone.append(path)
        self.text.append(byte)
        weighed = survivors + [(c, c.log_mass) for c in new]
        if not weighed:
            del self.text[-1]
            raise Unreachable(f"byte {byte} has probability 0 under this model's paths")
        replayed = min(survivors, key=lambda s: s[0].start)[0] if force and survivors else None
        kept, dropped = self._prune(weighed, hold=replayed)
        gone += [p for p in dropped if p.row is not None]  # a dropped new path was never evaluated
        kept_ids = {id(p) for p in kept}
        new = [c for c in new if id(c) in kept_ids]
        self.paths = kept
        self.most_paths = max(self.most_paths, len(kept))
        self.rows += len(new)
        return Advance(new, gone)

    def settle(self) -> list[TokenPath]:
        """Fold the paths that end at the end of the text (the last byte's new paths, their rows
        given) into the heaviest of them where one predicts like it: its mass times the total
        variation between their rows below `prune` times the heaviest's mass (the bound on what
        the fold moves in this byte's distribution, as pruning bounds what a drop takes away).
        The heaviest carries their mass on. Returns the paths folded away (their handles may be
        reused); none with prune 0."""
        n = len(self.text)
        fresh = [p for p in self.paths if p.start == n]
        if self.prune == 0 or len(fresh) < 2:
            return []
        heaviest = max(fresh, key=lambda p: p.log_mass)
        assert heaviest.row is not None, "give every new path its row first"
        folded = [
            p for p in fresh
            if p is not heaviest and math.exp(p.log_mass - heaviest.log_mass) * p.row.distance(heaviest.row) < self.prune  # type: ignore[union-attr]
        ]  # fmt: skip
        if not folded:
            return []
        # a new object: a snapshot taken before holds the old one
        heir = replace(heaviest, log_mass=_logsumexp([heaviest.log_mass] + [p.log_mass for p in folded]))
        gone = {id(p) for p in folded}
        self.paths = [heir if p is heaviest else p for p in self.paths if id(p) not in gone]
        self.folded += len(folded)
        return folded

    def _prune(self, paths: list[tuple[TokenPath, float]], hold: TokenPath | None = None) -> tuple[list[TokenPath], list[TokenPath]]:
        """Keep the paths above `prune` x the largest mass, at most `max_paths` (the heaviest);
        `hold`, where given, is kept in any case (in place of the lightest kept one)."""
        if self.prune == 0 and len(paths) <= self.max_paths:
            return [p for p, _ in paths], []
        paths = sorted(paths, key=lambda x: -x[1])
        top = paths[0][1]
        floor = top + math.log(self.prune) if self.prune > 0 else -math.inf
        keep = [(p, m) for p, m in paths[: self.max_paths] if m >= floor]
        if hold is not None and all(p is not hold for p, _ in keep):
            keep = keep[: self.max_paths - 1] + [next(x for x in paths if x[0] is hold)]
        kept_ids = {id(p) for p, _ in keep}
        drop = [p for p, _ in paths if id(p) not in kept_ids]
        if drop:
            total = _logsumexp([m for _, m in paths])
            kept = math.exp(_logsumexp([m for _, m in keep]) - total)
            self._kept *= kept
            self.dropped = 1.0 - self._kept
        return [p for p, _ in keep], drop


    def lattice(self, draft: bytes, limit: int, extend: int | None = None) -> list[tuple[TokenPath, list[int]]]:
        """The token sequences whose rows advancing through `draft` will likely ask for, as
        chains from held paths, `limit` tokens at most in all (to evaluate them in one call):
        each token that completes a held path's pending bytes inside the draft (its probability
        is known: heaviest first, pruned as `advance` would), followed, for the `extend`
        heaviest (default all), by the longest tokens that cover the rest of the draft (how a
        tokenizer would most likely go on). A row that is not here is asked for when `replay`
        reaches it."""
        vocab = self.vocab
        firsts: list[tuple[float, TokenPath, int, int]] = []
        for path in self.paths:
            pending = bytes(self.text[path.start :])
            row = path.row
            assert row is not None
            for j in range(1, len(draft) + 1):
                lo, hi = vocab.exact(pending + draft[:j])
                for k in range(lo, hi):
                    p = row.prob(k)
                    if p > 0:
                        firsts.append((path.log_mass + math.log(p), path, int(vocab.order[k]), j))
        firsts.sort(key=lambda x: -x[0])
        floor = firsts[0][0] + math.log(self.prune) if firsts and self.prune > 0 else -math.inf
        firsts = [f for f in firsts[: min(self.max_paths, limit)] if f[0] >= floor]
        chains: list[tuple[TokenPath, list[int]]] = [(path, [token]) for _, path, token, _ in firsts]
        ends = [end for _, _, _, end in firsts]
        rows = len(chains)
        # the heaviest first, each as far as the draft goes, while the call has room
        for (_, chain), end in zip(chains[:extend], ends):
            while end < len(draft) and rows < limit:
                step = vocab.longest(draft[end:])
                if step is None:
                    break
                chain.append(step[0])
                end += step[1]
                rows += 1
        return chains


def replay(
    view: ByteView,
    draft: bytes,
    known: Mapping[tuple[int, ...], Row],
    evaluate: Callable[[list[TokenPath]], None],
    distributions: bool = True,
) -> tuple[list[np.ndarray], list[ViewState]]:
    """Advance `view` through `draft`, each new path's row taken from `known` (token sequence ->
    `ByteView.normalise`d row) or, where it is not there, from `evaluate(paths)` (which must
    `set_row` each). Returns the view's distribution and state at every position reached, the
    current one first: all len(draft) + 1 of them, or fewer when a byte of the draft has
    probability 0 under the held paths (the view then stays at the last byte it could take).
    The view is exactly where advancing (and settling) one byte at a time would bring it.
    Without `distributions` (a catch-up reads none of them) the first list is empty."""
    dists = [view.distribution()] if distributions else []
    states = [view.snapshot()]
    for byte in draft:
        try:
            change = view.advance(byte)
        except Unreachable:
            break
        missing = []
        for path in change.new:
            row = known.get(path.tokens)
            if row is None:
                missing.append(path)
            else:
                path.row = row
        if missing:
            evaluate(missing)
        view.settle()
        if distributions:
            dists.append(view.distribution())
        states.append(view.snapshot())
    return dists, states


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


# --- UTF-8: which bytes keep the text valid ----------------------------------------------------

def _utf8_masks() -> dict[tuple[int, int, int], np.ndarray]:
    masks = {}

    def allow(*ranges: tuple[int, int], end: bool = False) -> np.ndarray:
        m = np.zeros(SYMBOLS, dtype=bool)
        for a, b in ranges:
            m[a : b + 1] = True
        m[END] = end
        return m

    masks[(0, 0, 0)] = allow((0x00, 0x7F), (0xC2, 0xF4), end=True)
    masks[(1, 0x80, 0xBF)] = allow((0x80, 0xBF))
    for lo, hi in ((0xA0, 0xBF), (0x80, 0x9F), (0x90, 0xBF), (0x80, 0x8F)):
        for need in (1, 2, 3):
            masks[(need, lo, hi)] = allow((lo, hi))
    for need in (2, 3):
        masks[(need, 0x80, 0xBF)] = allow((0x80, 0xBF))
    return masks


_UTF8 = _utf8_masks()


class Utf8State:
    """Where a byte string stands in UTF-8: which next symbols keep it valid (`allowed`), and
    whether it ends on a character boundary. The end symbol is allowed only there."""

    def __init__(self) -> None:
        self.need = 0  # continuation bytes still to come
        self.lo, self.hi = 0, 0  # the range of the next continuation byte

    @property
    def allowed(self) -> np.ndarray:
        return _UTF8[(self.need, self.lo, self.hi)]

    def copy(self) -> Utf8State:
        other = Utf8State()
        other.need, other.lo, other.hi = self.need, self.lo, self.hi
        return other

    def push(self, byte: int) -> None:
        if self.need:
            self.need -= 1
            self.lo, self.hi = (0x80, 0xBF) if self.need else (0, 0)
            return
        if byte < 0x80:
            return
        if 0xC2 <= byte <= 0xDF:
            self.need, self.lo, self.hi = 1, 0x80, 0xBF
        elif 0xE0 <= byte <= 0xEF:
            self.need = 2
            self.lo, self.hi = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F)}.get(byte, (0x80, 0xBF))
        elif 0xF0 <= byte <= 0xF4:
            self.need = 3
            self.lo, self.hi = {0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}.get(byte, (0x80, 0xBF))
        else:
            raise ValueError(f"byte {byte:#x} cannot start a UTF-8 character")
