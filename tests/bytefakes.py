"""Test-only: tiny tokenised models with ambiguous vocabularies, and the byte-level quantities
they define computed by brute force over token sequences (no paths, no prefix sums)."""

from __future__ import annotations

import codecs
import functools
import hashlib
from dataclasses import dataclass
from collections.abc import Sequence

import numpy as np

from localcos.core.bytelevel import END, SYMBOLS


@dataclass(frozen=True)
class TinyModel:
    """A model whose next-token logits after a token context are a fixed pseudo-random function
    of the context (sharp enough to matter, never zero). Token ids index `pieces`; an empty piece
    that is not an end token is a control token (never generated at the byte level)."""

    pieces: tuple[bytes, ...]
    end_tokens: tuple[int, ...]
    seed: int
    sharpness: float = 2.0

    def logits(self, context: Sequence[int]) -> np.ndarray:
        digest = hashlib.sha256(repr((self.seed, tuple(context))).encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        return (self.sharpness * rng.standard_normal(len(self.pieces))).astype(np.float32)

    def probs(self, context: Sequence[int]) -> np.ndarray:
        """The next-token distribution renormalised over byte tokens and end tokens."""
        z = self.logits(context).astype(np.float64)
        p = np.exp(z - z.max())
        allowed = np.array([bool(piece) or t in self.end_tokens for t, piece in enumerate(self.pieces)])
        p = np.where(allowed, p, 0.0)
        return p / p.sum()


# 'a', 'b', 'ab', 'ba', 'aba'; a second 'a' (a byte-fallback duplicate); the two bytes of 'é' on
# their own and together; a control token; two end tokens
VOCAB_A = TinyModel((b"a", b"b", b"ab", b"ba", b"aba", b"a", b"\xc3", b"\xa9", b"\xc3\xa9", b"", b"", b""), end_tokens=(10, 11), seed=1)
# another tokenizer of the same strings: 'aa', 'bab', 'b', 'a', the two bytes of 'é', one end
VOCAB_B = TinyModel((b"", b"b", b"aa", b"bab", b"a", b"\xc3", b"\xa9", b""), end_tokens=(7,), seed=2)


class BruteForce:
    """p(b | s) of a `TinyModel` after a prompt, by summing over every token sequence."""

    def __init__(self, model: TinyModel, prompt: Sequence[int] = ()) -> None:
        self.model = model
        self.prompt = tuple(prompt)

    @functools.cache  # noqa: B019  (a brute force that lives for one test)
    def _probs(self, tokens: tuple[int, ...]) -> np.ndarray:
        return self.model.probs(self.prompt + tokens)

    def prefix(self, s: bytes) -> float:
        """P(the output begins with s)."""
        if not s:
            return 1.0
        return self._covering((), 0, 1.0, s)

    def _covering(self, tokens: tuple[int, ...], pos: int, mass: float, s: bytes) -> float:
        p = self._probs(tokens)
        rest = s[pos:]
        total = 0.0
        for t, piece in enumerate(self.model.pieces):
            if not piece or p[t] == 0:
                continue
            if piece.startswith(rest):  # reaches to or past the end of s: a covering path
                total += mass * p[t]
            elif rest.startswith(piece):
                total += self._covering(tokens + (t,), pos + len(piece), mass * p[t], s)
        return total

    def ends(self, s: bytes) -> float:
        """P(the output is exactly s)."""
        return self._exact((), 0, 1.0, s)

    def _exact(self, tokens: tuple[int, ...], pos: int, mass: float, s: bytes) -> float:
        p = self._probs(tokens)
        if pos == len(s):
            return mass * sum(p[t] for t in self.model.end_tokens)
        rest = s[pos:]
        total = 0.0
        for t, piece in enumerate(self.model.pieces):
            if piece and p[t] > 0 and rest.startswith(piece):
                total += self._exact(tokens + (t,), pos + len(piece), mass * p[t], s)
        return total

    def next_symbol(self, s: bytes) -> np.ndarray:
        """p(next symbol | s) over the 256 bytes and END."""
        base = self.prefix(s)
        out = np.zeros(SYMBOLS)
        for b in range(256):
            out[b] = self.prefix(s + bytes([b])) / base
        out[END] = self.ends(s) / base
        return out


def valid_utf8_prefix(s: bytes) -> bool:
    """Whether s is the beginning of some valid UTF-8 text."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(s, final=False)
        return True
    except UnicodeDecodeError:
        return False


def string_distribution(next_symbol, length: int, alphabet: Sequence[int], *, utf8: bool = True) -> dict[tuple[bytes, bool], float]:
    """The distribution of outcomes of sampling bytes from `next_symbol(s)` (a SYMBOLS vector)
    until END or `length` characters: (bytes, ended) -> probability. With `utf8`, symbols that would
    make the text invalid UTF-8 (END included, mid-character) are removed and the rest
    renormalised, as the byte-level sampler does."""
    out: dict[tuple[bytes, bool], float] = {}

    def walk(s: bytes, mass: float) -> None:
        if complete_utf8(s) and len(s.decode("utf-8")) == length:  # `length` characters
            out[(s, False)] = out.get((s, False), 0.0) + mass
            return
        dist = np.array(next_symbol(s), dtype=np.float64)
        if utf8:
            for b in range(256):
                if dist[b] and not valid_utf8_prefix(s + bytes([b])):
                    dist[b] = 0.0
            if dist[END] and not complete_utf8(s):
                dist[END] = 0.0
        dist /= dist.sum()
        if dist[END] > 0:
            out[(s, True)] = out.get((s, True), 0.0) + mass * dist[END]
        for b in alphabet:
            if dist[b] > 0:
                walk(s + bytes([b]), mass * dist[b])

    walk(b"", 1.0)
    return out


def complete_utf8(s: bytes) -> bool:
    try:
        s.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def alphabet_of(*models: TinyModel) -> list[int]:
    return sorted({b for m in models for piece in m.pieces for b in piece})


def all_strings(alphabet: Sequence[int], length: int) -> list[bytes]:
    out = [b""]
    frontier = [b""]
    for _ in range(length):
        frontier = [s + bytes([b]) for s in frontier for b in alphabet]
        out += frontier
    return out




class FakeMember:
    """A `TinyModel` as the byte-level generation drives a member: rows computed on the spot."""

    def __init__(self, model: TinyModel, *, max_paths: int = 10**6, prune: float = 0.0, tree_limit: int = 8) -> None:
        from localcos.core.bytelevel import ByteView, ByteVocab

        self.tree_limit = tree_limit
        self.missed = 0
        self.tree_rows = 0  # rows evaluated ahead for drafts
        self.model = model
        self.view = ByteView(ByteVocab(model.pieces, model.end_tokens), max_paths=max_paths, prune=prune)
        self.prompt: tuple[int, ...] = ()
        self.calls = 0
        self.price = None  # its calls are not priced
        self.spent = 0.0
        self.llama_seconds = 0.0  # no llama.cpp here

    @property
    def longest(self) -> int:
        """The most tokens one of its paths holds after the prompt's."""
        return len(self.prompt) + max((len(p.tokens) for p in self.view.paths), default=0)

    def start(self, prompt) -> None:
        self.prompt = tuple(prompt)
        self.view.start(self.model.logits(self.prompt))
        self.calls = 0

    def advance(self, byte: int) -> None:
        from localcos.core.bytelevel import Unreachable

        try:
            self._evaluate(self.view.advance(byte).new)
        except Unreachable:  # pruned away: one path again, the longest-match tokenisation
            self._restart(bytes(self.view.text) + bytes([byte]))

    def take_token(self, k: int, log_p: float | None = None) -> None:
        self._evaluate(self.view.take_token(k, log_p).new)

    def start_beside(self, other: FakeMember) -> None:
        self.start(other.prompt)

    @staticmethod
    def advance_together(members, data) -> None:
        for member, byte in zip(members, data):
            member.advance(byte)

    def rebuild(self, ahead: bytes) -> None:
        """As `ByteMember.rebuild`: one path again, of the text and the bytes ahead of it."""
        text = bytes(self.view.text)
        self._restart(text + ahead, until=len(text))

    def _restart(self, data: bytes, until: int | None = None) -> None:
        tokens = self.view.vocab.cover(data)
        start = len(data) - len(self.model.pieces[tokens.pop()])
        self.view.restart(tokens, start, self.model.logits(self.prompt + tuple(tokens)))
        for b in data[start:until]:
            self._evaluate(self.view.advance(b, force=True).new)

    def _evaluate(self, paths) -> None:
        if paths:
            self.calls += 1
        for path in paths:
            self.view.set_row(path, self.model.logits(self.prompt + path.tokens))
        self.view.settle()

    def snapshot(self):
        return self.view.snapshot()

    def rollback(self, state) -> None:
        self.view.restore(state)

    @property
    def call_rows(self) -> int:
        return self.tree_limit

    def score(self, draft: bytes, extend: int | None = None, distributions: bool = True):
        """As `ByteMember.score`: the lattice's rows ahead, then the replay (missing rows
        counted)."""
        from localcos.core.bytelevel import replay

        known = {}
        for base, tokens in self.view.lattice(draft, self.tree_limit, extend):
            for i in range(len(tokens)):
                seq = base.tokens + tuple(tokens[: i + 1])
                known[seq] = self.view.normalise(self.model.logits(self.prompt + seq))
        if known:
            self.calls += 1
            self.tree_rows += len(known)

        def evaluate(paths) -> None:
            self.missed += len(paths)
            self._evaluate(paths)

        return replay(self.view, draft, known, evaluate, distributions)

