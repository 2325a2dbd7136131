"""`localcos rpc-server`: this host's CPU or GPUs as ggml devices for models of an ensemble
running elsewhere (llama.cpp's RPC server, from the same llama.cpp build localcos loads)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import socket

from ..errors import ConfigError, LocalcosError
from ..config.parse import parse_port
from .options import check_port_free, is_loopback, note, say

TRUST_FLAG = "--trusted-network"


def register(sub: argparse._SubParsersAction) -> None:
    from ..backend.rpc import DEFAULT_PORT

    p = sub.add_parser(
        "rpc-server",
        help="lend this host's CPU/GPUs to ensembles on other hosts (llama.cpp's RPC server)",
        description="Run llama.cpp's RPC server: a localcos on another host then puts a model's layers on this "
        "host's devices with --rpc HOST:PORT. The RPC protocol has no authentication: by default it listens "
        f"on 127.0.0.1 only; any other address needs {TRUST_FLAG}. A server serves one client at a time.",
    )
    p.add_argument("--host", default="127.0.0.1", help="IPv4 address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", default=str(DEFAULT_PORT), help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--threads", default=None, help="CPU threads for the CPU device (default: physical cores)")
    p.add_argument(
        "--device",
        default=None,
        metavar="DEV[,DEV]",
        help="devices to offer, e.g. CUDA0,CUDA1 (default: every GPU, else the CPU); see --list-devices",
    )
    p.add_argument("--cache", action="store_true", help="keep large tensors in a local cache so a reload sends only their hashes")
    p.add_argument(TRUST_FLAG, action="store_true", help="allow a non-loopback --host: only on a network where every host is trusted")
    p.add_argument("--list-devices", action="store_true", help="list this host's devices and exit")
    p.add_argument("--check", action="store_true", help="exit 0 if this llama.cpp build has the RPC backend, else say how to rebuild it")
    p.set_defaults(func=run)


def _listen_address(host: str) -> str:
    """ggml's RPC server binds IPv4 addresses only (inet_addr); localhost means 127.0.0.1."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise ConfigError(
            f"--host must be an IPv4 address (llama.cpp's RPC server listens on IPv4 only), got {host!r}", param="host"
        ) from None
    return host


def run(args: argparse.Namespace) -> int:
    from ..backend import default_threads
    from ..backend.rpc import NO_AUTH_WARNING, Endpoint, local_devices, pick_devices, require_rpc, serve
    from ..paths import cache_dir
    from ..config.parse import parse_int

    require_rpc()
    if args.check:
        print("this llama.cpp build has the RPC backend")
        return 0
    if args.list_devices:
        for d in local_devices():
            print(f"{d.name}\t{d.description}\t{d.total_mib} MiB ({d.free_mib} MiB free)")
        return 0
    devices = pick_devices([d.strip() for d in args.device.split(",") if d.strip()] if args.device else None)
    host = _listen_address(args.host)
    port = parse_port(args.port)
    threads = parse_int(args.threads, "--threads", minimum=1) if args.threads is not None else default_threads()
    if not is_loopback(host) and not args.trusted_network:
        raise ConfigError(
            f"refusing to listen on {host}: {NO_AUTH_WARNING} On a trusted network add {TRUST_FLAG}; for this machine only leave --host out",
            param="host",
        )
    if port == 0:
        with socket.socket() as s:  # ggml's server takes a port, not 0: pick a free one
            s.bind((host, 0))
            port = s.getsockname()[1]
    check_port_free(host, port)
    rpc_cache = None
    if args.cache:
        rpc_cache = os.fspath(cache_dir() / "rpc")
        os.makedirs(rpc_cache, exist_ok=True)
    endpoint = Endpoint(host, port)
    note(f"warning: {NO_AUTH_WARNING}")
    if not is_loopback(host):
        note(f"warning: listening on {host}: every host that can reach port {port} can use this server")
    names = ", ".join(f"{d.name} ({d.description}, {d.free_mib} MiB free)" for d in devices)
    say(f"localcos rpc-server: {names} at {endpoint}, {threads} threads; Ctrl-C stops")
    say(f"  use it from another host: localcos generate --models small.gguf,big.gguf --rpc -,{endpoint}")
    # the server loop never returns to Python: let Ctrl-C and SIGTERM end the process directly
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    serve(endpoint, devices, threads, rpc_cache)
    raise LocalcosError(f"llama.cpp's RPC server could not start on {endpoint} (see the lines above)")
