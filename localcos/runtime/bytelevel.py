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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from ..backend import Model, shared_vocab_size
from ..core.bytelevel import END, Advance, ByteView, ByteVocab, Unreachable, Utf8State
from ..core.combiners import BoundCombiner
from ..core.sampling import Sampler
from ..errors import ConfigError, TokenizerMismatchError

if TYPE_CHECKING:
    from ..config.specs import LoadSpec

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


class ByteMember:
    """One model at the byte level: its view and the llama.cpp sequences that hold its paths
    (one per path, `max_paths` at most; a new path takes over its parent's sequence when the
    parent is let go, else a free one sharing the parent's cells)."""

    def __init__(self, model: Model, *, max_paths: int, prune: float) -> None:
        if len(model.slots) < max_paths:
            raise ValueError(f"{model.name} holds {len(model.slots)} sequences; the byte level needs {max_paths}")
        self.model = model
        self.view = ByteView(byte_vocab(model), max_paths=max_paths, prune=prune)
        self.free = list(model.slots[1:])
        self.calls = 0
        self.prompt: list[int] = []

    def start(self, prompt: Sequence[int]) -> None:
        """Evaluate the prompt (its own tokens) in the first sequence; the view starts there."""
        for slot in self.model.slots:
            slot.truncate(0)
        home = self.model.slots[0]
        self.prompt = list(prompt)
        row = home.prefill(self.prompt)
        self.free = list(self.model.slots[1:])
        self.view.start(row, handle=home)
        self.calls = 0

    def advance(self, byte: int) -> None:
        """Append a byte; the new paths' rows come from one call (or a few, within the model's
        limits). A byte the held paths cannot produce (pruning dropped the paths that could, and
        another model chose it) rebuilds the paths from this model's own tokenisation of the text."""
        try:
            change = self.view.advance(byte)
        except Unreachable:
            self._restart(bytes(self.view.text) + bytes([byte]))
            return
        self._evaluate(self._place(change))

    def _restart(self, data: bytes) -> None:
        """One path again: the model's tokens of `data` but the last, evaluated in the first
        sequence; then the bytes after them again, one by one."""
        tokens = self.model.tokenize(data, add_bos=False)[:-1]
        start = sum(len(self.model.piece(t)) for t in tokens)
        home = self.model.slots[0]
        row = home.prefill(self.prompt + tokens)  # shares what any sequence holds of it
        self.calls += 1
        for path in self.view.paths:
            path.handle = None
        self.free = [s for s in self.model.slots if s is not home]
        for slot in self.free:
            slot.truncate(0)
        self.view.restart(tokens, start, row, handle=home)
        for b in data[start:]:
            self._evaluate(self._place(self.view.advance(b)))

    def _evaluate(self, parts: list) -> None:
        limit = self.model.max_logit_rows
        for i in range(0, len(parts), limit):
            batch = parts[i : i + limit]
            rows = self.model.decode([(slot, [path.token], 0, 1) for path, slot in batch])
            self.calls += 1
            for (path, _), row in zip(batch, rows):
                self.view.set_row(path, row[0])

    def _place(self, change: Advance) -> list[tuple[object, object]]:
        """A sequence for each new path: its parent's, when the parent is let go, else a free one
        holding the parent's cells. Sequences of paths let go are freed."""
        parents = {id(p.parent) for p in change.new}
        gone = {id(p): p for p in change.gone}
        for path in change.gone:
            if id(path) not in parents:
                self._release(path)
        inherited: set[int] = set()
        out = []
        for path in change.new:
            parent = path.parent
            assert parent is not None and parent.handle is not None
            if id(parent) in gone and id(parent) not in inherited:
                inherited.add(id(parent))
                slot = parent.handle
            else:
                slot = self.free.pop()  # empty: it takes the parent's cells from the parent's sequence
                slot.share_prefix(parent.handle.tokens)
            path.handle = slot
            out.append((path, slot))
        for key, path in gone.items():
            if key in parents and key not in inherited:
                self._release(path)
        return out

    def _release(self, path) -> None:
        slot = path.handle
        if slot is not None:
            path.handle = None
            slot.truncate(0)
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
    finish_reason: str = ""

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
            "finish_reason": self.finish_reason,
        }

    def summary(self, names: Sequence[str]) -> str:
        per_model = ", ".join(
            f"{n}: {c / max(self.chars, 1):.2f} calls/char, {p} paths at most, {d:.2g} mass dropped, {r} restarts"
            for n, c, p, d, r in zip(names, self.calls, self.most_paths, self.dropped, self.restarts)
        )
        return f"byte level: {self.chars} chars in {self.seconds:.2f} s ({self.chars_per_second:.1f} chars/s); {per_model}"


@dataclass
class ByteCompletion:
    text: str
    data: bytes
    finish_reason: str  # "stop" (the end symbol or a stop string), "length" (max_chars or the context)
    stats: ByteStats

    def to_dict(self) -> dict:
        return {"text": self.text, "finish_reason": self.finish_reason}


class ByteGeneration:
    """One completion at the byte level: `run()` yields text as characters complete and returns
    the `ByteCompletion`.

    Args:
        members: the models' byte views over their sequences (`ByteMember`, or a test's stand-in
            with `view`, `start(prompt)`, `advance(byte)`, `calls`).
        prompts: each model's prompt, in its own tokens.
        combiner: bound to the members; it receives [1, 257] log probabilities per model.
        sampler: temperature and truncations, applied to r over the 257 symbols.
        max_chars: characters (UTF-8) to generate at most.
        stop: strings that end the text (not included).
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
    ) -> None:
        self.members = list(members)
        self.ignore_end = ignore_end
        self.prompts = [list(p) for p in prompts]
        self.combiner = combiner
        self.sampler = sampler
        self.rng = rng
        self.max_chars = max_chars
        self.stop = tuple(s for s in stop if s)
        self.n_ctx = n_ctx

    def symbol_distribution(self) -> np.ndarray:
        """r over the 257 symbols now, before UTF-8 and sampling settings."""
        dists = [m.view.distribution() for m in self.members]
        if not self.combiner.mixes_probs:
            dists = floor_ruled_out(dists)
        with np.errstate(divide="ignore"):
            logits = [np.log(d)[None, :] for d in dists]
        return np.asarray(self.combiner.combine(logits, self.sampler.softmax_temperature)[0], dtype=np.float64)

    def run(self) -> Iterator[str]:
        t_prompt = time.perf_counter()
        for member, prompt in zip(self.members, self.prompts):
            member.start(prompt)
        t0 = time.perf_counter()
        utf8 = Utf8State()
        decoder = codecs.getincrementaldecoder("utf-8")()
        data = bytearray()
        text = ""
        emitted = 0  # characters of `text` already yielded
        hold = max((len(s) for s in self.stop), default=1) - 1  # a stop string may still begin here
        finish = ""
        while not finish:
            r = self.symbol_distribution() * utf8.allowed
            if self.ignore_end:
                r[END] = 0.0
            total = r.sum()
            if total <= 0:
                raise ValueError("no byte the models allow keeps the text valid UTF-8")
            r = self.sampler.finalize((r / total).astype(np.float32))
            symbol = self.sampler.draw(r, self.rng)
            if symbol == END:
                finish = "stop"
                break
            data.append(symbol)
            utf8.push(symbol)
            for member in self.members:
                member.advance(symbol)
            piece = decoder.decode(bytes([symbol]))
            if piece:
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
                if safe > emitted:
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
            finish_reason=finish,
        )
        self.completion = ByteCompletion(text, bytes(data), finish, stats)
        return self.completion


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

    def __init__(self, models: Sequence[Model], combiner: BoundCombiner, *, max_paths: int, prune: float) -> None:
        self.models = list(models)
        self.combiner = combiner
        self.members = [ByteMember(m, max_paths=max_paths, prune=prune) for m in self.models]
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

        models: list[Model] = []
        try:
            for i, path in enumerate(spec.paths):
                if progress:
                    progress(i, len(spec.paths), os.fspath(path))
                models.append(Model(path, n_seq=spec.byte_paths, **model_options(spec, i, max(8, spec.byte_paths))))
                models[-1].warm_up(timed_calls=0)
            bound = combiner.bind(len(models), [m.n_params for m in models])
            for m in models:
                byte_vocab(m)
            return cls(models, bound, max_paths=spec.byte_paths, prune=spec.byte_prune)
        except BaseException:
            for m in models:
                m.close()
            raise

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.models]

    def prompts(self, text: str) -> list[list[int]]:
        """The prompt text in each model's own tokens (each adds BOS as its metadata says)."""
        return [m.tokenize(text) for m in self.models]

    def generation(
        self, prompts: Sequence[Sequence[int]], sampler: Sampler, rng: np.random.Generator, *, max_chars: int, stop: Sequence[str] = (), ignore_end: bool = False
    ) -> ByteGeneration:
        """One completion of `prompts` (each model's own tokens)."""
        for m, p in zip(self.models, prompts):
            if len(p) >= m.n_ctx:
                raise ConfigError(f"the prompt is {len(p)} tokens for {m.name}, which holds {m.n_ctx}", param="prompt")
        return ByteGeneration(self.members, prompts, self.combiner, sampler, rng, max_chars=max_chars, stop=stop, n_ctx=self.n_ctx, ignore_end=ignore_end)

    def close(self) -> None:
        for m in self.models:
            m.close()

    def __enter__(self) -> "ByteModels":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
