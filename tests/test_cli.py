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
    assert_one_line_error(run("generate", "--models", str(f), "--prompt", "x"), "cut.gguf", "corrupted or incomplete")


def test_tokenizer_mismatch(models):
    assert_one_line_error(
        run("generate", "--models", f"{models['base']},{models['other_tokenizer']}", "--prompt", "x"),
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
