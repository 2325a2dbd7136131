"""The byte level on trained models of two families: SmolLM2-135M-Instruct (its own tokenizer)
with Qwen2.5-Coder-0.5B-Instruct, through real llama.cpp and the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from localcos.backend import Model
from localcos.errors import ConfigError
from localcos.runtime.bytelevel import ByteMember


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localcos", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def pair(trained):
    return [trained("smollm2-135m"), trained("coder-0.5b")]


def test_a_real_models_first_byte_is_the_mass_of_the_tokens_that_begin_with_it(pair):
    """p(b | prompt) from the view equals the sum of the token probabilities of the tokens whose
    bytes begin with b (the end symbol: of the end tokens), renormalised over byte and end
    tokens: computed here straight from the row, without the view's sorted prefix sums."""
    with Model(pair[0], n_ctx=256, n_seq=2) as model:
        member = ByteMember(model, max_paths=2, prune=0.0)
        prompt = model.tokenize("The capital of France is")
        member.start(prompt)
        got = member.view.distribution()
        row = model.slots[0].prefill(prompt).astype(np.float64)
        p = np.exp(row - row.max())
        first = np.full(model.n_vocab, -1)
        for t in range(model.n_vocab):
            piece = model.piece(t)
            if model.is_eog(t):
                first[t] = 256
            elif piece:
                first[t] = piece[0]
        want = np.bincount(first[first >= 0], weights=p[first >= 0], minlength=257)
        np.testing.assert_allclose(got, want / want.sum(), atol=1e-9)
        # and after a byte in the middle of a token the view holds the tokens that go on with it
        member.advance(ord(" "))
        after_space = member.view.distribution()
        assert after_space[ord("P")] > 0.2  # " Paris"


@pytest.mark.parametrize("big", ["coder-0.5b", "coder-1.5b"])
@pytest.mark.parametrize("combine", ["we", "cd"])
def test_generate_combines_two_tokenizers_at_the_byte_level(trained, big, combine):
    pair = [trained("smollm2-135m"), trained(big)]
    out = run_cli("generate", "--models", ",".join(map(str, pair)), "--combine", combine, "-p", "def add(a, b):\n",
                  "--temperature", "0", "--max-tokens", "60", "--json", "--ctx", "512")  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    (completion,) = result["completions"]
    stats = result["stats"]
    text = completion["text"]
    assert stats["level"] == "byte"
    assert "return" in text and "a" in text and "b" in text  # the body of add
    assert stats["chars"] == len(text) and stats["bytes"] == len(text.encode())
    assert all(0 < c < 1 for c in stats["calls_per_char"])  # bytes inside a token cost no call
    assert result["combiner"].startswith(combine)


def test_the_cross_family_preset_contrasts_at_the_byte_level_where_its_gate_opens(trained):
    for name in ("smollm2-135m", "coder-1.5b"):
        trained(name)  # pulled: the preset names them
    # a body the 1.5B is unsure how to begin (a comment or code): the gate opens there
    out = run_cli("generate", "--preset", "smol-coder-cd", "-p", "def is_palindrome(text):\n", "--temperature", "0", "--max-tokens", "48",
                  "--json", "--ctx", "512")  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    stats = result["stats"]
    assert stats["level"] == "byte" and "cd" in result["combiner"] and "gate" in result["combiner"]
    assert 0 < stats["gate_opened"] < stats["gate_decided"]  # the amateur where the 1.5B is unsure, the 1.5B alone elsewhere
    code = [line for line in result["completions"][0]["text"].splitlines() if line.strip() and not line.strip().startswith("#")]
    assert any("text" in line for line in code), result["completions"][0]["text"]  # a body that uses its argument


def test_chat_prompts_each_model_in_its_own_template(pair):
    out = run_cli("generate", "--models", ",".join(map(str, pair)), "--chat", "-p", "What is the capital of France? One word.",
                  "--temperature", "0", "--max-tokens", "40", "--ctx", "512")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
    assert "<|im_start|>" not in out.stdout and "<|im_end|>" not in out.stdout  # the reply ends at the end token
    assert "byte level" in out.stderr


def test_level_auto_keeps_the_token_path_for_one_tokenizer_and_byte_is_forced(trained):
    pair = ",".join(map(str, [trained("coder-0.5b"), trained("coder-1.5b")]))
    common = ["generate", "--models", pair, "-p", "def add(a, b):", "--temperature", "0", "--max-tokens", "16", "--ctx", "512", "--seed", "1"]
    token = run_cli(*common, "--method", "ensemble")
    assert token.returncode == 0, token.stderr
    assert "byte level" not in token.stderr
    forced = run_cli(*common, "--level", "byte")
    assert forced.returncode == 0, forced.stderr
    assert "byte level" in forced.stderr
    # an option only the byte level reads, for models at the token level: one line, not ignored
    cases = [("generate", ["-p", "x", "--byte-prune", "0"]), ("score", ["--file", __file__, "--byte-paths", "4"]),
             ("generate", ["-p", "x", "--byte-gamma", "4"]), ("bench", ["--byte-gamma", "4"])]  # fmt: skip
    for command, extra in cases:
        flag = extra[-2]
        refused = run_cli(command, "--models", pair, *extra)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"localcos: error: {flag}: these models share a tokenizer"), refused.stderr


def test_every_front_end_takes_the_byte_level_options_and_score_keeps_every_tokenisation(trained, tmp_path):
    for command in ("generate", "chat", "serve", "bench", "score"):
        helped = run_cli(command, "--help")
        assert all(flag in helped.stdout for flag in ("--level", "--byte-paths", "--byte-prune")), command
    # score at the byte level for one tokenizer when asked, exact by default (nothing pruned)
    text = tmp_path / "t.py"
    text.write_text("def add(a, b):\n    return a + b\n\n\nprint(add(2, 3))\n")
    coder = str(trained("coder-0.5b"))
    out = run_cli("score", "--models", f"{coder},{coder}", "--file", str(text), "--level", "byte", "--ctx", "64", "--json", str(tmp_path / "s.json"))
    assert out.returncode == 0, out.stderr
    assert "at the byte level" in out.stdout and "--byte-prune 0)" in out.stdout
    report = json.loads((tmp_path / "s.json").read_text())
    alone = [row["value"] for row in report["rows"] if row["kind"] == "model"]
    assert len(alone) == 2 and alone[0] == pytest.approx(alone[1], abs=1e-6)  # one model twice: one score
    refused = run_cli("score", "--models", f"{coder},{coder}", "--file", str(text), "--level", "byte", "--byte-prune", "1")
    assert refused.returncode == 2 and "--byte-prune" in refused.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--byte-prune", "1.5"], "--byte-prune must be below 1"),
        (["--byte-prune", "-1"], "--byte-prune"),
        (["--method", "sd"], "not available at the byte level yet"),
        (["--gamma", "3"], "--byte-gamma"),
        (["--byte-gamma", "0"], "--byte-gamma"),
        (["--level", "bytes"], "--level"),
        (["--proposer", "1"], "proposer: not available at the byte level"),
        (["--lookup", "on"], "lookup: not available at the byte level"),
        (["--rpc", "127.0.0.1:1"], "--rpc: not available at the byte level"),
        (["--chat", "--chat-template-model", "1"], "--chat-template-model: at the byte level each model reads"),
    ],
)
@pytest.mark.slow
def test_bad_byte_level_input_is_one_line(pair, flags, message):
    out = run_cli("generate", "--models", ",".join(map(str, pair)), "-p", "x", "--max-tokens", "4", *flags)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr


@pytest.mark.parametrize("combine", ["we", "cd"])
def test_byte_level_cos_across_two_families(pair, combine):
    from localcos import ByteEnsemble, Contrastive, WeightedEnsemble
    from localcos.runtime.bytelevel import combine_symbols
    from localcos.testing.rows import RowLog
    from test_trained import score_gap_bound

    combiner = Contrastive(mu=0.1) if combine == "cd" else WeightedEnsemble([0.5, 0.5])
    rows = RowLog()  # every row each run got: the noise between the two runs, as they called llama.cpp
    with ByteEnsemble.load(pair, combiner, n_ctx=512) as ens:
        with rows.recording("ensemble"):
            ensemble = ens.generate("def add(a, b):\n", method="ensemble", temperature=0, max_tokens=24)
        with rows.recording("cos"):
            cos = ens.generate("def add(a, b):\n", method="cos", byte_gamma=8, temperature=0, max_tokens=24)  # drafts whatever the costs
        stats = cos.stats
        assert stats.method == "cos" and 0 < stats.accepted <= stats.drafted
        assert "return" in cos.text and stats.bytes == len(cos.text.encode())
        # greedy cos draws from r like the ensemble; this quantised pair is not batch-invariant, so
        # the texts may part, but only where r's top two bytes are closer than the noise between
        # the two runs' rows can move them
        got, want = cos.text.encode(), ensemble.text.encode()
        if got == want:
            return
        j = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        assert j < min(len(got), len(want)), "one text ended where the other went on"
        for member, tokens in zip(ens.members, ens.prompts("def add(a, b):\n")):
            member.start(tokens)
            for byte in want[:j]:
                member.advance(byte)
        r = combine_symbols(ens.combiner, [m.view.distribution() for m in ens.members], 1.0)
    measured = rows.noise("ensemble", "cos")
    assert rows.shared("ensemble", "cos") > 0
    noise = [measured.get(str(p), 0.0) for p in pair]
    # a symbol's probability is a sum of token probabilities, whose logs move at most twice a
    # logit's noise; cd combines the symbols' log-probabilities (each moved by up to 2 noise)
    bound = score_gap_bound(combine, noise) * (2 if combine == "cd" else 1)
    gap = abs(float(np.log(r[want[j]]) - np.log(r[got[j]])))
    assert gap < bound, f"parted at byte {j} where log r differs by {gap:.3f}, beyond what the noise {noise} moves ({bound:.3f})"


# --- the front ends: serve (the openai client), chat (the terminal app) ------------------------------
QUESTION = "What is the capital of France? One word."


def test_serve_combines_two_tokenizers_at_the_byte_level(pair):
    """`localcos serve` with models of different tokenizers: chat and text completions through the
    official client, streamed and not, WE and CD and cos per request, the same text as `generate`;
    what needs one vocabulary is a 400 naming its field."""
    import httpx
    import openai

    from test_server import serving

    models = ",".join(map(str, pair))
    common = ["--temperature", "0", "--ctx", "512"]
    want = run_cli("generate", "--models", models, "-p", "def add(a, b):\n", "--combine", "cd", "--max-tokens", "16", "--json", *common)
    assert want.returncode == 0, want.stderr
    want_text = json.loads(want.stdout)["completions"][0]["text"]
    with serving(["--models", models, *common, "--alias", "duo"]) as s:
        client = s.client()
        messages = [{"role": "user", "content": QUESTION}]
        reply = client.chat.completions.create(model="duo", messages=messages, max_tokens=40)
        content = reply.choices[0].message.content
        stats = reply.model_extra["localcos"]
        assert "Paris" in content and "<|im_end|>" not in content and reply.choices[0].finish_reason == "stop"
        # the byte level's default: cos planned from the call costs (--byte-gamma auto), which takes
        # the ensemble's step wherever a draft would not pay
        assert stats["level"] == "byte" and stats["method"] == "cos" and stats["combiner"].startswith("we")
        assert stats["ensemble_steps"] + stats["drafted"] > 0
        assert reply.usage.completion_tokens == stats["tokens"] > 0 and reply.usage.prompt_tokens > 0  # the lead's tokens, as max_tokens
        streamed = client.chat.completions.create(model="duo", messages=messages, max_tokens=40, stream=True)
        assert "".join(e.choices[0].delta.content or "" for e in streamed if e.choices) == content
        # a request's combination, as generate's: the same code, the same text
        text = client.completions.create(model="duo", prompt="def add(a, b):\n", max_tokens=16, extra_body={"combine": "cd"})
        assert text.choices[0].text == want_text and text.model_extra["localcos"]["combiner"].startswith("cd")
        assert text.choices[0].finish_reason == "length" and 16 <= text.usage.completion_tokens <= 16 + 3  # the lead's tokens
        # cos per request, two choices
        both = client.completions.create(model="duo", prompt="def add(a, b):\n", max_tokens=12, n=2, extra_body={"method": "cos", "byte_gamma": 8})
        stats = both.model_extra["localcos"]
        assert len(both.choices) == 2 and stats["method"] == "cos" and 0 < stats["accepted"] <= stats["drafted"]
        assert stats["completions"] == 2 and all("return" in c.text for c in both.choices)
        assert client.models.list().data[0].model_extra["localcos"]["level"] == "byte"
        # one vocabulary needed: a 400 naming the field, the server goes on
        refused = [
            ("completions", {"prompt": [[1, 2, 3]]}, "prompt"),
            ("completions", {"prompt": "x", "logprobs": 1}, "logprobs"),
            ("completions", {"prompt": "x", "echo": True}, "echo"),
            ("completions", {"prompt": "x", "gamma": 3}, "gamma"),
            ("completions", {"prompt": "x", "method": "sd"}, "method"),
            ("chat/completions", {"messages": messages, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
        ]
        for route, body, param in refused:
            got = httpx.post(f"{s.url}/v1/{route}", json={"model": "duo", **body}, timeout=60)
            assert got.status_code == 400 and got.json()["error"]["param"] == param, (body, got.text)
        assert httpx.post(s.url + "/tokenize", json={"prompt": "x"}, timeout=10).status_code == 400
        # structured output constrains the bytes: a JSON object under a schema, from both models
        schema = {"type": "object", "properties": {"capital": {"type": "string"}}, "required": ["capital"]}
        asked = [{"role": "user", "content": "The capital of France, as JSON with the key capital."}]
        shaped = client.chat.completions.create(model="duo", messages=asked, max_tokens=60,
                                                response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})  # fmt: skip
        assert json.loads(shaped.choices[0].message.content)["capital"] == "Paris"
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="duo", prompt=[[1, 2]], max_tokens=4)
        again = client.chat.completions.create(model="duo", messages=messages, max_tokens=40)
        assert again.choices[0].message.content == content  # after other requests: the same reply
        # one seed, one text: a seeded request after requests of other lengths, twice, as a fresh process
        fib = ["-p", "def fib(n):", "--combine", "cd", "--max-tokens", "16", "--temperature", "0.8", "--seed", "11", "--json", "--ctx", "512"]
        want = run_cli("generate", "--models", models, *fib)
        assert want.returncode == 0, want.stderr
        for other in ("x = 1", "class Stack:\n    def push(self, item):"):
            got = client.completions.create(model="duo", prompt="def fib(n):", max_tokens=16, temperature=0.8, seed=11, extra_body={"combine": "cd"})
            assert got.choices[0].text == json.loads(want.stdout)["completions"][0]["text"]
            client.completions.create(model="duo", prompt=other, max_tokens=len(other) // 3, temperature=0.8, seed=3)


@pytest.mark.parametrize("big", ["coder-0.5b", "coder-1.5b"])
def test_the_terminal_chat_runs_two_tokenizers_at_the_byte_level(trained, big, monkeypatch):
    """`localcos chat` with SmolLM2 and a Qwen2.5-Coder: each model reads the conversation in its
    own template, the reply is `generate --chat`'s, and a second turn goes on from it."""
    import asyncio

    from localcos import cli
    from localcos.tui.app import ChatApp
    from localcos.tui.widgets import StatsPanel
    from test_tui import replies, send, until

    models = ",".join(map(str, [trained("smollm2-135m"), trained(big)]))
    common = ["--temperature", "0", "--max-tokens", "40", "--ctx", "512", "--combine", "we"]
    proc = run_cli("generate", "--models", models, "--chat", "--prompt", QUESTION, "--json", *common)
    assert proc.returncode == 0, proc.stderr
    want = json.loads(proc.stdout)["completions"][0]["text"]
    assert "Paris" in want
    texts, panels = [], []

    def headless(app):
        async def scenario():
            async with app.run_test(size=(120, 40)) as pilot:
                await until(pilot, lambda: app.ensemble is not None)
                for n, question in enumerate([QUESTION, "And of Italy?"], 1):
                    await send(pilot, app, question)
                    await until(pilot, lambda: len(replies(app)) == n and replies(app)[-1].complete, timeout=120)
                    texts.append(replies(app)[-1].text)
                    panels.append(app.query_one(StatsPanel).render().plain)

        asyncio.run(scenario())

    monkeypatch.setattr(ChatApp, "run", headless)
    assert cli.main(["chat", "--models", models, *common]) == 0
    assert texts[0] == want
    assert "Rome" in texts[1], texts
    assert "level" in panels[0] and "byte" in panels[0] and "chars/s" in panels[0]


@pytest.mark.parametrize("method", ["ensemble", "cos"])
def test_a_json_schema_constrains_the_bytes_of_two_tokenizers(pair, method):
    """--json-schema at the byte level: one mask over the 257 symbols, applied to r and to every
    byte a model drafts; the text is valid JSON under the schema."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]}
    out = run_cli("generate", "--models", ",".join(map(str, pair)), "--chat", "-p", "Invent a person: JSON with name and age.",
                  "--json-schema", json.dumps(schema), "--method", method, "--temperature", "0", "--max-tokens", "80", "--ctx", "512", "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    (completion,) = result["completions"]
    value = json.loads(completion["text"])
    assert set(value) == {"name", "age"} and isinstance(value["age"], int) and isinstance(value["name"], str)
    assert completion["finish_reason"] == "stop"


def test_bench_compares_the_byte_level_methods_and_a_model_alone(pair, tmp_path):
    """`localcos bench` with models of different tokenizers: the byte-level ensemble, cos at each
    --byte-gamma and the larger model alone, interleaved, in characters per second."""
    models = ",".join(map(str, pair))
    report = tmp_path / "bench.json"
    out = run_cli("bench", "--models", models, "--limit-prompts", "2", "--max-tokens", "14", "--byte-gamma", "4,8", "--temperature", "0",
                  "--ctx", "512", "--json", str(report))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "byte level" in out.stdout
    data = json.loads(report.read_text())
    labels = [row["config"] for row in data["summary"]]
    assert labels == ["ensemble", "cos/4", "cos/8", "alone-1"]
    rows = {row["config"]: row for row in data["summary"]}
    assert rows["ensemble"]["speedup"] == 1.0 and all(r["chars_per_second"] > 0 for r in rows.values())
    assert 0 < rows["cos/8"]["accepted"] <= rows["cos/8"]["drafted"] and len(rows["cos/8"]["calls_per_char"]) == 2
    assert rows["alone-1"]["calls_per_char"][0] == 0 < rows["alone-1"]["calls_per_char"][1]  # model 1 on its own tokens
    runs = data["runs"]
    assert len(runs) == 2 * 5 and {r["prompt"] for r in runs} == {0, 1}  # the ensemble twice
    assert all(r["tokens"] <= 14 + 3 for r in runs)  # --max-tokens: the lead's tokens at the byte level, counted at a character's end
    assert any(r["tokens"] == 14 for r in runs if r["config"] == "alone-1")  # on its own tokens, cut at the budget as the byte level is
    refused = run_cli("bench", "--models", models, "--gamma", "3", "--max-tokens", "8")
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1 and "--byte-gamma" in lines[0]
    refused = run_cli("bench", "--models", models, "--sequences", "1,2", "--max-tokens", "8")  # before any model loads
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and lines == ["localcos: error: --sequences: the byte level decodes one generation at a time (models with "
                                                 "different tokenizers)"], refused.stderr  # fmt: skip


def test_the_python_api_combines_two_tokenizers_as_the_command_line_does(pair):
    """`ByteEnsemble`: one seed, one text, whether generated, streamed or from `localcos
    generate`; a conversation in each model's own template; bits per byte."""
    from localcos import ByteEnsemble, Contrastive
    from localcos.chat import Message

    cli = run_cli("generate", "--models", ",".join(map(str, pair)), "--combine", "cd", "-p", "def fib(n):", "--max-tokens", "16",
                  "--temperature", "0.8", "--seed", "11", "--json", "--ctx", "512")  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    want = json.loads(cli.stdout)["completions"][0]["text"]
    with ByteEnsemble.load(pair, Contrastive(mu=0.1, expert=1), n_ctx=512) as ens:
        out = ens.generate("def fib(n):", max_tokens=16, temperature=0.8, seed=11)
        assert out.text == want and out.stats.method == "cos" and out.stats.tokens <= 16 + 3
        assert "".join(ens.stream("def fib(n):", max_tokens=16, temperature=0.8, seed=11)) == want
        reply = ens.generate(ens.chat_prompts([Message("user", "What is the capital of France? One word.")]), max_tokens=30, temperature=0)
        assert "Paris" in reply.text and reply.finish_reason == "stop"
        two = ens.generate_many("def fib(n):", 2, max_tokens=16, temperature=0.8, seed=11)
        assert two[0].text == want and two[1].text != want
        score = ens.bits_per_byte("def add(a, b):\n    return a + b\n" * 2, window=64)  # exact scoring costs rows at every byte
        assert 0 < score.combined[0].per_byte < 8 and len(score.members) == 2
        # scored with every tokenisation kept (prune 0), then back to the loaded pruning
        assert [m.view.prune for m in ens.members] == [0.01, 0.01]
        rough = ens.bits_per_byte("def add(a, b):\n    return a + b\n" * 2, window=64, prune=0.5)
        assert max(rough.dropped) > max(score.dropped)
        with pytest.raises(ConfigError, match="below 1"):
            ens.bits_per_byte("def f(): pass\n", prune=1.5)
        assert [m.view.prune for m in ens.members] == [0.01, 0.01]


def test_serve_and_score_at_the_byte_level_refuse_parallel_in_one_line(pair):
    for command, extra in (("serve", ["--port", "0"]), ("score", ["--file", __file__])):
        out = run_cli(command, "--models", ",".join(map(str, pair)), "--parallel", "2", *extra, timeout=120)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and "--parallel: the byte level decodes one generation at a time" in lines[0], out.stderr


def test_tokenisations_folded_on_a_trained_model_give_up_their_sequences(pair, monkeypatch):
    """Trained models put a little mass on other splits of a text that then follow the same
    tokens (random models never predict alike, so only trained ones fold): a folded path's
    sequence goes back to the free ones, and every path still held keeps its own sequence
    holding exactly the prompt and its tokens."""
    from localcos import ByteEnsemble, WeightedEnsemble
    from localcos.tools.prompts import builtin_prompts

    checked = [0]
    original = ByteMember._settle  # after every byte's rows (and a rebuild's bytes)

    def settle(self):
        original(self)
        seqs = [p.handle for p in self.view.paths]
        assert len({id(s) for s in seqs}) == len(seqs)  # one sequence per held path
        for path in self.view.paths:
            want = self.prompt + list(path.tokens)
            assert path.handle.tokens[: len(want)] == want
        held, free = {id(s) for s in seqs}, {id(s) for s in self.free}
        assert not held & free and held | free == {id(s) for s in self.slots}  # none lost
        checked[0] += 1

    monkeypatch.setattr(ByteMember, "_settle", settle)
    with ByteEnsemble.load(pair, WeightedEnsemble([0.5, 0.5]), n_ctx=1024) as ens:
        _, prompt = builtin_prompts()[4]
        folded = [sum(ens.generate(prompt, max_tokens=48, temperature=t, seed=0, method="ensemble").stats.folded) for t in (0, 1)]
    assert sum(folded) > 0 and checked[0] > 100  # what this test is about did happen
