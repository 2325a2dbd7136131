"""`localcos serve` is safe to leave running: real server processes on 127.0.0.1 and free ports,
driven by httpx with a browser's headers where it matters, every wait bounded.

1. No code from requests: a request naming a file or a module as its combiner is a 400 and
   nothing is imported or executed; a custom combiner given at start is every request's default
   and its file runs once.
2. Cross-site: a foreign Origin (a web page's POST, text/plain or JSON, and its preflight) and a
   foreign Host (a DNS-rebinding page) are refused before the body is read; a body that is not
   JSON is a 415; --cors and --allowed-hosts let given pages and names in.
3. One thread touches llama.cpp: /health, /tokenize, /detokenize and token-id prompts hammered
   from several threads during long generations give the answers they give alone.
4. Cancellation: a client that disconnects during a long prompt or an echo scoring frees the
   engine within a llama.cpp call; Ctrl-C mid-prompt stops the server cleanly.
5. Fuzz: a few hundred generated bodies on every route get a 200 or a 4xx in OpenAI's shape, never
   a 500, and the caches are exact afterwards.
"""

from __future__ import annotations

import concurrent.futures
import json
import socket
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import assert_same_or_near_tie
from localcos import Ensemble, WeightedEnsemble
from localcos.backend import Model
from test_server import PROMPTS, Server, serving

ZEN = "Beautiful is better than ugly"  # what `import this` prints
BROWSER = {
    "User-Agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/156.0 Safari/537.36",
    "Accept": "*/*",
    "Sec-Fetch-Site": "cross-site",
    "Sec-Fetch-Mode": "no-cors",
    "Sec-Fetch-Dest": "empty",
}


def error(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


@pytest.fixture(scope="module")
def pair(models) -> list[Path]:
    return [models["base"], models["sibling"]]


@pytest.fixture(scope="module")
def server(pair):
    with serving(["--models", ",".join(map(str, pair)), "--ctx", "1024", "--alias", "duo"]) as s:
        yield s


# --- 1. no code from requests ---------------------------------------------------------------------


def test_a_request_never_imports_or_runs_code(pair, tmp_path):
    mark = tmp_path / "ran"
    script = tmp_path / "evil.py"
    script.write_text(f"open({str(mark)!r}, 'w').write('ran')\ndef f(logits):\n    return logits[0]\n")
    with serving(["--models", ",".join(map(str, pair)), "--ctx", "256"]) as s:
        client = s.client()
        for combine in (f"{script}:f", "this:x", "os:system", "localcos.core.combiners:load_custom", "evil.py:f"):
            for route, body in (
                ("/v1/completions", {"prompt": "Hello", "max_tokens": 2, "combine": combine}),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "combine": combine}),
            ):
                r = httpx.post(s.url + route, json=body, timeout=30)
                e = error(r)
                assert r.status_code == 400 and e["param"] == "combine", e
                assert "names code to import" in e["message"] and "localcos serve --combine" in e["message"]
        # the same through the official client's extra_body
        with pytest.raises(Exception) as raised:
            client.completions.create(model="x", prompt="Hello", max_tokens=2, extra_body={"combine": "this:x"})
        assert getattr(raised.value, "status_code", None) == 400
        assert s.health()["queue"]["served"] == 0  # nothing was queued
        rc, out, err = s.stop()
    assert rc == 0
    assert not mark.exists(), "the request's file was executed"
    assert ZEN not in out and ZEN not in err, "the request's module was imported"


def test_a_custom_combiner_from_the_command_line_is_the_default_and_runs_once(pair, tmp_path):
    counter = tmp_path / "imports"
    script = tmp_path / "first.py"
    script.write_text(f"open({str(counter)!r}, 'a').write('x')\ndef first(logits):\n    return logits[0]\n")
    with serving(["--models", ",".join(map(str, pair)), "--ctx", "256", "--combine", f"{script}:first"]) as s:
        info = httpx.get(s.url + "/v1/models", timeout=10).json()["data"][0]["localcos"]
        assert info["combiner"] == "first"
        client = s.client()
        outs = [
            client.completions.create(model=s_alias(s), prompt=p, max_tokens=12, temperature=0, extra_body={"return_token_ids": True})
            for p in PROMPTS[:3]
        ]
        assert all(o.model_extra["localcos"]["combiner"] == "first" for o in outs)
        # r = model 0 alone: its greedy text is model 0's (weights 1, 0)
        alone = WeightedEnsemble([1, 0]).bind(2, [1, 1])
        with Ensemble.load(pair, alone, n_ctx=256) as ens:
            for p, o in zip(PROMPTS[:3], outs):
                want = ens.generate(p, method="ensemble", temperature=0, max_tokens=12).token_ids
                prompt_ids = o.choices[0].model_extra["prompt_token_ids"]
                assert_same_or_near_tie(o.choices[0].model_extra["token_ids"], want, pair, alone, prompt_ids, "custom default")
        # a request may still choose a built-in one
        we = client.completions.create(model=s_alias(s), prompt="Hello", max_tokens=2, extra_body={"combine": "we"})
        assert we.model_extra["localcos"]["combiner"].startswith("we(")
    assert counter.read_text() == "x", "the combiner's file ran more than once (per request?)"


def s_alias(s) -> str:
    return httpx.get(s.url + "/v1/models", timeout=10).json()["data"][0]["id"]


# --- 2. cross-site ------------------------------------------------------------------------------------


def test_web_pages_and_rebinding_hosts_are_refused_before_the_body_is_read(server):
    url, port = server.url, server.port
    body = json.dumps({"prompt": PROMPTS[0], "max_tokens": 4}).encode()
    served = server.wait_idle()["queue"]["served"]

    def post(headers: dict, content: bytes = body, path: str = "/v1/completions") -> httpx.Response:
        return httpx.post(url + path, content=content, headers=headers, timeout=30)

    # a web page's "simple request": no preflight, text/plain, its Origin
    page = post({**BROWSER, "Origin": "http://evil.example", "Content-Type": "text/plain;charset=UTF-8"})
    assert page.status_code == 403 and error(page)["code"] == "origin_not_allowed"
    assert "--cors" in error(page)["message"]
    # the same page with a JSON body (a browser would preflight it), and its preflight
    assert post({**BROWSER, "Origin": "http://evil.example", "Content-Type": "application/json"}).status_code == 403
    preflight = httpx.options(
        url + "/v1/completions",
        headers={**BROWSER, "Origin": "http://evil.example", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"},
        timeout=10,
    )
    assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers
    assert httpx.get(url + "/v1/models", headers={"Origin": "http://evil.example"}, timeout=10).status_code == 403
    # a DNS-rebinding page: its own name in Host (the address is 127.0.0.1 by then)
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.nip.io:{port}", f"localhost:{port + 1}"):
        r = post({"Host": host, "Content-Type": "application/json"})
        assert r.status_code == 403 and error(r)["code"] == "host_not_allowed", (host, r.status_code)
        assert httpx.get(url + "/health", headers={"Host": host}, timeout=10).status_code == 403
    # a body that is not JSON, from a client that sends no Origin (curl -d sends a form type)
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        r = post({"Content-Type": content_type} if content_type else {})
        assert r.status_code == 415 and error(r)["code"] == "unsupported_media_type"
    # the body was never read: nothing of the above was generated
    assert server.wait_idle()["queue"]["served"] == served
    # what is allowed: no Origin (OpenAI clients, curl), the server's own origin, its own names
    for headers in (
        {"Content-Type": "application/json"},
        {"Content-Type": "application/json; charset=utf-8", "Origin": f"http://127.0.0.1:{port}"},
        {"Content-Type": "application/json", "Origin": f"http://localhost:{port}", "Host": f"localhost:{port}"},
        {"Content-Type": "application/json", "Host": "127.0.0.1"},
        {"Content-Type": "application/json", "Host": f"[::1]:{port}"},
    ):
        r = post(headers)
        assert r.status_code == 200, (headers, r.text)
    assert server.wait_idle()["queue"]["served"] == served + 5


def test_cors_and_allowed_hosts_let_given_pages_and_names_in(pair):
    args = ["--models", ",".join(map(str, pair)), "--ctx", "256", "--cors", "http://app.example:3000", "--allowed-hosts", "mybox.lan"]
    with serving(args) as s:
        json_body = {"Content-Type": "application/json"}
        ok = httpx.post(s.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers={**BROWSER, "Origin": "http://app.example:3000"}, timeout=30)
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://app.example:3000"
        preflight = httpx.options(
            s.url + "/v1/completions",
            headers={"Origin": "http://app.example:3000", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"},
            timeout=10,
        )
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "http://app.example:3000"
        other = httpx.post(s.url + "/v1/completions", json={"prompt": "Hi"}, headers={"Origin": "http://app.example:3001"}, timeout=10)
        assert other.status_code == 403
        named = httpx.post(s.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers={**json_body, "Host": f"mybox.lan:{s.port}"}, timeout=30)
        assert named.status_code == 200
        assert httpx.get(s.url + "/health", headers={"Host": f"otherbox.lan:{s.port}"}, timeout=10).status_code == 403


def test_bad_flags_are_one_line(pair):
    import subprocess
    import sys

    for flags in (["--cors", "a,,b"], ["--allowed-hosts", ","]):
        proc = subprocess.run([sys.executable, "-m", "localcos", "serve", "--models", str(pair[0]), *flags], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "empty" in proc.stderr, proc.stderr


# --- 3. one thread touches llama.cpp -----------------------------------------------------------------


@pytest.mark.slow
def test_tokenizer_routes_and_health_during_long_generations_answer_as_alone(server, pair):
    url = server.url
    texts = PROMPTS + ["Ünïcödé and 数字 mixed in", "  leading spaces and\nnew lines"]
    with Model(pair[0], vocab_only=True) as m:
        expected_ids = {t: m.tokenize(t, add_bos=False, special=True) for t in texts}
        expected_text = {t: m.detokenize(ids) for t, ids in expected_ids.items()}
    id_prompts = [expected_ids[t] for t in PROMPTS[:3]]
    echo = {"model": "duo", "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0}
    alone = [httpx.post(url + "/v1/completions", json={**echo, "prompt": ids}, timeout=60).json() for ids in id_prompts]

    stop_at = time.monotonic() + 60  # bounded however slow the machine
    rounds = {"health": 0, "tokenize": 0, "token-id prompt": 0}

    def generate(i: int) -> int:
        done = 0
        while time.monotonic() < stop_at and done < 3:
            body = {"prompt": PROMPTS[i], "max_tokens": 250, "ignore_eos": True, "seed": i + done, "stream": done % 2 == 0}
            r = httpx.post(url + "/v1/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            done += 1
        return done

    def hammer(kind: str, n: int) -> None:
        for k in range(n):
            if time.monotonic() > stop_at:
                return
            if kind == "health":
                for m in httpx.get(url + "/health", timeout=10).json()["models"]:
                    assert m["kv_positions"] == m["cached_tokens"], m
            elif kind == "tokenize":
                text = texts[k % len(texts)]
                got = httpx.post(url + "/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=10).json()["tokens"]
                assert got == expected_ids[text]
                back = httpx.post(url + "/detokenize", json={"tokens": got}, timeout=10).json()["prompt"]
                assert back == expected_text[text]
            else:
                j = k % len(id_prompts)
                r = httpx.post(url + "/v1/completions", json={**echo, "prompt": id_prompts[j]}, timeout=120).json()
                assert r["choices"][0]["text"] == alone[j]["choices"][0]["text"]
                got_lp = r["choices"][0]["logprobs"]["token_logprobs"]
                want_lp = alone[j]["choices"][0]["logprobs"]["token_logprobs"]
                assert got_lp[0] is None and max(abs(a - b) for a, b in zip(got_lp[1:], want_lp[1:])) < 2e-3
            rounds[kind] += 1

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        long = [pool.submit(generate, i) for i in range(2)]
        hammers = [pool.submit(hammer, what, n) for what, n in (("health", 150), ("tokenize", 100), ("health", 150), ("token-id prompt", 8))]
        for f in hammers + long:
            f.result()
    print(f"during long generations: {rounds}")
    assert rounds == {"health": 300, "tokenize": 100, "token-id prompt": 8}, rounds
    h = server.wait_idle()
    assert all(m["kv_positions"] == m["cached_tokens"] for m in h["models"])


# --- 4. cancellation ---------------------------------------------------------------------------------

LONG_PROMPT = [(7 * i) % 1000 + 3 for i in range(3000)]  # token ids: a prompt of 3000 tokens


@pytest.fixture(scope="module")
def slow_pair(models) -> list[str]:
    """The test pair loaded to evaluate prompts one token a call: a 3000-token prompt is 3000
    llama_decode calls, so a test can act in the middle of it."""
    return ["--models", f"{models['larger']},{models['larger']}", "--ctx", "4096", "--batch-size", "1", "--threads", "1"]


def _send(s, body: dict) -> socket.socket:
    """POST /v1/completions on a raw connection the test closes when it wants (a client leaving)."""
    data = json.dumps(body).encode()
    conn = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    head = f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    conn.sendall(head.encode() + data)
    return conn


def _mid_prompt(s, length: int, timeout: float = 30) -> int:
    """Wait (bounded) until the running request's prompt is part-way into the caches."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = s.health()
        cached = h["models"][0]["cached_tokens"]
        if h["queue"]["running"] and 0 < cached < length - 500:
            return cached
        time.sleep(0.005)
    raise AssertionError(f"never saw the prompt part-way in: {s.health()}")


@pytest.mark.parametrize("kind", ["prompt", "echo scoring"])
def test_a_client_that_leaves_mid_prompt_frees_the_engine_at_once(slow_pair, kind):
    body = {"prompt": LONG_PROMPT, "max_tokens": 4}
    if kind == "echo scoring":
        body = {**body, "max_tokens": 0, "echo": True, "logprobs": 1}
    with serving(slow_pair) as s:
        conn = _send(s, body)
        seen = _mid_prompt(s, len(LONG_PROMPT))
        conn.close()  # the client leaves
        h = s.wait_idle(timeout=5)  # within a llama.cpp call or so, not the rest of the prompt
        cached = h["models"][0]["cached_tokens"]
        assert seen <= cached < len(LONG_PROMPT) - 200, (seen, cached)
        assert all(m["kv_positions"] == m["cached_tokens"] for m in h["models"])
        out = httpx.post(s.url + "/v1/completions", json={"prompt": LONG_PROMPT[:100], "max_tokens": 2}, timeout=60)
        assert out.status_code == 200 and out.json()["usage"]["prompt_tokens"] == 100


def test_ctrl_c_mid_prompt_waits_for_the_call_in_flight_and_exits_cleanly(slow_pair):
    s = Server(slow_pair)
    conn = _send(s, {"prompt": LONG_PROMPT, "max_tokens": 4})
    _mid_prompt(s, len(LONG_PROMPT))
    t0 = time.monotonic()
    rc, out, err = s.stop(timeout=30)  # SIGINT, as Ctrl-C
    took = time.monotonic() - t0
    conn.close()
    # a context freed under a running llama_decode crashes the process (SIGSEGV, SIGABRT: rc < 0)
    assert rc == 0, (rc, err[-2000:])
    assert "stopped" in err and "Traceback" not in err and "internal error" not in err, err[-2000:]
    assert took < 10, f"shutdown took {took:.1f}s: the prompt was not cancelled between its calls"


# --- 5. fuzz -------------------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-3, max_value=40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.sampled_from(["we", "cd", "logit-mix", "cos", "ensemble", "auto", "duo", "this:x", "5,1", "user", "\u0000", "Ω≈ç√"]),
)
wild = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12
)
token_ids = st.one_of(st.lists(st.integers(0, 1023), min_size=1, max_size=12), st.lists(st.integers(-2, 1100), max_size=12))
texts = st.text(max_size=40)
# values a client might well send, edges included (about half the bodies get through to the
# models), mixed with wild ones
PLAUSIBLE = {
    "model": st.sampled_from(["duo", "duo", "gpt-4o"]),
    "max_tokens": st.integers(0, 80),
    "n": st.integers(1, 16),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "temperature": st.floats(0, 3),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(0, 2000),
    "min_p": st.floats(0, 1),
    "seed": st.integers(-1, 2**64),
    "stop": st.one_of(texts, st.lists(texts, max_size=3)),
    "ignore_eos": st.booleans(),
    "method": st.sampled_from(["ensemble", "sd", "naive-cos", "cos"]),
    "gamma": st.one_of(st.integers(1, 8), st.just("auto"), st.lists(st.integers(1, 6), min_size=2, max_size=2)),
    "combine": st.sampled_from(["we", "cd", "logit-mix"]),
    "weights": st.lists(st.floats(0.1, 5), min_size=2, max_size=2),
    "mu": st.floats(0, 1e6),
    "plausibility": st.floats(0.001, 1),
    "expert": st.integers(0, 1),
    "proposer": st.integers(0, 1),
    "return_token_ids": st.booleans(),
    "user": texts,
}
COMPLETION_ONLY = {"echo": st.booleans(), "logprobs": st.integers(0, 20)}
CHAT_ONLY = {"max_completion_tokens": st.integers(1, 80), "logprobs": st.booleans(), "top_logprobs": st.integers(0, 20)}
prompts = st.one_of(texts, token_ids, st.lists(token_ids, max_size=3), st.lists(texts, max_size=3))
messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "system", "assistant"]),
            "content": st.one_of(texts, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}), max_size=2)),
        }
    ),
    min_size=1,
    max_size=3,
)
completion = st.fixed_dictionaries({"prompt": prompts}, optional={**PLAUSIBLE, **COMPLETION_ONLY})
chat = st.fixed_dictionaries({"messages": messages}, optional={**PLAUSIBLE, **CHAT_ONLY})
tokenize = st.one_of(
    st.fixed_dictionaries({"prompt": texts}, optional={"add_special_tokens": st.booleans(), "model": st.just("duo")}),
    st.fixed_dictionaries({"messages": messages}),
)
detokenize = st.fixed_dictionaries({"tokens": token_ids}, optional={"model": st.just("duo")})
BY_ROUTE = {"/v1/completions": completion, "/v1/chat/completions": chat, "/tokenize": tokenize, "/detokenize": detokenize}
ROUTES = list(BY_ROUTE)
FIELD_NAMES = [
    *PLAUSIBLE,
    *COMPLETION_ONLY,
    *CHAT_ONLY,
    "prompt",
    "messages",
    "tokens",
    "add_special_tokens",
    "logit_bias",
    "suffix",
    "response_format",
    "foo",
]


@st.composite
def requests(draw) -> tuple[str, object]:
    """A route and a body: one a client of that route would send (edges included), the same with
    one field made wild, a body for another route, or anything at all."""
    route = draw(st.sampled_from(ROUTES))
    kind = draw(st.sampled_from(["plausible", "plausible", "one wild field", "another route's", "wild"]))
    if kind == "wild":
        return route, draw(wild)
    body = draw(BY_ROUTE[draw(st.sampled_from(ROUTES))] if kind == "another route's" else BY_ROUTE[route])
    if kind == "one wild field":
        body = {**body, draw(st.sampled_from(FIELD_NAMES)): draw(wild)}
    return route, body


@pytest.mark.slow
def test_fuzzed_bodies_get_a_200_or_an_openai_4xx_and_leave_the_caches_exact(models):
    pair = [models["chat"], models["chat_sibling"]]
    # a small context bounds every generation a fuzzed body can ask for
    with serving(["--models", ",".join(map(str, pair)), "--ctx", "64", "--alias", "duo"]) as s:
        seen: dict[int, int] = {}

        @settings(max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
        @given(request=requests())
        def post(request: tuple[str, object]) -> None:
            route, body = request
            r = httpx.post(s.url + route, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, timeout=120)
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            assert r.status_code == 200 or 400 <= r.status_code < 500, (route, body, r.status_code, r.text[:500])
            if r.status_code != 200:
                e = error(r)
                assert e["message"] and "Traceback" not in e["message"]
            elif isinstance(body, dict) and body.get("stream") is True and route.startswith("/v1/"):
                assert r.text.rstrip().endswith("data: [DONE]")

        post()
        print(f"fuzz: {sum(seen.values())} requests, answers by status {dict(sorted(seen.items()))}")
        assert sum(seen.values()) == 300 and seen.get(200, 0) >= 80 and sum(v for k, v in seen.items() if k >= 400) >= 80, seen
        h = s.wait_idle()
        assert all(m["kv_positions"] == m["cached_tokens"] and max(m["sequences"]) <= 64 for m in h["models"])
        body = {"prompt": "The river", "max_tokens": 10, "temperature": 0, "return_token_ids": True}
        served = httpx.post(s.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    with Ensemble.load(pair, n_ctx=64) as ens:
        want = ens.generate("The river", method="cos", temperature=0, max_tokens=10).token_ids
    prompt = served["prompt_token_ids"]
    assert_same_or_near_tie(served["token_ids"], want, pair, WeightedEnsemble().bind(2, [1, 1]), prompt, "after the fuzz")
