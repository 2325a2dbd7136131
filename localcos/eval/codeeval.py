"""Executed code tasks over several configurations of one loaded ensemble (`localcos eval`).

Every configuration (the members alone, combinations, methods) completes every problem with the
same loaded models; each completion runs in the sandbox (`eval.sandbox`) with the problem's
test (passed: the test's check returned). Results go to a JSON-lines file as they come, one line per (configuration, problem), so a
run stopped by Ctrl-C resumes where it stopped; the summary reads that file: pass@1 with its
Wilson interval, and each configuration against a baseline problem by problem (won, lost, the
exact McNemar p and, for the several configurations compared, Holm's corrected p), with its
speed relative to the baseline's and the share of its time outside llama.cpp.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..config import OPTIONS, Settings, default_method
from ..errors import ConfigError
from ..files import storage_error
from .codetasks import STOPS, CodeTask
from .paired import Paired, holm, paired, wilson
from .sandbox import CONTAINED, Limits, run_program

# 3: the header holds the run's level, byte-level options and limits; 2 did not (read, not resumed);
# 1 counted any exit status 0 as passed (refused)
RESULTS_FORMAT = 3
_BY_FLAG = {flag: opt for opt in OPTIONS.values() for flag in opt.flags}
_CONFIG_TARGETS = ("combine", "generation")


@dataclass(frozen=True)
class EvalConfig:
    """One configuration: its name, its settings and the parameter counts of the models it runs
    (which model is the expert or the lead, where the settings leave it open). `own_tokens`: in a run at the byte level,
    r is one model's distribution and that model decodes by itself on its own tokens, as it runs
    alone (the others are not run)."""

    name: str
    settings: Settings
    n_params: tuple[int, ...]  # the models' parameter counts: the combiner is fitted to them as it runs
    own_tokens: bool = False
    mixed: bool = False  # in a run at the byte level: this configuration decodes at the mixed level

    @property
    def member(self) -> int | None:
        """The model whose own distribution r is (weights 1 and 0), or None for a combination."""
        return self.settings.combiner().fit(len(self.n_params), self.n_params).single_model()

    @property
    def alone(self) -> bool:
        """Whether r is one model's own distribution: a candidate for the default baseline, the
        best member."""
        return self.member is not None

    @property
    def identity(self) -> dict[str, str]:
        """Every combination and generation option's value, as text: what the results file
        records, so a resumed run never mixes two settings under one name."""
        values = {opt.name: opt.format(self.settings.value(opt.name)) for opt in OPTIONS.values() if opt.target in _CONFIG_TARGETS}
        if self.own_tokens or self.mixed:
            return {**values, "level": "token" if self.own_tokens else "mixed"}
        return values


def parse_config(text: str, base: Settings, n_params: Sequence[int], byte_level: bool = False, mixed: bool = False) -> EvalConfig:
    """A configuration from `--variant NAME=FLAGS`: the combination and generation flags of
    `localcos generate` (`--combine cd --mu 0.2 --gate 0.5`), over the run's own settings, each
    checked by its option's parser. In a run at the byte level (`byte_level`; `mixed`: the run's
    own level is the mixed one), `--level token` runs a configuration whose r is one model's on
    that model's own tokens, and `--level byte` or `--level mixed` the level it names."""
    name, sep, flags = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ConfigError(f"--variant takes NAME=FLAGS, e.g. 'CD=--combine cd --mu 0.1'; got {text!r}", param="variant")
    try:
        words = shlex.split(flags)
    except ValueError as e:
        raise ConfigError(f"--variant {name}: {e}", param="variant") from None
    values: dict[str, Any] = {}
    level = None
    i = 0
    while i < len(words):
        opt = _BY_FLAG.get(words[i])
        if opt is None or (opt.target not in _CONFIG_TARGETS and opt.name != "level"):
            raise ConfigError(f"--variant {name}: {words[i]} is not a combination or generation option of localcos generate, "
                              "nor --level", param="variant")  # fmt: skip
        if opt.switch:
            values[opt.name] = True
            i += 1
            continue
        if i + 1 >= len(words):
            raise ConfigError(f"--variant {name}: {opt.flag} needs a value", param="variant")
        if opt.name == "level":
            level = opt.check(words[i + 1])
            i += 2
            continue
        values[opt.name] = [*values.get(opt.name, []), words[i + 1]] if opt.repeat else words[i + 1]
        i += 2
    if level in ("byte", "mixed") and not byte_level:
        raise ConfigError(f"--variant {name}: --level {level}: this run decodes at the token level (its models share a tokenizer); "
                          f"give the run itself --level {level}", param="variant")  # fmt: skip
    in_bytes = level in ("byte", "mixed")
    if in_bytes and "method" not in values and "method" not in base.given:  # the default method of the level it names
        values["method"] = default_method(len(n_params), level)
    config = EvalConfig(name, base.with_values(values), tuple(n_params), own_tokens=byte_level and level == "token",
                        mixed=level == "mixed" if in_bytes else mixed and level != "token")  # fmt: skip
    if config.own_tokens and not config.alone:
        raise ConfigError(f"--variant {name}: --level token runs one model alone on its own tokens: give it all the weight "
                          "(e.g. --combine we --weights 0,1)", param="variant")  # fmt: skip
    return config


def unique_names(names: Sequence[str], paths: Sequence[str]) -> list[str]:
    """The models' names as configurations take them ("NAME alone"), made unique: a name two
    models share is replaced by each one's path (a run's records are found by name: two models
    of one name would share one row), and one file given twice by its place in the list."""
    by_path = [path if names.count(name) > 1 else name for name, path in zip(names, paths)]
    return [f"{name} (model {i})" if by_path.count(name) > 1 else name for i, name in enumerate(by_path)]


def default_configs(
    base: Settings, names: Sequence[str], n_params: Sequence[int], byte_level: bool = False, preset: str | None = None, mixed: bool = False
) -> list[EvalConfig]:
    """Each model alone (at the byte level on its own tokens, as it runs by itself), then, for a
    `preset`, the preset as configured ("is it better than its models on my task?"), else the
    weighted ensemble and, for two models, contrastive decoding."""
    n, counts = len(names), tuple(n_params)
    configs = [
        EvalConfig(f"{name} alone", base.with_values({"combine": "we", "weights": ",".join("1" if j == i else "0" for j in range(n)),
                                                       "method": "ensemble"}), counts, own_tokens=byte_level)  # fmt: skip
        for i, name in enumerate(names)
    ]
    if preset is not None:
        return configs + [EvalConfig(preset, base, counts, mixed=mixed)]
    configs.append(EvalConfig("WE", base.with_values({"combine": "we", "weights": ""}), counts, mixed=mixed))
    if n == 2:
        configs.append(EvalConfig("CD", base.with_values({"combine": "cd"}), counts, mixed=mixed))
    return configs


@dataclass(frozen=True)
class Generated:
    """A completion: its text, its length in what max_tokens counts (tokens, or characters at
    the byte level), the seconds it took to decode (after the prompt) and of them the seconds
    inside llama.cpp."""

    text: str
    length: int
    seconds: float
    llama_seconds: float


class ResultsFile:
    """The JSON-lines record of a run: a header line, then one line per (configuration, problem)
    as each finishes. The header holds what the whole run shares and changes what its
    configurations write or how their programs are judged (the task, the models, the level and
    its options, the sandbox and its limits); each record holds its configuration's own settings
    (`EvalConfig.identity`). Opening an existing file resumes it: the problems it holds are not
    run again, and a file whose header or a configuration's settings differ from this run's is
    refused, never mixed. A last line cut short by an interruption is dropped from the file
    before anything is appended; any other line that is not a record is refused."""

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any]) -> None:
        self.path = Path(path)
        self.header = {"localcos_eval": RESULTS_FORMAT, **header}
        self.records: dict[tuple[str, str], dict[str, Any]] = {}
        self.identities: dict[str, dict[str, str]] = {}
        self.legacy = False  # format 2: read for its summary; it does not say enough to be resumed
        if self.path.exists():
            self._read()
        else:
            self._append(self.header)

    def _read(self) -> None:
        try:
            data = self.path.read_bytes()
        except OSError as e:
            raise storage_error(self.path, e) from None
        lines = data.split(b"\n")  # the last is b"" where the file ends with a newline
        kept = len(data) - len(lines.pop())  # what ends with its newline is kept; the rest an interruption cut short
        if len(lines) > 1 and _json_or_none(lines[-1]) is None:  # a last line that is not even JSON: cut short too
            kept -= len(lines.pop()) + 1
        header = _json_or_none(lines[0]) if lines else None
        if isinstance(header, dict) and header.get("localcos_eval") == 1:
            raise ConfigError(f"{self.path} was written by an older localcos eval, which counted a program that exited early "
                              "as passed; give another --results to run again", param="results")  # fmt: skip
        if not isinstance(header, dict) or header.get("localcos_eval") not in (2, RESULTS_FORMAT):
            raise ConfigError(f"{self.path} is not a localcos eval results file; give another --results", param="results")
        self.legacy = header["localcos_eval"] == 2
        for key in ("task", "models", "sandbox") if self.legacy else self.header:
            if key != "localcos_eval" and header.get(key) != self.header.get(key):
                raise ConfigError(f"{self.path} holds results for {key} {header.get(key)!r}, not {self.header.get(key)!r}; "
                                  "give another --results", param="results")  # fmt: skip
        for number, line in enumerate(lines[1:], start=2):
            record = _json_or_none(line)
            if not _is_record(record):
                raise ConfigError(f"{self.path}:{number}: not a localcos eval record; give another --results", param="results")
            self.records[(record["config"], record["task_id"])] = record
            self.identities.setdefault(record["config"], record["settings"])
        if kept < len(data):  # repaired before anything is appended; that problem runs again
            try:
                with open(self.path, "r+b") as f:
                    f.truncate(kept)
            except OSError as e:
                raise storage_error(self.path, e) from None

    def check(self, config: EvalConfig) -> None:
        """A configuration whose name the file holds with other settings is refused."""
        known = self.identities.get(config.name)
        if known is not None and known != config.identity:
            changed = sorted(k for k in set(known) | set(config.identity) if known.get(k) != config.identity.get(k))
            raise ConfigError(f"{self.path} holds results for {config.name!r} with other settings ({', '.join(changed)}); "
                              "give it another name or another --results", param="variant")  # fmt: skip

    def check_resumable(self) -> None:
        """Refuse to add records to a file that cannot say whether they would mix with its own."""
        if self.legacy:
            raise ConfigError(f"{self.path} was written by a localcos eval that did not record the level, the limits and the "
                              "byte-level options of its run, so new results could silently mix with its own; it is read only "
                              "for a finished run's summary: give another --results to run", param="results")  # fmt: skip

    def get(self, config: str, task_id: str) -> dict[str, Any] | None:
        return self.records.get((config, task_id))

    def add(self, config: EvalConfig, record: dict[str, Any]) -> None:
        self.check_resumable()
        record = {"config": config.name, "settings": config.identity, **record}
        self._append(record)
        self.records[(config.name, record["task_id"])] = record
        self.identities.setdefault(config.name, config.identity)

    def _append(self, record: dict[str, Any]) -> None:
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise storage_error(self.path, e) from None


_RECORD_FIELDS = {"config": str, "task_id": str, "passed": bool, "settings": dict, "length": int, "seconds": (int, float),
                  "llama_seconds": (int, float)}  # fmt: skip


def _json_or_none(line: bytes) -> Any:
    try:
        return json.loads(line.decode("utf-8", errors="replace"))
    except json.JSONDecodeError:
        return None


def _is_record(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(value.get(k), t) for k, t in _RECORD_FIELDS.items())


@dataclass
class Progress:
    """Runs done of all to do, and an estimate of the time left from this run's pace."""

    total: int
    done: int = 0
    ran: int = 0
    seconds: float = 0.0
    started: float = field(default_factory=time.monotonic)

    def step(self, ran: bool) -> str:
        self.done += 1
        if ran:
            self.ran += 1
            self.seconds = time.monotonic() - self.started
        left = self.total - self.done
        eta = "" if not self.ran or not left else f", about {_duration(self.seconds / self.ran * left)} left"
        return f"[{self.done}/{self.total}{eta}]"


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{int(seconds % 60):02d}s"


def run_eval(
    tasks: Sequence[CodeTask],
    configs: Sequence[EvalConfig],
    generate: Callable[[str, EvalConfig], Generated],
    results: ResultsFile,
    limits: Limits,
    sandbox: str = CONTAINED,
    report: Callable[[str], None] = lambda line: None,
) -> None:
    """Every configuration on every task not in `results` yet, problem by problem (each problem's
    configurations one after another, so their speeds are measured side by side); each result
    appended as it comes."""
    for config in configs:
        results.check(config)
    progress = Progress(len(tasks) * len(configs))
    for task in tasks:
        for config in configs:
            if results.get(config.name, task.task_id) is not None:
                progress.step(ran=False)
                continue
            out = generate(task.prompt, replace(config, settings=with_stops(config.settings)))
            outcome = run_program(task.program(out.text), limits, sandbox)
            results.add(config, {"task_id": task.task_id, "passed": outcome.passed, "result": outcome.result, "length": out.length,
                                 "seconds": round(out.seconds, 4), "llama_seconds": round(out.llama_seconds, 4), "completion": out.text})  # fmt: skip
            report(f"{progress.step(ran=True)} {task.task_id} {config.name}: {outcome.result}")


def with_stops(settings: Settings) -> Settings:
    """A configuration's settings with the stops that end a function body added."""
    stops = tuple(dict.fromkeys((*settings.generation.stop, *STOPS)))
    return replace(settings, generation=replace(settings.generation, stop=stops))


@dataclass(frozen=True)
class ConfigSummary:
    """One configuration's results on the problems it completed, and how it compares with the
    baseline on the problems both completed."""

    name: str
    n: int
    passed: int
    length: int
    seconds: float
    against: Paired | None  # None for the baseline itself
    speed: float | None  # its length per second over the baseline's, on the problems both ran
    host: float | None = None  # the share of its decoding time outside llama.cpp
    p_holm: float | None = None  # the McNemar p corrected for every configuration compared with the baseline (Holm)

    @property
    def pass_at_1(self) -> float:
        return self.passed / self.n if self.n else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.passed, self.n)

    @property
    def per_second(self) -> float | None:
        return self.length / self.seconds if self.seconds > 0 else None

    def to_dict(self) -> dict[str, Any]:
        lo, hi = self.interval
        out: dict[str, Any] = {"config": self.name, "problems": self.n, "passed": self.passed, "pass_at_1": self.pass_at_1,
                               "interval_95": [lo, hi], "per_second": self.per_second, "speed_vs_baseline": self.speed}  # fmt: skip
        out["host_share"] = self.host
        if self.against is not None:
            a = self.against
            out["vs_baseline"] = {"problems": a.n, "won": a.won, "lost": a.lost, "difference": a.difference, "p_mcnemar": a.p, "p_holm": self.p_holm}
        return out


def summarize(results: ResultsFile, tasks: Sequence[CodeTask], configs: Sequence[EvalConfig], baseline: str | None) -> tuple[str, list[ConfigSummary]]:
    """(the baseline's name, each configuration's summary) over `tasks`. The default baseline is
    the best model alone (most problems passed), else the first configuration."""
    ids = [t.task_id for t in tasks]
    done = {c.name: [results.get(c.name, i) for i in ids] for c in configs}
    if baseline is None:
        alone = [c for c in configs if c.alone]
        pool = alone or list(configs[:1])
        baseline = max(pool, key=lambda c: sum(bool(r and r["passed"]) for r in done[c.name])).name
    assert baseline in done, "the command line checks the baseline's name"
    base = done[baseline]
    out = []
    for c in configs:
        mine = done[c.name]
        ran = [r for r in mine if r is not None]
        both = [(r, b) for r, b in zip(mine, base) if r is not None and b is not None]
        against = None if c.name == baseline else paired([r["passed"] for r, _ in both], [b["passed"] for _, b in both])
        speed = _rate([r for r, _ in both]) / _rate([b for _, b in both]) if both and _rate([b for _, b in both]) else None
        seconds = sum(r["seconds"] for r in ran)
        host = (seconds - sum(r["llama_seconds"] for r in ran)) / seconds if seconds > 0 else None
        out.append(ConfigSummary(c.name, len(ran), sum(r["passed"] for r in ran), sum(r["length"] for r in ran), seconds, against, speed, host))
    compared = [s for s in out if s.against is not None]
    corrected = dict(zip((s.name for s in compared), holm([s.against.p for s in compared])))  # type: ignore[union-attr]
    return baseline, [replace(s, p_holm=corrected.get(s.name)) for s in out]


def _rate(records: Iterable[dict[str, Any]]) -> float:
    records = list(records)
    seconds = sum(r["seconds"] for r in records)
    return sum(r["length"] for r in records) / seconds if seconds > 0 else 0.0


def table(baseline: str, summaries: Sequence[ConfigSummary], unit: str) -> list[list[str]]:
    """The rows people read: a header, then one row per configuration."""
    compared = sum(s.against is not None for s in summaries)
    rows = [["configuration", "problems", "pass@1", "95% interval", "vs baseline", "won", "lost", "p (McNemar)", f"p (Holm, {compared})",
             f"{unit}/s", "speed", "host"]]  # fmt: skip
    for s in summaries:
        lo, hi = s.interval
        a = s.against
        rows.append([
            s.name + (" (baseline)" if s.name == baseline else ""), str(s.n), f"{100 * s.pass_at_1:.1f}%", f"{100 * lo:.1f}-{100 * hi:.1f}",
            "" if a is None else f"{100 * a.difference:+.1f}", "" if a is None else str(a.won), "" if a is None else str(a.lost),
            "" if a is None else f"{a.p:.3g}", "" if s.p_holm is None else f"{s.p_holm:.3g}", "-" if s.per_second is None else f"{s.per_second:.1f}",
            "" if s.speed is None or a is None else f"{s.speed:.2f}x", "-" if s.host is None else f"{100 * s.host:.0f}%",
        ])  # fmt: skip
    return rows
