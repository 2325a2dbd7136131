"""Models on RPC servers, driven from a worker process so that a failing server costs nothing else.

ggml's RPC client aborts its process when a server goes away (see `backend.rpc`). A `RemoteModel`
therefore keeps only its vocabulary here, in the process that holds the conversation and the
local models, and has its llama.cpp model and context in a worker process (`python -m
localcos.backend.worker`). Each call to the model is one message to the worker, and each logits
row comes back through a shared memory file; nothing else crosses. Models that share an RPC
server share a worker, because an RPC server serves one client connection at a time.

When a server fails, the worker dies (or stops answering: every request has a deadline, and each
progress report while loading extends it). The `RemoteModel` then raises `RemoteError`, naming
the server, and forgets its KV cache; everything in this process is intact. Its next call starts a
new worker and loads the model again, so a chat or a server can go on once the host is back.
"""

from __future__ import annotations

import mmap
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from multiprocessing.connection import Connection
from typing import IO, Any
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import ConfigError, ModelFileError, RemoteError
from .model import Model
from .rpc import Endpoint, check_reachable, probe
import contextlib

DEFAULT_TIMEOUT = 120.0  # seconds a worker may stay silent before its server is taken as lost
_EXIT_WAIT = 5.0
# what a RemoteModel learns from its worker's load
_LOADED = ("n_ctx", "n_batch", "n_threads", "max_logit_rows", "n_params", "size_bytes", "offloaded")


def layers_to_offload(servers: Sequence[Endpoint], n_gpu_layers: int | None, index: int) -> int:
    """Model `index`'s --n-gpu-layers: as given, else every layer for a model on RPC servers
    (layers left behind would run on this host's CPU) and none for a local one. Zero layers on
    RPC servers is refused: the servers would do nothing."""
    if n_gpu_layers is None:
        return -1 if servers else 0
    if servers and n_gpu_layers == 0:
        raise ConfigError(
            f"model {index} is on RPC server {'+'.join(map(str, servers))} but --n-gpu-layers gives it 0 layers "
            "there; give -1 (all) or a count",
            param="n_gpu_layers",
        )
    return n_gpu_layers


def _shared_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None  # else the temp dir (macOS)


class WorkerProcess:
    """One worker process, the message channel to it (a socket pair, pickled messages) and the
    `RemoteModel`s it holds."""

    _live: list[WorkerProcess] = []

    def __init__(self, endpoints: Sequence[Endpoint]) -> None:
        self.endpoints: set[Endpoint] = set(endpoints)
        self.models: list[RemoteModel] = []
        self.lost: str | None = None  # why it is gone, once it is
        self._lock = threading.Lock()  # one request at a time on the channel
        ours, theirs = socket.socketpair()
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115  (the worker's stderr for its whole life, read when it fails)
        env = dict(os.environ, GGML_NO_BACKTRACE="1")  # an abort is expected here, not a bug to trace
        self.process = subprocess.Popen(
            [sys.executable, "-m", "localcos.backend.worker", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            env=env,
        )
        theirs.close()
        self.conn = Connection(ours.detach())
        WorkerProcess._live.append(self)

    @classmethod
    def for_endpoints(cls, endpoints: Sequence[Endpoint]) -> WorkerProcess:
        """A live worker already connected to one of these servers, else a new one. Servers it
        is not yet connected to are probed first (the one it holds would not answer a probe:
        an RPC server serves one connection at a time)."""
        joined = next((w for w in cls._live if w.lost is None and w.endpoints & set(endpoints)), None)
        check_reachable([e for e in endpoints if joined is None or e not in joined.endpoints])
        if joined is None:
            return cls(endpoints)
        joined.endpoints |= set(endpoints)
        return joined

    def request(self, timeout: float, op: str, *args: Any) -> Any:
        """Send one request and wait for its answer (at most `timeout` s between messages)."""
        with self._lock:
            return self._request(timeout, op, *args)

    def _request(self, timeout: float, op: str, *args: Any) -> Any:
        if self.lost is not None:
            raise RemoteError(self.lost)
        try:
            self.conn.send((op, *args))
            while True:
                if not self.conn.poll(timeout):
                    self._fail(f"no answer within {timeout:g} s")
                reply = self.conn.recv()
                if reply[0] != "progress":
                    break
        except (EOFError, OSError):
            self._fail("its connection closed")
        except RemoteError:
            raise
        except BaseException:  # interrupted mid-call (Ctrl-C): its answer would answer the next call
            self._abandon("a call to it was interrupted")
            raise
        if reply[0] == "error":
            _, kind, message = reply
            raise {"model": ModelFileError, "value": ValueError, "remote": RemoteError}.get(kind, RuntimeError)(message)
        return reply[1]

    def _fail(self, what: str) -> None:
        """The worker is gone or stuck: end it, say which server is at fault, raise."""
        self.stop(kill=True)
        down = {e: probe(e, timeout=2.0) for e in sorted(self.endpoints, key=str)}
        named = [f"{e} ({why})" for e, why in down.items() if why]
        if named:
            why = f"lost RPC server {', '.join(named)}"
        else:  # every server answers again: report what the worker saw
            why = f"lost the connection to RPC server {', '.join(str(e) for e in down)}: {self.stderr_tail() or what}"
        self._abandon(why)
        raise RemoteError(why)

    def _abandon(self, why: str) -> None:
        """Give the worker up: it is ended, and its models' caches are empty here too (a later
        prefill then starts from nothing and loads the model again)."""
        self.stop(kill=True)
        self.lost = why
        for model in self.models:
            model._forget()

    def stderr_tail(self) -> str:
        """The worker's last error line (ggml's abort message, when it aborted)."""
        self._stderr.seek(0)
        lines = [ln.strip() for ln in self._stderr.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        aborts = [ln for ln in lines if "GGML_ABORT" in ln or "error" in ln.lower()]
        return (aborts or lines or [""])[-1][-300:]

    def detach(self, model: RemoteModel) -> None:
        """`model` no longer uses this worker; the last one out ends it."""
        if model in self.models:
            self.models.remove(model)
        if not self.models:
            self.stop()

    def stop(self, kill: bool = False) -> None:
        if self in WorkerProcess._live:
            WorkerProcess._live.remove(self)
        if self.process.poll() is None:
            if not kill:
                try:
                    self.conn.send(("exit",))
                    self.process.wait(_EXIT_WAIT)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        if not self.conn.closed:
            self.conn.close()
        if self.lost is None:
            self.lost = "its worker process was stopped"


class RemoteModel(Model):
    """A model whose layers live on RPC servers (`rpc`), with `Model`'s interface.

    The vocabulary and metadata are read here (a vocab-only load); the weights, the context and
    the KV cache are in a worker process, which uploads the offloaded layers to the servers.
    `timeout` bounds every call (and each stretch of loading without progress). Other arguments
    as `Model`'s; `n_gpu_layers` defaults to all, since layers left here would run on this CPU.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        rpc: Sequence[Endpoint],
        timeout: float = DEFAULT_TIMEOUT,
        n_gpu_layers: int = -1,
        **load_options: Any,
    ) -> None:
        super().__init__(path, vocab_only=True)
        if not rpc:
            raise ValueError("a RemoteModel needs at least one RPC server")
        self.rpc = tuple(rpc)
        self.timeout = timeout
        self.n_gpu_layers = n_gpu_layers
        self._load_options = dict(load_options, n_gpu_layers=n_gpu_layers)
        self._worker: WorkerProcess | None = None
        self._rows: np.ndarray | None = None
        self._rows_map: mmap.mmap | None = None
        self._worker_kv = 0  # the worker's KV cache length, as its last answer gave it
        self._connect()

    @property
    def servers(self) -> str:
        """The RPC servers as --rpc writes them (HOST:PORT+HOST:PORT)."""
        return "+".join(str(e) for e in self.rpc)

    def _connect(self) -> None:
        """Start (or join) a worker and load the model there, with an empty cache."""
        try:
            worker = WorkerProcess.for_endpoints(self.rpc)
        except RemoteError as e:
            raise RemoteError(f"{self.label}: {e}") from None
        worker.models.append(self)
        self._worker = worker
        fd, rows_path = tempfile.mkstemp(prefix="localcos-logits-", dir=_shared_dir())
        try:
            info = worker.request(
                self.timeout, "load", id(self), str(self.path), [str(e) for e in self.rpc], self._load_options, rows_path
            )
            size = info["max_logit_rows"] * self.n_vocab * 4
            os.ftruncate(fd, size)
            self._rows_map = mmap.mmap(fd, size)
            self._rows = np.frombuffer(self._rows_map, dtype=np.float32).reshape(info["max_logit_rows"], self.n_vocab)
            worker.request(self.timeout, "map", id(self))
        except RemoteError as e:
            self._disconnect()
            raise RemoteError(f"{self.label}: {e}") from None
        except BaseException:
            self._disconnect()
            raise
        finally:
            os.close(fd)
            os.unlink(rows_path)  # both processes keep their mappings
        for key in _LOADED:
            setattr(self, key, info[key])
        self._forget()

    def _disconnect(self) -> None:
        if self._worker is not None:
            self._worker.detach(self)
            self._worker = None
        self._rows = None
        if self._rows_map is not None:
            self._rows_map.close()
            self._rows_map = None

    def _forget(self) -> None:
        """The worker's KV cache is gone (or new): so is ours."""
        slot = self.slot0
        slot.tokens.clear()
        slot._prefill_row = None
        self._worker_kv = 0
        slot._publish()

    @property
    def connected(self) -> bool:
        return self._worker is not None and self._worker.lost is None

    def _request(self, op: str, *args: Any) -> Any:
        try:
            return self._worker.request(self.timeout, op, id(self), *args)  # type: ignore[union-attr]
        except RemoteError as e:
            self._forget()
            self._disconnect()
            raise RemoteError(
                f"{self.label}: {e}; the other models and the conversation are kept, and the next request loads it again"
            ) from None

    def _run_batch(self, parts: Sequence[tuple[Any, Sequence[int], int, int]]) -> np.ndarray:
        (slot, tokens, out_from, out_to), = parts  # one sequence: a remote model has one slot
        start = len(slot.tokens)
        if not self.connected:
            # after a loss the cache is empty (`_forget`), so this batch starts at 0: load again
            if start:
                raise RuntimeError(f"{self.name}: a batch at position {start} after its worker was lost")
            self._disconnect()
            self._connect()
        self._worker_kv = self._request("decode", [int(t) for t in tokens], start, out_from, out_to)
        return self._rows[: out_to - out_from]  # type: ignore[index]

    def remove_cells(self, seq_id: int, n: int) -> None:
        self._worker_kv = self._request("truncate", n)

    def _clear(self) -> None:
        if self.connected:  # a lost worker's cache is gone with it
            self._worker_kv = self._request("reset")

    def _save_state(self, seq_id: int) -> None:
        """Not kept: a prompt on RPC servers is evaluated again at each start (its cells would
        cross the pipe both ways)."""
        return None

    def kv_positions(self, seq_id: int) -> int:
        """The worker's llama.cpp KV cache length as of its last answer (0 when disconnected):
        read without a round trip, so /health never waits for a running call."""
        return self._worker_kv if self.connected else 0

    def close(self) -> None:
        if self.connected:
            with contextlib.suppress(RemoteError):
                self._request("close")
        self._disconnect()
        super().close()

    def __repr__(self) -> str:
        return f"RemoteModel({self.name!r}, rpc={self.servers!r}, n_vocab={self.n_vocab}, n_ctx={self.n_ctx})"


# --- the worker process ---------------------------------------------------------------------------


def _serve(conn: Connection) -> None:
    from .rpc import parse_endpoint, server_devices

    models: dict[int, Model] = {}
    rows_files: dict[int, str] = {}
    rows: dict[int, np.ndarray] = {}

    def load(key: int, path: str, endpoints: list[str], options: dict[str, Any], rows_path: str) -> dict[str, Any]:
        devices = server_devices([parse_endpoint(e) for e in endpoints])
        model = Model(path, devices=devices, load_progress=lambda f: conn.send(("progress", f)), **options)
        models[key] = model
        rows_files[key] = rows_path
        return {k: getattr(model, k) for k in _LOADED}

    def map_rows(key: int) -> None:
        model = models[key]
        with open(rows_files.pop(key), "r+b") as f:
            buffer = mmap.mmap(f.fileno(), model.max_logit_rows * model.n_vocab * 4)
        rows[key] = np.frombuffer(buffer, dtype=np.float32).reshape(model.max_logit_rows, model.n_vocab)

    def decode(key: int, tokens: list[int], start: int, out_from: int, out_to: int) -> int:
        model = models[key]
        if start != len(model.tokens):
            raise RuntimeError(f"{model.name}: a batch at position {start}, but the cache holds {len(model.tokens)}")
        rows[key][: out_to - out_from] = model.decode([(model.slot0, tokens, out_from, out_to)])[0]
        return model.kv_length()

    def truncate(key: int, n: int) -> int:
        models[key].truncate(n)
        return models[key].kv_length()

    def reset(key: int) -> int:
        models[key].reset()
        return models[key].kv_length()

    def close(key: int) -> None:
        rows.pop(key, None)
        models.pop(key).close()

    handlers: dict[str, Callable[..., Any]] = {
        "load": load,
        "map": map_rows,
        "decode": decode,
        "truncate": truncate,
        "reset": reset,
        "close": close,
    }
    while True:
        try:
            op, *args = conn.recv()
        except (EOFError, OSError):
            return  # the client is gone
        if op == "exit":
            return
        try:
            conn.send(("ok", handlers[op](*args)))
        except ModelFileError as e:
            conn.send(("error", "model", str(e)))
        except RemoteError as e:
            conn.send(("error", "remote", str(e)))
        except ValueError as e:
            conn.send(("error", "value", str(e)))
        except Exception as e:
            conn.send(("error", "runtime", f"{type(e).__name__}: {e}"))


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the client's to handle
    conn = Connection(int(argv[0]))
    try:
        _serve(conn)
    finally:
        os._exit(0)  # llama.cpp's memory goes with the process


if __name__ == "__main__":
    main(sys.argv[1:])
