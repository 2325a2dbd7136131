"""The standard ensemble vs CoS with a model on an RPC server, as network latency grows.

One model (by default cd-pair's expert: the "big model on another host" case) runs on a
`localcos rpc-server`; the other stays here. For each one-way delay the benchmark:
1. makes a network namespace of its own with `tc netem` delaying its loopback interface (so a
   round trip costs twice the delay), starts the RPC server and this script's measuring half
   inside it, then deletes the namespace (delay 0 runs on the plain loopback, no namespace);
2. times the ensemble and cos side by side on the same prompts (ensemble, cos, ensemble, cos),
   greedy, and reports tokens/s, the cos/ensemble ratio, calls per model per token and RPC round
   trips per token.
Round trips are counted, untimed, through a small proxy that reads the RPC protocol's reply
frames (every command that waits for an answer is one round trip).

The namespace needs root (or CAP_NET_ADMIN), `ip` and `tc`, and a kernel with the netem qdisc.
Where one is missing (some VMs' kernels have no netem) it says so on stderr, and the same proxy
adds the delay instead: each chunk leaves `delay` after it arrived, in each direction.

    .venv/bin/python benchmarks/rpc.py                      # cd-pair, delays 0,1,5 ms
    .venv/bin/python benchmarks/rpc.py --set we-pair --delays 0,2 --tokens 64
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time

from localcos.testing.loopback import RpcServerProcess
import contextlib

PROMPTS = ["The river flows from the mountains", "Once upon a time there was", "Two plus two makes", "The old mill by the water"]
METHODS = ("ensemble", "cos")


def _hang_up(sock: socket.socket) -> None:
    """Send FIN now (close() alone waits for the other thread reading this socket)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class Proxy:
    """Forwards RPC client connections to a server, delaying every chunk by `delay` seconds in
    each direction (pipelined: a chunk leaves `delay` after it arrived, whatever is in flight),
    and counts the server's reply frames (| size: 8 bytes | data |): one per command that waited
    for an answer, i.e. one per round trip."""

    def __init__(self, target: tuple[str, int], delay: float = 0.0) -> None:
        self.target = target
        self.delay = delay
        self.replies = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._direction(client, server, count=False)
            self._direction(server, client, count=True)

    def _direction(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        chunks: queue.Queue = queue.Queue()

        def read() -> None:
            frame = b""
            try:
                while data := src.recv(1 << 16):
                    chunks.put((time.perf_counter() + self.delay, data))
                    if count:
                        frame += data
                        while len(frame) >= 8:  # whole reply frames: count them, drop them
                            (size,) = struct.unpack_from("<Q", frame)
                            if len(frame) < 8 + size:
                                break
                            frame = frame[8 + size :]
                            self.replies += 1
            except OSError:
                pass
            chunks.put(None)

        def write() -> None:
            while (item := chunks.get()) is not None:
                due, data = item
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                try:
                    dst.sendall(data)
                except OSError:
                    break
            _hang_up(dst)

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()

    def close(self) -> None:
        self.listener.close()


def load(args: argparse.Namespace, endpoint):
    from localcos import Ensemble
    from localcos.backend.rpc import Endpoint
    from localcos.config import resolve

    settings = resolve({"synthetic": args.set, "ctx": 2048})
    where = [()] * len(settings.load.paths)
    if endpoint is not None:  # None: every model here
        where[args.remote] = (endpoint if isinstance(endpoint, Endpoint) else Endpoint("127.0.0.1", endpoint),)
    return Ensemble.load(settings.load.paths, settings.combiner(), n_ctx=2048, rpc=where, n_threads=args.threads)


def run_methods(ens, args: argparse.Namespace, rounds: int, methods=METHODS) -> dict:
    """tokens, seconds and calls per model for each method, over `rounds` A-B rounds."""
    totals = {m: {"tokens": 0, "seconds": 0.0, "calls": [0] * len(ens.models)} for m in methods}
    for _ in range(rounds):
        for method in methods:
            for prompt in PROMPTS[: args.prompts]:
                out = ens.generate(prompt, method=method, temperature=0, max_tokens=args.tokens, ignore_eos=True)
                t = totals[method]
                t["tokens"] += len(out.token_ids)
                t["seconds"] += out.stats.seconds
                for i, m in enumerate(out.stats.models):
                    t["calls"][i] += m.calls
    return totals


def measure(args: argparse.Namespace, delay_ms: float = 0.0, proxied: bool = False) -> dict:
    """One server, both methods: tokens, seconds, calls and (through a proxy) round trips. With
    `proxied`, the proxy adds `delay_ms` each way; otherwise the network (netem) does."""
    server = RpcServerProcess(threads=args.server_threads)
    proxy = Proxy(("127.0.0.1", server.endpoint.port), delay_ms / 1000) if proxied else None
    try:
        with load(args, proxy.port if proxy else server.endpoint) as ens:
            ens.generate(PROMPTS[0], max_tokens=8)  # warm-up
            totals = run_methods(ens, args, args.rounds)
            if proxy:  # round trips of both methods together; split by a short untimed run each
                for method in METHODS:
                    start = proxy.replies
                    one = run_methods(ens, argparse.Namespace(**{**vars(args), "prompts": 1}), 1, (method,))
                    totals[method]["round_trips_per_token"] = (proxy.replies - start) / one[method]["tokens"]
            return totals
    finally:
        if proxy:
            proxy.close()
        server.kill()


def in_namespace(args: argparse.Namespace, delay_ms: float) -> dict:
    """`measure` in a network namespace made for it, its loopback delayed by netem; removed after."""
    ns = f"localcos-rpc-{os.getpid()}"
    inner = [sys.executable, os.path.abspath(__file__), "--measure", *sys.argv[1:]]
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        ip = ["ip", "netns", "exec", ns]
        subprocess.run([*ip, "ip", "link", "set", "lo", "up"], check=True)
        if delay_ms:
            subprocess.run([*ip, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", f"{delay_ms}ms"], check=True)
        out = subprocess.run([*ip, *inner], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"rpc.py: the measurement at {delay_ms} ms failed:\n{out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def netem_missing() -> str | None:
    """Why a namespace with a netem-delayed loopback cannot be made here (None: it can)."""
    if not (shutil.which("ip") and shutil.which("tc")):
        return "ip and tc (iproute2) are not installed"
    ns = f"localcos-rpc-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", ns], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace ({made.stderr.strip() or 'ip netns add failed'}); run as root"
    try:
        ip = ["ip", "netns", "exec", ns]
        subprocess.run([*ip, "ip", "link", "set", "lo", "up"], check=True)
        netem = subprocess.run([*ip, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"], capture_output=True, text=True)
        if netem.returncode != 0:
            return f"this kernel has no netem qdisc ({netem.stderr.strip()})"
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--set", default="cd-pair", help="synthetic set (default cd-pair: amateur here, expert remote)")
    p.add_argument("--remote", type=int, default=1, help="index of the model on the RPC server (default 1: cd-pair's expert)")
    p.add_argument("--delays", default="0,1,5", help="one-way delays in ms (default 0,1,5)")
    p.add_argument("--tokens", type=int, default=96, help="tokens per prompt")
    p.add_argument("--prompts", type=int, default=4, help="prompts per round (at most 4)")
    p.add_argument("--rounds", type=int, default=2, help="A-B rounds (ensemble, cos) per delay")
    p.add_argument("--threads", type=int, default=None, help="threads of the local model(s)")
    p.add_argument("--server-threads", type=int, default=None, help="threads of the RPC server")
    p.add_argument("--proxy", action="store_true", help="add the delay in a user-space proxy even where netem works")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(measure(args)))
        return

    from localcos.models.synthetic import ensure_set

    ensure_set(args.set, progress=lambda m: print(m, file=sys.stderr))
    delays = [float(d) for d in args.delays.split(",")]
    why_not = "--proxy" if args.proxy else netem_missing()
    if why_not:
        print(f"rpc.py: delaying in a user-space proxy, not netem: {why_not}", file=sys.stderr)
    trips = None if why_not else measure(args, proxied=True)  # netem: count round trips once, through the proxy
    print(f"# {args.set}, model {args.remote} on an RPC server over loopback, greedy, {args.prompts} prompts x {args.tokens} tokens x {args.rounds} rounds")
    print(f"# delay: {'user-space proxy (' + why_not + ')' if why_not else 'tc netem on the loopback of a network namespace'}; a round trip costs 2 x delay")
    with load(args, None) as ens:
        ens.generate(PROMPTS[0], max_tokens=8)
        here = run_methods(ens, args, args.rounds)
    rate = {m: here[m]["tokens"] / here[m]["seconds"] for m in METHODS}
    print(f"# every model here: ensemble {rate['ensemble']:.1f} tok/s, cos {rate['cos']:.1f} tok/s ({rate['cos'] / rate['ensemble']:.2f}x)")
    print("delay_ms  ensemble_tok/s  cos_tok/s  cos/ensemble  round_trips/token ens  cos  calls/token ens (per model)  cos (per model)")
    for delay in delays:
        r = measure(args, delay, proxied=True) if why_not else in_namespace(args, delay)
        counted = r if why_not else trips
        rate = {m: r[m]["tokens"] / r[m]["seconds"] for m in METHODS}
        calls = {m: "/".join(f"{c / r[m]['tokens']:.2f}" for c in r[m]["calls"]) for m in METHODS}
        print(
            f"{delay:8g}  {rate['ensemble']:14.1f}  {rate['cos']:9.1f}  {rate['cos'] / rate['ensemble']:11.2f}x"
            f"  {counted['ensemble']['round_trips_per_token']:21.2f}  {counted['cos']['round_trips_per_token']:4.2f}"
            f"  {calls['ensemble']:>27}  {calls['cos']:>15}",
            flush=True,
        )


if __name__ == "__main__":
    main()
