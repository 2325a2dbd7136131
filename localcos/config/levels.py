"""What a level means, written once: which level models decode at (`decide_level`), what each
level allows and decodes (`check_level`, `level_methods`), what it defaults to (`default_method`,
`mixed_gate`), which level one request decodes at (`request_level`), and the one question a front
end asks of its settings before anything loads (`decoding_level`), with the options only the byte
level reads refused elsewhere (`refuse_byte_options`). The level itself and its per-level facts
(its unit, what its drafts count) are `core.level.Level`'s.

It sits below the specs (`config.specs` checks its rules where a spec is made), so it reads the
settings through the small Protocols it declares.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol
from collections.abc import Collection, Iterable, Sequence

from ..core.decoding import METHODS
from ..core.level import Level
from ..errors import ConfigError
from .options import OPTIONS

if TYPE_CHECKING:
    from pathlib import Path

    from ..core.sampling import Sampler


class GenerationAsked(Protocol):
    """What the level's rules read of the generation settings (`config.specs.GenerationConfig`)."""

    @property
    def method(self) -> str | None: ...
    @property
    def gamma(self) -> object: ...
    @property
    def proposer(self) -> object: ...
    @property
    def lookup(self) -> str: ...
    @property
    def lookahead(self) -> object: ...
    @property
    def samplers(self) -> Collection[str] | None: ...
    @property
    def infill_layout(self) -> str: ...
    @property
    def json_schema(self) -> object: ...
    @property
    def grammar(self) -> object: ...
    @property
    def json_object(self) -> bool: ...
    def sampler(self) -> Sampler: ...


class LoadAsked(Protocol):
    """What `decoding_level` reads of what to load (`config.specs.LoadSpec`)."""

    @property
    def level(self) -> Level: ...
    @property
    def parallel(self) -> int | None: ...
    @property
    def second_prompt(self) -> bool: ...


class SettingsAsked(Protocol):
    """What `decoding_level` reads of a front end's settings (`config.specs.Settings`)."""

    @property
    def load(self) -> LoadAsked: ...
    @property
    def generation(self) -> GenerationAsked: ...
    @property
    def given(self) -> frozenset[str]: ...


def decide_level(asked: str, paths: Sequence[Path]) -> Level:
    """The level models decode at, decided once, where they are named (`LoadSpec`): the one asked
    for, or (auto) the token level for models that share a tokenizer and the byte level otherwise
    (`tokenizer_mismatch`, read from their GGUF headers as `localcos models list` reads it,
    before anything loads)."""
    if asked != "auto":
        return Level(asked)
    if len(paths) == 1:  # one model shares its tokenizer with itself: no file opened
        return Level.TOKEN
    from ..backend import read_info  # the headers, not llama.cpp: loading a vocabulary takes longer than reading the file's
    from ..backend.tokenizers import tokenizer_groups

    return Level.TOKEN if max(tokenizer_groups([read_info(p).token_table() for p in paths])) == 0 else Level.BYTE


def byte_views_level(n_models: int) -> Level:
    """The level models loaded for their byte views decode at where none is named
    (`ByteEnsemble.load`): the mixed level for one model (alone at the byte level it only reads
    slower), the byte level for several."""
    return Level.MIXED if n_models == 1 else Level.BYTE


def default_method(n_models: int, level: Level | str = "auto", lookahead: bool = False) -> str:
    """The method every front end takes when none is given (the command line, the chat, the
    server, `Ensemble`, `ByteEnsemble`, presets): cos for two or more models (it samples from r
    exactly, and with --gamma auto, the default, it takes the ensemble's own step wherever drafts
    would not pay), the standard step for one, at the mixed level (whose token steps are not
    drafted) and with `lookahead` (which looks ahead from the ensemble's step)."""
    return "cos" if n_models > 1 and level != "mixed" and not lookahead else "ensemble"


MIXED_GATE = 0.5  # the gate of one model's mixed level where none is given (the preset coder-plus's)


def mixed_gate(gate: float | None, level: Level | str, n: int, second_prompt: bool) -> float | None:
    """The gate a combination decodes with: one model's mixed level takes `MIXED_GATE` where none
    is given; elsewhere (several models, or a second prompt's member, whose gate is the user's
    choice) the gate given, if any."""
    return MIXED_GATE if gate is None and level == "mixed" and n == 1 and not second_prompt else gate


def level_methods(level: Level | str) -> tuple[str, ...]:
    """The methods a level decodes (what `check_level` lets through): all four at the token
    level; the ensemble's step and cos at the byte level (the models take turns drafting bytes);
    the ensemble's step at the mixed level (its whole tokens are not drafted)."""
    return {Level.TOKEN: METHODS, Level.BYTE: ("ensemble", "cos"), Level.MIXED: ("ensemble",)}[Level(level)]


def check_level(level: Level | str, generation: GenerationAsked, gated: bool) -> None:
    """The byte and mixed levels' rules, written once (the settings layer checks them before any
    model loads, the byte level's planning for every request, and a one-model mixed-level server
    to route a request that breaks them to the token level): no lookahead there (its branches are
    sequences of one tokenizer's tokens); drafts counted in bytes (`--byte-gamma`, not a gamma in
    tokens), the methods ensemble and cos, no proposer (the models take turns drafting bytes) and
    no lookup (its drafts are token ids), a fill-in-the-middle read in the makers' layout (the
    others heal the cursor's token in one vocabulary). The mixed level also needs a gate (`gated`: the gate
    says where the lead decides whole tokens alone), decodes with the ensemble's step (its whole
    tokens are not drafted) and takes no constraint (a grammar masks bytes, not the lead's whole
    tokens)."""
    if level not in ("byte", "mixed"):
        return
    level = Level(level).value  # a Level formats as its name
    if generation.lookahead is not None:
        raise ConfigError(f"lookahead: not available at the {level} level (its branches are sequences of one tokenizer's tokens: "
                          "--level token)", param="lookahead")  # fmt: skip
    if level == "mixed":
        if not gated:
            raise ConfigError("--level mixed needs --gate G: whole tokens of the lead where its likeliest has probability G or more, "
                              "the byte level elsewhere", param="gate")  # fmt: skip
        constraint = next((name for name in ("json_schema", "grammar", "json_object") if getattr(generation, name)), None)
        if constraint is not None:
            raise ConfigError("a JSON schema or grammar: not available at the mixed level (it decodes with the ensemble's step: "
                              "--method ensemble)", param=constraint)  # fmt: skip
        if generation.method not in (None, *level_methods(level)):
            raise ConfigError(f"--method {generation.method}: not available at the mixed level (it decodes with the ensemble's step: "
                              "--method ensemble)", param="method")  # fmt: skip
    if generation.gamma != "auto":
        raise ConfigError("gamma counts tokens; at the byte level drafts are counted in bytes: --byte-gamma N", param="gamma")
    if generation.samplers is not None and "infill" in generation.samplers:
        raise ConfigError(f"samplers: infill merges tokens by their texts: not available at the {level} level (--level token)", param="samplers")
    if generation.infill_layout != "makers":
        raise ConfigError(f"infill_layout {generation.infill_layout}: not available at the {level} level (it heals the cursor's token in "
                          "one vocabulary; each model here reads its own: --level token)", param="infill_layout")  # fmt: skip
    if generation.method not in (None, *level_methods(level)):
        raise ConfigError(f"method {generation.method}: not available at the byte level yet (models with different tokenizers, or "
                          "level byte); ensemble or cos", param="method")  # fmt: skip
    if generation.proposer is not None or generation.lookup == "on":
        param = "proposer" if generation.proposer is not None else "lookup"
        raise ConfigError(f"{param}: not available at the byte level (models take turns drafting bytes; lookup drafts are "
                          "token ids)", param=param)  # fmt: skip


def mixed_decodes(generation: GenerationAsked) -> bool:
    """Whether a one-model server loaded for the mixed level decodes these settings there: greedy,
    and nothing the mixed level's rules refuse (`check_level`, their one owner: the token
    level's drafts (a gamma in tokens, a proposer, lookup), a constraint, another method,
    lookahead)."""
    if not generation.sampler().greedy:
        return False
    try:
        check_level("mixed", generation, gated=True)
    except ConfigError:
        return False
    return True


def request_level(level: Level, generation: GenerationAsked, *, needs_tokens: bool, token_view: bool) -> Level:
    """The level one request decodes at, decided once: the level the models decode at (`level`),
    except that a request the mixed level does not serve (settings `mixed_decodes` refuses, or
    what needs one vocabulary's tokens: log-probabilities, echo, tools, token-id prompts, token
    ids back) decodes at the token level where one model's own tokens are at hand (`token_view`:
    one model, loaded for the mixed level). Never "auto"."""
    if level is Level.MIXED and token_view and (needs_tokens or not mixed_decodes(generation)):
        return Level.TOKEN
    return level


def variant_level(asked: Level | str, run: Level) -> Level:
    """The level an eval configuration decodes at, in a run whose models load for `run`: the one
    asked, or the run's ("auto"). A byte or mixed level in a run at the token level is refused
    (its models share a tokenizer and load without byte views)."""
    level = run if asked == "auto" else Level(asked)
    if level.in_bytes and not run.in_bytes:
        raise ConfigError(f"--level {level.value}: this run decodes at the token level (its models share a tokenizer); give the run itself "
                          f"--level {level.value}", param="level")  # fmt: skip
    return level


def on_own_tokens(level: Level, run: Level) -> bool:
    """Whether a configuration at `level` in a run loaded for `run` decodes one model by itself on
    its own tokens: the token level, in a run whose models load for their byte views."""
    return run.in_bytes and level is Level.TOKEN


def check_variant(level: Level, run: Level, *, lookahead: bool, contrast: bool) -> None:
    """What an eval configuration at `level` may not ask in a run loaded for `run`: lookahead where
    the run's models load for their byte views (its branches are sequences of the models as they
    load for the token level), a second prompt's member on one model's own tokens (that member
    decodes at the run's level)."""
    if lookahead and run.in_bytes:
        raise ConfigError("--lookahead needs a run at the token level (its branches are sequences of the models as they load for it): "
                          "give the run --level token", param="lookahead")  # fmt: skip
    if contrast and on_own_tokens(level, run):
        raise ConfigError("--contrast-prompt with --level token: a second prompt's member decodes at the run's level", param="contrast_prompt")


def recorded_level(level: Level, run: Level) -> str | None:
    """The level an eval results file records beside a configuration's options: where it is not
    the byte level of a run loaded for the byte views (the records made before levels were
    named), None otherwise."""
    return level.value if run.in_bytes and level is not Level.BYTE else None


def variant_method(level: Level, n_models: int) -> str | None:
    """The method an eval configuration at `level` takes where neither it nor the run names one:
    the byte and mixed levels' own (`default_method`: the run's settings made theirs for the run's
    level, which may be the other); None at the token level, where the run's stands."""
    return default_method(n_models, level) if level.in_bytes else None


def decodes_one_at_a_time(level: Level) -> bool:
    """Whether models at `level` decode one generation at a time: at the byte and mixed levels a
    generation's paths take every sequence of every model (--parallel is theirs)."""
    return level.in_bytes


def decoded_load_options(level: Level) -> tuple[str, ...]:
    """The load options a text decoded at `level` depends on (what a record keeps beside the
    level): at the byte and mixed levels the paths each model holds and their pruning."""
    return ("byte_paths", "byte_prune") if level.in_bytes else ()


BYTE_OPTIONS = ("byte_paths", "byte_prune", "byte_gamma")  # read by the byte level only


def decoding_level(settings: SettingsAsked, also_given: Sequence[str] = (), *, scoring: bool = False, parallel_flag: str = "--parallel") -> Level:
    """The level the models of `settings` decode at (`settings.load.level`), the one place a front end
    asks. An option given (in `settings`, or `also_given`: options a front end took itself) that
    the level chosen would not read is refused in one line: the byte level's own for models that
    decode at the token level; at the byte and mixed levels what they do not decode
    (`check_level`: a gamma in tokens, a proposer, lookup, another method,
    lookahead...), --chat-template-model (each model reads a conversation in its own template
    there) and --parallel above 1 (a byte-level generation takes every model's sequences: one at
    a time). With `scoring` (`localcos score`, which reads the probabilities of a given text), the
    mixed level (a way of decoding) and a second prompt's member at the byte level are refused
    too. So these are refused before any model loads. `parallel_flag`: what the front end calls
    the sequences decoded at once (the bench's --sequences)."""
    level = settings.load.level
    if scoring and level is Level.MIXED:
        raise ConfigError("--level mixed is a way of decoding (whole tokens where the lead is sure); score reads the byte level's "
                          "probabilities of a given text: --level byte", param="level")  # fmt: skip
    if scoring and level.in_bytes and settings.load.second_prompt:
        raise ConfigError("--negative-prompt: score reads a second prompt's member at the token level (models of one tokenizer, "
                          "--level token); at the byte level it reads one text", param="negative_prompt")  # fmt: skip
    if level.in_bytes:
        # the gate belongs to a combination, checked where one is resolved (eval's variants each bring their own)
        check_level(level, settings.generation, gated=True)
        if (settings.load.parallel or 1) > 1:  # it decodes one generation at a time (`decodes_one_at_a_time`)
            raise ConfigError(f"{parallel_flag}: the byte level decodes one generation at a time (models with different tokenizers)",
                              param=parallel_flag.removeprefix("--"))  # fmt: skip
        if "chat_template_model" in settings.given:
            raise ConfigError("--chat-template-model: at the byte level each model reads the conversation in its own chat template",
                              param="chat_template_model")  # fmt: skip
        return level
    refuse_byte_options([*settings.given, *also_given])
    return level


def refuse_byte_options(given: Iterable[str], *, json: bool = False, remedy: str = "add --level byte") -> None:
    """The one rule for models that decode at the token level: an option only the byte level
    reads (`BYTE_OPTIONS`), among the options `given`, is a `ConfigError` (named as a flag, or
    with `json` as a request's field or a keyword), saying how to decode at the byte level
    (`remedy`)."""
    unread = [name for name in BYTE_OPTIONS if name in given]
    if unread:
        raise ConfigError(f"{OPTIONS[unread[0]].what(json)}: these models share a tokenizer and decode at the token level, where "
                          f"it does nothing; {remedy} to decode them at the byte level", param=unread[0])  # fmt: skip
