"""Executed code tasks over several configurations of one loaded ensemble (`localcos eval`): the
run. Every configuration (`eval.configs`) completes every problem with the same loaded models;
each completion runs in the sandbox (`eval.sandbox`) with the problem's test (passed: the test's
check returned); each result is appended to the results file (`eval.results`) as it comes, so a
run stopped by Ctrl-C resumes where it stopped. The summary: `eval.summary`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING
from collections.abc import Callable, Sequence

from ..config import Settings
from .codetasks import SCRIPT_STOPS, STOPS, CodeTask
from .sandbox import CONTAINED, Limits, run_program

if TYPE_CHECKING:
    from ..infill import Infill
    from .configs import EvalConfig
    from .results import ResultsFile


@dataclass(frozen=True)
class Generated:
    """A completion: its text, its length in the run's unit (`Level.unit`: tokens, or characters
    in a run at the byte or mixed level: `Completion.measured`), the seconds it took to decode
    (after the prompt) and of them the seconds inside llama.cpp."""

    text: str
    length: int
    seconds: float
    llama_seconds: float
    note: str | None = None  # how it was decoded where that is not what its configuration says (a task with no second prompt)


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
    generate: Callable[[str | Infill, EvalConfig], Generated],
    results: ResultsFile,
    limits: Limits,
    sandbox: str = CONTAINED,
    report: Callable[[str], None] = lambda line: None,
    scripts: Callable[[EvalConfig], bool] = lambda config: False,
) -> None:
    """Every configuration on every task not in `results` yet, problem by problem (each problem's
    configurations one after another, so their speeds are measured side by side); each result
    appended as it comes. A configuration whose models write a whole script (`scripts`: the
    evalplus phrasing) ends at a script's stops and is run as one (`CodeTask.program`); an
    infilling task's middle is written through the models' FIM tokens, with no stop of ours."""
    for config in configs:
        results.check(config)
    progress = Progress(len(tasks) * len(configs))
    for task in tasks:
        for config in configs:
            if results.get(config.name, task.task_id) is not None:
                progress.step(ran=False)
                continue
            script = scripts(config)
            if task.infill is not None:  # a middle ends where the model ends it (its end token) or at max_tokens
                out = generate(task.infill, config)
            else:
                out = generate(task.prompt, replace(config, settings=with_stops(config.settings, SCRIPT_STOPS if script else STOPS)))
            outcome = run_program(task.program(out.text, script), limits, sandbox)
            record = {"task_id": task.task_id, "passed": outcome.passed, "result": outcome.result, "length": out.length,
                      "seconds": round(out.seconds, 4), "llama_seconds": round(out.llama_seconds, 4), "completion": out.text}  # fmt: skip
            if out.note is not None:
                record["note"] = out.note
            results.add(config, record)
            said = f" ({out.note})" if out.note is not None else ""
            report(f"{progress.step(ran=True)} {task.task_id} {config.name}: {outcome.result}{said}")


def with_stops(settings: Settings, ends: Sequence[str] = STOPS) -> Settings:
    """A configuration's settings with the stops that end a function body (or a script) added."""
    stops = tuple(dict.fromkeys((*settings.generation.stop, *ends)))
    return replace(settings, generation=replace(settings.generation, stop=stops))
