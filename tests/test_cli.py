"""The `localcos` command in a subprocess: output formats and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def run(*args: str, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "localcos", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("localcos: error: ")
    assert "Traceback" not in proc.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
    assert proc.stdout == ""


def test_generate_json(models):
    proc = run(
        "generate",
        "--models",
        f"{models['base']},{models['sibling']}",
        "--prompt",
        "The river runs",
        "--method",
        "ensemble",
        "--max-tokens",
        "12",
        "--seed",
        "3",
        "--n",
        "3",
        "--ignore-eos",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert len(out["completions"]) == 3
    for c in out["completions"]:
        assert set(c) == {"text", "token_ids", "finish_reason"}
        assert len(c["token_ids"]) == 12 and c["finish_reason"] == "length"
    s = out["stats"]
    assert s["method"] == "ensemble" and s["tokens"] == 36
    assert s["calls"] == [33, 33]
    assert s["tokens_per_second"] > 0 and s["seconds"] > 0
    assert s["seed"] == 3


def test_generate_json_has_one_shape_at_every_level(models):
    """The same keys, the same stats keys and completions' keys at the token, mixed and byte
    levels; what a level does not count is null."""
    common = ["--prompt", "The river runs", "--max-tokens", "6", "--seed", "1", "--temperature", "0", "--json"]
    runs = {
        "token": run("generate", "--models", str(models["base"]), "--level", "token", *common),
        "mixed": run("generate", "--models", str(models["base"]), "--level", "mixed", "--gate", "0.5", *common),
        "byte": run("generate", "--models", f"{models['base']},{models['other_tokenizer']}", *common),
    }
    outs = {}
    for level, proc in runs.items():
        assert proc.returncode == 0, (level, proc.stderr)
        outs[level] = json.loads(proc.stdout)
        assert outs[level]["level"] == outs[level]["stats"]["level"] == level
    shapes = {level: (set(out), set(out["stats"]), set(out["completions"][0])) for level, out in outs.items()}
    assert shapes["token"] == shapes["mixed"] == shapes["byte"], shapes
    assert outs["token"]["completions"][0]["token_ids"] and outs["byte"]["completions"][0]["token_ids"] is None
    assert outs["token"]["stats"]["chars"] is None and outs["byte"]["stats"]["chars"] > 0 and outs["token"]["stats"]["tokens"] > 0
    assert outs["mixed"]["stats"]["token_bytes"] is not None and outs["byte"]["stats"]["token_bytes"] is None


def test_generate_streams_text_and_summarises_on_stderr(models):
    proc = run(
        "generate", "--models", str(models["base"]), "--max-tokens", "10", "--seed", "1", stdin="The river runs"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert proc.stderr.count("\n") == 1 and "ensemble" in proc.stderr and "seed 1" in proc.stderr


def test_same_seed_same_text(models):
    args = ["generate", "--models", f"{models['base']},{models['sibling']}", "--prompt", "Hello", "--seed", "9", "--json"]
    a, b = run(*args), run(*args)
    assert json.loads(a.stdout)["completions"] == json.loads(b.stdout)["completions"]


def test_missing_file(tmp_path):
    assert_one_line_error(run("generate", "--models", str(tmp_path / "nope.gguf"), "--prompt", "x"), "not found", "nope.gguf")


def test_not_a_gguf(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_text("definitely not a model")
    assert_one_line_error(run("generate", "--models", str(f), "--prompt", "x"), "not a GGUF file")


def test_truncated_gguf(tmp_path, models):
    f = tmp_path / "cut.gguf"
    f.write_bytes(models["base"].read_bytes()[:300_000])
    assert_one_line_error(run("generate", "--models", str(f), "--prompt", "x"), "cut.gguf", "incomplete", "the file has 0.3 MB")


def test_tokenizer_mismatch(models):
    # at the token level; auto (the default) combines them at the byte level (test_bytelevel_trained)
    assert_one_line_error(
        run("generate", "--models", f"{models['base']},{models['other_tokenizer']}", "--prompt", "x", "--level", "token"),
        "tokenizer mismatch",
        "token id",
    )


@pytest.mark.parametrize(
    "weights, message",
    [("0.5", "got 1 weights for 2 models"), ("1,-1", "weights must be >= 0"), ("a,b", "comma-separated numbers")],
)
def test_bad_weights(models, weights, message):
    assert_one_line_error(
        run("generate", "--models", f"{models['base']},{models['sibling']}", "--weights", weights, "--prompt", "x"), message
    )


def test_prompt_longer_than_the_context(models):
    assert_one_line_error(
        run("generate", "--models", str(models["base"]), "--ctx", "16", "--prompt", "word " * 40), "context holds 16"
    )


def test_usage_errors_are_one_line_too(models):
    assert_one_line_error(run("generate", "--prompt", "x"), "--models")
    assert_one_line_error(run("generate", "--models", str(models["base"]), "--method", "bogus", "--prompt", "x"), "--method")
    assert_one_line_error(run("generate", "--models", str(models["base"]), "--temperature", "-1", "--prompt", "x"), "temperature")


def test_make_test_models(tmp_path):
    proc = run("make-test-models", str(tmp_path / "m"), "--vocab", "600")
    assert proc.returncode == 0, proc.stderr
    names = [line.split("\t")[0] for line in proc.stdout.splitlines()]
    assert names == ["base", "sibling", "larger", "other-tokenizer", "padded"]
    assert all((tmp_path / "m" / f"{n}.gguf").stat().st_size > 0 for n in names)


# --- every kind of bad value: one line, exit 2, before any model is loaded ---------------------------

BAD_OPTIONS = [
    (["--ctx", "1"], "--ctx must be >= 8"),
    (["--ctx", "big"], "--ctx must be an integer"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--seed", "-2"], "--seed must be >= 0 (or -1 for a random seed)"),
    (["--seed", "1.5"], "--seed must be an integer"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--n-gpu-layers", "all"], "--n-gpu-layers must be comma-separated integers"),
    (["--n-gpu-layers", "-2"], "--n-gpu-layers must be >= -1"),
    (["--n-gpu-layers", "1,2,3"], "got 3 --n-gpu-layers values for 2 models"),
    (["--main-gpu", "-1"], "--main-gpu must be >= 0"),
    (["--split-mode", "diagonal"], "--split-mode must be one of none, layer, row"),
    (["--flash-attn", "maybe"], "--flash-attn must be one of auto, on, off"),
    (["--temperature", "nan"], "--temperature must be a finite number"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--top-k", "-1"], "--top-k must be >= 0"),
    (["--top-p", "0"], "--top-p must be > 0"),
    (["--top-p", "1.5"], "--top-p must be <= 1"),
    (["--min-p", "2"], "--min-p must be <= 1"),
    (["--gamma", "0"], "--gamma must be an integer >= 1"),
    (["--gamma", "fast"], "--gamma must be an integer >= 1"),
    (["--gamma", "1,2,3"], "got 3 gamma values for 2 models"),
    (["--proposer", "2"], "--proposer must be a model index from 0 to 1"),
    (["--method", "bogus"], "--method must be one of ensemble, sd, naive-cos, cos"),
    (["--combine", "bogus"], "--combine must be we, cd, logit-mix, cfg or FILE.py:FUNCTION"),
    (["--combine", "nowhere.py:f"], "combiner file not found"),
    (["--combine", "cd", "--weights", "1,1"], "--weights does not apply to cd; use --mu, --plausibility, --expert"),
    (["--combine", "cd", "--expert", "2"], "--expert must be a model index from 0 to 1"),
    (["--mu", "-1"], "--mu must be >= 0"),
    (["--plausibility", "0"], "--plausibility must be > 0"),
    (["--gate", "0"], "--gate must be > 0"),
    (["--gate", "1.5"], "--gate must be <= 1"),
    (["--lead", "0"], "--lead names the model a --gate leaves alone"),
    (["--gate", "0.5", "--lead", "2"], "--lead must be a model index from 0 to 1"),
    (["--weights", "1,"], "--weights must be comma-separated numbers"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1"),
    (["--n", "0"], "--n must be >= 1"),
    (["--chat", "--chat-template-model", "2"], "--chat-template-model must be a model index from 0 to 1"),
    (["--preset", "no-such-preset"], "unknown preset"),
    (["--preset", "qwen-1.5b-we"], "give one of --models, --preset, not several"),
]


@pytest.mark.parametrize("argv, message", BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_bad_values_are_one_line(models, monkeypatch, capsys, argv, message):
    from localcos import cli
    from localcos.backend import model

    def no_loading(*args, **kwargs):
        raise AssertionError("a bad value must be refused before any model is loaded")

    monkeypatch.setattr(model.Model, "__init__", no_loading)
    pair = [] if message == "unknown preset" else ["--models", f"{models['base']},{models['sibling']}"]
    code = cli.main(["generate", *pair, "--prompt", "x", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("localcos: error: "), err
    assert message in err[0], err[0]


def test_seed_minus_one_is_a_random_seed_printed_in_the_stats(models):
    proc = run("generate", "--models", str(models["base"]), "--prompt", "The river", "--max-tokens", "3", "--seed", "-1", "--json")
    assert proc.returncode == 0, proc.stderr
    seed = json.loads(proc.stdout)["stats"]["seed"]
    assert isinstance(seed, int) and seed >= 0


def test_demo_says_what_it_is_and_runs_on_a_given_pair(models):
    proc = run("demo", "--max-tokens", "16")
    assert proc.returncode == 0, proc.stderr
    assert "random by design" in proc.stderr and "localcos demo --models" in proc.stderr
    assert "standard ensemble: ensemble | 16 tokens" in proc.stdout and "CoS:               cos | 16 tokens" in proc.stdout
    assert "CoS ran at" in proc.stdout
    proc = run("demo", "--models", f"{models['base']},{models['sibling']}", "--max-tokens", "8", "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    assert "random by design" not in proc.stderr and "t-base-" in proc.stderr
    assert "CoS ran at" in proc.stdout and "seed 3" in proc.stdout
