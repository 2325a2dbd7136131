"""Prompt members: a member is a model and the prompt it reads. One model under two prompts
(guidance, cd against a weaker prompt, an average of two phrasings) loads once, shares its calls,
and decodes what llama-cpp-python's own logits under the two prompts say."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import numpy as np
import pytest

from localcos import Ensemble
from localcos.backend import Model
from localcos.core.combiners import Contrastive, Guidance, WeightedEnsemble
from localcos.errors import ConfigError
from localcos.eval.contrast import drop_examples
from localcos.phrasing import instruct_phrasing
from localcos.runtime.scoring import _calls
from localcos.testing import reference
from localcos.testing.loopback import ServeProcess
from localcos.testing.reference import in_child

N = 12
PROMPT, NEGATIVE = "The river flows from the mountains", "A letter arrived"


# the combinations written on llama-cpp-python's rows (module-level: the reference runs in a child)
def _guided(rows):
    return rows[1] + 1.8 * (rows[0] - rows[1])


def _cd(rows):
    return rows[0] - 0.5 * rows[1]


def _we(rows):
    return sum(np.exp(r - r.max()) / np.exp(r - r.max()).sum() for r in rows)


@pytest.mark.parametrize("method", ["ensemble", "sd", "cos"])
def test_guidance_decodes_what_llama_cpps_logits_under_two_prompts_say_with_one_load(models, method):
    """Greedy guidance equals guidance written straight on llama-cpp-python (two `Llama`s, each
    after its own prompt), whatever the method; the model loads once and its two members' rows
    go in one call (a call both take part in counts once, for the prompt's member)."""
    path = str(models["base"])
    with Ensemble.load([path], combiner=Guidance(scale=1.8), second_prompt=True) as ens:
        assert len(ens.loaded) == 1 and ens.models[0] is ens.models[1]
        prompt, negative = ens.tokenize(PROMPT), ens.tokenize(NEGATIVE)
        out = ens.generate(prompt, second_prompt=negative, method=method, temperature=0, max_tokens=N, ignore_eos=True)
        calls = ens.loaded[0].stats.calls
    want = in_child(reference.greedy_combined, [path, path], _guided, prompt, N, [prompt, negative])
    assert out.token_ids == want
    own, second = out.stats.models
    assert second.name.endswith("(second prompt)") and second.tokens >= N - 1
    if method == "ensemble":  # every step's two rows in one call
        assert second.calls == 0 and own.calls == N - 1
    assert sum(out.stats.calls) <= calls  # no call counted twice


def test_scale_1_is_the_model_alone_and_never_evaluates_the_second_prompt(models):
    path = str(models["base"])
    with Ensemble.load([path], combiner=Guidance(scale=1.0), second_prompt=True) as ens:
        out = ens.generate(PROMPT, second_prompt=NEGATIVE, temperature=0, max_tokens=N, ignore_eos=True)
        assert out.stats.models[1].tokens == 0  # after its prompt: r never asked for its rows
    assert out.token_ids == in_child(reference.greedy, path, PROMPT, N)


@pytest.mark.real
def test_scale_1_is_the_model_alone_on_a_quantized_model_and_no_call_carries_the_unused_member(trained):
    """A member r does not use is not evaluated at all, its prompt included: on a Q4 model, whose
    rows change with the shape of the call they come from, a negative prompt at --cfg-scale 1
    gives the model's own token ids (through the library and the command line), and no
    llama_decode call carries a token of its sequences."""
    path = trained("smollm2-135m")
    prompt = 'def is_palindrome(text):\n    """Return True if text reads the same backwards."""\n'
    negative = "hello world, how are you today"
    with Ensemble.load([path], n_ctx=512) as ens:
        alone = ens.generate(prompt, temperature=0, max_tokens=24).token_ids
    parts: list[tuple[int, int]] = []  # (sequence, tokens) of every part of every call
    decode = Model.decode

    def logged(model, calls):
        parts.extend((slot.seq_id, len(tokens)) for slot, tokens, _, _ in calls)
        return decode(model, calls)

    with Ensemble.load([path], combiner=Guidance(scale=1.0), second_prompt=True, n_ctx=512) as ens:
        unused = {slot.seq_id for slot in ens.member_slots[ens.second_member]}
        n_prompt = len(ens.tokenize(prompt))
        Model.decode = logged  # type: ignore[method-assign]
        try:
            guided = ens.generate(prompt, negative_prompt=negative, temperature=0, max_tokens=24)
        finally:
            Model.decode = decode  # type: ignore[method-assign]
    assert guided.token_ids == alone
    assert parts and not [p for p in parts if p[0] in unused], parts
    assert sum(p[1] for p in parts) == n_prompt + len(alone) - 1  # the prompt's tokens and the generated ones, once each
    proc = subprocess.run([sys.executable, "-m", "localcos", "generate", "--models", str(path), "--ctx", "512", "--temperature", "0",
                           "--max-tokens", "24", "--prompt", prompt, "--negative-prompt", negative, "--cfg-scale", "1", "--json"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["completions"][0]["token_ids"] == alone


def test_cd_and_an_average_take_the_second_prompts_member_beside_the_models(models):
    """--combine cd contrasts the prompt with the weaker one (its amateur: the member reading the
    second prompt counts one fewer), we averages the two phrasings; both as written on llama.cpp."""
    path = str(models["base"])
    for combiner, combine in (
(Contrastive(mu=0.5, plausibility=None), _cd), (WeightedEnsemble([0.5, 0.5]), _we)):
        with Ensemble.load([path], combiner=combiner, second_prompt=True) as ens:
            prompt_ids, negative = ens.tokenize(PROMPT), ens.tokenize(NEGATIVE)
            out = ens.generate(prompt_ids, second_prompt=negative, temperature=0, max_tokens=N, ignore_eos=True)
        assert out.token_ids == in_child(reference.greedy_combined, [path, path], combine, prompt_ids, N, [prompt_ids, negative]), combiner


def test_a_second_prompt_needs_its_member_and_differs_from_the_prompt(models):
    path = str(models["base"])
    with Ensemble.load([path], combiner=Guidance(scale=1.5), second_prompt=True) as ens:
        with pytest.raises(ConfigError, match="negative_prompt"):
            ens.generate(PROMPT, temperature=0, max_tokens=2)  # loaded for one: give it
        with pytest.raises(ConfigError, match="prompt itself"):
            ens.generate(PROMPT, second_prompt=PROMPT, max_tokens=2)
    with pytest.raises(ConfigError, match="a prompt and a negative prompt"):
        Ensemble.load([path], combiner=Guidance(scale=1.5))  # guidance without the member


@pytest.mark.parametrize(
    "args, message",
    [
        (["--negative-prompt", ""], "--negative-prompt is empty"),
        (["--negative-prompt", PROMPT], "--negative-prompt is the prompt itself"),
        (["--cfg-scale", "1.5"], "--cfg-scale (guidance) needs a second prompt"),
        (["--negative-prompt", "x", "--cfg-scale", "0"], "--cfg-scale must be"),
        (["--negative-prompt", "x", "--cfg-scale", "21"], "--cfg-scale must be <= 20"),
        (["--negative-prompt", "x", "--cfg-scale", "2", "--models-twice"], "guidance contrasts one model with itself"),
    ],
)
def test_bad_second_prompts_are_one_line_before_anything_loads(args, message, models):
    """Checked by the settings layer, from the files' headers."""
    path = str(models["base"])
    models = [path, path] if "--models-twice" in args else [path]
    args = [a for a in args if a != "--models-twice"]
    proc = subprocess.run([sys.executable, "-m", "localcos", "generate", "--models", ",".join(models), "--prompt", PROMPT, *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and message in err[0], proc.stderr


def test_generate_on_the_command_line_is_the_library(models):
    path = str(models["base"])
    proc = subprocess.run([sys.executable, "-m", "localcos", "generate", "--models", path, "--prompt", PROMPT, "--negative-prompt", NEGATIVE,
                           "--cfg-scale", "1.8", "--temperature", "0", "--max-tokens", str(N), "--ignore-eos", "--json"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with Ensemble.load([path], combiner=Guidance(scale=1.8), second_prompt=True) as ens:
        want = ens.generate(PROMPT, second_prompt=NEGATIVE, temperature=0, max_tokens=N, ignore_eos=True).token_ids
    out = json.loads(proc.stdout)
    assert out["completions"][0]["token_ids"] == want and out["stats"]["combiner"] == "cfg(s=1.8,positive=0)"


def test_a_server_takes_a_second_prompt_per_request_and_rejects_bad_ones(models):
    path = str(models["base"])
    server = ServeProcess(["--models", path, "--negative-prompt", NEGATIVE, "--cfg-scale", "1.8", "--alias", "guided"], start_timeout=90)
    try:
        def post(body: dict) -> httpx.Response:
            return httpx.post(server.url + "/v1/completions", json={"model": "guided", "max_tokens": N, "temperature": 0, "ignore_eos": True, **body},
                              timeout=120)  # fmt: skip

        with Ensemble.load([path], combiner=Guidance(scale=1.8), second_prompt=True) as ens:
            served = ens.generate(PROMPT, second_prompt=NEGATIVE, temperature=0, max_tokens=N, ignore_eos=True).text
            other = ens.generate(PROMPT, second_prompt="Once upon a time", temperature=0, max_tokens=N, ignore_eos=True).text
        assert post({"prompt": PROMPT}).json()["choices"][0]["text"] == served  # the server's own second prompt
        # log-probabilities of what it wrote: the second prompt's member reading its prompt in place of the request's
        scored = post({"prompt": PROMPT, "logprobs": 1, "return_token_ids": True}).json()["choices"][0]
        with Ensemble.load([path], combiner=Guidance(scale=1.8), second_prompt=True) as ens:
            (want,) = ens.loglikelihood(ens.tokenize(PROMPT), [scored["token_ids"]], second_prompt=ens.tokenize(NEGATIVE))
        assert abs(sum(scored["logprobs"]["token_logprobs"]) - want.logprob) < 0.05 and want.logprob != sum(want.members[:1])
        echo = post({"prompt": PROMPT, "echo": True, "max_tokens": 0})
        assert echo.status_code == 400 and echo.json()["error"]["param"] == "echo"
        assert post({"prompt": PROMPT, "negative_prompt": "Once upon a time"}).json()["choices"][0]["text"] == other
        for body, param in (({"cfg_scale": 0}, "cfg_scale"), ({"cfg_scale": 50}, "cfg_scale"), ({"negative_prompt": ""}, "negative_prompt"),
                            ({"negative_prompt": PROMPT}, "negative_prompt"), ({"negative_prompt": 5}, "negative_prompt")):  # fmt: skip
            response = post({"prompt": PROMPT, **body})
            assert response.status_code == 400 and response.json()["error"]["param"] == param, (body, response.text)
    finally:
        server.stop()


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    z = rows.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def test_score_reads_the_second_prompt_in_place_of_the_document_start_in_the_leads_calls(models):
    """Guidance's log-probabilities of a text: the prompt's member reads the text, the second
    reads the negative prompt and then the text after its first token; both as llama-cpp-python's
    logits of the two sequences say, the second member's rows in the lead's calls."""
    path = str(models["base"])
    text = PROMPT + " and down to the sea where the boats wait for the morning tide"
    with Ensemble.load([path], combiner=Guidance(scale=1.8), second_prompt=True, n_ctx=256) as ens:
        tokens, negative = ens.tokenize(text), ens.tokenize(NEGATIVE)
        calls = ens.loaded[0].stats.calls
        scores = ens.score(text, second_prompt=NEGATIVE)
        calls = ens.loaded[0].stats.calls - calls
        model = ens.loaded[0]
        shared = len(list(_calls(len(tokens), 1, 0, model.n_batch // 2, model.max_logit_rows // 2)))  # each call's tokens and rows split in two
        with pytest.raises(ConfigError, match="negative_prompt"):
            ens.score(text)  # loaded for a second prompt: give it one
    own = _log_softmax(in_child(reference.all_logits, path, tokens)[:-1])
    second = _log_softmax(in_child(reference.all_logits, path, negative + tokens[1:])[len(negative) - 1 : -1])
    guided = _log_softmax(second + 1.8 * (own - second))
    at = np.arange(len(tokens) - 1), np.asarray(tokens[1:])
    # within llama.cpp's batch variance (calls of other shapes; guidance scales it by 1.8)
    assert np.allclose(scores.logprobs, guided[at], atol=1e-2)
    assert scores.members is not None and np.allclose(scores.members[0], own[at], atol=1e-2) and np.allclose(scores.members[1], second[at], atol=1e-2)
    assert abs(scores.logprobs.sum() - own[at].sum()) > 1.0  # the second prompt moved the scores
    assert calls == 1 + shared  # the negative prompt's own call, then both members' rows in each call


def test_score_on_the_command_line_takes_a_negative_prompt(models, tmp_path):
    path = str(models["base"])
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"the river {i} runs past the mill and the bridge" for i in range(40)))
    proc = subprocess.run([sys.executable, "-m", "localcos", "score", "--models", path, "--file", str(text), "--ctx", "64",
                           "--negative-prompt", NEGATIVE, "--cfg-scale", "1.5", "--json", str(tmp_path / "s.json")],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "s.json").read_text())
    rows = {row["label"]: row["value"] for row in report["rows"]}
    assert set(rows) == {"cfg(s=1.5,positive=0)", "t-base", "t-base (second prompt)"} and len(set(rows.values())) == 3
    assert report["n_ctx"] == 64 - (len(Ensemble.load([path], n_ctx=64).tokenize(NEGATIVE)) - 1)  # the windows leave it room
    assert report["llama_seconds"] <= report["seconds"]  # the model's calls counted once
    bytes_level = subprocess.run([sys.executable, "-m", "localcos", "score", "--models", path, "--file", str(text), "--level", "byte",
                                  "--negative-prompt", NEGATIVE, "--cfg-scale", "1.5"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert bytes_level.returncode == 2 and "at the token level" in bytes_level.stderr, bytes_level.stderr


def test_drop_examples_keeps_the_task_and_drops_its_examples():
    humaneval = 'def add(a, b):\n    """Add two numbers.\n    >>> add(1, 2)\n    3\n    >>> add(0, 0)\n    0\n    """\n'
    assert drop_examples(humaneval) == 'def add(a, b):\n    """Add two numbers.\n    """\n'
    mbpp = 'def add(a, b):\n    """Write a function to add two numbers.\n    For example: assert add(1, 2) == 3\n    """\n'  # eval's MBPP shape
    assert drop_examples(mbpp) == 'def add(a, b):\n    """Write a function to add two numbers.\n    """\n'
    headed = 'def f(x):\n    """Double x.\n    Example:\n    f(2) == 4\n\n    Returns an int.\n    """\n'
    assert drop_examples(headed) == 'def f(x):\n    """Double x.\n\n    Returns an int.\n    """\n'
    worked = 'def g(s):\n    """Reverse s.\n    Input: "ab"\n    Output: "ba"\n    """\n'
    assert drop_examples(worked) == 'def g(s):\n    """Reverse s.\n    """\n'
    assert drop_examples('def h():\n    """Nothing to drop."""\n') is None
    assert humaneval in instruct_phrasing(humaneval)


def test_an_unknown_contrast_prompt_is_one_line_before_anything_loads(models, tmp_path):
    task = tmp_path / "t.jsonl"
    task.write_text(json.dumps({"task_id": "t/1", "prompt": "def f():\n", "test": "def check(c):\n    pass\n", "entry_point": "f"}) + "\n")
    proc = subprocess.run([sys.executable, "-m", "localcos", "eval", "--models", str(models["base"]), "--task", str(task), "--run-code",
                           "--results", str(tmp_path / "r.jsonl"), "--variant", "x=--contrast-prompt louder"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and "--contrast-prompt" in err[0] and "drop-examples" in err[0], proc.stderr
    assert not (tmp_path / "r.jsonl").exists()


def test_eval_reads_each_task_without_its_examples_and_says_where_there_were_none(models, tmp_path):
    """eval --contrast-prompt drop-examples: the second member reads the task without its
    examples (the text is the library's with that second prompt); a task with nothing to drop is
    decoded by the model alone, and its record and progress line say so."""
    path = models["base"]
    with_examples = 'def f(x):\n    """Double x.\n    >>> f(2)\n    4\n    """\n'
    without = 'def g(x):\n    """Halve x."""\n'
    task = tmp_path / "t.jsonl"
    task.write_text("".join(json.dumps({"task_id": f"t/{i}", "prompt": p, "test": "def check(c):\n    pass\n", "entry_point": p[4]}) + "\n"
                            for i, p in enumerate((with_examples, without))))  # fmt: skip

    def evaluate(*args: str) -> tuple[subprocess.CompletedProcess, dict]:
        """eval of the two tasks with `args`: the process and its records by (configuration, task)."""
        results = tmp_path / f"r{len(list(tmp_path.glob('r*.jsonl')))}.jsonl"
        proc = subprocess.run([sys.executable, "-m", "localcos", "eval", "--models", str(path), "--task", str(task), "--run-code", "--timeout", "2",
                               "--max-tokens", "8", "--results", str(results), *args], capture_output=True, text=True, timeout=300)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc, {(r["config"], r["task_id"]): r for r in map(json.loads, results.read_text().splitlines()[1:])}

    proc, by = evaluate("--level", "token", "--variant", "alone=--combine we", "--variant", "cfg=--contrast-prompt drop-examples --cfg-scale 3")
    assert "note" not in by[("cfg", "t/0")] and "nothing to change" in by[("cfg", "t/1")]["note"]
    assert any(line.split("] ", 1)[-1].startswith("t/1 cfg: ") and line.endswith("(drop-examples: nothing to change in this task; decoded by the "
               "lead model alone)") for line in proc.stderr.splitlines())  # fmt: skip
    assert by[("cfg", "t/1")]["completion"] == by[("alone", "t/1")]["completion"]
    with Ensemble.load([path], combiner=Guidance(scale=3), second_prompt=True) as ens:
        guided = ens.generate(with_examples, second_prompt=drop_examples(with_examples), max_tokens=8, temperature=0).text
    completion = by[("cfg", "t/0")]["completion"]
    assert completion and guided.startswith(completion) and completion != by[("alone", "t/0")]["completion"]
    # at the mixed level, a task with nothing to drop is the model alone behind the same gate
    _, by = evaluate("--temperature", "0", "--level", "mixed", "--variant", "plus=--gate 0.5",
                     "--variant", "cfg=--contrast-prompt drop-examples --cfg-scale 3 --gate 0.5")
    assert "nothing to change" in by[("cfg", "t/1")]["note"] and by[("cfg", "t/1")]["completion"] == by[("plus", "t/1")]["completion"]


def test_at_byte_steps_the_second_prompts_member_takes_each_byte_in_the_leads_call(models):
    """At the mixed level with gate 1, sampled (every step the byte level's, the gate open wherever
    the lead's next byte is not certain; greedy would spell each step with a whole token of the
    lead), where the gate opened the member reading the second prompt
    takes the byte in the call that advances the lead: the model makes fewer calls than its two
    members take part in (each member counts every call it took part in)."""
    from localcos.config.specs import GenerationConfig, LoadSpec
    from localcos.core.combiners import Gated
    from localcos.runtime.bytelevel import ByteModels, run_to_end
    from localcos.runtime.generation import completion_rng

    spec = LoadSpec.make([models["base"]], level="mixed", second_prompt=True, byte_paths=4)
    with ByteModels.load(spec, Gated(WeightedEnsemble([0.5, 0.5]), 1.0, lead=0)) as loaded:
        prompts = loaded.prompts(PROMPT, NEGATIVE)
        plan = loaded.plan(prompts, GenerationConfig(temperature=1.0, max_tokens=N, ignore_eos=True))
        before = loaded.loaded[0].stats.calls
        out = run_to_end(loaded.start(plan, completion_rng(0, 0)))
        model_calls = loaded.loaded[0].stats.calls - before
    own, second = out.stats.calls
    assert out.stats.bytes >= N and out.stats.gate_opened > out.stats.gate_decided / 2
    assert own <= model_calls < own + second, (model_calls, own, second)  # shared calls count once for the model


def test_a_chat_at_the_mixed_level_reads_the_second_prompt_through_its_models_template(models):
    """A chat at the mixed level: the member reading a second prompt reads the conversation with
    --negative-prompt in place of the user's message, through the model's own chat template (as
    at the token level), not the negative prompt's raw text; `generate --chat` and a server's
    chat completion are the library given that rendering."""
    from localcos import ByteEnsemble
    from localcos.chat import Message
    from localcos.config.specs import LoadSpec
    from localcos.core.combiners import Gated

    path = str(models["chat"])
    proc = subprocess.run([sys.executable, "-m", "localcos", "generate", "--models", path, "--level", "mixed", "--chat", "--prompt", PROMPT,
                           "--negative-prompt", NEGATIVE, "--cfg-scale", "1.8", "--gate", "0.9", "--temperature", "0", "--max-tokens", str(N),
                           "--ignore-eos", "--json"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    with ByteEnsemble.from_spec(LoadSpec.make([path], level="mixed", second_prompt=True), Gated(Guidance(scale=1.8), 0.9)) as ens:
        assert ens.combiner.description == out["stats"]["combiner"]
        prompts = ens.chat_prompts([Message("user", PROMPT)])
        settings = dict(temperature=0, max_tokens=N, ignore_eos=True)
        rendered = ens.generate(prompts, second_prompt=ens.second_chat_prompt([Message("user", NEGATIVE)]), **settings).text
        raw = ens.generate(prompts, negative_prompt=NEGATIVE, **settings).text
    # (the gate opens at most steps here: where it stays shut the lead's token is taken alone)
    assert out["stats"]["level"] == "mixed" and out["stats"]["gate_opened"] > 0 and out["completions"][0]["text"] == rendered != raw
    server = ServeProcess(["--models", path, "--level", "mixed", "--negative-prompt", NEGATIVE, "--cfg-scale", "1.8", "--gate", "0.9"], start_timeout=90)
    try:
        reply = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": PROMPT}], "max_tokens": N,
                                                                      "temperature": 0, "ignore_eos": True}, timeout=120)  # fmt: skip
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == rendered and reply.json()["localcos"]["level"] == "mixed"
    finally:
        server.stop()
    # the terminal chat: the same reply to the same message
    import asyncio

    from localcos.config import resolve
    from localcos.tui.app import ChatApp
    from test_tui import replies, send, until

    app = ChatApp(resolve({"models": [path], "level": "mixed", "negative_prompt": NEGATIVE, "cfg_scale": 1.8, "gate": 0.9, "temperature": 0,
                           "max_tokens": N, "ignore_eos": True}, json=True))  # fmt: skip

    texts: list[str] = []

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            await send(pilot, app, PROMPT)
            await until(pilot, lambda: len(replies(app)) == 1 and replies(app)[-1].complete, timeout=120)
            texts.extend(r.text for r in replies(app))

    asyncio.run(scenario())
    assert texts == [rendered]
