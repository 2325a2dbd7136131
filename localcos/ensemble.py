"""The Python API: load an ensemble once, generate many times.

    from localcos import Ensemble, WeightedEnsemble
    with Ensemble.load(["a.gguf", "b.gguf"], combiner=WeightedEnsemble([0.5, 0.5])) as ens:
        out = ens.generate("The capital of France is", method="cos", max_tokens=32, seed=0)
        print(out.text, out.finish_reason, out.stats.tokens_per_second)
        for piece in ens.stream("Once upon a time", method="cos"):
            print(piece, end="", flush=True)
"""

from __future__ import annotations

import codecs
import os
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from .backend import Model, ModelStats, shared_vocab_size
from .combiners import Combiner, WeightedEnsemble
from .decoding import (
    METHODS,
    CoS,
    Decoder,
    EnsembleDecoding,
    NaiveCoS,
    Origin,
    SpeculativeDecoding,
    Strategy,
)
from .errors import ConfigError, PromptTooLongError, TokenizerMismatchError
from .hostmem import keep_freed_memory
from .sampling import Sampler
from .speedmodel import AutoGamma, CallCosts
from .text import TextAssembler


@dataclass(frozen=True)
class GenerationConfig:
    """Settings of one generation call (see `Ensemble.generate`)."""

    method: str = "ensemble"
    max_tokens: int = 128
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    gamma: int | tuple[int, ...] | str | None = None  # None: from the cost ratio; "auto": chosen online
    proposer: int | None = None
    check_invariants: bool = False  # assert the KV-cache invariant every round (tests)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if self.max_tokens < 1:
            raise ConfigError(f"max tokens must be >= 1, got {self.max_tokens}")
        g = self.gamma
        if isinstance(g, str):
            if g != "auto":
                raise ConfigError(f"gamma must be a number, one number per model, or 'auto'; got {g!r}")
            return
        gammas = () if g is None else (g,) if isinstance(g, int) else tuple(g)
        if any((not isinstance(x, (int, np.integer))) or x < 1 for x in gammas):
            raise ConfigError(f"gamma values must be integers >= 1, got {g}")


@dataclass
class ModelRunStats:
    """One model's work during a generation."""

    name: str
    calls: int
    tokens: int
    seconds: float
    calls_per_token: float | None


@dataclass
class GenerationStats:
    """What a generation cost and how speculation went."""

    method: str
    combiner: str
    tokens: int
    seconds: float
    tokens_per_second: float | None
    prompt_tokens: int
    prompt_seconds: float
    models: list[ModelRunStats]
    llama_seconds: float
    host_seconds: float
    proposed: int = 0  # draft tokens submitted to verification
    accepted: int = 0
    acceptance_rate: float | None = None  # accepted / (accepted + rollbacks)
    mean_accepted: float | None = None
    verifications: int = 0
    bonus: int = 0
    rollbacks: int = 0
    calls_per_token: float | None = None
    gamma: list[int] | None = None
    proposer: int | None = None
    # what the standard ensemble would spend inside llama.cpp on these tokens: one single-token
    # call per model per token, at the single-token call times measured on this ensemble
    ensemble_llama_seconds: float | None = None

    @property
    def speedup_estimate(self) -> float | None:
        """The standard ensemble's estimated llama.cpp time for these tokens over this run's."""
        return speedup_estimate(self.ensemble_llama_seconds, self.llama_seconds)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["calls"] = [m.calls for m in self.models]
        d["speedup_estimate"] = self.speedup_estimate
        return d

    def summary(self) -> str:
        """One line for humans."""
        parts = [
            f"{self.method}",
            f"{self.tokens} tokens in {self.seconds:.2f}s",
            f"{self.tokens_per_second:.1f} tok/s" if self.tokens_per_second else "- tok/s",
        ]
        if self.proposed:
            parts.append(f"acceptance {self.acceptance_rate:.0%} ({self.accepted}/{self.accepted + self.rollbacks})")
            parts.append(f"mean accepted {self.mean_accepted:.2f}")
        parts.append("calls " + "/".join(str(m.calls) for m in self.models))
        if self.seconds > 0:
            parts.append(f"host {self.host_seconds / self.seconds:.0%}")
        if self.method != "ensemble" and self.speedup_estimate:
            parts.append(f"~{self.speedup_estimate:.2f}x the ensemble (est.)")
        return " | ".join(parts)


def speedup_estimate(ensemble_llama_seconds: float | None, llama_seconds: float) -> float | None:
    """Estimated speedup in llama.cpp time over the standard ensemble (None when unknown)."""
    if ensemble_llama_seconds is None or llama_seconds <= 0:
        return None
    return ensemble_llama_seconds / llama_seconds


@dataclass
class Completion:
    """One generated completion."""

    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or a stop string), "length" (max tokens or context), "cancelled"
    origins: list[Origin]
    stats: GenerationStats

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason}


@dataclass(frozen=True)
class TokenEvent:
    """A committed token: its id, its text on its own, and where it came from."""

    token: int
    text: str
    origin: Origin


@dataclass(frozen=True)
class Chunk:
    """What one round of decoding produced: the text that became final and the tokens committed."""

    text: str
    tokens: tuple[TokenEvent, ...]


class Stream:
    """Iterates over final text pieces of a generation; `completion` is set when it ends.

    `chunks()` iterates over `Chunk`s instead (text plus per-token origins); `cancel()` makes the
    generation stop after the current round with finish reason "cancelled".
    """

    def __init__(self, run: Callable[["Stream"], Iterator[Chunk]]) -> None:
        self.completion: Completion | None = None
        self.cancelled = False
        self._gen = run(self)

    def cancel(self) -> None:
        self.cancelled = True

    def chunks(self) -> Iterator[Chunk]:
        while True:
            try:
                yield next(self._gen)
            except StopIteration as stop:
                self.completion = stop.value
                return

    def __iter__(self) -> Iterator[str]:
        for chunk in self.chunks():
            if chunk.text:
                yield chunk.text


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Ensemble:
    """Two or more GGUF models sharing one tokenizer, decoded together.

    Args:
        models: loaded models (see `Ensemble.load`).
        combiner: default combination function (default: equal-weight `WeightedEnsemble`).
    """

    def __init__(self, models: Sequence[Model], combiner: Combiner | None = None) -> None:
        if not models:
            raise ConfigError("an ensemble needs at least one model")
        keep_freed_memory()  # vocabulary-sized arrays come and go every token (see hostmem)
        self.models = list(models)
        self.n_vocab = shared_vocab_size(self.models)
        for m in self.models:
            m.logits_vocab = self.n_vocab
        self.n_ctx = min(m.n_ctx for m in self.models)
        first = self.models[0]
        self.end_tokens = {t for t in range(self.n_vocab) if first.is_eog(t)}
        self.combiner = self._bind(combiner or WeightedEnsemble())
        self._prompt_rows: list[tuple[tuple[int, ...], np.ndarray] | None] = [None] * len(self.models)
        # --gamma auto: acceptance is learned per setting, call costs once per ensemble
        self._auto: dict[tuple, AutoGamma] = {}
        self._call_costs = CallCosts([m.n_params for m in self.models])

    @classmethod
    def load(
        cls,
        paths: Sequence[str | os.PathLike[str]],
        combiner: Combiner | None = None,
        *,
        n_ctx: int = 4096,
        n_gpu_layers: int | Sequence[int] = 0,
        n_threads: int | None = None,
        n_batch: int = 512,
        main_gpu: int = 0,
        split_mode: int | None = None,
        flash_attn: bool | None = None,
        progress: Callable[[int, int, str], None] | None = None,
    ) -> "Ensemble":
        """Load every model (each into its own llama.cpp context) and check their tokenizers.

        `n_gpu_layers` is one value for all models or one per model (-1 = all layers).
        `progress(i, n, name)` is called before model i of n is loaded.
        """
        if not paths:
            raise ConfigError("no models given")
        layers = [n_gpu_layers] * len(paths) if isinstance(n_gpu_layers, int) else list(n_gpu_layers)
        if len(layers) != len(paths):
            raise ConfigError(f"got {len(layers)} --n-gpu-layers values for {len(paths)} models")
        extra = {} if split_mode is None else {"split_mode": split_mode}
        models: list[Model] = []
        single_calls: list[list[float]] = []
        try:
            for i, path in enumerate(paths):
                if progress:
                    progress(i, len(paths), os.fspath(path))
                models.append(
                    Model(
                        path,
                        n_ctx=n_ctx,
                        n_gpu_layers=layers[i],
                        n_threads=n_threads,
                        n_batch=n_batch,
                        main_gpu=main_gpu,
                        flash_attn=flash_attn,
                        **extra,
                    )
                )
                single_calls.append(models[-1].warm_up())
            ens = cls(models, combiner)
            # the single-token call times price the standard ensemble in the speedup estimate
            for i, times in enumerate(single_calls):
                for seconds in times:
                    ens._call_costs.observe(i, 1, seconds)
            return ens
        except BaseException:
            for m in models:
                m.close()
            raise

    # --- helpers ---------------------------------------------------------------------------------
    def _bind(self, combiner: Combiner) -> Combiner:
        return combiner.bind(len(self.models), [m.n_params for m in self.models])

    def close(self) -> None:
        for m in self.models:
            m.close()

    def __enter__(self) -> "Ensemble":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def names(self) -> list[str]:
        """The models' names for people (GGUF general.name, else the file name)."""
        return [m.label for m in self.models]

    def cheapest(self) -> int:
        """Index of the model with the fewest parameters (the first of equals)."""
        return min(range(len(self.models)), key=lambda i: (self.models[i].n_params, i))

    def tokenize(self, text: str) -> list[int]:
        """Tokens of `text` with each model's default BOS handling; all models must agree."""
        tokens = self.models[0].tokenize(text)
        for m in self.models[1:]:
            other = m.tokenize(text)
            if other != tokens:
                i = _common_prefix(tokens, other)
                raise TokenizerMismatchError(
                    f"tokenizer mismatch: {self.models[0].path} and {m.path} tokenize the prompt "
                    f"differently (first difference at token {i})"
                )
        return tokens

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.models[0].detokenize(tokens)

    # --- generation ------------------------------------------------------------------------------
    def generate(self, prompt: str | Sequence[int], *, combiner: Combiner | None = None, **settings: object) -> Completion:
        """Generate one completion of `prompt` (raw text, or token ids).

        Settings (see `GenerationConfig`): method ("ensemble", "sd", "naive-cos", "cos"),
        max_tokens, temperature (0 = greedy), top_k, top_p, min_p, seed, stop (strings),
        ignore_eos, gamma (one value, or one per model), proposer (model index).
        """
        stream = self.stream(prompt, combiner=combiner, **settings)
        for _ in stream.chunks():
            pass
        assert stream.completion is not None
        return stream.completion

    def generate_many(
        self, prompt: str | Sequence[int], n: int, *, combiner: Combiner | None = None, **settings: object
    ) -> list[Completion]:
        """`n` independent completions of one prompt; the prompt is evaluated once.

        With a seed the whole list is reproducible (one random stream runs through all of them).
        """
        config = GenerationConfig(**_tupled(settings))
        rng = np.random.default_rng(config.seed)
        tokens = self._prompt_tokens(prompt)
        out = []
        for _ in range(n):
            stream = Stream(lambda s: self._run(tokens, config, combiner, rng, s))
            for _ in stream.chunks():
                pass
            assert stream.completion is not None
            out.append(stream.completion)
        return out

    def stream(self, prompt: str | Sequence[int], *, combiner: Combiner | None = None, **settings: object) -> Stream:
        """Like `generate`, but returns a `Stream` that yields text pieces as they become final."""
        config = GenerationConfig(**_tupled(settings))
        rng = np.random.default_rng(config.seed)
        tokens = self._prompt_tokens(prompt)
        return Stream(lambda s: self._run(tokens, config, combiner, rng, s))

    def _prompt_tokens(self, prompt: str | Sequence[int]) -> list[int]:
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not tokens:
            raise ConfigError("the prompt is empty")
        if len(tokens) >= self.n_ctx:
            raise PromptTooLongError(
                f"the prompt has {len(tokens)} tokens but the context holds {self.n_ctx}; "
                "shorten the prompt or raise --ctx"
            )
        bad = [t for t in tokens if not 0 <= t < self.n_vocab]
        if bad:
            raise ConfigError(f"token id {bad[0]} is outside the shared vocabulary of {self.n_vocab}")
        return tokens

    def _prepare(self, prompt: list[int]) -> list[np.ndarray]:
        """Bring every KV cache to exactly `prompt`, reusing what it already holds; return each
        model's logits row at the position after the prompt."""
        key = tuple(prompt)
        rows = []
        for i, m in enumerate(self.models):
            keep = _common_prefix(m.tokens, prompt)
            cached = self._prompt_rows[i]
            if keep == len(prompt) and cached is not None and cached[0] == key:
                m.truncate(keep)
                rows.append(cached[1])
                continue
            keep = min(keep, len(prompt) - 1)  # re-evaluate at least the last token for its row
            m.truncate(keep)
            row = m.evaluate(prompt[keep:], 1)[0]
            self._prompt_rows[i] = (key, row)
            rows.append(row)
        return rows

    def _strategy(self, dec: Decoder, config: GenerationConfig) -> tuple[Strategy, list[int] | None, int | None]:
        n = len(self.models)
        if config.method == "ensemble":
            return EnsembleDecoding(dec), None, None
        if n < 2:
            raise ConfigError(f"method {config.method} needs at least 2 models; use --method ensemble for one")
        proposer = self.cheapest() if config.proposer is None else config.proposer
        if not 0 <= proposer < n:
            raise ConfigError(f"proposer must be a model index from 0 to {n - 1}, got {proposer}")
        auto = config.gamma == "auto"
        gammas = self._gammas(None if auto else config.gamma, proposer)
        if config.method == "sd":
            return SpeculativeDecoding(dec, proposer, gammas[proposer], auto), [gammas[proposer]], proposer
        if config.method == "naive-cos":
            return NaiveCoS(dec, proposer, gammas[proposer], auto), [gammas[proposer]], proposer
        order = [proposer] + [i for i in range(n) if i != proposer]
        return CoS(dec, order, gammas, auto), gammas, proposer

    def _observer(self, config: GenerationConfig, combiner: Combiner) -> AutoGamma | None:
        """The --gamma auto controller for these settings (kept, so it learns across calls)."""
        if config.gamma != "auto" or config.method == "ensemble":
            return None
        key = (config.method, combiner.describe(), config.temperature, config.top_k, config.top_p, config.min_p)
        if key not in self._auto:
            self._auto[key] = AutoGamma(self._call_costs)
        return self._auto[key]

    def _gammas(self, gamma: int | tuple[int, ...] | None, proposer: int) -> list[int]:
        """Proposal length per model: one value sets the proposer's (others 1); a list sets all."""
        n = len(self.models)
        if gamma is None:
            gamma = self.default_gamma(proposer)
        if isinstance(gamma, (int, np.integer)):
            return [int(gamma) if i == proposer else 1 for i in range(n)]
        if len(gamma) == 1:
            return [int(gamma[0]) if i == proposer else 1 for i in range(n)]
        if len(gamma) != n:
            raise ConfigError(f"got {len(gamma)} gamma values for {n} models; give one, or one per model")
        return [int(g) for g in gamma]

    def default_gamma(self, proposer: int) -> int:
        """Default proposal length: long drafts when the proposer is much cheaper than the rest
        (cost ratio from parameter counts), short when the models cost about the same."""
        others = [m.n_params for i, m in enumerate(self.models) if i != proposer]
        c = self.models[proposer].n_params / max(max(others), 1)
        return 5 if c < 0.3 else 3 if c < 0.6 else 1

    def _run(
        self,
        prompt: list[int],
        config: GenerationConfig,
        combiner: Combiner | None,
        rng: np.random.Generator,
        stream: Stream,
    ) -> Iterator[Chunk]:
        combiner = self.combiner if combiner is None else self._bind(combiner)
        sampler = Sampler(config.temperature, config.top_k, config.top_p, config.min_p)
        t_prompt = time.perf_counter()
        prompt_rows = self._prepare(prompt)
        t0 = time.perf_counter()
        before = [m.stats.snapshot() for m in self.models]

        first = self.models[0]
        text = TextAssembler(first.piece, config.stop)
        token_text = _TokenText(first.piece)
        events: list[TokenEvent] = []

        def on_commit(token: int, origin: Origin) -> None:
            events.append(TokenEvent(token, token_text(token), origin))

        dec = Decoder(
            self.models,
            combiner,
            sampler,
            rng,
            prompt,
            prompt_rows,
            max_length=min(len(prompt) + config.max_tokens, self.n_ctx),
            end_tokens=set() if config.ignore_eos else self.end_tokens,
            banned=sorted(self.end_tokens) if config.ignore_eos else (),
            text=text,
            on_commit=on_commit,
            observer=self._observer(config, combiner),
            costs=self._call_costs,
        )
        strategy, gammas, proposer = self._strategy(dec, config)
        while not dec.finished:
            if stream.cancelled:
                dec.finish_reason = "cancelled"
                break
            strategy.step()
            if config.check_invariants:
                dec.check_invariants()
            if dec.finished:
                text.finish()
            chunk = Chunk(text.take_final(), tuple(events))
            events.clear()
            if chunk.text or chunk.tokens:
                yield chunk
        text.finish()
        tail = text.take_final()
        if tail:
            yield Chunk(tail, ())
        seconds = time.perf_counter() - t0
        stats = self._stats(config, combiner, dec, before, seconds, t0 - t_prompt, gammas, proposer)
        return Completion(text.text, dec.generated, dec.finish_reason or "cancelled", dec.origins, stats)

    def _stats(
        self,
        config: GenerationConfig,
        combiner: Combiner,
        dec: Decoder,
        before: list[ModelStats],
        seconds: float,
        prompt_seconds: float,
        gammas: list[int] | None,
        proposer: int | None,
    ) -> GenerationStats:
        n_tokens = len(dec.generated)
        work = [m.stats.minus(b) for m, b in zip(self.models, before)]
        llama_seconds = sum(w.seconds for w in work)
        per_model = [
            ModelRunStats(m.name, w.calls, w.tokens, w.seconds, w.calls / n_tokens if n_tokens else None)
            for m, w in zip(self.models, work)
        ]
        spec = dec.spec
        return GenerationStats(
            method=config.method,
            combiner=combiner.describe(),
            tokens=n_tokens,
            seconds=seconds,
            tokens_per_second=n_tokens / seconds if seconds > 0 and n_tokens else None,
            prompt_tokens=dec.n_prompt,
            prompt_seconds=prompt_seconds,
            models=per_model,
            llama_seconds=llama_seconds,
            host_seconds=max(0.0, seconds - llama_seconds),
            proposed=spec.proposed,
            accepted=spec.accepted,
            acceptance_rate=spec.acceptance_rate,
            mean_accepted=spec.mean_accepted,
            verifications=spec.verifications,
            bonus=spec.bonus,
            rollbacks=spec.rollbacks,
            calls_per_token=sum(w.calls for w in work) / n_tokens if n_tokens else None,
            gamma=gammas,
            proposer=proposer,
            ensemble_llama_seconds=self._ensemble_llama_seconds(n_tokens),
        )

    def _ensemble_llama_seconds(self, n_tokens: int) -> float | None:
        """llama.cpp seconds the standard ensemble needs for n_tokens after the prompt: one
        single-token call per model for every token but the first (its row comes with the
        prompt), at measured single-token call times (`load` times a few, decoding adds every one
        it makes); None until every model has some."""
        costs = self._call_costs
        if not all(costs.measured(i, 1) for i in range(len(self.models))):
            return None
        return max(n_tokens - 1, 0) * sum(costs(i, 1) for i in range(len(self.models)))


class _TokenText:
    """Text of each token on its own, decoding UTF-8 across token boundaries."""

    def __init__(self, piece: Callable[[int], bytes]) -> None:
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, token: int) -> str:
        return self._decoder.decode(self._piece(token))


def _tupled(settings: dict[str, object]) -> dict[str, object]:
    """Lists to tuples (GenerationConfig is frozen and hashable)."""
    out = dict(settings)
    for key in ("stop", "gamma"):
        if isinstance(out.get(key), list):
            out[key] = tuple(out[key])  # type: ignore[arg-type]
    if isinstance(out.get("stop"), str):
        out["stop"] = (out["stop"],)
    return out
