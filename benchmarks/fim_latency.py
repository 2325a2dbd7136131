"""Editor completion's latency: an editor typing code back into real Python files, side by side with
llama-server's /infill.

A block of lines is taken out of each file (Python's own standard library, which ships with the
interpreter) and typed back in, character by character, text inserted at the cursor; every few
characters the editor asks for a completion with llama.vim's fields (the 256 lines above the
cursor as `input_prefix`, the cursor's line up to the cursor as `prompt`, the 64 lines below as
`input_suffix`, `n_indent` the line's indentation, n_predict 48, top_k 40, top_p 0.9, samplers
top_k/top_p/infill, t_max_predict_ms 1000, cache_prompt) and waits for it, as an editor that
shows each suggestion does. Every configuration is a server of its own, all loaded before the
replay: localcos serving the 1.5B alone, `sd` and `cos --gamma auto` with the 0.5B drafting, the
1.5B with drafts looked up in the prompt (`--proposer lookup`), the 1.5B reading the suffix's
first 64 tokens only (`--infill-suffix 64`), the cached layout (`--infill-layout
cached`: the suffix read first, so a keystroke evaluates what was typed) alone, with drafts
looked up in the prompt and the cells (`cached-lookup`: the last suggestion among them) and with
the 0.5B drafting as well (`cached-pair`), and llama-server (built once from the llama.cpp
localcos runs on, `--no-repack` where localcos turns repacking off) with the same file, threads,
context and batch. Each request goes to every server in turn, one server computing at a time,
the order rotating, so the machine's drift falls on all of them alike. Printed per
configuration: the median and p90 milliseconds a completion took (the client's clock), each as a
ratio to the 1.5B alone's (the makers' layout and the cached one) and to llama-server's, the
prompt tokens the server evaluated per request (the rest was in its cache), the tokens it
generated and, of them, those accepted from each kind of draft (held in the cells from the last
request, looked up in the prompt, drafted by the 0.5B); and how often its suggestion was the same
model's in the same layout (the 1.5B alone's: `alone`, or `cached` for the cached configurations).

`--replay jump` moves the cursor as well: every 10 requests the editor jumps to another block of
the file and types there (the suffix and the prefix both change).

    .venv/bin/python benchmarks/fim_latency.py                      # the packaged pair (localcos models pull coder-we)
    .venv/bin/python benchmarks/fim_latency.py --every 5 --requests 40 --batch 1024
    .venv/bin/python benchmarks/fim_latency.py --configs alone,llama-server --suffix-tokens 64
    .venv/bin/python benchmarks/fim_latency.py --configs alone,cached,cached-lookup,cached-pair,llama-server --temperature 0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from localcos.backend import default_threads
from localcos.models.registry import Registry
from localcos.testing import llamacpp_sdist
from localcos.testing.loopback import ServeProcess, free_port
from localcos.testing.reference import tool_args

FILES = ["json/decoder.py", "textwrap.py", "csv.py", "shlex.py"]  # of the standard library: real code of varied shape
ABOVE, BELOW = 256, 64  # llama.vim's n_prefix and n_suffix (lines)
CONFIGS = {
    "alone": ["--models", "coder-1.5b", "--method", "ensemble"],
    "sd": ["--models", "coder-0.5b,coder-1.5b", "--combine", "we", "--weights", "0,1", "--method", "sd", "--gamma", "4"],
    "cos-auto": ["--models", "coder-0.5b,coder-1.5b", "--combine", "we", "--weights", "0,1", "--method", "cos", "--gamma", "auto"],
    "lookup": ["--models", "coder-1.5b", "--proposer", "lookup"],
    # the 1.5B alone reading a quarter of the suffix llama-server reads at -b 1024: what a keystroke
    # saves, and how often its suggestion is still the whole suffix's ("same text")
    "suffix-64": ["--models", "coder-1.5b", "--method", "ensemble", "--infill-suffix", "64"],
    # the suffix read first: a keystroke evaluates what was typed; then speculation on what is left
    "cached": ["--models", "coder-1.5b", "--method", "ensemble", "--infill-layout", "cached"],
    "cached-lookup": ["--models", "coder-1.5b", "--proposer", "lookup", "--infill-layout", "cached"],
    "cached-pair": ["--models", "coder-0.5b,coder-1.5b", "--combine", "we", "--weights", "0,1", "--method", "cos", "--gamma", "auto",
                    "--infill-layout", "cached"],
}
SAME_AS = {"cached-lookup": "cached", "cached-pair": "cached"}  # whose text each is (the others: the 1.5B alone's, `alone`)
JUMP = 10  # --replay jump: requests typed at one place before the cursor jumps to another
T_MAX_PREDICT_MS = 1000  # llama.vim's: after a second, the next new line ends the middle (its length then depends on the speed)


@dataclass
class Request:
    """One completion an editor asks for: llama.vim's fields."""

    prefix: str
    typed: str
    suffix: str
    indent: int

    def body(self, n_predict: int, seed: int, extra: dict) -> dict:
        return {"input_prefix": self.prefix, "input_suffix": self.suffix, "input_extra": [], "prompt": self.typed, "n_predict": n_predict,
                "n_indent": self.indent, "top_k": 40, "top_p": 0.90, "samplers": ["top_k", "top_p", "infill"], "stream": False,
                "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": T_MAX_PREDICT_MS, "seed": seed, **extra}  # fmt: skip


def typing_replay(path: Path, every: int, block: tuple[int, int]) -> list[Request]:
    """The requests of typing lines block[0]..block[1] of `path` back in: the block is taken out,
    then each of its lines typed at the cursor (its indentation at once, as an editor's auto-indent
    puts it), a request after every `every` characters and at the line's end."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start, stop = block
    below = "\n".join(lines[stop : stop + BELOW]) + "\n"
    out: list[Request] = []
    for n in range(start, stop):
        line = lines[n]
        indent = len(line) - len(line.lstrip(" \t"))
        above = lines[max(0, n - ABOVE) : n]  # the lines before it: the file's, then those typed already
        prefix = "\n".join(above) + "\n" if above else ""
        for k in range(indent + 1, len(line) + 1):
            if (k - indent) % every == 0 or k == len(line):
                out.append(Request(prefix, line[:k], "\n" + below, indent))  # nothing after the cursor on its line yet
    return out


def jumping_replay(path: Path, every: int, places: int, per_place: int) -> list[Request]:
    """Typing at `places` blocks of `path` in turn (evenly spread over it), `per_place` requests
    at each before the cursor jumps to the next: the first `per_place` requests of typing each
    block back in (`typing_replay`), one after the other."""
    lines = path.read_text(encoding="utf-8").splitlines()
    starts = [len(lines) * (k + 1) // (places + 1) for k in range(places)]
    return [r for start in starts for r in typing_replay(path, every, (start, min(len(lines), start + 40)))[:per_place]]


@dataclass
class Result:
    ms: list[float] = field(default_factory=list)
    evaluated: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)  # of the generated tokens: drafts the cells held from the last request, accepted
    looked_up: list[int] = field(default_factory=list)  # drafts looked up in the prompt, accepted
    drafted: list[int] = field(default_factory=list)  # drafts of a model (the 0.5B), accepted
    prompt_ms: list[float] = field(default_factory=list)  # the server's own timings
    predicted_ms: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)


def replay(servers: dict[str, str], files: list[list[Request]], n_predict: int, extra: dict, sampling: dict) -> dict[str, Result]:
    """Each file's requests, its first one as the editor opens it (not counted), each sent to
    every server in turn (the order rotating by one each request), the next once it has answered:
    one server computes at a time."""
    results = {name: Result() for name in servers}
    names = list(servers)

    def send(client: httpx.Client, name: str, r: Request, seed: int) -> dict:
        answer = client.post(servers[name] + "/infill", json=r.body(n_predict, seed, {**sampling, **(extra if name != "llama-server" else {})}))
        if answer.status_code != 200:
            raise SystemExit(f"{name}: /infill answered {answer.status_code}: {answer.text}")
        return answer.json()

    done = 0
    with httpx.Client(timeout=600) as client:
        for requests in files:
            for name in names:
                send(client, name, requests[0], 1)
            for r in requests[1:]:
                done += 1
                for name in names[done % len(names) :] + names[: done % len(names)]:
                    t0 = time.perf_counter()
                    body = send(client, name, r, done)
                    result = results[name]
                    result.ms.append((time.perf_counter() - t0) * 1000)
                    result.evaluated.append(int(body["timings"]["prompt_n"]))
                    result.generated.append(int(body["timings"]["predicted_n"]))
                    stats = body.get("localcos") or {}
                    held, looked_up = int(stats.get("held_accepted") or 0), int(stats.get("lookup_accepted") or 0)
                    result.held.append(held)
                    result.looked_up.append(looked_up)
                    result.drafted.append(int(stats.get("accepted") or 0) - held - looked_up)
                    result.prompt_ms.append(float(body["timings"]["prompt_ms"]))
                    result.predicted_ms.append(float(body["timings"]["predicted_ms"]))
                    result.texts.append(body["content"])
                if done % 10 == 0:
                    print(f"  {done}: " + ", ".join(f"{n} {statistics.median(results[n].ms):.0f} ms" for n in names), flush=True)
    return results


class LlamaServer:
    """llama-server on 127.0.0.1 and a free port, ready when the constructor returns."""

    def __init__(self, binary: Path, model: Path, threads: int, n_ctx: int, batch: int) -> None:
        self.url = f"http://127.0.0.1:{(port := free_port())}"
        cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads), "-tb", str(threads),
               "-c", str(n_ctx), "-b", str(batch), "-ub", str(batch), "-np", "1", "--no-webui", *tool_args()]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while True:  # bounded: until /health answers, the process exits, or the deadline
            if self.proc.poll() is not None:
                raise SystemExit(f"llama-server exited: {self.proc.stderr.read()[-2000:] if self.proc.stderr else ''}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit("llama-server did not answer /health within 120 s")
            time.sleep(0.3)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def cpu() -> str:
    """The CPU, as lscpu names it (model name, family, model)."""
    try:
        info = dict(line.split(":", 1) for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines() if ":" in line)
        return f"{info['Model name'].strip()} (family {info['CPU family'].strip()}, model {info['Model'].strip()})"
    except (OSError, KeyError):
        return "unknown CPU"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--every", type=int, default=5, help="characters typed between two requests (default 5)")
    p.add_argument("--requests", type=int, default=30, help="requests per file (default 30)")
    p.add_argument("--files", default=",".join(FILES), help="standard-library files to type into")
    p.add_argument("--n-predict", type=int, default=48)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1024, help="n_batch of both servers: the prefix's 3/4 and the suffix's 1/4 (llama.vim recommends 1024)")
    p.add_argument("--suffix-tokens", type=int, default=None, help="localcos's --infill-suffix (default: llama-server's rule)")
    p.add_argument("--temperature", type=float, default=None, help="sent with every request (default: none, as llama.vim sends; 0: greedy)")
    p.add_argument("--t-max-predict-ms", type=float, default=T_MAX_PREDICT_MS,
                   help=f"sent with every request (default llama.vim's {T_MAX_PREDICT_MS}; 0: off, so greedy texts can be compared)")
    p.add_argument("--threads", type=int, default=default_threads())
    p.add_argument("--configs", default=",".join([*CONFIGS, "llama-server"]))
    p.add_argument("--replay", choices=("typing", "jump"), default="typing",
                   help=f"typing: a block typed back in; jump: {JUMP} requests at one block, then another (the cursor moves)")
    p.add_argument("--json", metavar="FILE", help="write every request's figures as JSON")
    args = p.parse_args()

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files: list[list[Request]] = []
    for name in args.files.split(","):
        path = stdlib / name
        lines = path.read_text(encoding="utf-8").splitlines()
        if args.replay == "jump":
            files.append(jumping_replay(path, args.every, -(-(args.requests + 1) // JUMP), JUMP)[: args.requests + 1])
            continue
        start = len(lines) // 3  # a block in the middle of the file, typed back in
        files.append(typing_replay(path, args.every, (start, min(len(lines), start + 40)))[: args.requests + 1])
    n_requests = sum(len(f) - 1 for f in files)
    registry = Registry.load(user=False)
    target = registry.resolve("coder-1.5b")
    wanted = args.configs.split(",")
    print(f"{n_requests} requests ({args.requests} per file, one every {args.every} characters, {args.replay}) into {args.files}; "
          f"n_batch {args.batch}, {args.threads} threads; {cpu()}", flush=True)  # fmt: skip
    extra = {} if args.suffix_tokens is None else {"infill_suffix": args.suffix_tokens}
    sampling = {"t_max_predict_ms": args.t_max_predict_ms, **({} if args.temperature is None else {"temperature": args.temperature})}
    servers: dict[str, str] = {}
    stoppers: list = []
    try:
        for name in wanted:  # every server loaded first: then one computes at a time
            if name == "llama-server":
                print("building llama-server from the llama-cpp-python sdist's llama.cpp (once; minutes) ...", flush=True)
                binary = llamacpp_sdist.build(["llama-server"]) / "llama-server"
                server = LlamaServer(binary, target, args.threads, args.ctx, args.batch)
                servers[name] = server.url
                stoppers.append(server.stop)
            else:
                serve = ServeProcess([*CONFIGS[name], "--ctx", str(args.ctx), "--batch-size", str(args.batch), "--threads", str(args.threads),
                                      "--parallel", "1"], start_timeout=300)  # fmt: skip
                servers[name] = serve.url
                stoppers.append(serve.stop)
        results = replay(servers, files, args.n_predict, extra, sampling)
    finally:
        for stop in stoppers:
            stop()
    base, peer, cached = results.get("alone"), results.get("llama-server"), results.get("cached")

    def ratio(r: Result, to: Result | None) -> float:
        return statistics.median(r.ms) / statistics.median(to.ms) if to else float("nan")

    print(f"\n{'configuration':<14}{'median ms':>10}{'p90 ms':>9}{'x alone':>9}{'x cached':>10}{'x llama-server':>16}{'prompt tokens':>15}"
          f"{'ms/token':>10}{'generated':>11}{'held':>6}{'looked up':>11}{'drafted':>9}{'ms/token':>10}{'same text':>11}")  # fmt: skip
    for name, r in results.items():
        same_as = results.get(SAME_AS.get(name, "alone"))
        same = sum(a == b for a, b in zip(r.texts, same_as.texts)) / len(r.texts) if same_as else float("nan")
        prompt_rate = sum(r.prompt_ms) / max(1, sum(r.evaluated))
        predicted_rate = sum(r.predicted_ms) / max(1, sum(r.generated))
        mean = statistics.mean
        print(f"{name:<14}{statistics.median(r.ms):>10.0f}{percentile(r.ms, 0.9):>9.0f}{ratio(r, base):>8.2f}x{ratio(r, cached):>9.2f}x"
              f"{ratio(r, peer):>15.2f}x{mean(r.evaluated):>15.0f}{prompt_rate:>10.1f}{mean(r.generated):>11.1f}"
              f"{mean(r.held or [0]):>6.1f}{mean(r.looked_up or [0]):>11.1f}{mean(r.drafted or [0]):>9.1f}{predicted_rate:>10.1f}"
              f"{100 * same:>10.0f}%")  # fmt: skip
    if peer is not None:
        print("p90 against llama-server's: " + ", ".join(f"{n} {percentile(r.ms, 0.9) / percentile(peer.ms, 0.9):.2f}x" for n, r in results.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({name: vars(r) for name, r in results.items()}, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
