"""`localcos serve`: a real server process on 127.0.0.1 and a free port, called through the
official `openai` client (and httpx where a client must misbehave)."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from conftest import REAL_SPECS, assert_same_or_near_tie
from localcos import Ensemble, WeightedEnsemble
from localcos.backend import Model
from localcos.chat import ChatFormatter, Message
from localcos.testing.loopback import ServeProcess
from localcos.models.writer import cached_model

START_TIMEOUT = 90  # seconds for a server to load its models and answer /health
PROMPTS = [
    "The river flows from the mountains",
    "Once upon a time there was",
    "The small model writes a draft and",
    "In the morning the market opens",
    "Two plus two makes",
    "The old mill by the water",
    "A letter arrived for the",
    "The train leaves the station at",
]


class Server(ServeProcess):
    """A `localcos serve` process, with the official client."""

    def __init__(self, args: list[str], env: dict | None = None) -> None:
        super().__init__(args, env, start_timeout=START_TIMEOUT)

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, timeout=120, **kw)


@contextmanager
def serving(args: list[str], env: dict | None = None):
    server = Server(args, env)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def pair(models) -> list[Path]:
    return [models["base"], models["sibling"]]


@pytest.fixture(scope="module")
def server(pair):
    with serving(["--models", ",".join(map(str, pair)), "--ctx", "1024", "--max-queue", "16", "--alias", "duo"]) as s:
        yield s


def generate_cli(pair, prompt: str, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "localcos", "generate", "--models", ",".join(map(str, pair)), "--ctx", "1024", "--prompt", prompt, "--json", *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["completions"][0]


def test_text_completions_stream_equal_non_stream_and_localcos_generate(server, pair):
    client = server.client()
    prompt = PROMPTS[0]
    # the server's first generation: from an empty cache, as `localcos generate` starts
    first = client.completions.create(model="duo", prompt=prompt, max_tokens=24, temperature=0, extra_body={"return_token_ids": True})
    expected = generate_cli(pair, prompt, "--max-tokens", "24", "--temperature", "0")
    choice = first.choices[0]
    assert choice.text == expected["text"] and choice.model_extra["token_ids"] == expected["token_ids"]
    assert first.usage.completion_tokens == len(expected["token_ids"]) and first.usage.prompt_tokens > 0
    assert first.model_extra["localcos"]["method"] == "cos" and first.model_extra["localcos"]["tokens"] == len(expected["token_ids"])
    # the same request again, streamed: the same text, in pieces, then finish_reason and [DONE]
    pieces, finish = [], None
    for event in client.completions.create(model="duo", prompt=prompt, max_tokens=24, temperature=0, stream=True):
        pieces.append(event.choices[0].text)
        finish = event.choices[0].finish_reason or finish
    assert "".join(pieces) == choice.text and len([p for p in pieces if p]) > 1 and finish == choice.finish_reason


def test_ensemble_and_cos_give_the_same_greedy_text(server, pair):
    client = server.client()
    ens_combiner = WeightedEnsemble().bind(2, [1, 1])
    with Model(pair[0], vocab_only=True) as m:
        for prompt in PROMPTS[1:3]:
            outs = {
                method: client.completions.create(
                    model="duo", prompt=prompt, max_tokens=32, temperature=0, extra_body={"method": method, "return_token_ids": True}
                ).choices[0]
                for method in ("ensemble", "cos", "naive-cos")
            }
            ids = {k: v.model_extra["token_ids"] for k, v in outs.items()}
            prompt_ids = outs["cos"].model_extra["prompt_token_ids"]
            assert prompt_ids == m.tokenize(prompt)
            for method in ("cos", "naive-cos"):
                assert_same_or_near_tie(ids[method], ids["ensemble"], pair, ens_combiner, prompt_ids, f"{method} vs ensemble")


def test_chat_completions_need_a_template_and_say_so(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(model="duo", messages=[{"role": "user", "content": "Hi"}])
    assert "no chat template" in e.value.body["message"] and e.value.body["param"] == "messages"


def test_eight_concurrent_clients_each_get_what_they_get_alone(server, pair):
    client = server.client()

    def ask(prompt: str):
        c = client.completions.create(model="duo", prompt=prompt, max_tokens=20, temperature=0, extra_body={"return_token_ids": True}).choices[0]
        return c.model_extra["prompt_token_ids"], c.model_extra["token_ids"], c.text

    alone = [ask(p) for p in PROMPTS]
    served_before = server.health()["queue"]["served"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, PROMPTS))
    combiner = WeightedEnsemble().bind(2, [1, 1])
    for (p_ids, ids, text), (p_ids2, ids2, text2) in zip(alone, together):
        assert p_ids == p_ids2
        if assert_same_or_near_tie(ids2, ids, pair, combiner, p_ids, "concurrent vs alone") is None:
            assert text == text2
    assert server.wait_idle()["queue"]["served"] == served_before + len(PROMPTS)


@pytest.mark.slow
def test_disconnected_clients_are_cancelled_and_the_caches_stay_exact(server):
    long = {"model": "duo", "prompt": PROMPTS[3], "max_tokens": 900, "temperature": 1, "ignore_eos": True}
    served = server.wait_idle()["queue"]["served"]
    for i in range(50):
        body = {**long, "seed": i, "stream": i % 2 == 0}
        if body["stream"]:
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        break  # one event, then hang up
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(server.url + "/v1/completions", json=body, timeout=0.3)
        # cancelled within a round or so: 900 tokens would take seconds on this pair
        h = server.wait_idle(timeout=10)
    assert h["queue"]["served"] == served + 50
    for m in h["models"]:
        assert m["kv_positions"] == m["cached_tokens"] and max(m["sequences"]) <= 1024  # the decoder's invariant
    # and the next request is answered normally
    out = server.client().completions.create(model="duo", prompt=PROMPTS[4], max_tokens=8, temperature=0)
    assert out.choices[0].finish_reason in ("length", "stop") and out.usage.completion_tokens > 0


def _error(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def test_errors_have_openai_shape_and_status(server):
    url = server.url

    def post(path: str, **kw) -> httpx.Response:
        return httpx.post(url + path, timeout=30, **kw)

    cases = [
        (post("/v1/completions", json={"prompt": "x", "temperature": -1}), 400, "temperature"),
        (post("/v1/completions", json={"prompt": "x", "max_tokens": "many"}), 400, "max_tokens"),
        (post("/v1/completions", json={"prompt": "x", "gamma": "fast"}), 400, "gamma"),
        (post("/v1/completions", json={"prompt": "x", "weights": [1]}), 400, "weights"),
        (post("/v1/completions", json={"prompt": 5}), 400, "prompt"),
        (post("/v1/completions", json={"prompt": [[1, 2, 999999]]}), 400, "prompt"),
        (post("/v1/completions", json={"prompt": "x", "stream": "yes"}), 400, "stream"),
        (post("/v1/completions", json={"prompt": "x", "presence_penalty": 1}), 400, "presence_penalty"),
        (post("/v1/completions", json={"prompt": "x", "model": "gpt-4"}), 404, "model"),
        (post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"}), 400, None),
        (post("/v1/completions", json=["a", "list"]), 400, None),
        (post("/v1/nothing", json={}), 404, None),
        (post("/v1/completions", content=b"x" * (17 << 20), headers={"content-type": "application/json"}), 413, None),
        # chunked, without a Content-Length: counted as it arrives
        (post("/v1/completions", content=(b"x" * (1 << 20) for _ in range(17)), headers={"content-type": "application/json"}), 413, None),
        (post("/v1/completions", content=b'{"prompt": "x"}', headers={"content-type": "text/plain"}), 415, None),
        (post("/v1/completions", json={"prompt": "x", "combine": "this:x"}), 400, "combine"),
        (post("/v1/completions", json={"prompt": "x", "gate": 2}), 400, "gate"),
        (post("/v1/completions", json={"prompt": "x", "lead": 0}), 400, "lead"),
        (post("/v1/completions", json={"prompt": "x", "gate": 0.5, "lead": 2}), 400, "lead"),
        (post("/v1/completions", json={"prompt": "x", "response_format": {"type": "xml"}}), 400, "response_format"),
        (post("/v1/completions", json={"prompt": "x", "frobnicate": 1}), 400, "frobnicate"),
        # the byte level's own draft length, sent to models that decode at the token level
        (post("/v1/completions", json={"prompt": "x", "byte_gamma": 8}), 400, "byte_gamma"),
        (post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "byte_gamma": "auto"}), 400, "byte_gamma"),
        (post("/tokenize", json={"prompt": 5}), 400, "prompt"),
        (post("/detokenize", json={"tokens": [1, 10**9]}), 400, "tokens"),
    ]
    for response, status, param in cases:
        error = _error(response)
        assert response.status_code == status, (status, error)
        assert error["param"] == param, error
        assert "Traceback" not in error["message"] and error["message"]
    # a prompt longer than the context
    too_long = post("/v1/completions", json={"prompt": [[5] * 1100]})
    assert too_long.status_code == 400 and _error(too_long)["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        server.client().completions.create(model="duo", prompt=" word" * 1100)
    assert e.value.code == "context_length_exceeded"
    assert server.health()["status"] == "ok"


def test_a_request_gates_its_combination(server):
    """`gate` and `lead` per request: r is the lead's own distribution where it is sure; the
    reply's statistics say where the gate opened."""
    client = server.client()
    out = client.completions.create(model="duo", prompt=PROMPTS[1], max_tokens=32, temperature=0, extra_body={"gate": 0.4, "lead": 0})
    stats = out.model_extra["localcos"]
    assert stats["combiner"] == "we(0.5,0.5)+gate(0.4,lead=0)" and stats["gate_decided"] == 32 and 0 < stats["gate_opened"] < 32
    # the ensemble's step: where the lead decides alone, the other model is not evaluated
    out = client.completions.create(model="duo", prompt=PROMPTS[1], max_tokens=32, temperature=0, extra_body={"gate": 0.4, "lead": 0, "method": "ensemble"})
    stats = out.model_extra["localcos"]
    assert stats["models"][1]["calls"] <= stats["gate_opened"] < stats["models"][0]["calls"] == 31


def test_a_request_for_another_combiner_leaves_the_servers_parameters_behind(pair):
    """A server started with we weights (as a preset gives them) answers a request for cd: the
    weights belong to we, so they do not follow the request to cd (they made it a 400)."""
    from localcos.config import resolve

    served = resolve({"models": [str(p) for p in pair], "weights": [0.3, 0.7]}, json=True)
    cd = served.with_values({"combine": "cd", "mu": 0.2}, json=True, parsed=True)
    assert (cd.combine.combine, cd.combine.weights, cd.combine.mu) == ("cd", None, 0.2)
    assert served.with_values({"mu": 0.2}, json=True, parsed=True).combine.weights == (0.3, 0.7)


def test_queue_full_is_503_with_retry_after_and_the_api_key_guards(pair):
    models = ",".join(map(str, pair))
    with serving(["--models", models, "--ctx", "1024", "--max-queue", "0"], env={"LOCALCOS_API_KEY": "s3cret"}) as s:
        anyone = httpx.get(s.url + "/v1/models", timeout=10)
        assert anyone.status_code == 401 and _error(anyone)["code"] == "invalid_api_key"
        wrong = httpx.get(s.url + "/v1/models", headers={"Authorization": "Bearer s3cret!"}, timeout=10)
        assert wrong.status_code == 401
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="nope").completions.create(model="x", prompt="a")
        key = {"Authorization": "Bearer s3cret"}
        alias = httpx.get(s.url + "/v1/models", headers=key, timeout=10).json()["data"][0]["id"]
        assert alias.endswith(".gguf") and "+" in alias
        # one long generation runs; with no room to wait, the next request is refused
        long = {"prompt": "a", "max_tokens": 900, "ignore_eos": True}
        with httpx.stream("POST", s.url + "/v1/completions", json={**long, "stream": True}, headers=key, timeout=60) as r:
            lines = r.iter_lines()  # kept: a dropped iterator closes the connection
            next(lines)
            refused = httpx.post(s.url + "/v1/completions", json={"prompt": "b", "max_tokens": 2}, headers=key, timeout=10)
            assert refused.status_code == 503 and refused.headers["retry-after"].isdigit()
            assert _error(refused)["code"] == "queue_full"
        s.wait_idle()
        ok = s.client(api_key="s3cret").completions.create(model=alias, prompt="a", max_tokens=2, extra_body={"ignore_eos": True})
        assert ok.usage.completion_tokens == 2 and ok.choices[0].finish_reason == "length"  # served again once there is room
        rc, _, printed = s.stop()
    assert rc == 0 and f"127.0.0.1:{s.port}" in printed and "curl" in printed and "stopped" in printed


def _log_r(pair, tokens: list[int]) -> np.ndarray:
    """log r(tokens[i] | tokens[:i]) for i >= 1, from fresh contexts, written out in NumPy."""
    rows = []
    for p in pair:
        m = Model(p, n_ctx=256)
        rows.append(m.evaluate(tokens).astype(np.float64))
        m.close()
    logp = [r - np.log(np.exp(r - r.max(1, keepdims=True)).sum(1, keepdims=True)) - r.max(1, keepdims=True) for r in rows]
    log_r = np.logaddexp(np.log(0.5) + logp[0], np.log(0.5) + logp[1])
    return log_r[np.arange(len(tokens) - 1), tokens[1:]], log_r


def test_lm_eval_loglikelihood_requests(server, pair):
    """What lm-evaluation-harness's local-completions model sends for log-likelihood tasks."""
    tok = httpx.post(server.url + "/tokenize", json={"prompt": "The river flows from the mountains"}, timeout=10).json()
    info = httpx.get(server.url + "/tokenizer_info", timeout=10).json()
    assert info["model_max_length"] == 1024 and tok["count"] == len(tok["tokens"])
    back = httpx.post(server.url + "/detokenize", json={"tokens": tok["tokens"]}, timeout=10).json()["prompt"]
    assert back.endswith("The river flows from the mountains")
    prompts = [tok["tokens"], tok["tokens"][:4] + [17, 40, 99], [3, 9, 27, 81, 243]]
    body = {"model": "duo", "prompt": prompts, "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0, "seed": 1234}
    out = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    choices = sorted(out["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1, 2]
    for ids, choice in zip(prompts, choices):
        lp = choice["logprobs"]
        values = lp["token_logprobs"]
        assert len(values) == len(ids) + 1 and values[0] is None
        expected, log_r = _log_r(pair, ids)
        np.testing.assert_allclose(values[1 : len(ids)], expected, atol=2e-3)
        # the generated token is r's greedy choice and is scored too; top_logprobs holds it
        generated = values[len(ids)]
        assert generated == pytest.approx(float(log_r[-1].max()), abs=2e-3)
        for position, entry in enumerate(lp["top_logprobs"][1:], start=1):
            assert lp["tokens"][position] in entry and len(entry) <= 2
        # lm-eval's greedy check: the continuation's tokens are each the top one
        greedy = all(max(e.values()) == e[t] for e, t in zip(lp["top_logprobs"][1:], lp["tokens"][1:]))
        assert greedy == all(log_r[i].argmax() == ids[i + 1] for i in range(len(ids) - 1))
    # text prompts: nothing is added to what was sent (no BOS), one entry per token
    text = httpx.post(server.url + "/v1/completions", json={**body, "prompt": ["The river", "flows"]}, timeout=60).json()
    with Model(pair[0], vocab_only=True) as m:
        for c, words in zip(sorted(text["choices"], key=lambda c: c["index"]), ["The river", "flows"]):
            sent = m.tokenize(words, add_bos=False)
            assert len(c["logprobs"]["token_logprobs"]) == len(sent) + 1 and c["logprobs"]["token_logprobs"][0] is None
            assert "".join(c["logprobs"]["tokens"][:-1]).strip() == words


def test_qwen2_chat_renders_chatml_and_im_end_ends_replies(llama_vocab, model_dir):
    """Qwen2's vocabulary and ChatML template (llama.cpp's test file), weights whose end tokens
    follow half of all tokens: replies end, and some at <|im_end|>."""
    vocab, spec = REAL_SPECS["qwen2"]
    tokenizer = str(llama_vocab(vocab))
    heavy = [cached_model(replace(spec, tokenizer=tokenizer, eos_rate=0.5, noise=n, name=f"r-qwen2-eos{i}"), model_dir) for i, n in enumerate((0.0, 0.3))]
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a river."}]
    with serving(["--models", ",".join(map(str, heavy)), "--ctx", "512", "--alias", "qwen"]) as s:
        with Ensemble.load(heavy, n_ctx=512) as ens:
            expected = ChatFormatter(ens).tokens([Message(m["role"], m["content"]) for m in messages])
            im_end = ens.models[0].tokenize("<|im_end|>", add_bos=False, special=True)[0]
        info = httpx.get(s.url + "/tokenizer_info", timeout=10).json()
        assert "<|im_start|>" in info["chat_template"]
        rendered = httpx.post(s.url + "/tokenize", json={"messages": messages}, timeout=10).json()["tokens"]
        assert rendered == expected
        client = s.client()
        out = client.chat.completions.create(model="qwen", messages=messages, n=8, seed=3, max_tokens=60, extra_body={"return_token_ids": True})
        assert out.usage.prompt_tokens == len(expected) * 1
        reasons = [(c.finish_reason, c.model_extra["stop_reason"]) for c in out.choices]
        assert all(r == "stop" for r, _ in reasons), reasons
        assert any(stop == im_end for _, stop in reasons), reasons
        for c in out.choices:
            assert "<|im_end|>" not in c.message.content and im_end not in c.model_extra["token_ids"]
        # streamed: the role first, then content, and the same end
        events = list(client.chat.completions.create(model="qwen", messages=messages, seed=3, max_tokens=60, stream=True))
        assert events[0].choices[0].delta.role == "assistant"
        assert events[-1].choices[0].finish_reason == "stop"
        streamed = "".join(e.choices[0].delta.content or "" for e in events)
        alone = client.chat.completions.create(model="qwen", messages=messages, seed=3, max_tokens=60)
        assert streamed == alone.choices[0].message.content


def test_multiple_choice_requests_cost_their_context_once(server, pair):
    """lm-evaluation-harness sends each choice of an item as its own request (context + choice,
    echo, logprobs 1, max_tokens 1): the context's scores and cells are kept, so only the first
    request evaluates it; the scores equal a fresh computation's."""
    context = [(13 * i) % 1000 + 5 for i in range(200)]
    choices = [[11, 12, 13], [21, 22], [31, 32, 33, 34], [41]]
    body = {"model": "duo", "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0}
    evaluated = []
    for choice in choices:
        before = server.health()["models"]
        out = httpx.post(server.url + "/v1/completions", json={**body, "prompt": context + choice}, timeout=60).json()
        after = server.wait_idle()["models"]
        evaluated.append(max(a["evaluated_tokens"] - b["evaluated_tokens"] for a, b in zip(after, before)))
        values = out["choices"][0]["logprobs"]["token_logprobs"]
        expected, _ = _log_r(pair, context + choice)
        np.testing.assert_allclose(values[1 : len(context) + len(choice)], expected, atol=2e-3)
    # the first request: the context once (scored, and shared by the generation), its choice and
    # a token or two; the others: their own tokens and a few
    assert len(context) <= evaluated[0] < len(context) + 12, evaluated
    assert all(e < 12 for e in evaluated[1:]), evaluated


def test_the_engine_loads_the_models_in_the_thread_that_decodes(models):
    """llama.cpp's CPU threads belong to the thread that first computes (a decode from another
    thread ran a fifth slower): the engine loads the models in its own thread, the one that
    decodes; a load that fails is raised by the constructor."""
    import threading

    from localcos.errors import ConfigError
    from localcos.runtime.models import LevelViews
    from localcos.server.engine import Engine

    loaders: list[threading.Thread] = []

    def load():  # type: ignore[no-untyped-def]
        loaders.append(threading.current_thread())
        return LevelViews(Ensemble.load([models["base"]], n_ctx=256))

    engine = Engine(load)
    try:
        assert loaders == [engine._thread] and engine._thread is not threading.current_thread()
    finally:
        engine.shutdown()
        engine.loaded.close()

    def broken():  # type: ignore[no-untyped-def]
        raise ConfigError("no such model", param="models")

    with pytest.raises(ConfigError, match="no such model"):
        Engine(broken)
