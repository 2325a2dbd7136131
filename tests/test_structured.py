"""Structured output: a constraint (JSON schema, GBNF grammar, any JSON object, tool calls) is a
token mask applied to r and to every draft distribution, so every method samples exactly from
the constrained r and every completion is in the language.

1. Exactness on the fake models: the joint law of continuations under a grammar is the
   constrained r's (chi-square), for cos, sd, naive-cos and the ensemble; a draft token the
   grammar refuses is rejected and the matcher rolls back with the caches.
2. On llama.cpp models with Qwen2's real vocabulary: every sampled completion of every method
   parses and validates under a JSON schema (lookup drafts included); invalid schemas and
   grammars are one clear error before any model call.
3. The server: OpenAI's response_format (json_object, json_schema) on both routes, streamed too,
   and tools answered as message.tool_calls, through the official client.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import openai
import pytest

from conftest import REAL_SPECS
from fakes import FakeModel, exact_joint
from localcos import Ensemble, WeightedEnsemble
from localcos.core.decoding import Decoder, Draft
from localcos.core.sampling import Sampler
from localcos.core.text import TextAssembler
from localcos.errors import ConfigError
from localcos.grammar import Matcher, gbnf, json_schema
from localcos.models.writer import cached_model
from localcos.testing.invariants import assert_invariants, checked
from statcheck import assert_law
from test_server import serving

PARITY = 'root ::= e (o e)* o?\ne ::= "a" | "c" | "e" | "g" | "i"\no ::= "b" | "d" | "f" | "h" | "j"'  # even, odd, even, ...


def allowed_next(prefix: tuple[int, ...], token: int) -> bool:
    """The parity grammar, written again in Python: tokens alternate even, odd, even, ..."""
    return token % 2 == len(prefix) % 2


@pytest.mark.parametrize("method, gamma", [("ensemble", None), ("sd", 3), ("naive-cos", 2), ("cos", 2)])
def test_the_joint_law_under_a_grammar_is_the_constrained_r(method, gamma):
    models = [FakeModel(seed=20 + i, n_params=1000 * (i + 1)) for i in range(2)]
    combiner = WeightedEnsemble([0.4, 0.6])
    ens = Ensemble(models, combiner)
    outs = checked(ens).generate_many([1, 2], 2000, method=method, gamma=gamma, max_tokens=3, seed=17, grammar=gbnf(PARITY))
    assert_law(outs, exact_joint(models, ens.combiner, Sampler(), [1, 2], 3, allowed=allowed_next), f"{method} under the grammar")
    if method != "ensemble":
        assert sum(o.stats.rejected for o in outs) > 30


def test_a_draft_token_the_grammar_refuses_is_rejected_and_the_matcher_rolls_back():
    models = [FakeModel(seed=20 + i, n_params=1000 * (i + 1)) for i in range(2)]
    ens = Ensemble(models, WeightedEnsemble([0.5, 0.5]))
    prompt = [1, 2]
    sampler = Sampler()
    dec = Decoder(
        [m.slots[0] for m in models], ens.combiner, sampler, np.random.default_rng(0), prompt,
        [m.evaluate(prompt, 1)[0] for m in models], max_length=10, end_tokens=set(), text=TextAssembler(models[0].piece),
        constraint=Matcher(ens.vocabulary(), gbnf(PARITY)),
    )  # fmt: skip
    # a draft of three tokens whose first breaks the grammar (odd first), all scored by both models
    for token in (1, 2, 3):
        dec.pending.append(Draft(token, 0, np.eye(10, dtype=np.float32)[token]))
    for i, m in enumerate(models):
        seq = dec.sequence()
        rows = m.evaluate(seq[len(m.tokens) :], 3)
        for j in range(3):
            dec.rows[i][len(prompt) + j + 1] = rows[j]
    assert dec.constraint.mask(len(prompt) + 2) is None  # past the refused token: no mask
    assert dec.constraint.consumed == []  # the matcher stopped before it
    assert dec.verify_pending(3)  # rejected at once: r, constrained, gives an odd token nothing
    assert len(dec.committed) == len(prompt) + 1 and dec.committed[-1] % 2 == 0  # resampled: even
    assert_invariants(dec)
    dec.constraint.mask(len(dec.committed))
    assert dec.constraint.consumed == dec.committed[len(prompt) :]  # rolled back and moved on


# --- llama.cpp models with a real vocabulary ------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def valid(text: str) -> bool:
    """Valid under SCHEMA (checked by hand, not by the engine that made it)."""
    value = json.loads(text)
    return (
        set(value) == {"name", "age", "tags"}
        and isinstance(value["name"], str) and len(value["name"]) <= 12
        and isinstance(value["age"], int) and 0 <= value["age"] <= 120
        and isinstance(value["tags"], list) and len(value["tags"]) <= 3 and all(isinstance(t, str) and len(t) <= 8 for t in value["tags"])
    )  # fmt: skip


@pytest.fixture(scope="module")
def qwen_pair(real_models):
    return [real_models["qwen2"], real_models["qwen2_sibling"]]


def test_every_sampled_completion_validates_under_the_schema(qwen_pair):
    constraint = json_schema(SCHEMA)
    with Ensemble.load(qwen_pair, n_ctx=512, parallel=4) as ens:
        for method, extra in (("ensemble", {}), ("sd", {}), ("naive-cos", {}), ("cos", {}), ("cos", {"lookup": "on", "lookup_ngram": (1, 4)})):
            outs = checked(ens).generate_many("A person:", 12, method=method, gamma=3, max_tokens=120, temperature=1.0, seed=5, json_schema=constraint,
                                              **extra)  # fmt: skip
            for o in outs:
                assert o.finish_reason == "stop" and valid(o.text), (method, o.finish_reason, o.text)
        # greedy, the four methods agree (a near-tie aside) and stay valid
        greedy = {
            m: ens.generate("A person:", method=m, max_tokens=120, temperature=0, json_schema=constraint).text for m in ("ensemble", "cos")
        }
        assert all(valid(t) for t in greedy.values())


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--json-schema", '{"type": "objekt"}', "Invalid type"),
        ("--json-schema", "[1, 2]", "must be a JSON object"),
        ("--json-schema", "{not json", "not valid JSON"),
        ("--grammar", 'root ::= "a" | b', "not found"),
    ],
)
def test_a_bad_constraint_is_one_line_before_any_model_is_loaded(models, flag, value, message):
    proc = subprocess.run(
        [sys.executable, "-m", "localcos", "generate", "--models", "/nonexistent.gguf", "--prompt", "x", flag, value],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    # the model file does not exist: the constraint was refused before anything was loaded
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    with pytest.raises(ConfigError, match="give one constraint"):
        from localcos import GenerationConfig

        GenerationConfig(json_object=True, grammar=gbnf(PARITY))


# --- the server --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tools_pair(llama_vocab, model_dir):
    """Qwen2's vocabulary with Qwen2.5's chat template, which describes tools."""
    from localcos.testing import llamacpp_sdist

    vocab, spec = REAL_SPECS["qwen2"]
    tokenizer = str(llama_vocab(vocab))  # first: the sdist, fetched under the workers' lock
    base = replace(spec, tokenizer=tokenizer, chat_template=llamacpp_sdist.template("Qwen-Qwen2.5-7B-Instruct"))
    return [
        cached_model(replace(base, name="r-qwen25-tools"), model_dir),
        cached_model(replace(base, noise=0.3, name="r-qwen25-tools-b"), model_dir),
    ]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}


def test_response_format_and_tools_through_the_openai_client(tools_pair):
    with serving(["--models", ",".join(map(str, tools_pair)), "--ctx", "1024", "--alias", "q", "--max-tokens", "120"]) as s:
        client = s.client()
        messages = [{"role": "user", "content": "Describe a person."}]
        schema_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
        # chat, json_schema: n choices, all valid
        out = client.chat.completions.create(model="q", messages=messages, response_format=schema_format, n=4, seed=1)
        assert all(c.finish_reason == "stop" and valid(c.message.content) for c in out.choices), [c.message.content for c in out.choices]
        # chat, json_object, streamed
        events = list(
            client.chat.completions.create(model="q", messages=messages, response_format={"type": "json_object"}, stream=True, seed=2)
        )
        text = "".join(e.choices[0].delta.content or "" for e in events if e.choices)
        assert isinstance(json.loads(text), dict) and events[-1].choices[0].finish_reason == "stop"
        # completions, json_schema (localcos takes it on both routes)
        done = client.completions.create(model="q", prompt="Person:", max_tokens=120, extra_body={"response_format": schema_format}, seed=3)
        assert valid(done.choices[0].text)
        # an invalid schema is a 400 before any model call
        served = s.health()["queue"]["served"]
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(
                model="q",
                messages=messages,
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}},
            )
        assert e.value.body["param"] == "response_format" and "objekt" in e.value.body["message"]
        assert s.health()["queue"]["served"] == served
        # tools: a required call comes back as message.tool_calls, its arguments valid
        asked = client.chat.completions.create(
            model="q", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER], tool_choice="required", seed=4
        )
        choice = asked.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
        (call,) = choice.message.tool_calls
        arguments = json.loads(call.function.arguments)
        assert call.function.name == "get_weather" and set(arguments) == {"city", "days"} and 1 <= arguments["days"] <= 7
        # its result goes back through the template, and the reply may be text (tool_choice none)
        follow = [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'},
        ]
        reply = client.chat.completions.create(model="q", messages=follow, tools=[WEATHER], tool_choice="none", max_tokens=16, seed=5)
        assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason in ("stop", "length")
        # streamed, a call arrives whole in the closing event, and its text is not streamed as content
        events = list(client.chat.completions.create(model="q", messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER],
                                                     tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True, seed=6))  # fmt: skip
        assert not "".join(e.choices[0].delta.content or "" for e in events if e.choices)
        last = [e for e in events if e.choices][-1].choices[0]
        assert last.finish_reason == "tool_calls" and last.delta.tool_calls[0].function.name == "get_weather"
        json.loads(last.delta.tool_calls[0].function.arguments)
