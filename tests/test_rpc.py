"""Models on other hosts through llama.cpp's RPC backend: real `localcos rpc-server` processes on
127.0.0.1 and free ports, every wait bounded.

1. Exactness: with one or two models on RPC servers, greedy output equals the all-local
   ensemble's (ensemble and cos), and sampled cos tokens follow r (chi-square).
2. Faults: a server down at load, killed mid-generation, or stopped (hung) gives one RemoteError
   naming the server within a bound; the local models and the conversation are intact, and the
   next generation, once the server is back, equals the all-local one. `localcos serve` answers
   502 and keeps serving.
3. The command line: --rpc and models.toml parsing, one-line errors, rpc-server's loopback rule.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import httpx
import pytest

from conftest import BASE, RpcServer, assert_same_or_near_tie, free_port
from localcos import Ensemble, RemoteError, WeightedEnsemble
from localcos.backend import rpc
from localcos.backend.rpc import Endpoint, probe
from localcos.errors import ConfigError, RpcUnavailableError
from localcos.config import format_rpc, parse_rpc, resolve
from localcos.models.writer import cached_model
from test_server import serving
from test_speculative import SAMPLING_CASES, check_sampling

pytestmark = pytest.mark.usefixtures("rpc_build")  # skipped (with the rebuild command) on a build without RPC, failed in CI

FAULT_BOUND = 15.0  # seconds within which a lost server must be reported
PROMPTS = ["The river runs past the old mill", "Which planet is closest to the Sun?"]
RIVAL = replace(BASE, noise=0.8, noise_seed=5, name="t-rival")


@pytest.fixture(scope="module")
def rpc_pair():
    servers = [RpcServer(), RpcServer()]
    yield servers
    for s in servers:
        s.kill()


def greedy(ens: Ensemble, prompt: str, method: str, n: int = 48, gamma=None) -> list[int]:
    return ens.generate(prompt, method=method, gamma=gamma, temperature=0, max_tokens=n, ignore_eos=True).token_ids


def local_reference(paths, combiner, n: int = 48) -> dict[str, list[int]]:
    with Ensemble.load(paths, combiner, n_ctx=512) as ens:
        return {p: greedy(ens, p, "ensemble", n) for p in PROMPTS}


# --- exactness ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["verifier-remote", "proposer-remote", "two-servers", "two-on-one-server"])
def test_greedy_over_rpc_equals_all_local(models, rpc_pair, layout):
    a, b = (s.endpoint for s in rpc_pair)
    if layout in ("verifier-remote", "proposer-remote"):
        paths = [models["base"], models["larger"]]
        where = [(), (a,)] if layout == "verifier-remote" else [(a,), ()]
    else:
        paths = [models["base"], models["sibling"], models["sibling2"]]
        where = [(), (a,), (b,)] if layout == "two-servers" else [(), (a,), (a,)]
    combiner = WeightedEnsemble()
    reference = local_reference(paths, combiner)
    near_ties = set()
    with Ensemble.load(paths, combiner, n_ctx=512, rpc=where) as ens:
        remote = [m for m in ens.models if type(m).__name__ == "RemoteModel"]
        assert len(remote) == sum(1 for w in where if w)
        for m in remote:  # every layer is on the server (llama.cpp's own count, "N/N")
            done, total = map(int, m.offloaded.split("/"))
            assert done == total > 0
        if layout == "two-on-one-server":  # an RPC server serves one connection: one worker holds both
            assert remote[0]._worker is remote[1]._worker
        for prompt in PROMPTS:
            for method, gamma in (("ensemble", None), ("cos", None), ("cos", 3)):
                got = greedy(ens, prompt, method, gamma=gamma)
                near_ties.add(assert_same_or_near_tie(got, reference[prompt], paths, combiner, ens.tokenize(prompt), f"{layout}/{method}"))
            for m in ens.models:  # the worker's llama.cpp cache agrees with what we think it holds
                assert m.kv_length() == len(m.tokens)
        out = ens.generate(PROMPTS[0], method="cos", temperature=0, max_tokens=48, ignore_eos=True)
        # the remote models really ran: their calls were counted
        assert all(out.stats.models[ens.models.index(m)].calls > 0 for m in remote)
    assert len(near_ties - {None}) <= 1


@pytest.mark.slow
def test_cos_sampling_over_rpc_follows_the_combined_distribution(models, model_dir, rpc_pair):
    names, comb, sampling, _ = SAMPLING_CASES["we-t1"]
    paths = [cached_model(RIVAL, model_dir) if n == "rival" else models[n] for n in names]
    # the verifier of the first round on the server: every round crosses the network
    check_sampling("rpc/we-t1", paths, comb, sampling, (("cos", 2),), n_completions=1600, parallel=1, rpc=[(), (rpc_pair[0].endpoint,)])


# --- faults ---------------------------------------------------------------------------------------


def test_a_server_down_at_load_is_one_error_naming_it(models):
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match=f"127.0.0.1:{port}.*(refused|unreachable)"):
        Ensemble.load([models["base"], models["sibling"]], WeightedEnsemble(), n_ctx=256, rpc=[(), (Endpoint("127.0.0.1", port),)])
    assert time.monotonic() - t0 < FAULT_BOUND


def test_a_server_killed_mid_generation_loses_nothing_else(models):
    paths = [models["base"], models["sibling"]]
    combiner = WeightedEnsemble()
    reference = local_reference(paths, combiner)
    server = RpcServer()
    port = server.endpoint.port
    try:
        with Ensemble.load(paths, combiner, n_ctx=4096, rpc=[(), (server.endpoint,)], rpc_timeout=30) as ens:
            local = ens.models[0]
            stream = ens.stream(PROMPTS[0], method="cos", temperature=0, max_tokens=3000, ignore_eos=True)
            pieces = []
            t_kill = None
            with pytest.raises(RemoteError) as lost:
                for piece in stream:
                    pieces.append(piece)
                    if len(pieces) == 20:
                        server.kill()
                        t_kill = time.monotonic()
            assert t_kill is not None and time.monotonic() - t_kill < FAULT_BOUND
            message = str(lost.value)
            assert f"127.0.0.1:{port}" in message and "\n" not in message
            assert len(pieces) < 3000
            # this process's model is intact and consistent; the remote one forgot its cache
            assert local.kv_length() == len(local.tokens) > 0
            assert ens.models[1].tokens == [] and ens.models[1].kv_length() == 0
            # while the server is down, a new generation fails fast with the same kind of error
            t0 = time.monotonic()
            with pytest.raises(RemoteError, match=f"127.0.0.1:{port}"):
                greedy(ens, PROMPTS[1], "cos")
            assert time.monotonic() - t0 < FAULT_BOUND
            # the server is back on the same port: the next generation reloads the model and is exact
            server = RpcServer(port)
            for prompt in PROMPTS:
                got = greedy(ens, prompt, "cos")
                assert_same_or_near_tie(got, reference[prompt], paths, combiner, ens.tokenize(prompt), "after the restart")
    finally:
        server.kill()


@pytest.mark.slow
def test_a_hung_server_is_given_up_within_the_timeout(models):
    server = RpcServer()
    try:
        with Ensemble.load([models["base"], models["sibling"]], WeightedEnsemble(), n_ctx=512,
                           rpc=[(), (server.endpoint,)], rpc_timeout=2) as ens:  # fmt: skip
            greedy(ens, PROMPTS[0], "cos", n=8)
            server.proc.send_signal(signal.SIGSTOP)  # alive, connected, silent: as a host that vanished
            t0 = time.monotonic()
            with pytest.raises(RemoteError, match=f"{server.endpoint}.*no answer"):
                greedy(ens, PROMPTS[1], "cos", n=8)
            assert time.monotonic() - t0 < 2 + 2 + 5  # the timeout, the probe's own, and slack
            assert ens.models[0].kv_length() == len(ens.models[0].tokens)
    finally:
        server.proc.send_signal(signal.SIGCONT)
        server.kill()


def test_serve_answers_502_for_a_lost_server_and_keeps_serving(models):
    paths = [models["base"], models["sibling"]]
    server = RpcServer()
    port = server.endpoint.port
    body = {"model": "duo", "prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0}
    args = ["--models", ",".join(map(str, paths)), "--rpc", f"-,{server.endpoint}", "--ctx", "512", "--alias", "duo", "--rpc-timeout", "30"]
    try:
        with serving(args) as api:
            first = httpx.post(api.url + "/v1/completions", json=body, timeout=60)
            assert first.status_code == 200, first.text
            health = api.health()["models"]
            assert health[1]["rpc"] == str(server.endpoint) and health[1]["connected"] is True
            assert health[1]["kv_positions"] == health[1]["cached_tokens"] > 0
            server.kill()
            lost = httpx.post(api.url + "/v1/completions", json=body, timeout=FAULT_BOUND)
            assert lost.status_code == 502
            error = lost.json()["error"]
            assert f"127.0.0.1:{port}" in error["message"] and error["code"] == "rpc_server_lost"
            health = api.health()
            assert health["status"] == "ok" and health["models"][1]["connected"] is False
            assert health["models"][0]["kv_positions"] == health["models"][0]["cached_tokens"]
            server = RpcServer(port)
            again = httpx.post(api.url + "/v1/completions", json=body, timeout=60)
            assert again.status_code == 200, again.text
            assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
            assert api.health()["models"][1]["connected"] is True
    finally:
        server.kill()


# --- the command line and models.toml ---------------------------------------------------------------


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localcos", *args], capture_output=True, text=True, timeout=timeout)


def test_generate_over_rpc_matches_local_from_the_command_line(models, rpc_pair):
    pair = ",".join(str(p) for p in (models["base"], models["sibling"]))
    common = ["generate", "--models", pair, "--ctx", "512", "--prompt", PROMPTS[0], "-t", "0", "--max-tokens", "24", "--method", "cos"]
    here = run_cli(*common)
    there = run_cli(*common, "--rpc", f"-,{rpc_pair[0].endpoint}")  # "-,HOST:PORT" is a value, not a flag
    assert here.returncode == 0 and there.returncode == 0, there.stderr
    assert there.stdout == here.stdout


@pytest.mark.parametrize(
    "rpc_value, expected",
    [
        ("-,localhost", "--rpc must be HOST:PORT"),
        ("-,127.0.0.1:99999", "--rpc must be HOST:PORT"),
        ("-,-,127.0.0.1:5", "got 3 --rpc entries for 2 models"),
        ("-,127.0.0.1:{port}", "127.0.0.1:{port} is unreachable"),
    ],
)
def test_bad_rpc_values_are_one_line(models, rpc_value, expected):
    port = str(free_port())
    pair = ",".join(str(p) for p in (models["base"], models["sibling"]))
    t0 = time.monotonic()
    proc = run_cli("generate", "--models", pair, "--rpc", rpc_value.format(port=port), "--prompt", "x", timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected.format(port=port) in lines[0], proc.stderr
    assert time.monotonic() - t0 < 30


def test_rpc_parsing_and_defaults(models, tmp_path):
    assert parse_rpc("-,10.0.0.5:50052+10.0.0.6:50052") == ((), (Endpoint("10.0.0.5", 50052), Endpoint("10.0.0.6", 50052)))
    assert format_rpc(parse_rpc(["-", "h:1"])) == "-,h:1"
    base = {"models": [str(models["base"]), str(models["sibling"])]}
    # a remote model offloads every layer by default; explicit 0 layers there is refused
    settings = resolve({**base, "rpc": "-,127.0.0.1:50052"})
    assert settings.load.n_gpu_layers == (0, -1) and settings.load.rpc[1] == (Endpoint("127.0.0.1", 50052),)
    with pytest.raises(ConfigError, match="0 layers there"):
        resolve({**base, "rpc": "-,127.0.0.1:50052", "n_gpu_layers": "0"})
    # models.toml: rpc on a model entry
    toml = tmp_path / "models.toml"
    toml.write_text(
        f'[models.far]\npath = "{models["sibling"]}"\nrpc = "127.0.0.1:50053"\n'
        f'[models.bad]\npath = "{models["sibling"]}"\nrpc = "nowhere"\n'
    )
    with pytest.raises(ConfigError, match=r"models\.bad\.rpc"):
        resolve({"models": [str(models["base"]), "far"], "config": str(toml)})
    toml.write_text(f'[models.far]\npath = "{models["sibling"]}"\nrpc = "127.0.0.1:50053"\n')
    settings = resolve({"models": [str(models["base"]), "far"], "config": str(toml)})
    assert settings.load.rpc == ((), (Endpoint("127.0.0.1", 50053),)) and settings.load.n_gpu_layers == (0, -1)


def test_a_build_without_rpc_is_named_with_the_fix(models, monkeypatch):
    monkeypatch.setattr(rpc, "_rpc_reg", lambda: None)
    with pytest.raises(RpcUnavailableError, match='CMAKE_ARGS="-DGGML_RPC=ON"'):
        resolve({"models": [str(models["base"]), str(models["sibling"])], "rpc": "-,127.0.0.1:50052"})
    assert resolve({"models": [str(models["base"]), str(models["sibling"])]}).load.rpc == ((), ())


def test_rpc_server_refuses_to_face_the_network_unless_told():
    proc = run_cli("rpc-server", "--host", "0.0.0.0", "--port", str(free_port()), timeout=30)
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert "\n" not in line and "no authentication" in line and "--trusted-network" in line
    proc = run_cli("rpc-server", "--host", "::1", timeout=30)
    assert proc.returncode == 2 and "IPv4" in proc.stderr
    assert run_cli("rpc-server", "--check", timeout=30).returncode == 0
    listed = run_cli("rpc-server", "--list-devices", timeout=30)
    assert listed.returncode == 0 and listed.stdout.startswith("CPU")


def test_rpc_server_warns_and_serves_on_loopback():
    server = RpcServer()
    # one client at a time: the next is served once the last one left
    assert probe(server.endpoint) is None and probe(server.endpoint) is None
    server.proc.send_signal(signal.SIGINT)  # Ctrl-C ends it at once
    server.proc.wait(timeout=10)
    assert "no authentication" in server.proc.stderr.read()
    server.kill()


def test_no_worker_process_outlives_its_models(models, rpc_pair):
    from localcos.backend.worker import WorkerProcess

    with Ensemble.load([models["base"], models["sibling"]], WeightedEnsemble(), n_ctx=256, rpc=[(), (rpc_pair[0].endpoint,)]) as ens:
        worker = ens.models[1]._worker
        assert worker.process.poll() is None
    assert worker.process.poll() is not None and worker not in WorkerProcess._live
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("localcos-logits-")] if os.path.isdir("/dev/shm") else True


def test_the_chat_reports_a_lost_server_and_keeps_the_conversation(models):
    import asyncio

    from localcos.tui.app import ChatApp
    from test_tui import chat_settings, replies, send, until

    server = RpcServer()
    port = server.endpoint.port
    settings = chat_settings([models["chat"], models["chat_sibling"]], rpc=f"-,{server.endpoint}", max_tokens=16)

    async def scenario():
        nonlocal server
        app = ChatApp(settings)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            await send(pilot, app, "Where does the river go?")
            await until(pilot, lambda: replies(app) and replies(app)[0].complete)
            first = [(m.role, m.content) for m in app.conversation.messages]
            server.kill()
            await send(pilot, app, "And then?")
            await until(pilot, lambda: any(n.title == "Generation failed" for n in app._notifications), timeout=FAULT_BOUND)
            failure = next(n.message for n in app._notifications if n.title == "Generation failed")
            assert f"127.0.0.1:{port}" in failure
            assert [(m.role, m.content) for m in app.conversation.messages][:2] == first  # nothing lost
            await until(pilot, lambda: not app.query_one("#prompt").disabled and app.stream is None)
            server = RpcServer(port)  # back: the next message reloads the model and is answered
            await send(pilot, app, "Try again")
            await until(pilot, lambda: len(replies(app)) == 3 and replies(app)[2].complete)
            assert replies(app)[2].finish_reason in ("length", "stop")
            assert app.conversation.messages[0].content == "Where does the river go?"

    try:
        asyncio.run(scenario())
    finally:
        server.kill()
