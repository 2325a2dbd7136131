"""From option values to settings: the way every front end makes them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterable, Mapping

from ..errors import ConfigError
from .options import OPTIONS
from .parse import parse_rpc
from .levels import mixed_gate
from .specs import CombineSpec, GenerationConfig, LoadSpec, ServerSpec, Settings, check_for_models, imply_guidance


def resolve(
    values: Mapping[str, Any],
    *,
    defaults: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    building: Callable[[str], None] | None = None,
    json: bool = False,
    decoded: bool = True,
) -> Settings:
    """Settings from option values (`None` or absent = not given), the way every front end makes
    them: models from --models, --preset or --synthetic (a preset fills what the user left
    open), models.toml for names and per-model defaults, `defaults` (the front end's own, such
    as the chat's temperature) over the declared ones. Hub files are downloaded as needed;
    `progress` hears about each model, `building` about synthetic models being built (which
    takes a while, once). Everything that can be checked before loading is checked here; where
    the settings are not `decoded` as they are (the base of eval's --variant configurations,
    each checked over them), their combination's and generation's fit to the models is left to
    those."""
    given = _given(values, json, skip={"server"})
    front = dict(defaults or {})

    named = [k for k in ("models", "preset", "synthetic") if k in given]
    if len(named) > 1:
        raise ConfigError("give one of " + ", ".join(OPTIONS[k].flag for k in named) + ", not several", param=named[-1])
    if not named and "synthetic" in front:
        given["synthetic"] = front["synthetic"]
        named = ["synthetic"]
    if not named:
        raise ConfigError("no models: give --models A,B or --preset NAME", param="models")
    sources = _Sources.of(given, front, progress, building)
    n = len(sources.paths)

    def value(name: str) -> Any:
        if name in given:
            return given[name]
        if name in front:
            return front[name]
        return OPTIONS[name].default

    rpc = given.get("rpc")
    if rpc is None:
        rpc = tuple(parse_rpc(x, f"models.toml: rpc of {ref}")[0] if x else () for ref, x in zip(sources.labels, sources.rpc))
    if any(rpc):
        from ..backend.rpc import require_rpc

        require_rpc()
    layers = given.get("n_gpu_layers")
    generation = GenerationConfig(**_spec_values("generation", value))
    combine_values = _spec_values("combine", value)
    imply_guidance(combine_values, "cfg_scale" in given, "combine" in given)
    # the members: the lead model a second time where it reads a second prompt
    second_prompt = generation.negative_prompt is not None or bool(value("guide_system"))
    level = value("level")
    combine_values["gate"] = mixed_gate(combine_values["gate"], level, n, second_prompt)
    load = LoadSpec.make(
        sources.paths,
        labels=sources.labels,
        n_gpu_layers=tuple(sources.layers) if layers is None else layers,
        rpc=rpc,
        **{**_spec_values("load", value, exclude={"n_gpu_layers", "rpc"}), "level": level},
        second_prompt=second_prompt,
        lookahead=generation.lookahead,
    )
    combine = CombineSpec(**combine_values).loaded()
    generation = generation.for_models(n, load.level)
    chat_model = sources.chat_model if value("chat_template_model") is None else value("chat_template_model")
    if decoded:
        check_for_models(generation, n, combine=combine, chat_template_model=chat_model, json=json, level=load.level, second_prompt=second_prompt)
    return Settings(load, combine, generation, chat_template_model=chat_model, system=value("system"), guide_system=bool(value("guide_system")),
                    name=sources.title, given=frozenset(given))  # fmt: skip


@dataclass
class _Sources:
    """The models a front end's values name: their files, how the user named them, what
    models.toml says of each (GPU layers, RPC servers), what to call the ensemble, and the chat
    template's model. A preset's settings are merged into `front` (what the user left open)."""

    paths: list[Path]
    labels: tuple[str, ...]
    layers: list[int | None]
    rpc: list[str | None]
    title: str
    chat_model: int = 0

    @classmethod
    def of(cls, given: dict[str, Any], front: dict[str, Any], progress: Callable[[str], None] | None,
           building: Callable[[str], None] | None) -> _Sources:  # fmt: skip
        from ..models.registry import Registry

        registry = Registry.load(given.get("config"))
        if "synthetic" in given:
            from ..models.synthetic import SETS, ensure_set

            name = given["synthetic"]
            if name not in SETS:
                raise ConfigError(f"unknown synthetic set {name!r}; choose from {', '.join(SETS)}", param="synthetic")
            paths = ensure_set(name, progress=building, dtype=given.get("synthetic_dtype"))
            front.setdefault("combine", SETS[name].combine)
            return cls(list(paths), tuple(SETS[name].labels), [None] * len(paths), [None] * len(paths), name)
        preset, chat_model = None, 0
        if "preset" in given:
            preset = registry.ensembles.get(given["preset"])
            if preset is None:
                raise ConfigError(f"unknown preset {given['preset']!r}; see `localcos models list`", param="preset")
            front.update(preset.settings())
            if preset.chat_template:
                chat_model = list(preset.models).index(preset.chat_template)
        labels = tuple(preset.models) if preset else given["models"]
        paths = []
        for i, ref in enumerate(labels):
            if progress and len(labels) > 1:
                progress(f"model {i + 1}/{len(labels)}: {ref}")
            paths.append(registry.resolve(ref))
        layers = [registry.models[r].n_gpu_layers if r in registry.models else None for r in labels]
        rpc = [registry.models[r].rpc if r in registry.models else None for r in labels]
        title = preset.name if preset else " + ".join(Path(r).name for r in labels)
        return cls(paths, labels, layers, rpc, title, chat_model)


def resolve_server(values: Mapping[str, Any]) -> ServerSpec:
    """How `localcos serve` listens, from its option values (`None` or absent = the default)."""
    given = _given(values, json=False, only={"server"})
    return ServerSpec(**{OPTIONS[name].attr: value for name, value in given.items()})


def _given(values: Mapping[str, Any], json: bool, skip: Iterable[str] = (), only: Iterable[str] | None = None) -> dict[str, Any]:
    """The options given (not None, a switch not False), each parsed where it enters."""
    skip, only = set(skip), None if only is None else set(only)
    given = {}
    for name, raw in values.items():
        opt = OPTIONS.get(name)
        if opt is None or raw is None or (opt.switch and raw is False) or opt.target in skip or (only is not None and opt.target not in only):
            continue
        given[name] = opt.check(raw, json=json)
    return given


def _spec_values(target: str, value: Callable[[str], Any], exclude: Iterable[str] = ()) -> dict[str, Any]:
    return {o.attr: value(o.name) for o in OPTIONS.values() if o.target == target and o.attr not in set(exclude)}
