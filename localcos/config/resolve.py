"""From option values to settings: the way every front end makes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from ..errors import ConfigError
from .options import OPTIONS
from .parse import parse_rpc
from .specs import CombineSpec, GenerationConfig, LoadSpec, ServerSpec, Settings, check_for_models


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
    takes a while, once). Everything that can be checked before loading is checked here."""
    given = _given(values, json, skip={"server"})
    front = dict(defaults or {})

    sources = [k for k in ("models", "preset", "synthetic") if k in given]
    if len(sources) > 1:
        raise ConfigError("give one of " + ", ".join(OPTIONS[k].flag for k in sources) + ", not several", param=sources[-1])
    if not sources and "synthetic" in front:
        given["synthetic"] = front["synthetic"]
        sources = ["synthetic"]
    if not sources:
        raise ConfigError("no models: give --models A,B or --preset NAME", param="models")

    from ..models.registry import Registry

    registry = Registry.load(given.get("config"))
    chat_model = 0
    per_model_layers: list[int | None]
    per_model_rpc: list[str | None]
    if "synthetic" in given:
        from ..models.synthetic import SETS, ensure_set

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
            front.update(preset.settings())
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
    if any(rpc):
        from ..backend.rpc import require_rpc

        require_rpc()
    layers = given.get("n_gpu_layers")
    load = LoadSpec.make(
        paths,
        labels=labels,
        n_gpu_layers=tuple(per_model_layers) if layers is None else layers,
        rpc=rpc,
        **_spec_values("load", value, exclude={"n_gpu_layers", "rpc"}),
    )
    combine = CombineSpec(**_spec_values("combine", value)).loaded()
    generation = GenerationConfig(**_spec_values("generation", value)).for_models(n, load.level)
    if value("chat_template_model") is not None:
        chat_model = value("chat_template_model")
    check_for_models(generation, n, combine=combine, chat_template_model=chat_model, json=json, level=load.level)
    return Settings(load, combine, generation, chat_template_model=chat_model, system=value("system"), name=title, given=frozenset(given))


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
