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
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Generator, Iterator, Sequence

import numpy as np

from .backend import Model, RemoteModel, shared_vocab_size, tokenize_alike
from .backend.worker import layers_to_offload
from .core.combiners import Combiner, WeightedEnsemble
from .core.decoding import METHODS, Decoder, Evaluate, Origin, make_strategy
from .core.lookup import LOOKUP_MODES, ContextIndex, LookupOutcomes, LookupSettings, LookupState
from .core.hostmem import keep_freed_memory
from .core.sampling import Sampler
from .core.speedmodel import AutoGammaControllers, CallCosts, PlannedCosts
from .core.text import TextAssembler
from .errors import ConfigError, PromptTooLongError
from .grammar import Constraint, Matcher, Vocabulary, json_object
from .scoring import Loglikelihood, Scores, loglikelihood, score_tokens
from .stats import GenerationStats, ModelRunStats

if TYPE_CHECKING:
    from .backend.rpc import Endpoint

Gamma = int | tuple[int, ...] | str | None  # one value, one per model, "auto", or None (default)


@dataclass(frozen=True)
class GenerationConfig:
    """How to generate: method, proposal lengths, sampling and limits (see `Ensemble.generate`).

    Every field is checked when the config is made (`ConfigError`), so a bad value never reaches
    llama.cpp or NumPy.
    """

    method: str = "ensemble"
    max_tokens: int = 128
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None  # None: a fresh random seed
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    gamma: Gamma = None  # None: from the models' size ratio; "auto": chosen online
    proposer: int | str | None = None  # None: the model with the fewest parameters; "lookup": the context
    lookup: str = "auto"  # drafts looked up in the context: auto, on or off (cos, and proposer "lookup")
    lookup_ngram: tuple[int, int] = (3, 12)  # the shortest and longest suffix looked up
    lookup_tokens: int = 16  # the most looked-up tokens a draft takes
    # structured output (localcos.grammar): at most one of them
    json_schema: Constraint | None = None
    grammar: Constraint | None = None
    json_object: bool = False
    check_invariants: bool = False  # assert the KV-cache invariant every round (tests)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ConfigError(f"max tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise ConfigError(f"seed must be an integer >= 0, got {self.seed!r}")
        if self.proposer is not None and self.proposer != "lookup" and (not _is_int(self.proposer) or self.proposer < 0):
            raise ConfigError(f"proposer must be a model index >= 0 or 'lookup', got {self.proposer!r}")
        if self.lookup not in LOOKUP_MODES:
            raise ConfigError(f"lookup must be one of {', '.join(LOOKUP_MODES)}, got {self.lookup!r}")
        if self.proposer == "lookup" and self.lookup == "off":
            raise ConfigError("the lookup proposer needs lookup on or auto")
        low, high = self.lookup_ngram
        if not (_is_int(low) and _is_int(high) and 1 <= low <= high):
            raise ConfigError(f"lookup n-gram sizes must be integers with 1 <= min <= max, got {self.lookup_ngram}")
        if not _is_int(self.lookup_tokens) or self.lookup_tokens < 1:
            raise ConfigError(f"lookup tokens must be an integer >= 1, got {self.lookup_tokens!r}")
        given = [name for name in ("json_schema", "grammar", "json_object") if getattr(self, name)]
        if len(given) > 1:
            raise ConfigError(f"give one constraint, not {' and '.join(given)}")
        if given and self.ignore_eos:
            raise ConfigError("a constraint ends the text where it is complete: leave out ignore_eos")
        if not all(isinstance(s, str) for s in self.stop):
            raise ConfigError("stop strings must be strings")
        g = self.gamma
        if isinstance(g, str):
            if g != "auto":
                raise ConfigError(f"gamma must be a number, one number per model, or 'auto'; got {g!r}")
        else:
            gammas = () if g is None else (g,) if _is_int(g) else tuple(g)  # type: ignore[arg-type]
            if any(not _is_int(x) or x < 1 for x in gammas) or (g is not None and not gammas):
                raise ConfigError(f"gamma values must be integers >= 1, got {g}")
        self.sampler()  # checks temperature, top-k, top-p, min-p

    def sampler(self) -> Sampler:
        return Sampler(self.temperature, self.top_k, self.top_p, self.min_p)

    @property
    def constraint(self) -> Constraint | None:
        """What the text must be (structured output), if anything."""
        if self.json_object:
            return json_object()
        return self.json_schema or self.grammar


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


@dataclass
class Completion:
    """One generated completion."""

    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (an end token or a stop string), "length" (max tokens or context), "cancelled"
    origins: list[Origin]
    stats: GenerationStats
    end_token: int | None = None  # the end-of-generation token that ended it (not part of token_ids)

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


# A generation as the decoding core runs it: it yields a model's `Evaluate` request wherever it
# needs logits (and receives them), and a `Chunk` after every round; it returns the Completion.
Work = Generator["Evaluate | Chunk", "np.ndarray | None", "Completion"]


class Stream:
    """Iterates over final text pieces of a generation; `completion` is set when it ends.

    `chunks()` iterates over `Chunk`s instead (text plus per-token origins); `cancel()` makes the
    generation stop at its next llama.cpp call or round, with finish reason "cancelled".
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


def _on_gpu(model: Model) -> bool:
    """Whether llama.cpp put some of the model's layers on an accelerator ("N/M" offloaded)."""
    offloaded = getattr(model, "offloaded", None)
    return bool(offloaded) and not str(offloaded).startswith("0/")


class Ensemble:
    """Two or more GGUF models sharing one tokenizer, decoded together.

    Args:
        models: loaded models (see `Ensemble.load`).
        combiner: default combination function (default: equal-weight `WeightedEnsemble`).
    """

    def __init__(self, models: Sequence[Model], combiner: Combiner | None = None) -> None:
        if not models:
            raise ConfigError("an ensemble needs at least one model")
        keep_freed_memory()  # vocabulary-sized arrays come and go every token (see core.hostmem)
        self.models = list(models)
        self.n_vocab = shared_vocab_size(self.models)
        for m in self.models:
            m.logits_vocab = self.n_vocab
        self.n_ctx = min(m.n_ctx for m in self.models)
        self.parallel = min(len(m.slots) for m in self.models)  # sequences decoded at once
        first = self.models[0]
        self.end_tokens = {t for t in range(self.n_vocab) if first.is_eog(t)}
        self._combiner = self.bind(combiner or WeightedEnsemble())
        # every llama_decode call is timed into this; --gamma auto and the speedup estimate read it
        self.call_costs = CallCosts(self.n_params)
        # costs decided on without timing (lookup's auto mode)
        self.planned_costs = PlannedCosts(self.n_params, [_on_gpu(m) for m in self.models])
        self._auto = AutoGammaControllers(self.call_costs)
        self._lookups: dict[tuple, LookupOutcomes] = {}  # how lookup drafts fare, per setting
        self._vocabulary: Vocabulary | None = None  # the constraints' view of the vocabulary
        self._vocabulary_lock = threading.Lock()

    @classmethod
    def load(
        cls,
        paths: Sequence[str | os.PathLike[str]],
        combiner: Combiner | None = None,
        *,
        n_ctx: int = 4096,
        n_gpu_layers: int | Sequence[int | None] | None = None,
        n_threads: int | None = None,
        n_batch: int = 512,
        main_gpu: int = 0,
        split_mode: str = "layer",
        flash_attn: str = "auto",
        max_logit_rows: int = 64,
        rpc: Sequence[Sequence["Endpoint"]] = (),
        rpc_timeout: float = 120.0,
        parallel: int = 1,
        progress: Callable[[int, int, str], None] | None = None,
    ) -> "Ensemble":
        """Load every model (each into its own llama.cpp context) and check their tokenizers.

        `parallel` sequences decode at once (`generate_many`, `batch`): each model's KV cache holds
        that many sequences of `n_ctx` tokens, and their rows share llama_decode calls (models on
        RPC servers decode one sequence at a time).

        `n_gpu_layers` is one value for all models or one per model (-1 = all layers; default:
        all for a model on RPC servers, none for a local one);
        `split_mode` is "none", "layer" or "row"; `flash_attn` "auto", "on" or "off";
        `max_logit_rows` the most logits rows one call returns (`localcos score` loads with `scoring.SCORING_LOGIT_ROWS`).
        `rpc` gives each model's RPC servers (empty: this host; default: every model here): such a
        model is a `RemoteModel`, driven from a worker process, and `rpc_timeout` bounds its calls.
        `progress(i, n, name)` is called before model i of n is loaded.
        """
        if not paths:
            raise ConfigError("no models given")
        layers = [n_gpu_layers] * len(paths) if n_gpu_layers is None or isinstance(n_gpu_layers, int) else list(n_gpu_layers)
        if len(layers) != len(paths):
            raise ConfigError(f"got {len(layers)} --n-gpu-layers values for {len(paths)} models")
        servers = list(rpc) or [()] * len(paths)
        if len(servers) != len(paths):
            raise ConfigError(f"got {len(servers)} --rpc entries for {len(paths)} models")
        if parallel < 1:
            raise ConfigError(f"parallel must be >= 1, got {parallel}")
        if any(servers) and parallel > 1:
            raise ConfigError("models on RPC servers decode one sequence at a time: leave --parallel at 1 with --rpc")
        layers = [layers_to_offload(s, x, i) for i, (s, x) in enumerate(zip(servers, layers))]
        models: list[Model] = []
        single_calls: list[list[float]] = []
        try:
            for i, path in enumerate(paths):
                if progress:
                    progress(i, len(paths), os.fspath(path))
                options = dict(
                    n_ctx=n_ctx,
                    n_gpu_layers=layers[i],
                    n_threads=n_threads,
                    n_batch=n_batch,
                    main_gpu=main_gpu,
                    split_mode=split_mode,
                    flash_attn=flash_attn,
                    max_logit_rows=max_logit_rows,
                )
                if servers[i]:
                    models.append(RemoteModel(path, rpc=servers[i], timeout=rpc_timeout, **options))
                else:
                    models.append(Model(path, n_seq=parallel, **options))
                single_calls.append(models[-1].warm_up())
            ens = cls(models, combiner)
            # the single-token call times price the standard ensemble in the speedup estimate
            for i, times in enumerate(single_calls):
                for seconds in times:
                    ens.call_costs.observe(i, 1, seconds)
            return ens
        except BaseException:
            for m in models:
                m.close()
            raise

    # --- the ensemble ------------------------------------------------------------------------------
    @property
    def combiner(self) -> Combiner:
        """The default combination function (bound to this ensemble)."""
        return self._combiner

    @combiner.setter
    def combiner(self, combiner: Combiner) -> None:
        self._combiner = self.bind(combiner)

    def bind(self, combiner: Combiner) -> Combiner:
        """`combiner` checked against this ensemble, with its defaults filled in (`ConfigError`
        if it does not fit, e.g. weights for another number of models)."""
        return combiner.bind(len(self.models), self.n_params)

    @property
    def n_params(self) -> list[int]:
        return [m.n_params for m in self.models]

    @property
    def names(self) -> list[str]:
        """The models' names for people (GGUF general.name, else the file name)."""
        return [m.label for m in self.models]

    def close(self) -> None:
        for m in self.models:
            m.close()

    def __enter__(self) -> "Ensemble":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tokenize(self, text: str, *, add_bos: bool | None = None, special: bool = False) -> list[int]:
        """Tokens of `text` (BOS as the models' metadata says unless `add_bos` is given; special
        tokens such as <|im_start|> parsed only with `special`); all models must agree."""
        return tokenize_alike(self.models, text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.models[0].detokenize(tokens)

    def vocabulary(self) -> Vocabulary:
        """The vocabulary as constraints see it (built once, on first use; any thread)."""
        with self._vocabulary_lock:
            if self._vocabulary is None:
                self._vocabulary = Vocabulary(self.models[0], self.n_vocab, sorted(self.end_tokens))
            return self._vocabulary

    # --- scoring -----------------------------------------------------------------------------------
    def score(self, text: str | Sequence[int], *, combiner: Combiner | None = None, members: bool = True) -> Scores:
        """Log-probabilities (temperature 1) of every token of `text` after the first, each given
        the ones before it, under r (the ensemble's combination, or `combiner`) and, with
        `members`, under each model alone. The text must fit the context."""
        tokens = self.tokenize(text) if isinstance(text, str) else [int(t) for t in text]
        if len(tokens) < 2:
            raise ConfigError(f"nothing to score: the text has {len(tokens)} token(s)")
        return score_tokens(self, tokens, 1, combiners=None if combiner is None else [combiner], members=members)

    def loglikelihood(
        self, context: str | Sequence[int], continuations: Sequence[str | Sequence[int]], *, combiner: Combiner | None = None
    ) -> list[Loglikelihood]:
        """How likely each continuation is after `context` (summed and per token, under r and
        each model): multiple-choice scoring. The context is evaluated once; each continuation
        after it, rolled back between them."""
        return loglikelihood(self, context, continuations, combiner=combiner)

    # --- generation ------------------------------------------------------------------------------
    def generate(
        self, prompt: str | Sequence[int], *, config: GenerationConfig | None = None, combiner: Combiner | None = None, **settings: object
    ) -> Completion:
        """Generate one completion of `prompt` (raw text, or token ids).

        Settings are a `GenerationConfig` (`config`), or its fields as keywords (over `config`):
        method ("ensemble", "sd", "naive-cos", "cos"), max_tokens, temperature (0 = greedy),
        top_k, top_p, min_p, seed, stop (strings), ignore_eos, gamma (one value, one per model,
        or "auto"), proposer (model index). `combiner` replaces the ensemble's for this call.
        """
        stream = self.stream(prompt, config=config, combiner=combiner, **settings)
        for _ in stream.chunks():
            pass
        assert stream.completion is not None
        return stream.completion

    def generate_many(
        self,
        prompt: str | Sequence[int],
        n: int,
        *,
        config: GenerationConfig | None = None,
        combiner: Combiner | None = None,
        **settings: object,
    ) -> list[Completion]:
        """`n` independent completions of one prompt; the prompt is evaluated once.

        Up to `parallel` of them decode at once (their rows share llama_decode calls). With a
        seed the whole list is reproducible, however many run at once: completion k draws from
        its own random stream, spawned from the seed.
        """
        from .batch import Batch

        config = _config(config, settings)
        tokens = self._prompt_tokens(prompt)
        streams = np.random.SeedSequence(config.seed).spawn(n)
        if self.parallel == 1 or n == 1:
            out = []
            for k in range(n):
                stream = Stream(lambda s, k=k: self._run(self._work(tokens, config, combiner, np.random.default_rng(streams[k]), 0, lambda: s.cancelled), 0))
                for _ in stream.chunks():
                    pass
                assert stream.completion is not None
                out.append(stream.completion)
            return out
        for m in self.models:  # the prompt once, in slot 0: the others share its cells
            m.slots[0].prefill(tokens)
        batch = Batch(self)
        done: list[Completion | None] = [None] * n
        queue = list(range(n))
        while queue or batch.live:
            while queue and batch.free:
                k = queue.pop(0)
                batch.add(tokens, config, combiner, np.random.default_rng(streams[k]), key=k)
            for finished in batch.round():
                done[finished.key] = finished.completion
        return [c for c in done if c is not None]

    def stream(
        self, prompt: str | Sequence[int], *, config: GenerationConfig | None = None, combiner: Combiner | None = None, **settings: object
    ) -> Stream:
        """Like `generate`, but returns a `Stream` that yields text pieces as they become final."""
        config = _config(config, settings)
        rng = np.random.default_rng(config.seed)
        tokens = self._prompt_tokens(prompt)
        return Stream(lambda s: self._run(self._work(tokens, config, combiner, rng, 0, lambda: s.cancelled), 0))

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

    def _run(self, work: Work, slot: int) -> Generator[Chunk, None, Completion]:
        """Drive one generation by itself (slot `slot` of every model): each request is evaluated
        at once, in calls of up to n_batch tokens."""
        slots = [m.slots[slot] for m in self.models]
        value = None
        while True:
            try:
                item = work.send(value)
            except StopIteration as stop:
                return stop.value
            if isinstance(item, Evaluate):
                t0 = time.perf_counter()
                value = slots[item.model].evaluate(item.tokens, item.n_logits)
                self.call_costs.observe(item.model, len(item.tokens), time.perf_counter() - t0)
            else:
                value = None
                yield item

    def _work(
        self,
        prompt: list[int],
        config: GenerationConfig,
        combiner: Combiner | None,
        rng: np.random.Generator,
        slot: int,
        cancelled: Callable[[], bool],
        prompt_chunk: int | None = None,
    ) -> Work:
        """One generation in slot `slot` of every model, as a coroutine (see `Work`): the prompt
        in requests of up to `prompt_chunk` tokens (default n_batch), then one decoding round
        after another. `cancelled()` is checked between requests of the prompt and between
        rounds; a cancelled generation leaves every cache holding exactly what it committed."""
        combiner = self._combiner if combiner is None else self.bind(combiner)
        sampler = config.sampler()
        slots = [m.slots[slot] for m in self.models]
        chunk = prompt_chunk or min(m.n_batch for m in self.models)
        t_prompt = time.perf_counter()
        prompt_rows = []
        for i, s in enumerate(slots):
            row = s.known_row(prompt)
            if row is None:
                todo = prompt[len(s.tokens) :]
                while todo:
                    if cancelled():  # a long prompt goes in several calls: a cancel stops between two
                        stats = GenerationStats(config.method, combiner.describe(), [ModelRunStats(x.name) for x in slots],
                                                prompt_tokens=len(prompt), prompt_seconds=time.perf_counter() - t_prompt,
                                                seed=config.seed, finish_reasons={"cancelled": 1})  # fmt: skip
                        return Completion("", [], "cancelled", [], stats)
                    part, todo = todo[:chunk], todo[chunk:]
                    logits = yield Evaluate(i, part, 0 if todo else 1, prefill=True)
                row = logits[0]
                s.remember_row(prompt, row)
            prompt_rows.append(row)
        t0 = time.perf_counter()
        before = [s.stats.snapshot() for s in slots]

        first = self.models[0]
        text = TextAssembler(first.piece, config.stop)
        token_text = _TokenText(first.piece)
        events: list[TokenEvent] = []

        def on_commit(token: int, origin: Origin) -> None:
            events.append(TokenEvent(token, token_text(token), origin))

        auto = config.gamma == "auto" and config.method != "ensemble"
        lookup = None
        if config.lookup != "off" and (config.method == "cos" or (config.method != "ensemble" and config.proposer == "lookup")):
            lookup_settings = LookupSettings(config.lookup, *config.lookup_ngram, config.lookup_tokens)
            # learnt across generations only where timing already steers (--gamma auto): otherwise
            # each completion starts from the prior, so a seed pins it whatever ran before
            outcomes = self._lookups.setdefault((combiner.describe(), sampler), LookupOutcomes()) if auto else LookupOutcomes()
            lookup = LookupState(lookup_settings, ContextIndex(prompt, self.n_ctx), outcomes)
        dec = Decoder(
            slots,
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
            observer=self._auto.get((config.method, combiner.describe(), sampler), combiner.uses(len(self.models))) if auto else None,
            lookup=lookup,
            # planned, not measured: lookup's choices then depend on nothing timed (a seed pins the
            # output), and a batch size never measured is not guessed cheap
            costs=self.planned_costs,
            constraint=Matcher(self.vocabulary(), config.constraint) if config.constraint is not None else None,
        )
        strategy, gammas, proposer = make_strategy(dec, config.method, config.gamma, config.proposer, self.n_params)
        while not dec.finished:
            if cancelled():
                # drafts in flight leave every cache, which then holds exactly prompt + completion
                dec.finish_reason = "cancelled"
                dec.pending.clear()
                dec.rollback(len(dec.committed))
                break
            yield from strategy.step()
            if config.check_invariants:
                dec.check_invariants()
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
        seconds = time.perf_counter() - t0
        finish_reason = dec.finish_reason or "cancelled"
        work = [s.stats.minus(b) for s, b in zip(slots, before)]
        spec = dec.spec
        stats = GenerationStats(
            method=config.method,
            combiner=combiner.describe(),
            models=[ModelRunStats(m.name, w.calls, w.tokens, w.seconds) for m, w in zip(self.models, work)],
            tokens=len(dec.generated),
            seconds=seconds,
            prompt_tokens=len(prompt),
            prompt_seconds=t0 - t_prompt,
            proposed=spec.proposed,
            accepted=spec.accepted,
            rejected=spec.rejected,
            verifications=spec.verifications,
            bonus=spec.bonus,
            lookup_proposed=spec.lookup_proposed,
            lookup_accepted=spec.lookup_accepted,
            gamma=gammas,
            proposer=proposer,
            seed=config.seed,
            ensemble_llama_seconds=self.call_costs.ensemble_seconds(len(dec.generated)),
            finish_reasons={finish_reason: 1},
        )
        return Completion(text.text, dec.generated, finish_reason, dec.origins, stats, dec.end_token)


class _TokenText:
    """Text of each token on its own, decoding UTF-8 across token boundaries."""

    def __init__(self, piece: Callable[[int], bytes]) -> None:
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, token: int) -> str:
        return self._decoder.decode(self._piece(token))


def _config(config: GenerationConfig | None, settings: dict[str, object]) -> GenerationConfig:
    """`config` with the keyword settings over it (lists become tuples: the config is frozen)."""
    values = dict(settings)
    for key in ("stop", "gamma"):
        if isinstance(values.get(key), list):
            values[key] = tuple(values[key])  # type: ignore[arg-type]
    if isinstance(values.get("stop"), str):
        values["stop"] = (values["stop"],)
    try:
        return replace(config, **values) if config is not None else GenerationConfig(**values)  # type: ignore[arg-type]
    except TypeError as e:  # an unknown keyword
        raise ConfigError(f"unknown generation setting: {e}") from None
