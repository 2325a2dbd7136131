"""The bench at the byte level (models of different tokenizers, or `--level byte`): the byte-level
ensemble and byte-level cos at each draft length, and chosen models alone on their own token path,
interleaved prompt by prompt on the same prompts and seeds. Speed is characters per second (what
the byte level and a token path have in common); a configuration's ratio to the ensemble is over
all prompts' characters and seconds, with its worst prompt beside it, and over the prompts where it
wrote the ensemble's very text (a model alone against the mixed level: the same text, so the
ratio there is the cost of the level itself)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from collections.abc import Callable, Sequence

from ..config.specs import GenerationConfig
from ..runtime.bytelevel import run_to_end
from ..runtime.generation import completion_rng
from ..stats import GenerationStats

if TYPE_CHECKING:
    from ..ensemble import Ensemble
    from ..runtime.bytelevel import ByteModels

ENSEMBLE = "ensemble"


@dataclass(frozen=True)
class ByteConfig:
    """One configuration: a byte-level method and draft length, or a model alone (`alone`: its
    index) on its own token path."""

    label: str
    method: str = ENSEMBLE
    gamma: int | str = 8  # or "auto"
    alone: int | None = None


def byte_configurations(methods: Sequence[str], gammas: Sequence[int | str], alone: Sequence[int] = ()) -> list[ByteConfig]:
    """The ensemble first (the baseline), cos at each draft length, then each model alone."""
    configs = [ByteConfig(ENSEMBLE)] if ENSEMBLE in methods else []
    configs += [ByteConfig(f"cos {g}", "cos", g) for g in gammas] if "cos" in methods else []
    return configs + [ByteConfig(f"alone-{i}", alone=i) for i in alone]


@dataclass
class ByteRun:
    """One generation of the bench."""

    config: ByteConfig
    prompt: int
    task: str
    temperature: float
    chars: int
    tokens: int  # what max_tokens counts: a model alone's own, the lead's at the byte level
    seconds: float
    llama_seconds: float  # of `seconds`, inside llama.cpp
    text: str = ""
    stats: GenerationStats | None = None  # None: a model alone (token path)

    def to_dict(self) -> dict:
        out = {"config": self.config.label, "prompt": self.prompt, "task": self.task, "temperature": self.temperature,
               "chars": self.chars, "tokens": self.tokens, "seconds": self.seconds, "llama_seconds": self.llama_seconds, "text": self.text}  # fmt: skip
        if self.stats is not None:
            out["stats"] = self.stats.to_dict()
        return out


def run_byte_benchmark(
    models: ByteModels,
    alone: dict[int, Ensemble],
    prompts: Sequence[tuple[str, str]],
    configs: Sequence[ByteConfig],
    temperatures: Sequence[float],
    *,
    max_tokens: int,
    seed: int = 0,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[ByteRun]:
    """Every configuration on every prompt at every temperature, interleaved prompt by prompt
    (machine noise then touches them alike), each from empty caches; the ensemble runs twice,
    first and last (the two say how noisy the timing is: `timing_noise`). Prompt i draws from random stream i of `seed`;
    a model alone generates `max_tokens` of its own tokens, the byte level as many of the lead's (the
    same length of text where they write alike)."""
    runs: list[ByteRun] = []
    order = [*configs, *(c for c in configs if c.label == ENSEMBLE)]
    total = len(temperatures) * len(prompts) * len(order)
    for t in temperatures:
        for i, (task, prompt) in enumerate(prompts):
            for config in order:
                if progress:
                    progress(len(runs), total, f"T={t:g} {task} {config.label}")
                if config.alone is not None:
                    own = alone[config.alone].generate(prompt, max_tokens=max_tokens, temperature=t, seed=seed + i, method=ENSEMBLE)
                    runs.append(ByteRun(config, i, task, t, len(own.text), own.length, own.stats.seconds, own.stats.llama_seconds, own.text))
                    continue
                plan = models.plan(models.prompts(prompt), GenerationConfig(method=config.method, max_tokens=max_tokens, temperature=t,
                                                                            byte_gamma=config.gamma))  # fmt: skip
                c = run_to_end(models.start(plan, completion_rng(seed, i)))
                runs.append(ByteRun(config, i, task, t, c.stats.chars, c.stats.tokens, c.stats.seconds, c.stats.llama_seconds, c.text, c.stats))
    if progress:
        progress(total, total, "done")
    return runs


@dataclass
class ByteRow:
    """A configuration's figures at one temperature, over all prompts."""

    temperature: float
    config: str
    chars_per_second: float
    vs_ensemble: float | None  # over all prompts' characters and seconds
    worst_vs_ensemble: float | None  # the prompt where it did worst
    accepted: int = 0
    drafted: int = 0
    ensemble_steps: int = 0  # cos: rounds without a draft
    calls_per_char: list[float] = field(default_factory=list)
    most_paths: list[int] = field(default_factory=list)
    host: float | None = None  # the share of its time outside llama.cpp
    same_text: int | None = None  # prompts where it wrote the ensemble's very text (None: the ensemble's own row)
    vs_ensemble_there: float | None = None  # its speed over those prompts against the ensemble's


def summarize_bytes(runs: Sequence[ByteRun]) -> list[ByteRow]:
    """One row per temperature and configuration. A prompt's ratio to the ensemble puts all of a
    configuration's runs of that prompt (the ensemble's two) against the ensemble's."""
    rows = []
    for t in sorted({r.temperature for r in runs}):
        at = [r for r in runs if r.temperature == t]
        base = _by_prompt([r for r in at if r.config.label == ENSEMBLE])
        base_speed = _speed([r for group in base.values() for r in group])
        for label in dict.fromkeys(r.config.label for r in at):
            mine = [r for r in at if r.config.label == label]
            speed = _speed(mine)
            per_prompt = [_speed(group) / _speed(base[p]) for p, group in _by_prompt(mine).items() if p in base and _speed(base[p]) > 0]
            stats = [r.stats for r in mine if r.stats is not None]
            total = GenerationStats.aggregate(stats) if stats else None
            seconds = sum(r.seconds for r in mine)
            same = [p for p, group in _by_prompt(mine).items() if p in base and all(r.text == base[p][0].text for r in group)]
            there = _speed([r for p in same for r in base[p]])  # the ensemble's runs of those prompts
            rows.append(ByteRow(
                t, label, speed, speed / base_speed if base_speed else None, min(per_prompt) if per_prompt else None,
                *((total.accepted, total.drafted, total.ensemble_steps, [c / max(total.chars, 1) for c in total.calls], total.most_paths)
                  if total is not None else (0, 0, 0, [], [])),
                (seconds - sum(r.llama_seconds for r in mine)) / seconds if seconds > 0 else None,
                None if label == ENSEMBLE else len(same),
                _speed([r for r in mine if r.prompt in same]) / there if label != ENSEMBLE and there > 0 else None,
            ))  # fmt: skip
    return rows


def _by_prompt(runs: Sequence[ByteRun]) -> dict[int, list[ByteRun]]:
    groups: dict[int, list[ByteRun]] = {}
    for r in runs:
        groups.setdefault(r.prompt, []).append(r)
    return groups


def timing_noise(runs: Sequence[ByteRun]) -> list[float]:
    """For each prompt and temperature, how far the ensemble's two runs' speeds are apart, as a
    fraction of their mean."""
    pairs: dict[tuple, list[float]] = {}
    for r in runs:
        if r.config.label == ENSEMBLE and r.seconds > 0:
            pairs.setdefault((r.temperature, r.prompt), []).append(r.chars / r.seconds)
    return [abs(a - b) / ((a + b) / 2) for a, b in (v[:2] for v in pairs.values() if len(v) >= 2) if a + b > 0]


def _speed(runs: Sequence[ByteRun]) -> float:
    seconds = sum(r.seconds for r in runs)
    return sum(r.chars for r in runs) / seconds if seconds > 0 else 0.0


def format_byte_table(rows: Sequence[ByteRow], names: Sequence[str]) -> str:
    header = (f"{'T':>4}  {'configuration':<14}{'chars/s':>9}{'x ens':>8}{'worst':>8}{'host':>7}{'accepted':>12}{'no draft':>10}"
              f"{'same text':>11}{'x ens there':>13}  calls/char, most paths ({', '.join(names)})")  # fmt: skip
    lines = [header, "-" * len(header)]
    for r in rows:
        ratio = "-" if r.vs_ensemble is None else f"{r.vs_ensemble:.2f}x"
        worst = "-" if r.worst_vs_ensemble is None else f"{r.worst_vs_ensemble:.2f}x"
        accepted = f"{r.accepted}/{r.drafted}" if r.drafted else "-"
        steps = str(r.ensemble_steps) if r.config.startswith("cos") else "-"
        per_model = "; ".join(f"{c:.2f}, {p}" for c, p in zip(r.calls_per_char, r.most_paths)) or "token path"
        host = "-" if r.host is None else f"{100 * r.host:.0f}%"
        same = "-" if r.same_text is None else str(r.same_text)
        there = "-" if r.vs_ensemble_there is None else f"{r.vs_ensemble_there:.2f}x"
        lines.append(f"{r.temperature:>4g}  {r.config:<14}{r.chars_per_second:>9.1f}{ratio:>8}{worst:>8}{host:>7}{accepted:>12}{steps:>10}"
                     f"{same:>11}{there:>13}  {per_model}")  # fmt: skip
    return "\n".join(lines)
