"""`localcos serve` speaks Ollama's API too: a real server process driven by the official
`ollama` Python client (and httpx for the raw NDJSON lines and the misbehaving requests), an
ensemble of two models behind it, the same text for the same request as OpenAI's routes."""

from __future__ import annotations

import json

import httpx
import ollama
import openai
import pytest

from localcos.testing.loopback import ServeProcess

START_TIMEOUT = 90
MESSAGES = [{"role": "user", "content": "The river flows from the mountains"}]


@pytest.fixture(scope="module")
def server(models):
    # two models with a chat template, combined (WE), greedy by default
    pair = ",".join(str(models[name]) for name in ("chat", "chat_sibling"))
    s = ServeProcess(["--models", pair, "--ctx", "512", "--alias", "duo", "--chat-template-model", "0", "--temperature", "0"],
                     start_timeout=START_TIMEOUT)  # fmt: skip
    try:
        yield s
    finally:
        s.stop()


def client(server) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=120)


def test_list_show_version_and_ps_describe_the_served_ensemble(server, models):
    from localcos.backend.gguf_file import read_info

    c = client(server)
    listed = c.list().models
    assert [m.model for m in listed] == ["duo"]
    details = listed[0].details
    infos = [read_info(models[name], tokens=False) for name in ("chat", "chat_sibling")]
    assert details.format == "gguf" and details.family == infos[0].architecture and listed[0].size == sum(
        models[name].stat().st_size for name in ("chat", "chat_sibling"))
    assert details.quantization_level == infos[0].quantization
    shown = c.show("duo")
    assert shown.template and "{%" in shown.template and shown.modelinfo["localcos.models"] == [i.label for i in infos]
    assert "we" in shown.modelinfo["localcos.combiner"] and shown.capabilities == ["completion"]
    assert [m.model for m in c.ps().models] == ["duo"]
    assert httpx.get(server.url + "/api/version", timeout=10).json()["version"]


def test_chat_is_the_openai_routes_text_streamed_or_not(server):
    c = client(server)
    whole = c.chat("duo", messages=MESSAGES, options={"num_predict": 12, "seed": 1})
    pieces = list(c.chat("duo", messages=MESSAGES, options={"num_predict": 12, "seed": 1}, stream=True))
    assert "".join(p.message.content for p in pieces) == whole.message.content and whole.message.content
    assert pieces[-1].done and pieces[-1].done_reason in ("stop", "length") and pieces[-1].eval_count == whole.eval_count
    assert whole.done and whole.prompt_eval_count > 0 and whole.eval_count <= 12 and whole.total_duration >= whole.eval_duration > 0
    openai_text = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0).chat.completions.create(
        model="duo", messages=MESSAGES, max_tokens=12, seed=1).choices[0].message.content  # fmt: skip
    assert whole.message.content == openai_text
    # localcos's own options, as extra_body takes them on the OpenAI routes
    alone = c.chat("duo", messages=MESSAGES, options={"num_predict": 12, "combine": "we", "weights": [1, 0], "method": "ensemble"})
    openai_alone = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0).chat.completions.create(
        model="duo", messages=MESSAGES, max_tokens=12, extra_body={"combine": "we", "weights": [1, 0], "method": "ensemble"})  # fmt: skip
    assert alone.message.content == openai_alone.choices[0].message.content
    # localcos's statistics ride along (a field Ollama's clients leave aside): the second model never ran
    raw = httpx.post(server.url + "/api/chat", json={"model": "duo", "messages": MESSAGES, "stream": False,
                                                    "options": {"num_predict": 12, "combine": "we", "weights": [1, 0], "method": "ensemble"}},
                     timeout=120).json()  # fmt: skip
    assert raw["message"]["content"] == alone.message.content and raw["localcos"]["calls"][1] == 0


def test_generate_reads_the_prompt_through_the_template_unless_raw(server):
    c = client(server)
    templated = c.generate("duo", "The river flows from the mountains", options={"num_predict": 10})
    chat = c.chat("duo", messages=MESSAGES, options={"num_predict": 10})
    assert templated.response == chat.message.content and templated.done
    raw = c.generate("duo", "The river flows from the mountains", raw=True, options={"num_predict": 10})
    completion = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0).completions.create(
        model="duo", prompt="The river flows from the mountains", max_tokens=10)  # fmt: skip
    assert raw.response == completion.choices[0].text
    streamed = "".join(p.response for p in c.generate("duo", "The river flows from the mountains", raw=True, options={"num_predict": 10}, stream=True))
    assert streamed == raw.response


def test_structured_output_by_format(server):
    c = client(server)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["a", "b"]}}, "required": ["ok", "kind"],
              "additionalProperties": False}  # fmt: skip
    reply = c.chat("duo", messages=MESSAGES, format=schema, options={"num_predict": 64})
    value = json.loads(reply.message.content)
    assert reply.done_reason == "stop" and set(value) == {"ok", "kind"} and isinstance(value["ok"], bool) and value["kind"] in ("a", "b")
    reply = c.generate("duo", "The river", format="json", options={"num_predict": 64})
    assert reply.response.lstrip().startswith("{")  # one JSON object, however far it got
    if reply.done_reason == "stop":
        assert isinstance(json.loads(reply.response), dict)


def test_the_streamed_lines_are_ndjson_with_ollamas_fields(server):
    body = {"model": "duo", "messages": MESSAGES, "options": {"num_predict": 6}}  # Ollama streams unless told not to
    with httpx.stream("POST", server.url + "/api/chat", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert len(lines) >= 2 and all(not line["done"] for line in lines[:-1]) and lines[-1]["done"]
    assert all({"model", "created_at", "message", "done"} <= set(line) for line in lines)
    last = lines[-1]
    for field in ("done_reason", "total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"):
        assert field in last, field
    assert last["eval_count"] == 6 and last["done_reason"] == "length"
    assert last["created_at"].endswith("Z")


@pytest.mark.parametrize(
    "route, body, status, says",
    [
        ("/api/chat", {"model": "nope", "messages": MESSAGES}, 404, "not found"),
        ("/api/show", {"model": "nope"}, 404, "not found"),
        ("/api/chat", {"model": "duo", "messages": MESSAGES, "options": {"temperature": -1}}, 400, "temperature"),
        ("/api/chat", {"model": "duo", "messages": MESSAGES, "options": {"repeat_penalty": 1.3}}, 400, "repeat_penalty"),
        ("/api/chat", {"model": "duo", "messages": MESSAGES, "options": {"num_thread": 4}}, 400, "--threads"),
        ("/api/chat", {"model": "duo", "messages": MESSAGES, "options": {"no_such_option": 1}}, 400, "no_such_option"),
        ("/api/chat", {"model": "duo", "messages": MESSAGES, "options": {"num_ctx": 100000}}, 400, "num_ctx"),
        ("/api/chat", {"model": "duo", "messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, 400, "images"),
        ("/api/generate", {"model": "duo", "prompt": "hi", "images": ["aGk="]}, 400, "images"),
        ("/api/chat", {"model": "duo", "messages": []}, 400, "messages"),
    ],
)
def test_bad_requests_get_ollamas_error_shape(server, route, body, status, says):
    response = httpx.post(server.url + route, json={**({"stream": False} if route != "/api/show" else {}), **body}, timeout=60)
    assert response.status_code == status and set(response.json()) == {"error"} and says in response.json()["error"], response.text


def test_the_official_client_raises_on_errors_and_the_guards_hold(server):
    c = client(server)
    with pytest.raises(ollama.ResponseError) as e:
        c.chat("nope", messages=MESSAGES)
    assert e.value.status_code == 404
    not_json = httpx.post(server.url + "/api/chat", content=b"{not json", headers={"content-type": "application/json"}, timeout=30)
    assert not_json.status_code == 400 and set(not_json.json()) == {"error"}
    foreign = httpx.post(server.url + "/api/chat", json={"model": "duo", "messages": MESSAGES}, headers={"origin": "http://evil.example"}, timeout=30)
    assert foreign.status_code == 403 and set(foreign.json()) == {"error"}
    as_text = httpx.post(server.url + "/api/generate", content=b"{}", headers={"content-type": "text/plain"}, timeout=30)
    assert as_text.status_code == 415 and set(as_text.json()) == {"error"}
    # keep_alive is accepted (the models stay loaded while the server runs)
    assert c.generate("duo", "hi", keep_alive="5m", options={"num_predict": 2}).done


def test_the_api_key_guards_ollamas_routes_too(models):
    s = ServeProcess(["--models", str(models["chat"]), "--ctx", "256", "--alias", "one"], env={"LOCALCOS_API_KEY": "k3y"}, start_timeout=START_TIMEOUT)
    try:
        with pytest.raises(ollama.ResponseError) as e:
            ollama.Client(host=s.url).list()
        assert e.value.status_code == 401
        assert [m.model for m in ollama.Client(host=s.url, headers={"Authorization": "Bearer k3y"}).list().models] == ["one"]
    finally:
        s.stop()
