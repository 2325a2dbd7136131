"""eval's configurations (`EvalConfig`): what each one decodes, its settings and its level;
parsed from `--variant NAME=FLAGS` by the settings layer's own reader of flags, or the defaults
(each model alone, then the preset, or WE and CD)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import Any
from collections.abc import Sequence

from ..config import OPTIONS, LoadSpec, Settings, check_for_models
from ..config.flags import parse_flags
from ..config.levels import check_variant, mixed_gate, on_own_tokens, recorded_level, variant_level, variant_method
from ..core.level import Level
from ..core.sizes import member_params
from ..errors import ConfigError

_CONFIG_TARGETS = ("combine", "generation")
# the flags `eval --variant` reads: the combination and generation options of `localcos generate`, the
# level, the contrast prompt
VARIANT_OPTIONS = [opt for opt in OPTIONS.values() if opt.target in _CONFIG_TARGETS or opt.name in ("level", "contrast_prompt")]


@dataclass(frozen=True)
class EvalConfig:
    """One configuration: its name, its settings, the parameter counts of the models it runs
    (which model is the expert or the lead, where the settings leave it open), the level it
    decodes at and the run's level (how its models are loaded: for their byte views where the
    run is at the byte or the mixed level)."""

    name: str
    settings: Settings
    n_params: tuple[int, ...]  # the models' parameter counts: the combiner is fitted to them as it runs
    level: Level = Level.TOKEN
    run: Level = Level.TOKEN
    contrast: str | None = None  # the second prompt made from each task's (`eval.contrast`), read by a second member

    @property
    def own_tokens(self) -> bool:
        """In a run whose models load for the byte level: r is one model's distribution and that
        model decodes by itself on its own tokens, as it runs alone (the others are not run)."""
        return on_own_tokens(self.level, self.run)

    @property
    def members(self) -> list[int]:
        """The parameter counts of the members r combines: each model's, then a second prompt's
        member's (its model's, one fewer: the prompt's member leads), as `LoadedModels` counts them."""
        return member_params(self.n_params, self.contrast is not None)

    @property
    def member(self) -> int | None:
        """The member whose own distribution r is (weights 1 and 0), or None for a combination."""
        members = self.members
        return self.settings.combiner().fit(len(members), members).single_model()

    @property
    def alone(self) -> bool:
        """Whether r is one model's own distribution: a candidate for the default baseline, the
        best member."""
        return self.member is not None

    @property
    def identity(self) -> dict[str, str]:
        """Every combination and generation option's value, as text, and the level where it is
        not the one the run's models load for: what the results file records, so a resumed run
        never mixes two settings under one name."""
        values = {opt.name: opt.format(self.settings.value(opt.name)) for opt in OPTIONS.values() if opt.target in _CONFIG_TARGETS}
        if self.contrast is not None:
            values["contrast_prompt"] = self.contrast
        level = recorded_level(self.level, self.run)
        return values if level is None else {**values, "level": level}


def parse_config(text: str, base: Settings, n_params: Sequence[int], run: Level = Level.TOKEN) -> EvalConfig:
    """A configuration from `--variant NAME=FLAGS`: the combination and generation flags of
    `localcos generate` (`--combine cd --mu 0.2 --gate 0.5`, or `--mu=0.2`), over the run's own
    settings, each checked by its option's parser. In a run at the byte or mixed level (`run`),
    `--level token` runs a configuration whose r is one model's on that model's own tokens, and
    `--level byte` or `--level mixed` the level it names (the run's own by default)."""
    name, sep, flags = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ConfigError(f"--variant takes NAME=FLAGS, e.g. 'CD=--combine cd --mu 0.1'; got {text!r}", param="variant")
    try:
        words = shlex.split(flags)
    except ValueError as e:
        raise ConfigError(f"--variant {name}: {e}", param="variant") from None
    raw = parse_flags(words, VARIANT_OPTIONS, what=f"--variant {name}", param="variant",
                      refused="is not a combination or generation option of localcos generate, nor --level")  # fmt: skip
    values: dict[str, Any] = {k: v for k, v in raw.items() if k not in ("level", "contrast_prompt")}
    contrast = OPTIONS["contrast_prompt"].check(raw["contrast_prompt"]) if "contrast_prompt" in raw else None
    try:
        level = variant_level(OPTIONS["level"].check(raw["level"]) if "level" in raw else "auto", run)
    except ConfigError as e:
        raise ConfigError(f"--variant {name}: {e}", param="variant") from None
    method = variant_method(level, len(n_params))
    if method is not None and "method" not in values and "method" not in base.given:
        values["method"] = method
    settings = base.with_values(values, check=False)
    gate = mixed_gate(settings.combine.gate, level, len(n_params), contrast is not None)
    if gate != settings.combine.gate:  # a variant's new combination on one model's mixed level: its default gate, as `generate` takes it
        settings = base.with_values({**values, "gate": gate}, check=False)
    # checked as the command line is, at the level this configuration decodes at (before any model loads)
    try:
        check_for_models(settings.generation, len(n_params), combine=settings.combine, chat_template_model=settings.chat_template_model,
                         level=level, second_prompt=contrast is not None)  # fmt: skip
        check_variant(level, run, lookahead=settings.generation.lookahead is not None, contrast=contrast is not None)
    except ConfigError as e:
        raise ConfigError(f"--variant {name}: {e}", param="variant") from None
    config = EvalConfig(name, settings, tuple(n_params), level, run, contrast)
    if config.own_tokens and not config.alone:
        raise ConfigError(f"--variant {name}: --level token runs one model alone on its own tokens: give it all the weight "
                          "(e.g. --combine we --weights 0,1)", param="variant")  # fmt: skip
    return config


def run_load(load: LoadSpec, configs: Sequence[EvalConfig]) -> LoadSpec:
    """What the run's models load with: what its configurations need of them together (a second
    prompt's member where one reads a contrast prompt, lookahead's sequences for the most
    candidates and tokens any looks ahead), made before any model loads. Where one load cannot
    serve them all, a `ConfigError` naming the configurations that need it."""
    contrast = [c.name for c in configs if c.contrast is not None]
    ahead = [c.settings.generation.lookahead for c in configs if c.settings.generation.lookahead is not None]
    most = (max(k for k, _ in ahead), max(n for _, n in ahead)) if ahead else None
    try:
        return replace(load, second_prompt=bool(contrast), lookahead=most)
    except ConfigError as e:
        needs = contrast + [c.name for c in configs if c.settings.generation.lookahead is not None]
        raise ConfigError(f"{', '.join(needs)}: these models cannot be loaded for them: {e}", param="variant") from None


def check_infilling(configs: Sequence[EvalConfig]) -> None:
    """An infilling task is read through the models' FIM tokens, its makers' way: no other
    phrasing, no second prompt made from it (refused before any model loads)."""
    for c in configs:
        if c.contrast is not None:
            raise ConfigError(f"--variant {c.name}: --contrast-prompt: an infilling task is read through the FIM tokens; no second "
                              "prompt is made from it", param="variant")  # fmt: skip
        if c.settings.generation.phrasing not in ("raw", "auto"):
            raise ConfigError(f"{c.name}: --phrasing {c.settings.generation.phrasing}: an infilling task is read through the models' FIM "
                              "tokens (leave --phrasing out)", param="phrasing")  # fmt: skip


def unique_names(names: Sequence[str], paths: Sequence[str]) -> list[str]:
    """The models' names as configurations take them ("NAME alone"), made unique: a name two
    models share is replaced by each one's path (a run's records are found by name: two models
    of one name would share one row), and one file given twice by its place in the list."""
    by_path = [path if names.count(name) > 1 else name for name, path in zip(names, paths)]
    return [f"{name} (model {i})" if by_path.count(name) > 1 else name for i, name in enumerate(by_path)]


def default_configs(base: Settings, names: Sequence[str], n_params: Sequence[int], run: Level = Level.TOKEN, preset: str | None = None) -> list[EvalConfig]:
    """Each model alone, as its makers run it (`Settings.alone`: on its own tokens, its phrasing
    auto, none of the run's or the preset's combining options), then, for a `preset`, the preset
    as configured ("is it better than its models on my task?"), for one model its run at the
    run's level where that is not its own tokens ("is the mixed level better?"), else the
    weighted ensemble and, for two models, contrastive decoding, at the run's level."""
    n, counts = len(names), tuple(n_params)
    configs = [EvalConfig(f"{name} alone", base.alone(i, n), counts, Level.TOKEN, run) for i, name in enumerate(names)]
    if preset is not None:
        return configs + [EvalConfig(preset, base, counts, run, run)]
    if n == 1:
        # eval's business: beside one model alone on its own tokens, the same model at a level that is not them
        return configs + ([EvalConfig(f"{names[0]} {run.value}", base, counts, run, run)] if run.in_bytes else [])
    configs.append(EvalConfig("WE", base.with_values({"combine": "we", "weights": ""}), counts, run, run))
    if n == 2:
        configs.append(EvalConfig("CD", base.with_values({"combine": "cd"}), counts, run, run))
    return configs
