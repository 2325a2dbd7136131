"""--lookahead: greedy decoding of r that, where r is unsure, rolls its K likeliest tokens out L
tokens each, side by side, and keeps the branch r likes best. Checked against a brute-force
reference that rolls every branch out on its own from fresh evaluations: on pure-NumPy fakes
(several combiners, two prompts) and on llama.cpp through llama-cpp-python's own logits; the
branches' rows share one call per model and step, and nothing of a losing branch stays."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from fakes import FakeModel, FakeSequences
from localcos import Contrastive, Ensemble, Gated, WeightedEnsemble
from localcos.errors import ConfigError
from localcos.testing.invariants import checked


def reference(next_r: Callable[[list[int]], np.ndarray], prompt: Sequence[int], max_tokens: int, k: int, length: int, threshold: float,
              is_end: Callable[[int], bool]) -> tuple[list[int], int, int]:  # fmt: skip
    """The lookahead's text by brute force: r after any context from `next_r` (a fresh
    evaluation), every branch rolled out on its own. Returns (tokens, positions looked ahead
    from, positions where another branch than r's likeliest won)."""
    out: list[int] = []
    paused = changed = 0
    while len(out) < max_tokens:
        context = list(prompt) + out
        r = next_r(context).astype(np.float64)
        budget = max_tokens - len(out)
        if r.max() >= threshold or budget < 2:
            branch = [int(np.argmax(r))]
        else:
            paused += 1
            first = sorted(range(len(r)), key=lambda t: (-r[t], t))[:k]
            best, best_mean, best_j = None, -np.inf, 0
            for j, c in enumerate(first):
                branch, score = [c], np.log(r[c])
                while len(branch) < 1 + min(length, budget - 1) and not is_end(branch[-1]):
                    rr = next_r(context + branch).astype(np.float64)
                    t = int(np.argmax(rr))
                    branch.append(t)
                    score += np.log(rr[t])
                if score / len(branch) > best_mean:
                    best, best_mean, best_j = branch, score / len(branch), j
            assert best is not None
            branch = best
            changed += best_j != 0
        for t in branch:
            if is_end(t):
                return out, paused, changed
            out.append(t)
            if len(out) == max_tokens:
                break
    return out, paused, changed


def fake_r(models: Sequence[FakeModel], combiner, prompts: Sequence[Sequence[int]] | None = None) -> Callable[[list[int]], np.ndarray]:
    """r after a context (each member after its own prompt, where the members read two)."""

    def next_r(context: list[int]) -> np.ndarray:
        if prompts is None:
            rows = [m.logits_after(context)[None, :] for m in models]
        else:  # the context is the first member's prompt, then the text
            text = context[len(prompts[0]) :]
            rows = [m.logits_after(list(p) + text)[None, :] for m, p in zip(models, prompts)]
        return combiner.combine(rows, 1.0)[0]

    return next_r


FAKE_CASES = {
    "one model": (1, lambda: WeightedEnsemble()),
    "we": (2, lambda: WeightedEnsemble([0.3, 0.7])),
    "cd": (2, lambda: Contrastive(mu=0.4)),
    "gated we": (2, lambda: Gated(WeightedEnsemble(), 0.6)),
}


@pytest.mark.parametrize("case", list(FAKE_CASES))
@pytest.mark.parametrize("k, length, threshold", [(2, 1, 0.7), (3, 4, 0.6), (5, 3, 1.0)])
def test_lookahead_is_the_brute_force_greedy_of_the_branches_scores_on_fakes(case, k, length, threshold):
    n, make = FAKE_CASES[case]
    models = [FakeSequences(seed=40 + i, n_seq=k + 1, n_vocab=12, n_params=1000 * (i + 1), sharpness=1.0) for i in range(n)]
    ens = Ensemble(models, make(), branches=k)
    prompt = [1, 2]
    got = checked(ens).generate(prompt, max_tokens=30, temperature=0, lookahead=(k, length), lookahead_threshold=threshold)
    want, paused, changed = reference(fake_r(models, ens.combiner), prompt, 30, k, length, threshold, lambda t: t == models[0].eos)
    assert got.token_ids == want
    assert (got.stats.looked_ahead, got.stats.lookahead_changed) == (paused, changed)
    assert paused >= 3, "a test that looks ahead"
    # every call of the rollout holds a row of every live branch: one call per model and step
    for model in models:
        rollout = [parts for parts in model.call_parts if any(seq != 0 for seq in parts)]
        assert rollout and all(sorted(parts) == list(range(1, k + 1)) for parts in rollout), model.call_parts
        assert all(s.tokens == [] for s in model.slots[1:]), "the branches' sequences are emptied"


def test_where_r_is_sure_everywhere_lookahead_is_greedy_decoding():
    model = FakeSequences(seed=50, n_seq=4)
    ens = Ensemble([model], WeightedEnsemble(), branches=3)
    greedy = ens.generate([1, 2], max_tokens=25, temperature=0)
    never = ens.generate([1, 2], max_tokens=25, temperature=0, lookahead=(3, 4), lookahead_threshold=1e-9)
    assert never.token_ids == greedy.token_ids and never.stats.looked_ahead == 0
    always = ens.generate([1, 2], max_tokens=25, temperature=0, lookahead=(3, 4), lookahead_threshold=1.0)
    assert always.stats.looked_ahead > 0 and always.stats.lookahead_changed > 0 and always.token_ids != greedy.token_ids


def test_a_member_reading_a_second_prompt_looks_ahead_on_its_own_branches():
    from localcos import Guidance

    k = 3
    model = FakeSequences(seed=51, n_seq=2 * (k + 1), n_vocab=12)
    ens = Ensemble([model], Guidance(scale=2.0), second_prompt=True, branches=k)
    prompt, second = [1, 2], [3, 4, 5]
    got = checked(ens).generate(prompt, max_tokens=25, temperature=0, second_prompt=second, lookahead=(k, 3), lookahead_threshold=0.8)
    want, paused, _ = reference(fake_r([model, model], ens.combiner, prompts=[prompt, second]), prompt, 25, k, 3, 0.8, lambda t: t == model.eos)
    assert got.token_ids == want and paused >= 2
    # the prompt's member and the second prompt's, each with its branches, in one call
    assert any(len(parts) == 2 * k for parts in model.call_parts)


def test_lookahead_is_refused_where_it_cannot_run():
    model = FakeSequences(seed=52, n_seq=3)
    ens = Ensemble([model], WeightedEnsemble(), branches=2)
    with pytest.raises(ConfigError, match="lookahead decodes greedily"):
        ens.generate([1, 2], max_tokens=4, temperature=0.8, lookahead=(2, 2))
    with pytest.raises(ConfigError, match="loaded for at most 2"):
        ens.generate([1, 2], max_tokens=4, temperature=0, lookahead=(3, 2))
    with pytest.raises(ConfigError, match="loaded for none"):
        Ensemble([FakeModel(seed=53)], WeightedEnsemble()).generate([1, 2], max_tokens=4, temperature=0, lookahead=(2, 2))
    with pytest.raises(ConfigError, match="K,L"):
        ens.generate([1, 2], max_tokens=4, temperature=0, lookahead=(1, 2))


# --- llama.cpp ------------------------------------------------------------------------------------


def llama_cpp_r(path) -> Callable[[list[int]], np.ndarray]:
    """r of one model after a context: llama-cpp-python's own evaluation of the whole context in
    a fresh state (its Llama object), softmax of its logits."""
    from localcos.testing.reference import reference_llama

    # its threads as localcos's (a test worker's share of the cores): more threads than cores spin
    llm = reference_llama(path, n_ctx=256, n_batch=256, logits_all=True)

    def next_r(context: list[int]) -> np.ndarray:
        llm.reset()
        llm.eval(context)
        z = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        e = np.exp(z - z.max())
        return e / e.sum()

    return next_r


def test_lookahead_on_llama_cpp_is_the_brute_force_reference_and_its_branches_share_each_call(models):
    path = models["base"]
    k, length, threshold = 3, 4, 0.6
    with Ensemble.load([path], n_ctx=256, lookahead=(k, length)) as ens:
        model = ens.loaded[0]
        prompt = ens.tokenize("the lookahead test")
        calls = model.stats.calls
        got = ens.generate(prompt, max_tokens=40, temperature=0, lookahead=(k, length), lookahead_threshold=threshold)
        calls = model.stats.calls - calls
        # nothing of a branch stays: the branches' sequences hold nothing, the completion's holds its text
        assert [len(s.tokens) for s in model.slots[1:]] == [0] * k
        assert [s.kv_length() for s in model.slots[1:]] == [0] * k
        assert model.slots[0].kv_length() == len(model.slots[0].tokens)
        again = ens.generate(prompt, max_tokens=40, temperature=0, lookahead=(k, length), lookahead_threshold=threshold)
        greedy = ens.generate(prompt, max_tokens=40, temperature=0)
    want, paused, changed = reference(llama_cpp_r(path), prompt, 40, k, length, threshold, lambda t: False)
    assert got.token_ids == want and again.token_ids == want
    assert (got.stats.looked_ahead, got.stats.lookahead_changed) == (paused, changed) and paused >= 3 and changed >= 1
    assert greedy.token_ids != want
    # every token is evaluated once, in a call of its own step: the prompt's call, then one call
    # per step, a rollout's rows (one per branch) together; rows in calls of their own would add
    # (k - 1) calls per rollout step
    assert calls == 1 + len(got.token_ids) - 1, (calls, len(got.token_ids))
    assert got.stats.models[0].calls == len(got.token_ids) - 1


@pytest.mark.slow
def test_lookahead_from_the_command_line_and_its_refusals(models, tmp_path):
    path = str(models["base"])

    def generate(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "localcos", "generate", "--models", path, "--prompt", "the lookahead test",
                               "--max-tokens", "24", "--ctx", "256", *flags], capture_output=True, text=True, timeout=300)  # fmt: skip

    ok = generate("--temperature", "0", "--lookahead", "3,4", "--lookahead-threshold", "0.6", "--json")
    assert ok.returncode == 0, ok.stderr
    stats = json.loads(ok.stdout)["stats"]
    assert stats["looked_ahead"] > 0
    for flags, says in [
        (("--temperature", "0.8", "--lookahead", "3,4"), "lookahead decodes greedily: give temperature 0"),
        (("--temperature", "0", "--lookahead", "3,4", "--level", "mixed", "--gate", "0.5"), "lookahead: not available at the mixed level"),
        (("--temperature", "0", "--lookahead", "1,4"), "--lookahead must be K,L"),
        (("--temperature", "0", "--lookahead", "3,4", "--json-object"), "lookahead: not with json_object"),
    ]:
        bad = generate(*flags)
        assert bad.returncode == 2 and says in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, (flags, bad.stderr)


@pytest.mark.slow
def test_a_server_started_with_lookahead_looks_ahead_per_request(models):
    import httpx

    from localcos.testing.loopback import ServeProcess

    path = str(models["base"])
    server = ServeProcess(["--models", path, "--ctx", "256", "--alias", "m", "--temperature", "0", "--lookahead", "3,4",
                           "--lookahead-threshold", "0.6"], start_timeout=90)  # fmt: skip
    try:
        def complete(**extra: object) -> httpx.Response:
            body = {"model": "m", "prompt": "the lookahead test", "max_tokens": 24, "return_token_ids": True, **extra}
            return httpx.post(server.url + "/v1/completions", json=body, timeout=120)

        looked = complete()
        assert looked.status_code == 200 and looked.json()["localcos"]["looked_ahead"] > 0, looked.text
        with Ensemble.load([path], n_ctx=256, lookahead=(3, 4)) as ens:
            want = ens.generate(ens.tokenize("the lookahead test"), max_tokens=24, temperature=0, lookahead=(3, 4), lookahead_threshold=0.6)
            plain = ens.generate(ens.tokenize("the lookahead test"), max_tokens=24, temperature=0)
        assert looked.json()["choices"][0]["token_ids"] == want.token_ids
        off = complete(lookahead="off")
        assert off.status_code == 200 and off.json()["choices"][0]["token_ids"] == plain.token_ids and off.json()["localcos"]["looked_ahead"] == 0
        more = complete(lookahead="4,4")
        assert more.status_code == 400 and more.json()["error"]["param"] == "lookahead" and "at most 3" in more.json()["error"]["message"]
        sampled = complete(temperature=0.8)
        assert sampled.status_code == 400 and "greedily" in sampled.json()["error"]["message"]
    finally:
        server.stop()


@pytest.mark.slow
def test_eval_loads_the_branches_its_lookahead_variants_need(models, tmp_path):
    task = {"task_id": "t/0", "prompt": "def add(a, b):\n", "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n", "entry_point": "add"}
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text(json.dumps(task) + "\n")
    results = tmp_path / "r.jsonl"
    proc = subprocess.run([sys.executable, "-m", "localcos", "eval", "--models", str(models["base"]), "--task", str(task_file), "--run-code",
                           "--max-tokens", "16", "--level", "token", "--ctx", "256", "--results", str(results), "--variant", "greedy=",
                           "--variant", "ahead=--lookahead 3,4 --lookahead-threshold 0.9"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = {json.loads(line)["config"]: json.loads(line) for line in results.read_text().splitlines()[1:]}
    assert records["ahead"]["settings"]["lookahead"] == "3,4" and records["greedy"]["settings"]["lookahead"] == ""
    with Ensemble.load([models["base"]], n_ctx=256, lookahead=(3, 4)) as ens:
        stops = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```")
        want = ens.generate(task["prompt"], max_tokens=16, temperature=0, lookahead=(3, 4), lookahead_threshold=0.9, stop=stops)
    assert records["ahead"]["completion"] == want.text
    byte_run = subprocess.run([sys.executable, "-m", "localcos", "eval", "--models", str(models["base"]), "--task", str(task_file), "--run-code",
                               "--level", "mixed", "--gate", "0.5", "--results", str(tmp_path / "b.jsonl"), "--variant", "a=--lookahead 3,4"],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
    assert byte_run.returncode == 2 and "lookahead: not available at the mixed level" in byte_run.stderr, byte_run.stderr


def test_the_coder_lookahead_preset_looks_ahead_greedily_through_the_models_template(models, tmp_path):
    """The shipped preset: its model through its chat template, greedy, looking ahead (3, 4)
    where the model's top probability is under 0.5, at the token level (its model swapped for a
    synthetic one by the user's models.toml, as a user's own file may)."""
    from localcos.config import resolve
    from localcos.config.levels import decoding_level

    config = tmp_path / "models.toml"
    config.write_text(f'[models."coder-1.5b"]\npath = "{models["chat"]}"\n')
    settings = resolve({"preset": "coder-lookahead", "config": str(config)})
    generation = settings.generation
    assert (generation.lookahead, generation.lookahead_threshold, generation.phrasing) == ((3, 4), 0.5, "instruct")
    assert generation.sampler().greedy and decoding_level(settings).value == "token" and settings.load.lookahead == (3, 4)
