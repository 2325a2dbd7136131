"""The specs a front end's settings become: what to load (`LoadSpec`), how to combine
(`CombineSpec`), how to generate (`GenerationConfig`), how to serve (`ServerSpec`); together with
the chat's two options, a `Settings`.

They are frozen and checked when made, each value by its option's own parser (`config.options`),
so a spec made from raw values (the Python API) and one made from parsed values (`resolve`) obey
the same rule, written once. What depends on several values is checked here too, and what
depends on the number of models (indices, per-model lists) by `check_for_models`, which the
runtime's planning calls again for a loaded ensemble: one rule, two callers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Mapping, Sequence

from ..backend.worker import layers_to_offload
from ..core.combiners import COMBINERS, Combiner, CustomCombiner, custom_name, gated, load_function, make_combiner
from ..core.level import Level
from ..core.sampling import Sampler
from ..errors import ConfigError
from ..grammar import Constraint, json_object
from .levels import check_level, decide_level, decoded_load_options, decodes_one_at_a_time, default_method
from .options import OPTIONS, Option
from .parse import Gamma, is_custom_combine

if TYPE_CHECKING:
    from ..backend.rpc import Endpoint

# the spec fields each option feeds, by target
_BY_ATTR: dict[str, dict[str, Option]] = {}
for _o in OPTIONS.values():
    _BY_ATTR.setdefault(_o.target, {})[_o.attr] = _o


def _checked(spec: object, target: str, json: bool = True) -> None:
    """Run every set field of `spec` through its option's parser (parsed values pass unchanged)."""
    for name, option in _BY_ATTR[target].items():
        value = getattr(spec, name)
        if value is not None:
            object.__setattr__(spec, name, option.check(value, json=json))


def what(name: str, json: bool) -> str:
    """How a message names option `name`: its JSON field or its flag."""
    return OPTIONS[name].what(json)


# --- loading -------------------------------------------------------------------------------------


def require_models(n: int) -> None:
    """An ensemble has one model at least."""
    if n < 1:
        raise ConfigError("no models given", param="models")



@dataclass(frozen=True)
class LoadSpec:
    """What to load and how: the files, and llama.cpp's context and hardware settings, one entry
    per model where models may differ (`make` spreads one value over all)."""

    paths: tuple[Path, ...]
    labels: tuple[str, ...]  # the models as the user named them
    n_gpu_layers: tuple[int, ...]
    rpc: tuple[tuple[Endpoint, ...], ...] = ()  # per model: its RPC servers, () for this host
    rpc_timeout: float = 120.0
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int | None = None
    parallel: int | None = None  # sequences decoded at once (None: the front end's default)
    main_gpu: int = 0
    split_mode: str = "layer"
    flash_attn: str = "auto"
    verbose: bool = False
    calibrate: bool = False  # measure the models' call costs again (not the cached profile)
    # the level the models decode at: token, byte or mixed (byte where the lead is unsure); "auto"
    # given is decided when the spec is made (`decide_level`), so it is never "auto" after
    level: Level = Level.TOKEN
    # the members: each model reading the prompt, and where `second_prompt` the lead model a second
    # time, reading a second prompt (a negative prompt, a contrast, another phrasing)
    second_prompt: bool = False
    byte_paths: int = 8  # byte level: tokenisations (sequences) held per model
    byte_prune: float = 0.01  # byte level: relative mass below which a tokenisation is dropped
    # the most candidates and rolled-out tokens a generation may look ahead (`GenerationConfig.lookahead`):
    # each sequence gets a sequence more for each candidate's branch
    lookahead: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        require_models(len(self.paths))
        n = len(self.paths)
        if len(self.n_gpu_layers) != n:
            raise ConfigError(f"got {len(self.n_gpu_layers)} {what('n_gpu_layers', False)} values for {n} models", param="n_gpu_layers")
        if len(self.rpc) != n:
            raise ConfigError(
                f"got {len(self.rpc)} {what('rpc', False)} entries for {n} models; give one, or one per model (- for here)", param="rpc"
            )
        if any(self.rpc) and (self.parallel or 1) > 1:
            raise ConfigError("models on RPC servers decode one sequence at a time: leave out --parallel with --rpc", param="parallel")
        if any(self.rpc) and self.second_prompt:
            raise ConfigError("a second prompt (--negative-prompt, a contrast prompt): a model on RPC servers decodes one sequence; a second "
                              "prompt's member needs two", param="rpc")  # fmt: skip
        if any(self.rpc) and self.lookahead is not None:
            raise ConfigError("--lookahead: models on RPC servers decode one sequence at a time, and its branches are sequences",
                              param="lookahead")  # fmt: skip
        _checked(self, "load", json=False)
        object.__setattr__(self, "level", decide_level(self.level, self.paths))

    def decoded_by(self) -> dict[str, Any]:
        """The load settings a decoded text depends on, as a record keeps them: the level and, at
        the byte and mixed levels, the paths each model holds and their pruning."""
        return {"level": self.level.value, **{name: getattr(self, name) for name in decoded_load_options(self.level)}}

    def decoding_together(self, wanted: int) -> LoadSpec:
        """This spec with the sequences decoded at once where the user did not say (`parallel`):
        up to `wanted` as the context allows (`default_parallel`), one for models on RPC servers.
        The byte and mixed levels' sequences are their paths' (one generation at a time), so
        there it is left as it is."""
        if self.parallel is not None or decodes_one_at_a_time(self.level):
            return self
        return replace(self, parallel=1 if any(self.rpc) else default_parallel(self.n_ctx, wanted))

    @classmethod
    def make(
        cls,
        paths: Sequence[str | os.PathLike[str]],
        *,
        labels: Sequence[str] | None = None,
        n_gpu_layers: int | Sequence[int | None] | None = None,
        rpc: Sequence[Sequence[Endpoint]] = (),
        level: Level | str = "auto",
        **options: Any,
    ) -> LoadSpec:
        """A spec from values as the Python API takes them: `n_gpu_layers` one value for all
        models or one per model (None: all layers for a model on RPC servers, none for a local
        one), `rpc` one entry per model or none (every model here), `level` as --level takes it
        (auto: decided by the models' tokenizers, `decide_level`)."""
        n = len(paths)
        layers = [n_gpu_layers] * n if n_gpu_layers is None or isinstance(n_gpu_layers, int) else list(n_gpu_layers)
        servers = [tuple(s) for s in rpc] or [()] * n
        if len(servers) == 1:
            servers = servers * n
        if len(layers) == 1:
            layers = layers * n
        if len(layers) == n and len(servers) == n:
            layers = [layers_to_offload(s, x, i) for i, (s, x) in enumerate(zip(servers, layers))]
        return cls(
            tuple(Path(p).expanduser() for p in paths),
            tuple(labels) if labels is not None else tuple(Path(p).name for p in paths),
            tuple(layers),  # type: ignore[arg-type]
            tuple(servers),
            level=level,  # type: ignore[arg-type]  # decided in __post_init__
            **options,
        )


def default_parallel(n_ctx: int, wanted: int = 8) -> int:
    """Sequences to decode at once when the user did not say: up to `wanted` (at most 8), as
    many as keep the KV cache at 16k tokens per model (each sequence takes n_ctx)."""
    return max(1, min(wanted, 8, 16384 // n_ctx))


# --- combining -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CombineSpec:
    """How to combine: a built-in combiner and its parameters, or a user function."""

    combine: str = "we"
    weights: tuple[float, ...] | None = None
    mu: float = 0.1
    plausibility: float | None = None
    expert: int | None = None
    combine_on: str = "logits"  # what a custom combiner's function receives: logits or probabilities
    gate: float | None = None  # combine only where the lead model's top probability is below this
    lead: int | None = None  # the model a gate leaves alone where it is sure
    scale: float | None = None  # cfg: guidance's scale (default 1.5)
    # a custom combiner's function, imported once when the spec is made (`loaded`): never again
    # per generation or per server request
    function: Callable[..., Any] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _checked(self, "combine")

    def loaded(self) -> CombineSpec:
        """This spec with its custom combiner's function imported (once), or none for a built-in."""
        if not is_custom_combine(self.combine):
            return self if self.function is None else replace(self, function=None)
        return self if self.function is not None else replace(self, function=load_function(self.combine))

    def combiner(self) -> Combiner:
        if self.function is not None:
            return gated(CustomCombiner(self.function, level=self.combine_on, name=custom_name(self.combine)), self.gate, self.lead)
        return make_combiner(
            self.combine, weights=self.weights, mu=self.mu, plausibility=self.plausibility, expert=self.expert, level=self.combine_on,
            gate=self.gate, lead=self.lead, scale=1.5 if self.scale is None else self.scale,
        )


# --- generating ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationConfig:
    """How to generate: method, proposal lengths, sampling and limits (see `Ensemble.generate`).

    Every field is checked when the config is made, by the parser of its option
    (`ConfigError` naming the field), so a bad value never reaches llama.cpp or NumPy.
    """

    method: str | None = None  # None: the default for the models' number (`default_method`)
    max_tokens: int = 128
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None  # None: a fresh random seed (-1 means the same)
    samplers: tuple[str, ...] | None = None  # the sampler chain (None: every setting applies)
    stop: tuple[str, ...] = ()
    n_indent: int = 0  # a new line indented by fewer characters ends the text (0: off)
    t_max_predict_ms: float = 0.0  # after this long, the next new line ends the text (0: off)
    infill_suffix: int | None = None  # fill-in-the-middle: the most suffix tokens read (None: llama-server's rule)
    infill_layout: str = "makers"  # fill-in-the-middle: the prompt's order (localcos.infill.INFILL_LAYOUTS)
    infill_block: int = 16  # fill-in-the-middle, cached layout: the prefix starts at a block's first line, a block about this many lines
    cache_prompt: bool = False  # reuse an earlier request's cells of the prompt exactly (not as a fresh process)
    ignore_eos: bool = False
    negative_prompt: str | None = None  # what the member reading the second prompt reads (see LoadSpec.second_prompt)
    phrasing: str = "raw"  # how the members read a text prompt (localcos.phrasing); a prompt of token ids is read as it is
    gamma: Gamma = "auto"  # planned from the measured call costs; a fixed length only where one is asked for
    proposer: int | str | None = None  # None: the model with the fewest parameters; "lookup": the context
    lookup: str = "auto"  # drafts looked up in the context: auto, on or off (cos, and proposer "lookup")
    lookup_ngram: tuple[int, int] = (3, 12)  # the shortest and longest suffix looked up
    lookup_tokens: int = 16  # the most looked-up tokens a draft takes
    byte_gamma: int | str = "auto"  # byte level, cos: bytes a proposer drafts, or "auto" (planned from the call costs)
    lookahead: tuple[int, int] | None = None  # greedy: (candidates, tokens each rolls out) where r is unsure
    lookahead_threshold: float = 0.5  # r's top probability below which a position is looked ahead from
    # structured output (localcos.grammar): at most one of them
    json_schema: Constraint | None = None
    grammar: Constraint | None = None
    json_object: bool = False

    def __post_init__(self) -> None:
        _checked(self, "generation")
        if self.proposer == "lookup" and self.lookup == "off":
            raise ConfigError("the lookup proposer needs lookup on or auto", param="proposer")
        given = [name for name in ("json_schema", "grammar", "json_object") if getattr(self, name)]
        if len(given) > 1:
            raise ConfigError(f"give one constraint, not {' and '.join(given)}", param=given[-1])
        if given and self.ignore_eos:
            raise ConfigError("a constraint ends the text where it is complete: leave out ignore_eos", param="ignore_eos")
        self._check_lookahead(given)
        if self.samplers is not None and "infill" in self.samplers and not ("top_k" in self.samplers and 0 < self.top_k <= INFILL_CANDIDATES):
            raise ConfigError(f"samplers: infill compares its candidates' texts pair by pair: put top_k before it, with top_k from 1 to "
                              f"{INFILL_CANDIDATES}", param="samplers")  # fmt: skip

    def _check_lookahead(self, constraints: Sequence[str]) -> None:
        """Lookahead is greedy decoding of r with the ensemble's step (`core.strategies.Lookahead`)."""
        if self.lookahead is None:
            return
        if not self.sampler().greedy:
            raise ConfigError("lookahead decodes greedily: give temperature 0", param="lookahead")
        if self.method not in (None, "ensemble"):
            raise ConfigError(f"lookahead decodes with the ensemble's step, not method {self.method}: give method ensemble", param="method")
        if constraints:
            raise ConfigError(f"lookahead: not with {constraints[0]} (a constraint would follow every branch)", param=constraints[0])

    def sampler(self) -> Sampler:
        """The sampling settings as they apply: with a chain (`samplers`), only those it names
        (llama-server's way), temperature 1 where it names none; the infill sampler is bound to
        the vocabulary where a request is planned (`Sampler.infill`)."""
        chain = self.samplers
        if chain is None:
            return Sampler(self.temperature, self.top_k, self.top_p, self.min_p)
        return Sampler(self.temperature if "temperature" in chain else 1.0, self.top_k if "top_k" in chain else 0,
                       self.top_p if "top_p" in chain else 1.0, self.min_p if "min_p" in chain else 0.0)  # fmt: skip

    def for_models(self, n: int, level: Level | str = "auto") -> GenerationConfig:
        """This config for an ensemble of n models decoding at `level`: its method, or the
        default (`default_method`; cos where the context is the proposer)."""
        if self.method is not None:
            return self
        # the context as the only proposer drafts for one model too
        return replace(self, method="cos" if self.proposer == "lookup" else default_method(n, level, self.lookahead is not None))

    @property
    def constraint(self) -> Constraint | None:
        """What the text must be (structured output), if anything."""
        if self.json_object:
            return json_object()
        return self.json_schema or self.grammar

    def with_values(self, values: Mapping[str, Any]) -> GenerationConfig:
        """This config with the keyword settings over it (lists become tuples, a string stop one
        stop string); an unknown keyword is a `ConfigError`."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown generation setting: {unknown[0]}", param=unknown[0])
        changes: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        if isinstance(changes.get("stop"), str):
            changes["stop"] = (changes["stop"],)
        return replace(self, **changes)


INFILL_CANDIDATES = 128  # the most candidates the infill sampler compares (top_k's)
def check_for_models(
    generation: GenerationConfig,
    n: int,
    *,
    combine: CombineSpec | None = None,
    chat_template_model: int = 0,
    json: bool = False,
    level: Level | str = "auto",
    second_prompt: bool = False,
) -> None:
    """What the settings must satisfy for an ensemble of n models (and, with `second_prompt`,
    the lead model a second time reading a second prompt: n + 1 members, which the combination,
    the methods and the indices of members count): member indices in range, methods that need
    two members, one gamma or one per member, the combination's fit (weights per member, cd's
    and cfg's two), the members' own rules (`check_members`), the level's (`check_level`). The
    settings layer calls this before loading anything, the runtime's planning for every
    generation."""
    members = n + second_prompt

    def index(name: str, value: int | None, count: int = members) -> None:
        if value is not None and value >= count:
            raise ConfigError(f"{what(name, json)} must be a model index from 0 to {count - 1}, got {value}", param=name)

    index("proposer", generation.proposer if isinstance(generation.proposer, int) else None)
    index("chat_template_model", chat_template_model, n)
    if generation.method not in (None, "ensemble") and members < 2 and generation.proposer != "lookup":
        raise ConfigError(f"method {generation.method} needs at least 2 models (or --proposer lookup: drafts looked up in the context); "
                          "use --method ensemble for one", param="method")  # fmt: skip
    gamma = generation.gamma
    if isinstance(gamma, tuple) and len(gamma) not in (1, members):
        raise ConfigError(f"got {len(gamma)} gamma values for {members} models; give one, or one per model", param="gamma")
    check_second_member(generation, second_prompt, json)
    if combine is not None:
        index("expert", combine.expert)
        index("lead", combine.lead)
        check_members(n, combine, second_prompt, json)
        try:
            combine.combiner().fit(members, [1] * members)
        except ConfigError as e:
            kind = COMBINERS.get(combine.combine)
            if kind is None or (e.param, e.code) != ("weights", "unsupported_parameter"):
                raise
            # the registry's reads are CombineSpec's fields: named here as the user gave them
            raise ConfigError(f"{what('weights', json)} does not apply to {combine.combine}; use "
                              + ", ".join(_BY_ATTR["combine"][name].what(json) for name in kind.reads), param="weights") from None  # fmt: skip
        check_level(level, generation, combine.gate is not None)


def check_members(n: int, combine: CombineSpec, second_prompt: bool, json: bool = False) -> None:
    """Guidance's rules, written once: it contrasts one model with itself under a second
    prompt, so it needs that member and no other model."""
    if combine.combine == "cfg" and not second_prompt:
        raise ConfigError(f"{what('cfg_scale', json)} (guidance) needs a second prompt for the model to read: "
                          f"{what('negative_prompt', json)} TEXT (in the chat also --guide-system)", param="cfg_scale")  # fmt: skip
    if combine.combine == "cfg" and n > 1:
        raise ConfigError(f"{what('cfg_scale', json)}: guidance contrasts one model with itself under a second prompt; give one model "
                          "(with several, --combine we, cd or logit-mix takes the second prompt's member beside them)", param="cfg_scale")  # fmt: skip


def check_second_member(generation: GenerationConfig, second_prompt: bool, json: bool = False) -> None:
    """A negative prompt needs the member that reads it: models loaded with one."""
    if generation.negative_prompt is not None and not second_prompt:
        raise ConfigError(f"{what('negative_prompt', json)}: these models were loaded without a member for a second prompt "
                          "(give --negative-prompt when they load: localcos serve --negative-prompt TEXT)", param="negative_prompt")  # fmt: skip


def required_second_prompt(negative: str | Sequence[int] | None) -> str | Sequence[int]:
    """The second prompt of models loaded with a member to read one: it must be given."""
    if negative is None:
        raise ConfigError("negative_prompt: these models were loaded with a member for a second prompt; give it one", param="negative_prompt")
    return negative


def imply_guidance(combine_values: dict[str, Any], gave_scale: bool, gave_combine: bool) -> None:
    """--cfg-scale alone chooses guidance (--combine cfg): its scale is what it is for."""
    if gave_scale and not gave_combine:
        combine_values["combine"] = "cfg"


def check_second_prompt(prompt: str | Sequence[int], negative: str | Sequence[int] | None, json: bool = False) -> None:
    """A second prompt equal to the prompt (as text, or as tokens) contrasts nothing."""
    if negative is None:
        return
    same = negative.strip() == prompt.strip() if isinstance(prompt, str) and isinstance(negative, str) else list(negative) == list(prompt)
    if same:
        raise ConfigError(f"{what('negative_prompt', json)} is the prompt itself: a second prompt must differ from it", param="negative_prompt")


# --- serving -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerSpec:
    """How `localcos serve` listens and whom it answers."""

    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    max_queue: int = 64
    alias: str | None = None
    cors: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _checked(self, "server", json=False)


# --- all of it -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """Everything a front end needs: what to load, how to combine, how to generate."""

    load: LoadSpec
    combine: CombineSpec
    generation: GenerationConfig
    chat_template_model: int = 0
    system: str | None = None
    guide_system: bool = False  # the chat: the second member reads the conversation without its system message
    name: str = ""  # what to call the ensemble: the preset, the synthetic set, or its models
    given: frozenset[str] = frozenset()  # the options the user gave (not defaults): what a level may refuse

    def combiner(self) -> Combiner:
        return self.combine.combiner()

    def alone(self, model: int, n_models: int) -> Settings:
        """Model `model` of these `n_models` as its makers run it (eval's "X alone", the baseline
        every combination is judged against): every option that makes more of it than the model
        (`Option.combines`: a second model or prompt, a combination, drafts, lookahead) at its
        default, all the weight on it, the ensemble's step and its phrasing `auto` (its chat
        template where it has one); the sampling, length and stop of these settings."""
        values = {o.name: "" for o in OPTIONS.values() if o.combines and o.target in ("combine", "generation", "chat")}
        weights = ",".join("1" if i == model else "0" for i in range(n_models))
        return self.with_values({**values, "combine": "we", "weights": weights, "method": "ensemble", "phrasing": "auto"}, check=False)

    def value(self, name: str) -> Any:
        """The current value of option `name` (for forms that show the settings)."""
        opt = OPTIONS[name]
        spec = {"load": self.load, "combine": self.combine, "generation": self.generation}.get(opt.target, self)
        return getattr(spec, opt.attr)

    def with_values(self, values: Mapping[str, Any], *, json: bool = False, parsed: bool = False, check: bool = True) -> Settings:
        """These settings with some combination and generation options changed (the chat's
        settings form, a server request). An empty string resets an option to its default.
        `parsed`: the values were checked where they entered (the server's request models run
        each option's parser). `check`: also check them against the number of models now (a
        request's plan does, with the models, so the server leaves it out)."""
        changes: dict[str, dict[str, Any]] = {"combine": {}, "generation": {}, "chat": {}}
        for name, raw in values.items():
            opt = OPTIONS.get(name)
            if opt is None:
                raise ConfigError(f"unknown setting {name!r}", param=name)
            if opt.target not in changes:
                raise ConfigError(f"{opt.what(json)} cannot change once the models are loaded", param=name)
            if parsed:
                value = raw
            else:
                value = opt.default if raw is None or (isinstance(raw, str) and not raw.strip()) else opt.check(raw, json=json)
            changes[opt.target][opt.attr] = value
        imply_guidance(changes["combine"], "scale" in changes["combine"], "combine" in changes["combine"])
        combine = replace(self.combine, **changes["combine"])
        if combine.combine != self.combine.combine:
            # another combiner: the old one's parameters (a we preset's weights) do not carry over
            combine = CombineSpec(**changes["combine"]).loaded()
        generation = replace(self.generation, **changes["generation"])
        new = replace(self, combine=combine, generation=generation, **changes["chat"])
        if check:
            check_for_models(new.generation, len(new.load.paths), combine=new.combine, chat_template_model=new.chat_template_model, json=json,
                             level=new.load.level, second_prompt=new.load.second_prompt)  # fmt: skip
        return new


# every spec field has its option (a field without one could never be set by a front end)
assert {f.name for f in fields(LoadSpec)} - {"paths", "labels", "second_prompt", "lookahead"} == set(_BY_ATTR["load"])
assert {f.name for f in fields(CombineSpec)} - {"function"} == set(_BY_ATTR["combine"])
assert {f.name for f in fields(GenerationConfig)} == set(_BY_ATTR["generation"])
assert {f.name for f in fields(ServerSpec)} == set(_BY_ATTR["server"])
