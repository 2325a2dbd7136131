"""Servers on 127.0.0.1 for tests and benchmarks: a free port, and `localcos rpc-server` and
`localcos serve` child processes that are ready (they answer) when their constructors return."""

from __future__ import annotations

import os
import signal
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
                raise RuntimeError(f"rpc-server exited: {self.proc.stderr.read() if self.proc.stderr else ''}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"rpc-server did not answer on {self.endpoint} within {start_timeout:g}s")
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


class ServeProcess:
    """`localcos serve ARGS` on 127.0.0.1 and a free port, in a child process; ready (its /health
    answers) when the constructor returns, within `start_timeout` seconds. Its stdout and stderr
    are pipes, read when it stops."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, start_timeout: float = 90.0, cwd: str | None = None) -> None:
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "localcos", "serve", "--port", str(self.port), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=None if env is None else {**os.environ, **env},
            cwd=cwd,
        )
        deadline = time.monotonic() + start_timeout
        while True:  # bounded: until /health answers, the process exits, or the deadline
            if self.proc.poll() is not None:
                raise RuntimeError(f"localcos serve exited: {self.proc.stderr.read()}")  # type: ignore[union-attr]
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"localcos serve did not answer /health within {start_timeout:g}s")
            time.sleep(0.2)

    def health(self) -> dict:
        import httpx

        return httpx.get(self.url + "/health", timeout=10).json()

    def wait_idle(self, timeout: float = 20.0) -> dict:
        """/health once nothing runs or waits (at most `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if not h["queue"]["running"] and h["queue"]["waiting"] == 0:
                return h
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server is still busy after {timeout:g}s: {h}")
            time.sleep(0.05)

    def stop(self, timeout: float = 20.0) -> tuple[int, str, str]:
        """Ctrl-C, as a user would (killed if it takes longer than `timeout`); returns its exit
        status, stdout and stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        return self.proc.returncode, out or "", err or ""
