"""One parser per kind of value: integers, numbers, lists of either, seeds, gamma, choices, model
references, RPC endpoints, combiners, constraints.

Each takes a raw value as a front end has it (command-line text, a form field, a JSON value) and
`what` (the option's flag or JSON name, for the message), and returns the checked value or raises
`ConfigError` with one line naming it. A parser accepts its own output again unchanged, so a
spec built from parsed values (`config.specs`) checks them with the same rule, not a copy of it.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Sequence

from ..core.combiners import COMBINERS, combiner_names
from ..errors import ConfigError, check_range, param_of
from ..grammar import Constraint

if TYPE_CHECKING:
    from ..backend.rpc import Endpoint

Gamma = int | tuple[int, ...] | str | None  # one value, one per model, "auto", or None (default)
# the code of a value that is not of the kind asked for at all (a word where a number goes), as
# against one of the right kind out of range: a list reports the first as a malformed list
INVALID_TYPE = "invalid_type"


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) else None


def parse_int(value: Any, what: str, *, minimum: int | None = None) -> int:
    """An integer (a JSON number without fraction, or its text), at least `minimum`."""
    text = _text(value)
    if text is not None:
        try:
            number = int(text)
        except ValueError:
            raise ConfigError(f"{what} must be an integer, got {value!r}", param=param_of(what), code=INVALID_TYPE) from None
    elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
        number = int(value)
    else:
        raise ConfigError(f"{what} must be an integer, got {value!r}", param=param_of(what), code=INVALID_TYPE)
    check_range(number, what, minimum=minimum)
    return number


def parse_float(
    value: Any, what: str, *, minimum: float | None = None, maximum: float | None = None, above: float | None = None
) -> float:
    """A finite number, >= `minimum`, <= `maximum` and > `above` where given."""
    text = _text(value)
    try:
        if text is not None:
            number = float(text)
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            number = float(value)
        else:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{what} must be a number, got {value!r}", param=param_of(what), code=INVALID_TYPE) from None
    check_range(number, what, minimum=minimum, maximum=maximum, above=above)
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
        raise ConfigError(f"{what} must be comma-separated {kind}, got {value!r}", param=param_of(what))
    return items


def _list(value: Any, what: str, kind: str, parse_one: Callable[[Any], Any]) -> tuple[Any, ...]:
    """Comma-separated text or a JSON list of one or more items, each checked by `parse_one`; a
    malformed item is reported as a malformed list, an out-of-range one as itself."""
    items = _items(value, what, kind)
    try:
        return tuple(parse_one(x) for x in items)
    except ConfigError as e:
        if e.code == INVALID_TYPE:
            raise ConfigError(f"{what} must be comma-separated {kind}, got {value!r}", param=param_of(what)) from None
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
        raise ConfigError(f"{what} must be >= 0 (or -1 for a random seed), got {seed}", param=param_of(what))
    return seed


def parse_gamma(value: Any, what: str = "--gamma") -> Gamma:
    """Proposal length: "auto", one integer >= 1 (the proposer's), or one per model ("5,1")."""
    if isinstance(value, str) and value.strip() == "auto":
        return "auto"
    try:
        values = parse_ints(value, what, minimum=1)
    except ConfigError:
        raise ConfigError(f"{what} must be an integer >= 1, one per model (5,1), or auto; got {value!r}", param=param_of(what)) from None
    return values[0] if len(values) == 1 else values


def _int_or_word(value: Any, what: str, word: str, minimum: int, expected: str) -> int | str:
    """An integer >= `minimum`, or `word`; else one line saying `what` must be `expected`."""
    if isinstance(value, str) and value.strip() == word:
        return word
    try:
        return parse_int(value, what, minimum=minimum)
    except ConfigError:
        raise ConfigError(f"{what} must be {expected}, got {value!r}", param=param_of(what)) from None


def parse_byte_gamma(value: Any, what: str = "--byte-gamma") -> int | str:
    """Bytes a proposer drafts at the byte level: an integer >= 1, or "auto" (planned each round
    from the models' call costs)."""
    return _int_or_word(value, what, "auto", 1, "an integer >= 1 or auto")


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
        raise ConfigError(f"{what} must be one of {', '.join(choices)}, got {value!r}", param=param_of(what))
    return text  # type: ignore[return-value]


def parse_bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = _text(value)
    if text is not None and text.lower() in ("1", "true", "yes", "on"):
        return True
    if text is not None and text.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{what} must be true or false, got {value!r}", param=param_of(what))


def parse_strings(value: Any, what: str) -> tuple[str, ...]:
    """One string or a list of strings (stop strings: empty ones are dropped)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise ConfigError(f"{what} must be a string or a list of strings, got {value!r}", param=param_of(what))
    return tuple(s for s in items if s)


# llama-server's sampler names and aliases (common_sampler_types_from_names), and its one-letter ones
_SAMPLER_NAMES = {"top-k": "top_k", "topk": "top_k", "top-p": "top_p", "topp": "top_p", "nucleus": "top_p", "min-p": "min_p", "minp": "min_p",
                  "temp": "temperature", "typ": "typ_p", "typ-p": "typ_p", "typp": "typ_p", "top-n-sigma": "top_n_sigma",
                  "topnsigma": "top_n_sigma", "adaptive-p": "adaptive_p", "adaptivep": "adaptive_p"}  # fmt: skip
_SAMPLER_CHARS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p", "t": "temperature", "x": "xtc",
                  "i": "infill", "e": "penalties", "a": "adaptive_p"}  # fmt: skip


def parse_samplers(value: Any, what: str) -> tuple[str, ...]:
    """A sampler chain as llama-server takes it: a list of names ("top_k", "top-k", "temp"...)
    or a string of their letters ("kpi"); "a;b" on the command line. Only the samplers localcos
    has (`core.sampling.SAMPLERS`), in the order it applies them."""
    from ..core.sampling import SAMPLERS

    if isinstance(value, str):
        text = value.strip()
        if ";" in text or "," in text or text in _SAMPLER_NAMES or text in _SAMPLER_CHARS.values():
            names = [n.strip() for n in text.replace(",", ";").split(";") if n.strip()]
        else:  # letters
            names = [_SAMPLER_CHARS.get(c, c) for c in text]
    elif isinstance(value, (list, tuple)) and all(isinstance(n, str) for n in value):
        names = list(value)
    else:
        raise ConfigError(f"{what} must be a list of sampler names or a string of their letters, got {value!r}", param=param_of(what))
    chain = [_SAMPLER_NAMES.get(n, n) for n in names]
    lacking = next((n for n in chain if n not in SAMPLERS), None)
    if lacking is not None:
        raise ConfigError(f"{what}: {lacking!r} is not a sampler localcos has; it has {', '.join(SAMPLERS)}", param=param_of(what))
    if len(set(chain)) < len(chain) or chain != sorted(chain, key=SAMPLERS.index):
        raise ConfigError(f"{what}: localcos applies each sampler once, in the order {', '.join(SAMPLERS)}; got {', '.join(chain)}",
                          param=param_of(what))  # fmt: skip
    return tuple(chain)


def parse_refs(value: Any, what: str) -> tuple[str, ...]:
    """Model references: "a.gguf,b.gguf" or a list (paths, models.toml names, hf:OWNER/REPO/FILE,
    ollama:MODEL[:TAG], lmstudio:PUBLISHER/REPO[/FILE])."""
    if isinstance(value, str):
        refs = tuple(p.strip() for p in value.split(",") if p.strip())
    else:
        refs = parse_strings(value, what)
    if not refs:
        raise ConfigError(f"{what} names no models", param=param_of(what))
    return refs


def parse_rpc(value: Any, what: str = "--rpc") -> tuple[tuple[Endpoint, ...], ...]:
    """Where each model runs: "-" (here) or HOST:PORT, several servers joined with "+"; one entry
    per model, or one for all: "-,10.0.0.5:50052" or ["-", "10.0.0.5:50052"]."""
    from ..backend.rpc import Endpoint, parse_endpoint

    def one(item: Any) -> tuple[Endpoint, ...]:
        if isinstance(item, tuple) and all(isinstance(e, Endpoint) for e in item):
            return item  # parsed already
        text = _text(item)
        if not text:
            raise ConfigError(f"{what} takes - or HOST:PORT per model, got {value!r}", param=param_of(what))
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
    """A registered combiner's name (`core.combiners.COMBINERS`) or a user function
    FILE.py:FUNCTION / MODULE:FUNCTION."""
    text = _text(value)
    if text in COMBINERS or (text and is_custom_combine(text)):
        return text
    raise ConfigError(f"{what} must be {combiner_names()}, got {value!r}", param=param_of(what))


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
            "and is then every request's default",
            param=param_of(what),
        )
    raise ConfigError(f"{what} must be one of {', '.join(COMBINERS)}, got {value!r}", param=param_of(what))


def parse_proposer(value: Any, what: str) -> int | str:
    """A proposer: a model index >= 0, or "lookup" (drafts looked up in the context)."""
    return _int_or_word(value, what, "lookup", 0, "a model index >= 0 or lookup")


def parse_ngram_sizes(value: Any, what: str) -> tuple[int, int]:
    """MIN,MAX: 1 <= MIN <= MAX (one value: both)."""
    sizes = parse_ints(value, what, minimum=1)
    if len(sizes) == 1:
        sizes = (sizes[0], sizes[0])
    if len(sizes) != 2 or sizes[0] > sizes[1]:
        raise ConfigError(f"{what} must be MIN,MAX with 1 <= MIN <= MAX, got {value!r}", param=param_of(what))
    return sizes[0], sizes[1]


LOOKAHEAD_MOST = (16, 64)  # the most candidates and rolled-out tokens one lookahead takes


def parse_lookahead(value: Any, what: str) -> tuple[int, int] | None:
    """K,L: K candidates (2 to 16), each rolled out L tokens (1 to 64); or off (None)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "off"):
        return None
    sizes = parse_ints(value, what, minimum=1)
    if len(sizes) != 2 or not (2 <= sizes[0] <= LOOKAHEAD_MOST[0] and sizes[1] <= LOOKAHEAD_MOST[1]):
        raise ConfigError(f"{what} must be K,L: K candidates from 2 to {LOOKAHEAD_MOST[0]}, each rolled out L tokens from 1 to "
                          f"{LOOKAHEAD_MOST[1]} (or off), got {value!r}", param=param_of(what))  # fmt: skip
    return sizes[0], sizes[1]


def parse_json_schema(value: Any, what: str) -> Constraint:
    """A JSON schema: a file, JSON text, or (from JSON) the schema object itself; compiled and
    checked here, before any model is loaded."""
    from ..grammar import json_schema, read_source

    if isinstance(value, Constraint):
        return value
    return json_schema(value if isinstance(value, dict) else read_source(value, what), what)


def parse_grammar(value: Any, what: str) -> Constraint:
    """A GBNF grammar (a file or its text), compiled and checked here."""
    from ..grammar import gbnf, read_source

    if isinstance(value, Constraint):
        return value
    return gbnf(read_source(value, what), what)


def parse_name(value: Any, what: str) -> str:
    """A non-empty string (a preset's or a set's name, a path)."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what} must be a non-empty string, got {value!r}", param=param_of(what))
    return value.strip()



def parse_text(value: Any, what: str) -> str:
    """Any string, as given (a system message)."""
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a string, got {value!r}", param=param_of(what))
    return value


def parse_prompt_text(value: Any, what: str) -> str:
    """A prompt of its own (a negative prompt): a string with something in it."""
    text = parse_text(value, what)
    if not text.strip():
        raise ConfigError(f"{what} is empty: a second prompt with nothing in it contrasts nothing", param=param_of(what))
    return text


def parse_names(value: Any, what: str) -> tuple[str, ...]:
    """Names given once each or comma-separated, in one string or a list: "a,b" or ["a", "b,c"]."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise ConfigError(f"{what} must be a name or a list of names, got {value!r}", param=param_of(what))
    names = tuple(part.strip() for item in items for part in item.split(","))
    if any(not name for name in names):
        raise ConfigError(f"{what} takes names separated by commas, got an empty one", param=param_of(what))
    return names


def parse_port(value: Any, what: str = "--port") -> int:
    """A TCP port, 0 to 65535 (0: any free one)."""
    port = parse_int(value, what, minimum=0)
    if port > 65535:
        raise ConfigError(f"{what} must be at most 65535, got {port}", param=param_of(what))
    return port
