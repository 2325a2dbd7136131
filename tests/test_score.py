"""Scoring: log-likelihoods under r and each model, perplexity windows, multiple choice, sweeps.
Every figure is checked against an independent NumPy computation from a fresh model's logits."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from localcos import Contrastive, CustomCombiner, Ensemble, LogitMix, WeightedEnsemble
from localcos.backend import Model
from localcos.errors import ConfigError, PromptTooLongError
from localcos.scoring.choices import load_choices, score_choices
from localcos.scoring.perplexity import perplexity

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "examples" / "river.txt").read_text()


def all_rows(path, tokens, n_ctx=1024, n_batch=48):
    """Every position's logits from a fresh context, in float64 (the reference's own evaluation).
    llama.cpp's kernels round differently for different batch shapes (about 1e-4 relative), so
    the reference evaluates in the batches the scorer uses where the comparison is tight."""
    m = Model(path, n_ctx=n_ctx, n_batch=n_batch, max_logit_rows=n_batch)
    rows = m.evaluate(tokens).astype(np.float64)
    m.close()
    return rows


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def reference_logr(kind, rows, tokens):
    """log r(token) at every position, straight from the definitions (docs/algorithm.md §1)."""
    l0, l1 = rows
    if kind == "we":
        logr = np.logaddexp(np.log(0.3) + log_softmax(l0), np.log(0.7) + log_softmax(l1))
    elif kind == "cd":
        logr = log_softmax(l1 - 0.5 * l0)
    elif kind == "cd-plausible":
        z = l1 - 0.5 * l0
        z[l1 < l1.max(axis=-1, keepdims=True) + math.log(0.05)] = -np.inf
        logr = log_softmax(z)
    elif kind == "mix":
        logr = log_softmax(0.25 * l0 + 0.75 * l1)
    else:  # custom: the geometric mean of the probabilities, renormalised
        g = 0.5 * (log_softmax(l0) + log_softmax(l1))
        logr = log_softmax(g)
    return logr[np.arange(len(tokens) - 1), tokens[1:]]


COMBINERS = {
    "we": WeightedEnsemble([0.3, 0.7]),
    "cd": Contrastive(mu=0.5, expert=1),
    "cd-plausible": Contrastive(mu=0.5, plausibility=0.05, expert=1),
    "mix": LogitMix([1, 3]),
    "custom": CustomCombiner(lambda probs: np.sqrt(probs[0] * probs[1]), level="probs", name="geometric"),
}


@pytest.fixture(scope="module")
def pair(models):
    # a small batch: the text is evaluated in several llama_decode calls and many row slices
    with Ensemble.load([models["base"], models["sibling"]], n_ctx=1024, n_batch=48) as ens:
        yield ens


@pytest.mark.parametrize("kind", list(COMBINERS))
def test_combined_loglikelihood_equals_an_independent_numpy_computation(pair, models, kind):
    tokens = pair.tokenize(TEXT[:1500])
    assert 150 < len(tokens) < 1024
    scores = pair.score(tokens, combiner=COMBINERS[kind])
    rows = [all_rows(models[n], tokens) for n in ("base", "sibling")]
    expected = reference_logr(kind, rows, np.asarray(tokens))
    assert scores.tokens == tokens[1:]
    got = scores.logprobs
    finite = np.isfinite(expected)
    assert (np.isfinite(got) == finite).all()  # plausibility: the same tokens are impossible
    np.testing.assert_allclose(got[finite], expected[finite], atol=1e-4, rtol=1e-5)
    for i in (0, 1):
        np.testing.assert_allclose(scores.members[i], log_softmax(rows[i])[np.arange(len(tokens) - 1), tokens[1:]], atol=1e-4, rtol=1e-5)


def reference_perplexity(paths, combine, tokens, n_ctx, bos):
    """llama-perplexity's windows and formula, written out: chunks of n_ctx, BOS first, second half."""
    nll, count = 0.0, 0
    first = n_ctx // 2
    for i in range(len(tokens) // n_ctx):
        chunk = list(tokens[i * n_ctx : (i + 1) * n_ctx])
        if bos is not None:
            chunk[0] = bos
        rows = [all_rows(p, chunk, n_ctx, n_batch=n_ctx) for p in paths]
        logp = combine(rows)  # [n_ctx, vocab] log-probabilities
        for pos in range(first, n_ctx - 1):
            nll -= logp[pos, chunk[pos + 1]]
            count += 1
    return math.exp(nll / count), count


def test_perplexity_windows_and_formula_match_a_numpy_computation(models):
    n_ctx = 64
    with Ensemble.load([models["base"], models["sibling"]], n_ctx=n_ctx) as ens:
        combiner = WeightedEnsemble([0.5, 0.5])
        result = perplexity(ens, TEXT, [combiner])
        tokens = ens.tokenize(TEXT)
        m = ens.models[0]
    assert m.add_bos and result.windows == len(tokens) // n_ctx >= 2
    paths = [models["base"], models["sibling"]]
    ppl, count = reference_perplexity(
        paths, lambda rows: np.logaddexp(np.log(0.5) + log_softmax(rows[0]), np.log(0.5) + log_softmax(rows[1])), tokens, n_ctx, m.bos
    )
    assert result.combined[0].count == count == result.windows * (n_ctx - n_ctx // 2 - 1)
    assert result.combined[0].perplexity == pytest.approx(ppl, rel=1e-4)
    alone, _ = reference_perplexity(paths[:1], lambda rows: log_softmax(rows[0]), tokens, n_ctx, m.bos)
    assert result.members[0].perplexity == pytest.approx(alone, rel=1e-4)


def test_loglikelihood_evaluates_the_context_once_and_matches_numpy(pair, models):
    context = "The river flows from the mountains down to the"
    choices = [" sea", " sky and the clouds", " old mill", " harbour"]
    before = [m.stats.tokens for m in pair.models]
    results = pair.loglikelihood(context, choices)
    evaluated = [m.stats.tokens - b for m, b in zip(pair.models, before)]
    ctx = pair.tokenize(context)
    for choice, res in zip(choices, results):
        whole = pair.tokenize(context + choice)
        assert whole[: len(ctx)] == ctx
        rows = [all_rows(models[n], whole) for n in ("base", "sibling")]
        logr = np.logaddexp(np.log(0.5) + log_softmax(rows[0]), np.log(0.5) + log_softmax(rows[1]))
        cont = whole[len(ctx) :]
        expected = sum(logr[len(ctx) - 1 + j, t] for j, t in enumerate(cont))
        assert res.tokens == len(cont) and res.logprob == pytest.approx(expected, rel=1e-3, abs=3e-3)
        assert res.per_token == pytest.approx(res.logprob / res.tokens)
        greedy = all(int(np.argmax(logr[len(ctx) - 1 + j])) == t for j, t in enumerate(cont))
        assert res.greedy == greedy
    # the context once; each later choice re-evaluates only the context's last token
    cont_tokens = sum(r.tokens for r in results)
    assert all(e <= len(ctx) + cont_tokens + len(choices) - 1 for e in evaluated)


def test_the_multiple_choice_set_scores_every_choice_like_numpy(pair, models):
    items = load_choices(ROOT / "examples" / "choices.jsonl")
    assert len(items) >= 30
    some = items[:6]
    result = score_choices(pair, some, [pair.combiner])
    for k, item in enumerate(some):
        ctx = pair.tokenize(item.context)
        for c, choice in enumerate(item.choices):
            whole = pair.tokenize(item.context + choice)
            rows = [all_rows(models[n], whole) for n in ("base", "sibling")]
            logr = np.logaddexp(np.log(0.5) + log_softmax(rows[0]), np.log(0.5) + log_softmax(rows[1]))
            expected = sum(logr[len(ctx) - 1 + j, t] for j, t in enumerate(whole[len(ctx) :]))
            assert result.combined[0][k][c] == pytest.approx(expected, rel=1e-3, abs=3e-3)
    assert 0 <= result.accuracy(result.combined[0]) <= 1


def test_scoring_errors(pair):
    with pytest.raises(ConfigError, match="nothing to score"):
        pair.score("")
    with pytest.raises(ConfigError, match="needs at least"):
        perplexity(pair, "a short text", [pair.combiner], n_ctx=64)
    with pytest.raises(PromptTooLongError):
        pair.score(TEXT * 3)


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "localcos", *args], capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})}
    )


def test_score_command_perplexity_with_a_weights_sweep(models, tmp_path):
    pair = f"{models['base']},{models['sibling']}"
    out = tmp_path / "ppl.json"
    proc = run(
        "score",
        "--models",
        pair,
        "--file",
        str(ROOT / "examples" / "river.txt"),
        "--ctx",
        "128",
        "--sweep",
        "weights=0:1:0.5",
        "--json",
        str(out),
        "--plot",
        str(tmp_path / "p.png"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "perplexity" in proc.stdout and "r weights 0.5,0.5" in proc.stdout and "scored tokens/s" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    r = [x["value"] for x in rows if x["kind"] == "r"]
    alone = [x["value"] for x in rows if x["kind"] == "model"]
    assert len(r) == 3 and len(alone) == 2
    # the grid's ends are the models alone; an even mixture lies between or below them
    assert r[0] == pytest.approx(alone[1], rel=1e-3) and r[2] == pytest.approx(alone[0], rel=1e-3)
    assert r[1] < max(alone)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_score_command_sweeps_two_parameters_at_once(models, tmp_path):
    """gate x mu: every point of the grid, for the models' rows computed once. A gate that shuts
    everywhere (the lead's top probability is always at least 1e-6) is the lead alone; one that
    opens everywhere (1: the lead is never certain) is the ungated combination."""
    pair = f"{models['base']},{models['larger']}"
    out = tmp_path / "grid.json"
    text = str(ROOT / "examples" / "river.txt")
    proc = run("score", "--models", pair, "--file", text, "--ctx", "128", "--combine", "cd", "--sweep", "gate=0.000001,0.4,1",
               "--sweep", "mu=0.1,0.5", "--json", str(out), "--plot", str(tmp_path / "g.png"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "r gate 0.4, mu 0.5" in proc.stdout
    report = json.loads(out.read_text())
    assert [s["name"] for s in report["sweep"]] == ["gate", "mu"]
    r = {x["label"]: x["value"] for x in report["rows"] if x["kind"] == "r"}
    alone = {x["label"]: x["value"] for x in report["rows"] if x["kind"] == "model"}
    assert len(r) == 6 and r["gate 1e-06, mu 0.1"] == pytest.approx(alone["t-larger"], rel=1e-4) == r["gate 1e-06, mu 0.5"]
    plain = run(
        "score",
        "--models",
        pair,
        "--file",
        text,
        "--ctx",
        "128",
        "--combine",
        "cd",
        "--sweep",
        "mu=0.1,0.5",
        "--json",
        str(tmp_path / "p.json"),
    )
    assert plain.returncode == 0, plain.stderr
    ungated = {x["label"]: x["value"] for x in json.loads((tmp_path / "p.json").read_text())["rows"] if x["kind"] == "r"}
    assert r["gate 1, mu 0.5"] == pytest.approx(ungated["mu 0.5"], rel=1e-4) and r["gate 0.4, mu 0.5"] != r["gate 1, mu 0.5"]
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_score_command_multiple_choice(models, tmp_path):
    pair = f"{models['base']},{models['sibling']}"
    proc = run(
        "score",
        "--models",
        pair,
        "--choices",
        str(ROOT / "examples" / "choices.jsonl"),
        "--combine",
        "cd",
        "--sweep",
        "mu=0,0.5",
        "--csv",
        str(tmp_path / "c.csv"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "36 multiple-choice items" in proc.stdout and "r mu 0" in proc.stdout and "alone" in proc.stdout
    assert len((tmp_path / "c.csv").read_text().splitlines()) == 1 + 2 + 2


def test_score_command_bad_input_is_one_line(models, tmp_path):
    pair = f"{models['base']},{models['sibling']}"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"context": "a", "choices": ["b", "c"], "answer": 0}\n{"context": "a", "choices": ["b"], "answer": 0}\n')
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"context": "a", "choices": ["b", "c"], "answer": 0}\n\n{not json\n')
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    short = tmp_path / "short.txt"
    short.write_text("The river runs.")
    cases = [
        (["--file", str(empty)], "is empty"),
        (["--file", str(short), "--ctx", "64"], "needs at least 128"),
        (["--choices", str(bad)], "bad.jsonl:2: choices must be a list of two or more"),
        (["--choices", str(broken)], "broken.jsonl:3: not JSON"),
        (["--file", str(short), "--choices", str(bad)], "give --file TEXT"),
        (["--file", str(short), "--sweep", "mu=0,0.1"], "--sweep mu needs --combine cd"),
        (["--file", str(short), "--sweep", "weights=a:b"], "--sweep weights: values must be"),
        (["--file", str(short), "--sweep", "gate=0.5", "--sweep", "gate=0.9"], "--sweep: each parameter once"),
        (["--file", str(short), "--sweep", "gate=1.5"], "--gate must be <= 1"),
    ]
    for argv, message in cases:
        proc = run("score", "--models", pair, *argv)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], (argv, proc.stderr)


def test_scoring_host_memory_stays_bounded_at_a_152k_vocabulary(models):
    """A 512-token window of a 152k-vocabulary pair: a host copy of the window's logits would be
    2 x 256 x 151936 x 4 bytes = 311 MiB; the scorer asks llama.cpp for SCORING_LOGIT_ROWS rows a
    call and reads them in place, a slice at a time, so the growth is llama.cpp's own output
    buffer (that many rows per model) and a slice's temporaries."""
    from localcos.runtime.scoring import SCORING_LOGIT_ROWS
    from localcos.tools.bench import RssSampler, current_rss_mb

    paths = [models["vocab152k"], models["vocab152k_padded"]]
    with Ensemble.load(paths, n_ctx=512, n_batch=512, max_logit_rows=SCORING_LOGIT_ROWS) as ens:
        tokens = ens.tokenize(TEXT * 3)[:1100]
        ens.score(tokens[:200])  # llama.cpp sizes its output buffer on first use
        base = current_rss_mb()
        with RssSampler(interval=0.005) as rss:
            result = perplexity(ens, ens.detokenize(tokens), [ens.combiner], n_ctx=512)
        growth = rss.peak - base
    assert result.windows >= 2
    assert all(m.max_logit_rows == SCORING_LOGIT_ROWS for m in ens.models)
    window_copy = 2 * 256 * 151936 * 4 / 2**20  # 297 MiB
    assert growth < window_copy / 3, f"scoring grew host memory by {growth:.0f} MiB"


def test_a_swept_parameter_belongs_to_the_combiners_the_registry_says_read_it():
    from localcos.core.combiners import COMBINERS, CombinerKind, Contrastive, register
    from localcos.scoring.sweep import combiners_for

    assert combiners_for("weights") == ("we", "logit-mix") and combiners_for("mu") == ("cd",) and combiners_for("gate") is None
    register(CombinerKind("sharp-cd", lambda mu: Contrastive(mu), ("mu",), "contrastive decoding, plausibility off"))
    try:  # a combiner registered later is sweepable by what it reads
        assert combiners_for("mu") == ("cd", "sharp-cd") and "sharp-cd" not in combiners_for("plausibility")
    finally:
        del COMBINERS["sharp-cd"]
