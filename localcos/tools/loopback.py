"""Servers on 127.0.0.1 for tests and benchmarks: a free port, and a `localcos rpc-server` child
process that is ready (it answers the RPC handshake) when the constructor returns."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from ..backend.rpc import Endpoint, probe


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RpcServerProcess:
    """`localcos rpc-server` on 127.0.0.1 (a free port unless given), in this process's network
    namespace; waits at most `start_timeout` seconds for its handshake. Its stderr is a pipe."""

    def __init__(self, port: int | None = None, threads: int | None = None, start_timeout: float = 30.0) -> None:
        self.endpoint = Endpoint("127.0.0.1", port or free_port())
        command = [sys.executable, "-m", "localcos", "rpc-server", "--port", str(self.endpoint.port)]
        if threads:
            command += ["--threads", str(threads)]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + start_timeout
        while probe(self.endpoint, timeout=2.0) is not None:  # bounded: the deadline or the process's exit
            if self.proc.poll() is not None:
                raise RuntimeError(f"rpc-server exited: {self.proc.stderr.read()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"rpc-server did not answer on {self.endpoint} within {start_timeout:g}s")
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc.stderr.close()
