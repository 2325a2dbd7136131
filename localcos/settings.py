"""One settings layer for every front end.

The front ends (the CLI's subcommands, the chat, the server) take options as people write them:
command-line strings, form fields, JSON values. They hand them here, and get back frozen specs that
the library takes: what to load (`LoadSpec`), how to combine (`CombineSpec`) and how to generate
(`GenerationConfig`), together a `Settings`. Data runs one way: front end -> settings -> library.

Each option is declared once, in `OPTIONS`: its name (also the server's JSON field), its flags,
its help, its default, and its parser. There is one parser per kind of value (integers, numbers,
lists of either, gamma, seeds, choices), each raising `ConfigError` with one line that names the
option, so no value reaches llama.cpp or NumPy unchecked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from .backend import MIN_CTX
from .backend.worker import layers_to_offload
from .core.combiners import Combiner, CustomCombiner, custom_name, load_function, make_combiner
from .core.decoding import METHODS
from .core.lookup import LOOKUP_MODES
from .ensemble import Gamma, GenerationConfig
from .errors import ConfigError
from .grammar import Constraint

if TYPE_CHECKING:
    from .backend.rpc import Endpoint
    from .ensemble import Ensemble

SPLIT_MODES = ("none", "layer", "row")
FLASH_ATTN = ("auto", "on", "off")
COMBINERS = ("we", "cd", "logit-mix")  # or FILE.py:FUNCTION / MODULE:FUNCTION
COMBINE_LEVELS = ("logits", "probs")
MAX_MU = 1e6  # mu x logits stays finite in float32
WEIGHT_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m")  # what the synthetic-model writer offers (tools.testmodels)

# --- one parser per kind of value ---------------------------------------------------------------


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) else None


def parse_int(value: Any, what: str, *, minimum: int | None = None) -> int:
    """An integer (a JSON number without fraction, or its text), at least `minimum`."""
    text = _text(value)
    if text is not None:
        try:
            number = int(text)
        except ValueError:
            raise ConfigError(f"{what} must be an integer, got {value!r}") from None
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise ConfigError(f"{what} must be an integer, got {value!r}")
    if minimum is not None and number < minimum:
        raise ConfigError(f"{what} must be >= {minimum}, got {number}")
    return number


def parse_float(
    value: Any, what: str, *, minimum: float | None = None, maximum: float | None = None, above: float | None = None
) -> float:
    """A finite number, >= `minimum`, <= `maximum` and > `above` where given."""
    text = _text(value)
    try:
        if text is not None:
            number = float(text)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        else:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ConfigError(f"{what} must be a finite number, got {value!r}")
    if minimum is not None and number < minimum:
        raise ConfigError(f"{what} must be >= {minimum:g}, got {number:g}")
    if maximum is not None and number > maximum:
        raise ConfigError(f"{what} must be <= {maximum:g}, got {number:g}")
    if above is not None and number <= above:
        raise ConfigError(f"{what} must be > {above:g}, got {number:g}")
    return number


def _items(value: Any, what: str, kind: str) -> list[Any]:
    """Comma-separated text or a JSON list, as a non-empty list of items."""
    text = _text(value)
    if text is not None:
        items: list[Any] = [p.strip() for p in text.split(",")]
        if any(not p for p in items):
            items = []  # "", "1,", ",2": not a list of values
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = [value]
    if not items:
        raise ConfigError(f"{what} must be comma-separated {kind}, got {value!r}")
    return items


def _list(value: Any, what: str, kind: str, parse_one: Callable[[Any], Any]) -> tuple[Any, ...]:
    """Comma-separated text or a JSON list of one or more items, each checked by `parse_one`; a
    malformed item is reported as a malformed list, an out-of-range one as itself."""
    items = _items(value, what, kind)
    try:
        return tuple(parse_one(x) for x in items)
    except ConfigError as e:
        if "must be an integer," in str(e) or "must be a number," in str(e):
            raise ConfigError(f"{what} must be comma-separated {kind}, got {value!r}") from None
        raise


def parse_ints(value: Any, what: str, *, minimum: int | None = None) -> tuple[int, ...]:
    """One or more integers: "1,2" or [1, 2]."""
    return _list(value, what, "integers", lambda x: parse_int(x, what, minimum=minimum))


def parse_floats(value: Any, what: str, *, minimum: float | None = None) -> tuple[float, ...]:
    """One or more numbers: "0.5,0.5" or [0.5, 0.5]."""
    return _list(value, what, "numbers", lambda x: parse_float(x, what, minimum=minimum))


def parse_seed(value: Any, what: str = "--seed") -> int | None:
    """A seed >= 0, or -1 for a fresh random one (llama.cpp's convention)."""
    seed = parse_int(value, what)
    if seed == -1:
        return None
    if seed < 0:
        raise ConfigError(f"{what} must be >= 0 (or -1 for a random seed), got {seed}")
    return seed


def parse_gamma(value: Any, what: str = "--gamma") -> Gamma:
    """Proposal length: "auto", one integer >= 1 (the proposer's), or one per model ("5,1")."""
    if isinstance(value, str) and value.strip() == "auto":
        return "auto"
    try:
        values = parse_ints(value, what, minimum=1)
    except ConfigError:
        raise ConfigError(f"{what} must be an integer >= 1, one per model (5,1), or auto; got {value!r}") from None
    return values[0] if len(values) == 1 else values


def format_gamma(gamma: Gamma) -> str:
    """The text `parse_gamma` reads back ("" for the default)."""
    if gamma is None:
        return ""
    if isinstance(gamma, (str, int)):
        return str(gamma)
    return ",".join(str(g) for g in gamma)


def parse_choice(value: Any, what: str, choices: Sequence[str]) -> str:
    text = _text(value)
    if text not in choices:
        raise ConfigError(f"{what} must be one of {', '.join(choices)}, got {value!r}")
    return text  # type: ignore[return-value]


def parse_bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = _text(value)
    if text is not None and text.lower() in ("1", "true", "yes", "on"):
        return True
    if text is not None and text.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{what} must be true or false, got {value!r}")


def parse_strings(value: Any, what: str) -> tuple[str, ...]:
    """One string or a list of strings (stop strings: empty ones are dropped)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise ConfigError(f"{what} must be a string or a list of strings, got {value!r}")
    return tuple(s for s in items if s)


def parse_refs(value: Any, what: str) -> tuple[str, ...]:
    """Model references: "a.gguf,b.gguf" or a list (paths, models.toml names, hf:OWNER/REPO/FILE)."""
    if isinstance(value, str):
        refs = tuple(p.strip() for p in value.split(",") if p.strip())
    else:
        refs = parse_strings(value, what)
    if not refs:
        raise ConfigError(f"{what} names no models")
    return refs


def parse_rpc(value: Any, what: str = "--rpc") -> tuple[tuple[Endpoint, ...], ...]:
    """Where each model runs: "-" (here) or HOST:PORT, several servers joined with "+"; one entry
    per model, or one for all: "-,10.0.0.5:50052" or ["-", "10.0.0.5:50052"]."""
    from .backend.rpc import parse_endpoint

    def one(item: Any) -> tuple[Endpoint, ...]:
        text = _text(item)
        if not text:
            raise ConfigError(f"{what} takes - or HOST:PORT per model, got {value!r}")
        if text == "-":
            return ()
        return tuple(parse_endpoint(part, what) for part in text.split("+"))

    return tuple(one(item) for item in _items(value, what, "entries (- or HOST:PORT)"))


def format_rpc(rpc: Sequence[Sequence[Endpoint]]) -> str:
    """The text `parse_rpc` reads back."""
    return ",".join("+".join(str(e) for e in servers) or "-" for servers in rpc)


def is_custom_combine(text: str) -> bool:
    """A `--combine` value that names code (FILE.py:FUNCTION or MODULE:FUNCTION)."""
    return ":" in text


def parse_combine(value: Any, what: str) -> str:
    """A combiner name (we, cd, logit-mix) or a user function FILE.py:FUNCTION / MODULE:FUNCTION."""
    text = _text(value)
    if text in COMBINERS or (text and is_custom_combine(text)):
        return text
    raise ConfigError(f"{what} must be we, cd, logit-mix or FILE.py:FUNCTION, got {value!r}")


def parse_served_combine(value: Any, what: str) -> str:
    """A server request's combiner: a built-in name only. A request chooses among the server's
    combiners and never names code to import or run; a custom combiner is the server's own,
    given on its command line when it starts (and stays the default of every request)."""
    text = _text(value)
    if text in COMBINERS:
        return text
    if text and is_custom_combine(text):
        raise ConfigError(
            f"{what} {text!r} names code to import; a request chooses among {', '.join(COMBINERS)}. "
            "A custom combiner is given when the server starts (localcos serve --combine FILE.py:FUNCTION) "
            "and is then every request's default"
        )
    raise ConfigError(f"{what} must be one of {', '.join(COMBINERS)}, got {value!r}")


def parse_proposer(value: Any, what: str) -> int | str:
    """A proposer: a model index >= 0, or "lookup" (drafts looked up in the context)."""
    if isinstance(value, str) and value.strip() == "lookup":
        return "lookup"
    try:
        return parse_int(value, what, minimum=0)
    except ConfigError:
        raise ConfigError(f"{what} must be a model index >= 0 or lookup, got {value!r}") from None


def parse_ngram_sizes(value: Any, what: str) -> tuple[int, int]:
    """MIN,MAX: 1 <= MIN <= MAX (one value: both)."""
    sizes = parse_ints(value, what, minimum=1)
    if len(sizes) == 1:
        sizes = (sizes[0], sizes[0])
    if len(sizes) != 2 or sizes[0] > sizes[1]:
        raise ConfigError(f"{what} must be MIN,MAX with 1 <= MIN <= MAX, got {value!r}")
    return sizes[0], sizes[1]


def parse_json_schema(value: Any, what: str) -> Constraint:
    """A JSON schema: a file, JSON text, or (from JSON) the schema object itself; compiled and
    checked here, before any model is loaded."""
    from .grammar import json_schema, read_source

    if isinstance(value, Constraint):
        return value
    return json_schema(value if isinstance(value, dict) else read_source(value, what), what)


def parse_grammar(value: Any, what: str) -> Constraint:
    """A GBNF grammar (a file or its text), compiled and checked here."""
    from .grammar import gbnf, read_source

    if isinstance(value, Constraint):
        return value
    return gbnf(read_source(value, what), what)


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what} must be a non-empty string, got {value!r}")
    return value.strip()


# --- the options ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One option, declared once for every front end.

    `name` is the field in `Settings` values and the server's JSON; `flags` the command line's;
    `target` says which spec it feeds ("source": which models; "load", "combine", "generation")
    and `attr` the spec's field. `parse(value, what)` checks a raw value.
    """

    name: str
    flags: tuple[str, ...]
    group: str
    target: str
    attr: str
    parse: Callable[[Any, str], Any]
    help: str
    default: Any = None
    metavar: str | None = None
    switch: bool = False  # a command-line flag without a value
    repeat: bool = False  # a command-line option given once per value
    choices: tuple[str, ...] | None = None

    @property
    def flag(self) -> str:
        return self.flags[0]

    def check(self, value: Any, *, json: bool = False) -> Any:
        """`value` parsed and checked; errors name the option (`ConfigError.param` = name)."""
        try:
            return self.parse(value, self.name if json else self.flag)
        except ConfigError as e:
            raise ConfigError(str(e), param=self.name) from None

    def format(self, value: Any) -> str:
        """The text a person would type for `value` ("" for unset)."""
        if value is None:
            return ""
        if self.name == "gamma":
            return format_gamma(value)
        if self.name == "rpc":
            return format_rpc(value)
        if isinstance(value, Constraint):
            return value.source
        if isinstance(value, (list, tuple)):
            return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)


def _option(name: str, flags: str | tuple[str, ...], group: str, target: str, parse: Callable[[Any, str], Any], help: str, **kw: Any) -> Option:
    attr = kw.pop("attr", name)
    return Option(name, (flags,) if isinstance(flags, str) else flags, group, target, attr, parse, help, **kw)


def _choice(choices: Sequence[str]) -> Callable[[Any, str], str]:
    return lambda v, what: parse_choice(v, what, choices)


def _at_least(minimum: int) -> Callable[[Any, str], int]:
    return lambda v, what: parse_int(v, what, minimum=minimum)


_OPTIONS = [
    # which models
    _option("models", ("--models", "-m"), "models", "source", parse_refs,
            "comma-separated models in ensemble order: GGUF paths, names from models.toml, or hf:OWNER/REPO/FILE", metavar="A,B"),
    _option("preset", "--preset", "models", "source", _str, "a named ensemble from models.toml: its models, combiner, method and gamma", metavar="NAME"),
    _option("synthetic", "--synthetic", "models", "source", _str,
            "a built-in synthetic set: we-pair, cd-pair, we-triple, we-unrelated, we-pair-152k (built once, cached)", metavar="SET"),
    _option("synthetic_dtype", "--synthetic-dtype", "models", "source", _choice(WEIGHT_TYPES),
            "weight type of a synthetic set (default bf16: the cheapest batched verification on CPUs with BF16 instructions)",
            choices=WEIGHT_TYPES),
    _option("config", "--config", "models", "source", _str, "an extra models.toml (merged over the built-in and your own)", metavar="FILE"),
    # how to load them
    _option("ctx", "--ctx", "models", "load", _at_least(MIN_CTX), "context length per model", default=4096, attr="n_ctx", metavar="N"),
    _option("batch_size", "--batch-size", "models", "load", _at_least(1), "most tokens per llama_decode call", default=512, attr="n_batch", metavar="N"),
    _option("n_gpu_layers", "--n-gpu-layers", "hardware", "load", lambda v, what: parse_ints(v, what, minimum=-1),
            "layers to offload to the GPU: one value or one per model; -1 = all (default: models.toml, else 0)", metavar="N[,N]"),
    _option("main_gpu", "--main-gpu", "hardware", "load", _at_least(0), "GPU for the whole model when not splitting", default=0, metavar="I"),
    _option("split_mode", "--split-mode", "hardware", "load", _choice(SPLIT_MODES), "how to split a model across GPUs", default="layer", choices=SPLIT_MODES),
    _option("flash_attn", "--flash-attn", "hardware", "load", _choice(FLASH_ATTN), "flash attention", default="auto", choices=FLASH_ATTN),
    _option("rpc", "--rpc", "hardware", "load", parse_rpc,
            "where each model runs: - (here) or HOST:PORT of a `localcos rpc-server` (HOST:PORT+HOST:PORT for several); "
            "one entry or one per model (default: models.toml, else here). A remote model offloads all its layers "
            "unless --n-gpu-layers says otherwise", metavar="-|HOST:PORT[,...]"),
    _option("rpc_timeout", "--rpc-timeout", "hardware", "load", lambda v, what: parse_float(v, what, above=0),
            "seconds a model on an RPC server may take to answer one call before its server is taken as lost",
            default=120.0, metavar="S"),
    _option("threads", "--threads", "hardware", "load", _at_least(1), "CPU threads per model (default: physical cores)", attr="n_threads", metavar="N"),
    _option("parallel", "--parallel", "hardware", "load", _at_least(1),
            "sequences decoded at once, their rows sharing llama_decode calls (generate --n, concurrent server requests); "
            "each takes --ctx tokens of KV cache (default: serve and generate --n choose from the context size, else 1)",
            metavar="N"),
    _option("verbose", "--verbose", "hardware", "load", parse_bool, "show llama.cpp's own log lines", default=False, switch=True),
    # how to combine
    _option("combine", "--combine", "combination", "combine", parse_combine,
            "we (weighted ensemble), cd (contrastive), logit-mix, or FILE.py:FUNCTION", default="we", metavar="KIND"),
    _option("weights", "--weights", "combination", "combine", lambda v, what: parse_floats(v, what),
            "we / logit-mix weights, one per model (default: equal)", metavar="W,W"),
    _option("mu", "--mu", "combination", "combine", lambda v, what: parse_float(v, what, minimum=0, maximum=MAX_MU),
            "cd: the amateur's weight mu", default=0.1),
    _option("plausibility", "--plausibility", "combination", "combine", lambda v, what: parse_float(v, what, above=0, maximum=1),
            "cd: plausibility threshold alpha in (0, 1] (default off)", metavar="ALPHA"),
    _option("expert", "--expert", "combination", "combine", _at_least(0), "cd: index of the expert model (default: the larger)", metavar="I"),
    _option("combine_level", "--combine-level", "combination", "combine", _choice(COMBINE_LEVELS),
            "custom combiner: what FUNCTION receives", default="logits", attr="level", choices=COMBINE_LEVELS),
    # how to generate
    _option("method", "--method", "method", "generation", _choice(METHODS),
            "ensemble (every model, every token), sd, naive-cos, or cos (default: cos; ensemble for one model)", choices=METHODS),
    _option("gamma", "--gamma", "method", "generation", parse_gamma,
            "proposal length: one value (the proposer's; others 1), one per model, or auto (chosen online from measured "
            "acceptance and call times; the output then depends on timing, not only on --seed). Default: from the models' size ratio",
            metavar="G"),
    _option("proposer", "--proposer", "method", "generation", parse_proposer,
            "index of the default proposer (default: the cheapest model), or lookup: drafts looked up in the context only",
            metavar="I|lookup"),
    _option("lookup", "--lookup", "method", "generation", _choice(LOOKUP_MODES),
            "cos also verifies drafts looked up in the context (no model call; their rows ride in the calls made anyway): "
            "on, off, or auto (only when their rows are expected to cost less than the tokens they save)", default="auto",
            choices=LOOKUP_MODES),
    _option("lookup_ngram", "--lookup-ngram", "method", "generation", parse_ngram_sizes,
            "the shortest and the longest suffix of the text looked up earlier in it", default=(3, 12), metavar="MIN,MAX"),
    _option("lookup_tokens", "--lookup-tokens", "method", "generation", _at_least(1), "the most looked-up tokens one draft takes",
            default=16, metavar="N"),
    _option("temperature", ("--temperature", "-t"), "sampling", "generation", lambda v, what: parse_float(v, what, minimum=0),
            "0 = greedy", default=1.0, metavar="T"),
    _option("top_k", "--top-k", "sampling", "generation", _at_least(0), "keep the k most likely tokens; 0 = off", default=0, metavar="K"),
    _option("top_p", "--top-p", "sampling", "generation", lambda v, what: parse_float(v, what, above=0, maximum=1),
            "nucleus sampling; 1 = off", default=1.0, metavar="P"),
    _option("min_p", "--min-p", "sampling", "generation", lambda v, what: parse_float(v, what, minimum=0, maximum=1),
            "drop tokens below min-p x the most likely one; 0 = off", default=0.0, metavar="P"),
    _option("seed", "--seed", "sampling", "generation", parse_seed, "random seed; -1 = random (printed in the stats)", metavar="N"),
    _option("max_tokens", "--max-tokens", "output", "generation", _at_least(1), "tokens to generate at most", default=128, metavar="N"),
    _option("stop", "--stop", "output", "generation", parse_strings, "stop at this string (repeatable)", default=(), repeat=True, metavar="STR"),
    _option("ignore_eos", "--ignore-eos", "output", "generation", parse_bool, "never stop at (or sample) end-of-generation tokens",
            default=False, switch=True),
    _option("json_schema", "--json-schema", "output", "generation", parse_json_schema,
            "structured output: only JSON valid under this schema (a file, or the schema itself)", metavar="FILE|JSON"),
    _option("grammar", "--grammar", "output", "generation", parse_grammar,
            "structured output: only text of this GBNF grammar, llama.cpp's format (a file, or the grammar itself)", metavar="FILE|GBNF"),
    _option("json_object", "--json-object", "output", "generation", parse_bool, "structured output: one JSON object, any",
            default=False, switch=True),
    # chat formatting
    _option("chat_template_model", "--chat-template-model", "chat", "chat", _at_least(0),
            "index of the model whose chat template formats messages (default: the preset's, else 0)", metavar="I"),
    _option("system", "--system", "chat", "chat", lambda v, what: v if isinstance(v, str) else _str(v, what), "system message", metavar="TEXT"),
]
OPTIONS: dict[str, Option] = {o.name: o for o in _OPTIONS}
GROUPS: dict[str, list[Option]] = {}
for _o in _OPTIONS:
    GROUPS.setdefault(_o.group, []).append(_o)


# --- the specs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadSpec:
    """What to load and how: the files, and llama.cpp's context and hardware settings."""

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

    def load(
        self,
        combiner: Combiner | None = None,
        progress: Callable[[int, int, str], None] | None = None,
        max_logit_rows: int = 64,
        extra_slots: int = 0,
    ) -> "Ensemble":
        """Load the ensemble (`progress(i, n, name)` before model i of n; `max_logit_rows` as in
        `Ensemble.load`: decoding needs a few rows a call, scoring more; `extra_slots` sequences
        beyond `parallel`, a server's slot for scoring)."""
        from .backend import set_verbose
        from .ensemble import Ensemble

        if self.verbose:
            set_verbose(True)
        # every other field is an argument of Ensemble.load of the same name
        options = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("paths", "labels", "verbose", "parallel")}
        parallel = (self.parallel or 1) + extra_slots
        return Ensemble.load(self.paths, combiner, progress=progress, max_logit_rows=max_logit_rows, parallel=parallel, **options)


def default_parallel(n_ctx: int, wanted: int = 8) -> int:
    """Sequences to decode at once when the user did not say: up to `wanted` (at most 8), as
    many as keep the KV cache at 16k tokens per model (each sequence takes n_ctx)."""
    return max(1, min(wanted, 8, 16384 // n_ctx))


@dataclass(frozen=True)
class CombineSpec:
    """How to combine: a built-in combiner and its parameters, or a user function."""

    combine: str = "we"
    weights: tuple[float, ...] | None = None
    mu: float = 0.1
    plausibility: float | None = None
    expert: int | None = None
    level: str = "logits"
    # a custom combiner's function, imported once when the spec is made (`loaded`): never again
    # per generation or per server request
    function: Callable[..., Any] | None = field(default=None, compare=False, repr=False)

    def loaded(self) -> "CombineSpec":
        """This spec with its custom combiner's function imported (once), or none for a built-in."""
        if not is_custom_combine(self.combine):
            return self if self.function is None else replace(self, function=None)
        return self if self.function is not None else replace(self, function=load_function(self.combine))

    def combiner(self) -> Combiner:
        if self.function is not None:
            return CustomCombiner(self.function, level=self.level, name=custom_name(self.combine))
        return make_combiner(
            self.combine, weights=self.weights, mu=self.mu, plausibility=self.plausibility, expert=self.expert, level=self.level
        )


@dataclass(frozen=True)
class Settings:
    """Everything a front end needs: what to load, how to combine, how to generate."""

    load: LoadSpec
    combine: CombineSpec
    generation: GenerationConfig
    chat_template_model: int = 0
    system: str | None = None
    name: str = ""  # what to call the ensemble: the preset, the synthetic set, or its models

    def combiner(self) -> Combiner:
        return self.combine.combiner()

    def value(self, name: str) -> Any:
        """The current value of option `name` (for forms that show the settings)."""
        opt = OPTIONS[name]
        spec = {"load": self.load, "combine": self.combine, "generation": self.generation}.get(opt.target, self)
        return getattr(spec, opt.attr)

    def with_values(self, values: Mapping[str, Any], *, json: bool = False, parsed: bool = False) -> "Settings":
        """These settings with some combination and generation options changed (the chat's
        settings form, a server request). An empty string resets an option to its default.
        `parsed`: the values were checked where they entered (the server's request models run
        each option's parser), so only what depends on several of them is checked here."""
        changes: dict[str, dict[str, Any]] = {"combine": {}, "generation": {}, "chat": {}}
        for name, raw in values.items():
            opt = OPTIONS.get(name)
            if opt is None:
                raise ConfigError(f"unknown setting {name!r}", param=name)
            if opt.target not in changes:
                raise ConfigError(f"{opt.name if json else opt.flag} cannot change once the models are loaded", param=name)
            if parsed:
                value = raw
            else:
                value = opt.default if raw is None or (isinstance(raw, str) and not raw.strip()) else opt.check(raw, json=json)
            changes[opt.target][opt.attr] = value
        combine = replace(self.combine, **changes["combine"])
        if combine.combine != self.combine.combine:
            # another combiner: the old one's parameters (a we preset's weights) do not carry over
            combine = CombineSpec(**changes["combine"]).loaded()
        generation = replace(self.generation, **changes["generation"])
        new = replace(self, combine=combine, generation=generation, **changes["chat"])
        check_for_models(new.combine, new.generation, len(new.load.paths), new.chat_template_model, json=json)
        return new


def check_for_models(
    combine: CombineSpec, generation: GenerationConfig, n: int, chat_template_model: int = 0, *, json: bool = False
) -> None:
    """Check the settings against an ensemble of n models before any model is loaded (weights
    per model, cd's two models, model indices, gamma per model, methods that need two)."""

    def index(name: str, value: int | None) -> None:
        if value is not None and value >= n:
            what = name if json else OPTIONS[name].flag
            raise ConfigError(f"{what} must be a model index from 0 to {n - 1}, got {value}", param=name)

    index("proposer", generation.proposer if isinstance(generation.proposer, int) else None)
    index("expert", combine.expert)
    index("chat_template_model", chat_template_model)
    if generation.method != "ensemble" and n < 2:
        raise ConfigError(f"method {generation.method} needs at least 2 models; use --method ensemble for one", param="method")
    gamma = generation.gamma
    if isinstance(gamma, tuple) and len(gamma) not in (1, n):
        raise ConfigError(f"got {len(gamma)} gamma values for {n} models; give one, or one per model", param="gamma")
    combine.combiner().bind(n, [1] * n)


# --- from values to settings ---------------------------------------------------------------------


def resolve(
    values: Mapping[str, Any],
    *,
    defaults: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    building: Callable[[str], None] | None = None,
    json: bool = False,
) -> Settings:
    """Settings from option values (`None` or absent = not given), the way every front end makes
    them: models from --models, --preset or --synthetic (a preset fills what the user left
    open), models.toml for names and per-model defaults, `defaults` (the front end's own, such
    as the chat's temperature) over the declared ones. Hub files are downloaded as needed;
    `progress` hears about each model, `building` about synthetic models being built (which
    takes a while, once)."""
    given = {}
    for name, raw in values.items():
        opt = OPTIONS.get(name)
        if opt is None or raw is None or (opt.switch and raw is False):
            continue
        given[name] = opt.check(raw, json=json)
    front = dict(defaults or {})

    sources = [k for k in ("models", "preset", "synthetic") if k in given]
    if len(sources) > 1:
        raise ConfigError("give one of " + ", ".join(OPTIONS[k].flag for k in sources) + ", not several")
    if not sources and "synthetic" in front:
        given["synthetic"] = front["synthetic"]
        sources = ["synthetic"]
    if not sources:
        raise ConfigError("no models: give --models A,B or --preset NAME")

    from .tools.registry import Registry

    registry = Registry.load(given.get("config"))
    chat_model = 0
    per_model_layers: list[int | None]
    per_model_rpc: list[str | None]
    if "synthetic" in given:
        from .tools.synthetic import SETS, ensure_set

        name = given["synthetic"]
        if name not in SETS:
            raise ConfigError(f"unknown synthetic set {name!r}; choose from {', '.join(SETS)}", param="synthetic")
        paths = ensure_set(name, progress=building, dtype=given.get("synthetic_dtype"))
        labels = tuple(SETS[name].labels)
        front.setdefault("combine", SETS[name].combine)
        per_model_layers = [None] * len(paths)
        per_model_rpc = [None] * len(paths)
        title = name
    else:
        preset = None
        if "preset" in given:
            preset = registry.ensembles.get(given["preset"])
            if preset is None:
                raise ConfigError(f"unknown preset {given['preset']!r}; see `localcos models list`", param="preset")
            for key in ("combine", "weights", "mu", "plausibility", "expert", "method", "gamma"):
                if getattr(preset, key) is not None:
                    front[key] = getattr(preset, key)
            if preset.chat_template:
                chat_model = list(preset.models).index(preset.chat_template)
        labels = tuple(preset.models) if preset else given["models"]
        paths = []
        for i, ref in enumerate(labels):
            if progress and len(labels) > 1:
                progress(f"model {i + 1}/{len(labels)}: {ref}")
            paths.append(registry.resolve(ref))
        per_model_layers = [registry.models[r].n_gpu_layers if r in registry.models else None for r in labels]
        per_model_rpc = [registry.models[r].rpc if r in registry.models else None for r in labels]
        title = preset.name if preset else " + ".join(Path(r).name for r in labels)
    n = len(paths)

    def value(name: str) -> Any:
        if name in given:
            return given[name]
        if name in front:
            return front[name]
        return OPTIONS[name].default

    rpc = given.get("rpc")
    if rpc is None:
        rpc = tuple(parse_rpc(x, f"models.toml: rpc of {ref}")[0] if x else () for ref, x in zip(labels, per_model_rpc))
    elif len(rpc) == 1:
        rpc = rpc * n
    if len(rpc) != n:
        raise ConfigError(f"got {len(rpc)} --rpc entries for {n} models; give one, or one per model (- for here)", param="rpc")
    if any(rpc):
        from .backend.rpc import require_rpc

        require_rpc()
        if (given.get("parallel") or 1) > 1:
            raise ConfigError("models on RPC servers decode one sequence at a time: leave out --parallel with --rpc", param="parallel")
    layers = given.get("n_gpu_layers")
    if layers is None:
        layers = tuple(per_model_layers)
    elif len(layers) == 1:
        layers = layers * n
    if len(layers) != n:
        raise ConfigError(f"got {len(layers)} --n-gpu-layers values for {n} models", param="n_gpu_layers")
    layers = tuple(layers_to_offload(servers, x, i) for i, (servers, x) in enumerate(zip(rpc, layers)))

    load = LoadSpec(
        tuple(Path(p) for p in paths), tuple(labels), tuple(layers), rpc, **_spec_values("load", value, exclude={"n_gpu_layers", "rpc"})
    )
    combine = CombineSpec(**_spec_values("combine", value)).loaded()
    generation_values = _spec_values("generation", value)
    if generation_values["method"] is None:
        generation_values["method"] = "cos" if n > 1 else "ensemble"
    generation = GenerationConfig(**generation_values)
    if value("chat_template_model") is not None:
        chat_model = value("chat_template_model")
    check_for_models(combine, generation, n, chat_model, json=json)
    return Settings(load, combine, generation, chat_template_model=chat_model, system=value("system"), name=title)


def _spec_values(target: str, value: Callable[[str], Any], exclude: Iterable[str] = ()) -> dict[str, Any]:
    return {o.attr: value(o.name) for o in _OPTIONS if o.target == target and o.attr not in set(exclude)}


# every spec field has its option (a field without one could never be set by a front end)
assert {f.name for f in fields(LoadSpec)} - {"paths", "labels"} == {o.attr for o in _OPTIONS if o.target == "load"}
assert {f.name for f in fields(CombineSpec)} - {"function"} == {o.attr for o in _OPTIONS if o.target == "combine"}
assert {f.name for f in fields(GenerationConfig)} - {"check_invariants"} == {o.attr for o in _OPTIONS if o.target == "generation"}

__all__ = [
    "OPTIONS",
    "CombineSpec",
    "LoadSpec",
    "Option",
    "Settings",
    "check_for_models",
    "default_parallel",
    "format_gamma",
    "format_rpc",
    "parse_gamma",
    "parse_rpc",
    "parse_served_combine",
    "resolve",
]
