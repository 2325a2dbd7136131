"""The Python API: load an ensemble once, generate many times.

    from localcos import Ensemble, WeightedEnsemble
    with Ensemble.load(["a.gguf", "b.gguf"], combiner=WeightedEnsemble([0.5, 0.5])) as ens:
        out = ens.generate("The capital of France is", method="cos", max_tokens=32, seed=0)
        print(out.text, out.finish_reason, out.stats.tokens_per_second)
        for piece in ens.stream("Once upon a time", method="cos"):
            print(piece, end="", flush=True)

A thin facade over the runtime, one generation face at both levels (`Generating`): every call is
planned once by the models (`Models.plan`) and run by the scheduler of their level
(`runtime.models.scheduler_for`: the one scheduler, `runtime.scheduler`; at the byte level one
generation at a time, as the server's `ByteScheduler` runs them), so `generate`, `stream` and
`generate_many` give the same text for one seed, as the command line and the server do.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, cast
from collections.abc import Callable, Sequence

from .config.specs import GenerationConfig, LoadSpec
from .core.combiners import BoundCombiner, Combiner
from .core.level import Level
from .errors import ConfigError
from .models.registry import model_path
from .chat import Message, OwnTemplates
from .runtime.bytelevel import ByteModels
from .runtime.completion import Completion
from .runtime.loaded import LoadedModels
from .runtime.plan import Prompt
from .runtime.run import Stream, complete
from .runtime.scoring import Loglikelihood, Scores, loglikelihood, score_tokens

if TYPE_CHECKING:
    from .backend.rpc import Endpoint
    from .runtime.models import LevelPlan, Models
    from .scoring.bytescore import ByteScore


class Generating:
    """The generation face of both facades (`Ensemble`, `ByteEnsemble`), written once: a call is
    planned by the models (`Models.plan`, which checks it once for every front end) and run in
    the scheduler of their level (`runtime.run`), so `generate`, `stream` and `generate_many`
    give the same text for one seed, as the command line and the server do."""

    def generate(
        self,
        prompt: Prompt | Sequence[Sequence[int]],
        *,
        config: GenerationConfig | None = None,
        combiner: Combiner | BoundCombiner | None = None,
        second_prompt: str | Sequence[int] | None = None,
        **settings: object,
    ) -> Completion:
        """Generate one completion of `prompt`: raw text, what to fill in at a cursor (an `Infill`,
        read through the models' fill-in-the-middle tokens), or its tokens (token ids at the token
        level; at the byte level each model's prompt tokens: `ByteEnsemble.chat_prompts`).

        Settings are a `GenerationConfig` (`config`), or its fields as keywords (over `config`):
        method ("ensemble", "sd", "naive-cos", "cos"; default cos, as on the command line:
        `config.levels.default_method`; the byte level decodes "ensemble" and "cos"), max_tokens (at the
        byte level the lead model's tokens: the gate's lead, cd's expert, else the largest model,
        as it would count them alone), temperature (0 = greedy), top_k, top_p, min_p, seed, stop
        (strings), ignore_eos, gamma ("auto", the default, or one value, or one per model),
        byte_gamma (the byte level's: bytes a proposer drafts, or "auto"), proposer (model
        index), negative_prompt (what a member reading a second prompt reads:
        `load(second_prompt=True)`), lookahead ((K, L): greedy, looking ahead where r is unsure,
        `load(lookahead=...)`) and lookahead_threshold. An option the models' level does not read
        is a `ConfigError`, not ignored. `combiner` replaces the ensemble's for this call;
        `second_prompt` gives the second prompt as it is read (token ids: a chat's rendering)
        instead of negative_prompt's text.
        """
        return self.generate_many(prompt, 1, config=config, combiner=combiner, second_prompt=second_prompt, **settings)[0]

    def generate_many(
        self,
        prompt: Prompt | Sequence[Sequence[int]],
        n: int,
        *,
        config: GenerationConfig | None = None,
        combiner: Combiner | BoundCombiner | None = None,
        second_prompt: str | Sequence[int] | None = None,
        **settings: object,
    ) -> list[Completion]:
        """`n` independent completions of one prompt. With a seed the whole list is reproducible,
        however many run at once: completion k draws from its own random stream
        (`runtime.completion_rng`), the first of them the one `generate` and `stream` draw from.
        At the token level up to `parallel` of them decode at once (their rows share llama_decode
        calls; the prompt is evaluated once); at the byte level one after another."""
        models = cast("Models", self)
        return complete(models, _plan(models, prompt, config, combiner, settings, second_prompt), n)

    def stream(
        self,
        prompt: Prompt | Sequence[Sequence[int]],
        *,
        config: GenerationConfig | None = None,
        combiner: Combiner | BoundCombiner | None = None,
        second_prompt: str | Sequence[int] | None = None,
        **settings: object,
    ) -> Stream:
        """Like `generate`, but returns a `Stream` that yields text pieces as they become final
        (at the byte level, as characters complete)."""
        models = cast("Models", self)
        return Stream(models, _plan(models, prompt, config, combiner, settings, second_prompt))


def _plan(models: Models, prompt: Prompt | Sequence[Sequence[int]], config: GenerationConfig | None, combiner: Combiner | BoundCombiner | None,
          settings: dict[str, object], second_prompt: str | Sequence[int] | None) -> LevelPlan:  # fmt: skip
    """The plan of a facade's call: `config` (default: the defaults) with the keyword settings
    over it, an option the models' level does not read refused first."""
    models.refuse_unread(settings, json=True, remedy="load them with ByteEnsemble")
    return models.plan(prompt, (config or GenerationConfig()).with_values(settings), combiner, second_prompt=second_prompt)


class Ensemble(Generating, LoadedModels):
    """One or more GGUF models sharing one tokenizer, decoded together (one model alone is the
    model as llama.cpp decodes it, or with a second prompt's member, a model against itself).

    Args:
        models: loaded models (see `Ensemble.load`).
        combiner: default combination function (default: equal-weight `WeightedEnsemble`).
    """

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
        rpc: Sequence[Sequence[Endpoint]] = (),
        rpc_timeout: float = 120.0,
        parallel: int = 1,
        calibrate: bool = False,
        progress: Callable[[int, int, str], None] | None = None,
        second_prompt: bool = False,
        lookahead: tuple[int, int] | None = None,
    ) -> Ensemble:
        """Load every model (each into its own llama.cpp context) and check their tokenizers.
        `paths`: GGUF files, or names as `--models` takes them (models.toml names, hf:,
        ollama:, lmstudio:; nothing is downloaded).

        `parallel` sequences decode at once (`generate_many`): each model's KV cache holds that
        many sequences of `n_ctx` tokens, and their rows share llama_decode calls (models on RPC
        servers decode one sequence at a time).

        `n_gpu_layers` is one value for all models or one per model (-1 = all layers; default:
        all for a model on RPC servers, none for a local one);
        `split_mode` is "none", "layer" or "row"; `flash_attn` "auto", "on" or "off";
        `max_logit_rows` the most logits rows one call returns (`localcos score` loads with
        `runtime.scoring.SCORING_LOGIT_ROWS`).
        `rpc` gives each model's RPC servers (empty: this host; default: every model here): such a
        model is a `RemoteModel`, driven from a worker process, and `rpc_timeout` bounds its calls.
        `calibrate` measures the models' call costs again instead of reading the cached profile.
        `progress(i, n, name)` is called before model i of n is loaded.
        `second_prompt`: the lead model (the largest) is also a member reading a second prompt,
        its weights loaded once (its own sequences, its rows in the same calls): what
        `generate(..., negative_prompt=TEXT)` reads, combined by the combiner with the others
        (`Guidance(scale)`: classifier-free guidance; `Contrastive`; `WeightedEnsemble`: two
        phrasings averaged). The combiner's members are the models, then that one.
        `lookahead`: (K, L), the most candidates and rolled-out tokens a generation may look ahead
        (`generate(..., lookahead=(K, L), temperature=0)`): each sequence gets K sequences more
        for its branches, which share its cells.
        """
        spec = LoadSpec.make(
            [model_path(p) for p in paths], n_gpu_layers=n_gpu_layers, rpc=rpc, n_ctx=n_ctx, n_threads=n_threads, n_batch=n_batch, main_gpu=main_gpu,
            split_mode=split_mode, flash_attn=flash_attn, rpc_timeout=rpc_timeout, parallel=parallel, calibrate=calibrate,
            second_prompt=second_prompt, lookahead=lookahead, level=Level.TOKEN,
        )  # fmt: skip
        return cls.from_spec(spec, combiner, progress=progress, max_logit_rows=max_logit_rows)

    @classmethod
    def beside(cls, models: LoadedModels | ByteModels, i: int) -> Ensemble:
        """Model i of `models` (loaded at any level) by itself, decoding on its own tokens (the
        token level) on the weights and the context loaded there: no second copy in memory, and
        its calls cost what the calls there cost (a second copy of the same file can run a few
        percent faster or slower). How a model of a byte-level run decodes alone beside it
        (eval's "alone" configurations, the bench's alone-I). `models` owns it: close that, not
        this."""
        return cls([models.loaded[i]], profiles=[models.costs.profiles[i]])

    @classmethod
    def token_view(cls, models: LoadedModels | ByteModels) -> Ensemble | None:
        """The model whose own tokens serve the requests its level does not (`own_tokens`: one
        model loaded for the mixed level), on those tokens (`beside`): where sampling,
        log-probabilities, tools... decode (`config.levels.request_level`); None where there is
        none."""
        own = models.own_tokens()
        return None if own is None else cls.beside(models, own)

    # --- scoring -----------------------------------------------------------------------------------
    def score(self, text: str | Sequence[int], *, combiner: Combiner | None = None, members: bool = True,
              second_prompt: str | Sequence[int] | None = None) -> Scores:  # fmt: skip
        """Log-probabilities (temperature 1) of every token of `text` after the first, each given
        the ones before it, under r (the ensemble's combination, or `combiner`) and, with
        `members`, under each model alone (a second prompt's member too). The text must fit the
        context. Where the models were loaded with a second prompt's member, it reads
        `second_prompt` (text or token ids) in place of the text's first token (the document
        start) and the rest of the text after it."""
        tokens = self.tokenize(text) if isinstance(text, str) else [int(t) for t in text]
        if len(tokens) < 2:
            raise ConfigError(f"nothing to score: the text has {len(tokens)} token(s)", param="text")
        second = self.tokenize(second_prompt) if isinstance(second_prompt, str) else second_prompt
        return score_tokens(self, tokens, 1, combiners=None if combiner is None else [combiner], members=members,
                            second=None if second is None else (second, 1))  # fmt: skip

    def loglikelihood(
        self, context: str | Sequence[int], continuations: Sequence[str | Sequence[int]], *, combiner: Combiner | None = None,
        second_prompt: str | Sequence[int] | None = None,
    ) -> list[Loglikelihood]:
        """How likely each continuation is after `context` (summed and per token, under r and
        each model): multiple-choice scoring. The context is evaluated once; each continuation
        after it, rolled back between them. A second prompt's member reads `second_prompt` in
        place of the context."""
        return loglikelihood(self, context, continuations, combiner=combiner, second_prompt=second_prompt)


class ByteEnsemble(Generating, ByteModels):
    """One or more GGUF models of any tokenizers, combined exactly at the byte level: each model's
    distribution over the next byte, marginalised over its tokenisations, combined by the
    combiner, sampled byte by byte (docs/algorithm.md, section 10).

        from localcos import ByteEnsemble, Contrastive
        with ByteEnsemble.load(["smollm2.gguf", "qwen-coder.gguf"], Contrastive(mu=0.1, expert=1)) as ens:
            out = ens.generate("def add(a, b):", max_tokens=80, temperature=0)  # max_tokens: the lead's tokens
            print(out.text, out.stats.summary())

    Each model reads the prompt in its own tokens; `chat_prompts` renders a conversation in each
    model's own chat template. Models that share a tokenizer decode faster at the token level
    (`Ensemble`).
    """

    @classmethod
    def load(  # type: ignore[override]
        cls,
        paths: Sequence[str | os.PathLike[str]],
        combiner: Combiner | None = None,
        *,
        n_ctx: int = 4096,
        byte_paths: int = 8,
        byte_prune: float = 0.01,
        n_gpu_layers: int | Sequence[int | None] | None = None,
        n_threads: int | None = None,
        calibrate: bool = False,
        progress: Callable[[int, int, str], None] | None = None,
        level: Level | str | None = None,
    ) -> ByteEnsemble:
        """Load every model with `byte_paths` llama.cpp sequences (the tokenisations it holds at
        most); a tokenisation below `byte_prune` times the likeliest is dropped (0: exact, with
        enough paths). `level` "mixed": whole tokens of the lead where it is sure, with a gated
        combiner (`Gated`, docs/algorithm.md section 12); "byte"; or None (the default:
        `config.levels.byte_views_level`, with the combiner default gated as
        `config.levels.mixed_gate` says).
        Which level a set of models needs at all (the token level where they share a tokenizer:
        `Ensemble`) is `config.levels.decide_level`'s to say, not this class's. The other
        arguments as `Ensemble.load`."""
        from .config.levels import byte_views_level, mixed_gate
        from .core.combiners import Gated, WeightedEnsemble

        if level is None:
            level = byte_views_level(len(paths))
        # a level other than byte or mixed ("auto", decide_level's word, included) is refused where the models load (`ByteModels.load`)
        spec = LoadSpec.make([model_path(p) for p in paths], n_gpu_layers=n_gpu_layers, n_ctx=n_ctx, n_threads=n_threads, calibrate=calibrate,
                             level=level, byte_paths=byte_paths, byte_prune=byte_prune)  # fmt: skip
        gate = mixed_gate(None, spec.level, len(paths), second_prompt=False)
        if combiner is None and gate is not None:
            combiner = Gated(WeightedEnsemble(), gate)
        return cls.from_spec(spec, combiner, progress=progress)

    @classmethod
    def from_spec(
        cls, spec: LoadSpec, combiner: Combiner | None = None, *, progress: Callable[[int, int, str], None] | None = None, lanes: int = 1,
    ) -> ByteEnsemble:  # fmt: skip
        """Load the models of `spec` (its level byte or mixed) as `load` does: the front ends'
        way in (`load_at`), as `Ensemble.from_spec` is at the token level. `lanes`: texts scored
        side by side (`ByteModels.load`)."""
        from .core.combiners import WeightedEnsemble

        return super().load(spec, combiner or WeightedEnsemble(), progress=progress, lanes=lanes)  # type: ignore[return-value]

    def chat_prompts(self, messages: Sequence[Message]) -> list[list[int]]:
        """A conversation as each model's prompt, in its own chat template and special tokens."""
        return OwnTemplates(self).tokens(messages)

    def second_chat_prompt(self, messages: Sequence[Message]) -> list[int]:
        """A conversation as the member reading a second prompt reads it: in its model's (the
        lead's) own chat template (`second_prompt` of `generate`)."""
        return OwnTemplates(self).second_tokens(messages)

    def bits_per_byte(
        self, text: str, *, combiners: Sequence[Combiner] | None = None, window: int | None = None, prune: float = 0.0
    ) -> ByteScore:
        """Bits per byte of `text` under each of `combiners` (default: the ensemble's) and each
        model alone, in windows of `window` bytes (default: the context less 2), the second half
        of each scored (`localcos score --file` at the byte level). Tokenisations are pruned at
        `prune` while scoring (default 0: every one kept, up to the loaded `byte_paths`, as
        `localcos score` does): pruning bounds how far sampled text moves, not one given text's
        probability."""
        from .scoring.bytescore import bits_per_byte

        with self.pruning(prune):
            return bits_per_byte(self, text, list(combiners or [self.combiner.combiner]), window=window or self.n_ctx - 2)


# what `load_at` returns: the facade at the level of the spec (a front end reads `level`, never the type)
LevelEnsemble = Ensemble | ByteEnsemble


def load_at(
    spec: LoadSpec,
    combiner: Combiner | None = None,
    *,
    progress: Callable[[int, int, str], None] | None = None,
    max_logit_rows: int = 64,
    extra_slots: int = 0,
    lanes: int = 1,
) -> LevelEnsemble:
    """The models of `spec` loaded to decode at the level it decided (`spec.level`; a front end
    checks the settings for it first: `config.levels.decoding_level`): the one place models
    are loaded by level, each knowing it after (`level`). `max_logit_rows` and `extra_slots` are
    the token level's (`Ensemble.from_spec`), `lanes` the byte level's (`ByteEnsemble.from_spec`)."""
    if spec.level.in_bytes:  # the one branch on the level at loading: which runtime holds the models
        return ByteEnsemble.from_spec(spec, combiner, progress=progress, lanes=lanes)
    return Ensemble.from_spec(spec, combiner, progress=progress, max_logit_rows=max_logit_rows, extra_slots=extra_slots)
