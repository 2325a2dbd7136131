"""Load on `localcos serve`: throughput, latency and the server's own overhead, then a stress run.

Starts `localcos serve --demo` (the synthetic demo pair; or --models A,B / --preset NAME) on
127.0.0.1 and a free port, with --parallel 8, then:
1. 1, 2, 4, 8 and 16 concurrent clients x --requests completions each level (--levels):
   requests/s, aggregate tokens/s and its ratio to one client, p50/p95 latency, errors
   (expected 0), for the server's method (--method, default cos) and the ensemble;
2. the server's own overhead per request (HTTP, JSON, SSE, queueing) at 1 client: the client's
   latency minus the generation's own time as the response reports it, as a share of a short
   completion's latency;
3. a stress run of --stress requests from 8 threads mixing normal, streaming, streams dropped
   after the first event, requests abandoned by a client timeout and malformed bodies; after it
   the server must be healthy (idle, caches exact) and its memory flat (resident size after two
   stress rounds).

    .venv/bin/python benchmarks/serve_load.py
    .venv/bin/python benchmarks/serve_load.py --preset coder-we --requests 16 --tokens 48 --stress 0
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import random
import statistics
import time

import httpx

from localcos.testing.loopback import ServeProcess
import contextlib

PROMPTS = ["The river flows from the mountains", "Once upon a time there was", "Two plus two makes", "The old mill by the water"]


def start(args: argparse.Namespace) -> ServeProcess:
    models = ["--models", args.models] if args.models else ["--preset", args.preset] if args.preset else ["--demo"]
    extra = ["--method", args.method] + (["--gamma", args.gamma] if args.gamma else [])
    # the demo pair is built once (seconds) if not cached
    return ServeProcess([*models, *extra, "--max-queue", "64", "--ctx", "2048", "--parallel", str(args.parallel)], start_timeout=600)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def completion(client: httpx.Client, url: str, i: int, tokens: int, method: str | None = None) -> tuple[float, dict | None]:
    body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": tokens, "temperature": 1, "seed": i, "ignore_eos": True}
    if method:
        body["method"] = method
    t0 = time.perf_counter()
    r = client.post(url + "/v1/completions", json=body, timeout=300)
    latency = time.perf_counter() - t0
    return latency, (r.json() if r.status_code == 200 else None)


def load(url: str, concurrency: int, requests: int, tokens: int, method: str, one: dict[str, float]) -> float:
    latencies, generated, errors = [], 0, 0
    with httpx.Client() as client, concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        t0 = time.perf_counter()
        for latency, body in pool.map(lambda i: completion(client, url, i, tokens, method), range(requests)):
            latencies.append(latency)
            if body is None:
                errors += 1
            else:
                generated += body["usage"]["completion_tokens"]
        wall = time.perf_counter() - t0
    q = statistics.quantiles(latencies, n=20)
    rate = generated / wall
    one.setdefault(method, rate)
    print(
        f"{method:<10}{concurrency:>8}{requests:>10}{requests / wall:>12.2f}{rate:>10.1f}{rate / one[method]:>7.2f}x"
        f"{statistics.median(latencies) * 1e3:>10.0f}{q[18] * 1e3:>10.0f}{errors:>8}",
        flush=True,
    )
    return rate


def overhead(url: str, requests: int, tokens: int) -> None:
    shares, absolute = [], []
    with httpx.Client() as client:
        for i in range(requests):
            latency, body = completion(client, url, i, tokens)
            if body is None:
                continue
            stats = body["localcos"]
            inside = stats["seconds"] + stats["prompt_seconds"]  # the generation as the engine timed it
            absolute.append(latency - inside)
            shares.append((latency - inside) / latency)
    print(
        f"\nserver overhead per request (HTTP, JSON, queue; {tokens}-token completions, 1 client): "
        f"median {statistics.median(absolute) * 1e3:.2f} ms = {statistics.median(shares):.1%} of the latency"
    )


def stress(url: str, n: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    kinds = ["normal", "stream", "dropped-stream", "abandoned", "bad-json", "bad-value", "unknown-model"]
    plan = [rng.choice(kinds) for _ in range(n)]

    def one(i: int, kind: str) -> str:
        body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 24, "seed": i}
        with httpx.Client(timeout=120) as c:
            try:
                if kind == "normal":
                    return "ok" if c.post(url + "/v1/completions", json=body).status_code == 200 else "error"
                if kind == "stream":
                    r = c.post(url + "/v1/completions", json={**body, "stream": True})
                    return "ok" if r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]") else "error"
                if kind == "dropped-stream":
                    with c.stream("POST", url + "/v1/completions", json={**body, "max_tokens": 400, "stream": True}) as r:
                        for line in r.iter_lines():
                            if line.startswith("data: {"):
                                break
                    return "ok"
                if kind == "abandoned":
                    with contextlib.suppress(httpx.TimeoutException):
                        c.post(url + "/v1/completions", json={**body, "max_tokens": 400}, timeout=0.05)
                    return "ok"
                if kind == "bad-json":
                    r = c.post(url + "/v1/completions", content=b'{"prompt": ', headers={"content-type": "application/json"})
                elif kind == "bad-value":
                    r = c.post(url + "/v1/completions", json={**body, "temperature": "hot"})
                else:
                    r = c.post(url + "/v1/completions", json={**body, "model": "nope"})
                return "ok" if r.status_code in (400, 404) and "error" in r.json() else "error"
            except httpx.HTTPError:
                return "error"

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda a: one(*a), enumerate(plan)))
    counts = {k: plan.count(k) for k in kinds}
    counts["unexpected"] = results.count("error")
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", help="A,B (default: the synthetic demo pair)")
    p.add_argument("--preset", help="a models.toml preset instead (e.g. coder-we)")
    p.add_argument("--method", default="cos", help="the server's method (the ensemble is measured too)")
    p.add_argument("--gamma", default=None)
    p.add_argument("--parallel", type=int, default=8, help="the server's --parallel (default 8)")
    p.add_argument("--levels", default="1,2,4,8,16", help="concurrent clients (default 1,2,4,8,16)")
    p.add_argument("--requests", type=int, default=32, help="requests per concurrency level")
    p.add_argument("--tokens", type=int, default=32, help="tokens per completion")
    p.add_argument("--stress", type=int, default=300, help="requests in each stress round")
    args = p.parse_args()

    server = start(args)
    url = server.url
    try:
        models = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]
        print(f"localcos serve: {models['id']} ({models['localcos']['combiner']}, method {models['localcos']['method']}), {url}")
        completion(httpx.Client(), url, 0, 4)  # warm up
        print(f"\n{'method':<10}{'clients':>8}{'requests':>10}{'req/s':>12}{'tok/s':>10}{'vs 1':>8}{'p50 ms':>10}{'p95 ms':>10}{'errors':>8}")
        one: dict[str, float] = {}
        # the methods take turns at each level, so a drift of the machine's speed falls on both
        for concurrency in (int(c) for c in args.levels.split(",")):
            rates = {m: load(url, concurrency, max(args.requests, concurrency), args.tokens, m, one) for m in dict.fromkeys([args.method, "ensemble"])}
            if args.method != "ensemble":
                print(f"{'':<10}{'':>8}  {args.method} / ensemble at {concurrency} clients: {rates[args.method] / rates['ensemble']:.2f}x")
        overhead(url, args.requests, args.tokens)
        if not args.stress:
            return
        before = rss_mib(server.proc.pid)
        print(f"\nstress: {args.stress} requests x 2 rounds from 8 threads ...", flush=True)
        rounds = []
        for r in range(2):
            counts = stress(url, args.stress, seed=r)
            h = server.wait_idle(timeout=60)
            exact = all(m["kv_positions"] == m["cached_tokens"] for m in h["models"])
            rounds.append(rss_mib(server.proc.pid))
            print(f"round {r + 1}: {counts}; healthy: {h['status']}, caches exact: {exact}, resident {rounds[-1]:.0f} MiB")
        print(f"resident memory: {before:.0f} MiB before, {rounds[0]:.0f} after round 1, {rounds[1]:.0f} after round 2 ({rounds[1] - rounds[0]:+.0f} MiB)")
        ok = completion(httpx.Client(), url, 1, 8)[1] is not None
        print(f"a request after the stress: {'answered' if ok else 'FAILED'}")
    finally:
        server.stop()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
