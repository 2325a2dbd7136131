"""llama.cpp's RPC backend: ggml devices on other hosts, and the server that exposes this host's.

An RPC server (`localcos rpc-server`, or llama.cpp's own `rpc-server`) exposes its host's CPU or
GPUs as ggml devices; a client offloads a model's layers onto them by listing them in
`llama_model_params.devices`. llama-cpp-python 0.3.36 binds none of this, so it is bound here
through ggml's backend registry (`ggml_backend_reg_get_proc_address`, as llama.cpp's own tools
find the RPC entry points). The backend exists only in builds made with `-DGGML_RPC=ON`;
`require_rpc()` says so in one line when it is missing.

The client side of ggml's RPC backend aborts the whole process when a server fails (connection
refused at load, a server that dies mid-call: `GGML_ABORT`). So localcos never connects to a server
from the process that holds the conversation: `backend.worker` does, in a process of its own.
`probe()` checks a server from here without that risk, speaking the protocol's HELLO in Python.
"""

from __future__ import annotations

import ctypes
import socket
import struct
from dataclasses import dataclass
from collections.abc import Sequence

import llama_cpp  # noqa: F401  (loads llama.cpp's libraries before ggml is bound below)
from llama_cpp._ggml import libggml as _ggml

from ..errors import ConfigError, RemoteError, RpcUnavailableError, param_of

DEFAULT_PORT = 50052
REBUILD = (
    'CMAKE_ARGS="-DGGML_RPC=ON" pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36'
)
# the protocol version this build speaks (ggml-rpc.h) and its HELLO message (ggml-rpc.cpp)
PROTO_MAJOR = 7
_CMD_HELLO = 14
_CONN_CAPS_SIZE = 24  # RPC_CONN_CAPS_SIZE: the request is only the client's transport caps
NO_AUTH_WARNING = (
    "the RPC protocol has no authentication or encryption: anyone who can reach this port can run "
    "computations on this host's devices and read their memory. Never expose it to an untrusted network."
)


# --- ggml's registry --------------------------------------------------------------------------

_c = ctypes
_ggml.ggml_backend_reg_by_name.argtypes = [_c.c_char_p]
_ggml.ggml_backend_reg_by_name.restype = _c.c_void_p
_ggml.ggml_backend_reg_get_proc_address.argtypes = [_c.c_void_p, _c.c_char_p]
_ggml.ggml_backend_reg_get_proc_address.restype = _c.c_void_p
_ggml.ggml_backend_reg_dev_count.argtypes = [_c.c_void_p]
_ggml.ggml_backend_reg_dev_count.restype = _c.c_size_t
_ggml.ggml_backend_reg_dev_get.argtypes = [_c.c_void_p, _c.c_size_t]
_ggml.ggml_backend_reg_dev_get.restype = _c.c_void_p
_ggml.ggml_backend_dev_count.argtypes = []
_ggml.ggml_backend_dev_count.restype = _c.c_size_t
_ggml.ggml_backend_dev_get.argtypes = [_c.c_size_t]
_ggml.ggml_backend_dev_get.restype = _c.c_void_p
_ggml.ggml_backend_dev_name.argtypes = [_c.c_void_p]
_ggml.ggml_backend_dev_name.restype = _c.c_char_p
_ggml.ggml_backend_dev_description.argtypes = [_c.c_void_p]
_ggml.ggml_backend_dev_description.restype = _c.c_char_p
_ggml.ggml_backend_dev_memory.argtypes = [_c.c_void_p, _c.POINTER(_c.c_size_t), _c.POINTER(_c.c_size_t)]
_ggml.ggml_backend_dev_memory.restype = None

_AddServer = _c.CFUNCTYPE(_c.c_void_p, _c.c_char_p)
_StartServer = _c.CFUNCTYPE(None, _c.c_char_p, _c.c_char_p, _c.c_size_t, _c.c_size_t, _c.POINTER(_c.c_void_p))


def _rpc_reg() -> int | None:
    return _ggml.ggml_backend_reg_by_name(b"RPC")


def rpc_available() -> bool:
    """True when the loaded llama.cpp has its RPC backend."""
    return bool(_rpc_reg())


def require_rpc() -> None:
    """Raise `RpcUnavailableError` (one line, with the rebuild command) unless RPC is built in."""
    if not rpc_available():
        raise RpcUnavailableError(
            "this llama.cpp build has no RPC backend (pip's wheel cache ignores CMAKE_ARGS); rebuild it with: " + REBUILD
        )


def _entry(name: str, prototype: type) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    require_rpc()
    address = _ggml.ggml_backend_reg_get_proc_address(_rpc_reg(), name.encode())
    if not address:
        raise RpcUnavailableError(f"this llama.cpp's RPC backend lacks {name}; rebuild it with: {REBUILD}")
    return prototype(address)


# --- endpoints ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """One RPC server: host and TCP port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoint(text: str, what: str = "--rpc") -> Endpoint:
    """HOST:PORT as an `Endpoint` (ggml's RPC transport speaks IPv4: a name or an IPv4 address);
    `ConfigError` naming `what` otherwise."""
    text = text.strip()
    host, sep, port_text = text.partition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536 or any(c.isspace() for c in host):
        raise ConfigError(f"{what} must be HOST:PORT (or - for a local model), got {text!r}", param=param_of(what))
    return Endpoint(host, int(port_text))


def probe(endpoint: Endpoint, timeout: float = 5.0) -> str | None:
    """None if an RPC server of this build's protocol answers at `endpoint` within `timeout`
    seconds; else why not, in a few words. Speaks the HELLO handshake from Python, so an absent
    or busy server cannot abort this process."""
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(struct.pack("<BQ", _CMD_HELLO, _CONN_CAPS_SIZE) + bytes(_CONN_CAPS_SIZE))
            reply = b""
            while len(reply) < 11:
                chunk = sock.recv(64)
                if not chunk:
                    return "it closed the connection at the handshake (not an RPC server, or another protocol version)"
                reply += chunk
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as e:
        return e.strerror or str(e)
    major, minor, patch = reply[8], reply[9], reply[10]
    if major != PROTO_MAJOR:
        return f"it speaks RPC protocol {major}.{minor}.{patch}, this llama.cpp speaks {PROTO_MAJOR}.x (use the same llama.cpp version on both sides)"
    return None


def check_reachable(endpoints: Sequence[Endpoint], timeout: float = 5.0) -> None:
    """Raise `RemoteError` naming the first server of `endpoints` that does not answer."""
    for endpoint in endpoints:
        why = probe(endpoint, timeout)
        if why and why.startswith("no answer"):
            why += " (an RPC server serves one client at a time: is another process using it?)"
        if why:
            raise RemoteError(f"RPC server {endpoint} is unreachable: {why}")


# --- client side (only ever called in a worker process: see the module's docstring) -----------


def server_devices(endpoints: Sequence[Endpoint]) -> list[int]:
    """The ggml devices of these RPC servers, in order (connects to each: worker processes only)."""
    add_server = _entry("ggml_backend_rpc_add_server", _AddServer)
    devices: list[int] = []
    for endpoint in endpoints:
        reg = add_server(str(endpoint).encode())
        if not reg:
            raise RemoteError(f"RPC server {endpoint} offers no devices")
        devices.extend(_ggml.ggml_backend_reg_dev_get(reg, i) for i in range(_ggml.ggml_backend_reg_dev_count(reg)))
    return devices


# --- server side --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    """A ggml device of this host: its name (CPU, CUDA0, ...), description and memory."""

    handle: int
    name: str
    description: str
    total_mib: int
    free_mib: int


def local_devices() -> list[Device]:
    """This host's ggml devices (RPC devices excluded)."""
    found = []
    for i in range(_ggml.ggml_backend_dev_count()):
        dev = _ggml.ggml_backend_dev_get(i)
        name = (_ggml.ggml_backend_dev_name(dev) or b"").decode()
        if name.startswith("RPC"):
            continue
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        _ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        desc = (_ggml.ggml_backend_dev_description(dev) or b"").decode()
        found.append(Device(dev, name, desc, total.value >> 20, free.value >> 20))
    return found


def pick_devices(names: Sequence[str] | None) -> list[Device]:
    """The devices named (case-insensitive), or by default every accelerator, else the CPU (as
    llama.cpp's rpc-server chooses)."""
    devices = local_devices()
    if names:
        by_name = {d.name.lower(): d for d in devices}
        unknown = [n for n in names if n.lower() not in by_name]
        if unknown:
            raise ConfigError(f"--device: no device {unknown[0]!r} here; this host has {', '.join(d.name for d in devices)}", param="device")
        return [by_name[n.lower()] for n in names]
    accelerators = [d for d in devices if d.name != "CPU"]
    return accelerators or [d for d in devices if d.name == "CPU"]


def serve(endpoint: Endpoint, devices: Sequence[Device], n_threads: int, cache_dir: str | None) -> None:
    """Run llama.cpp's RPC server on `endpoint` in this thread; returns only if it cannot start."""
    start_server = _entry("ggml_backend_rpc_start_server", _StartServer)
    handles = (ctypes.c_void_p * len(devices))(*[d.handle for d in devices])
    start_server(str(endpoint).encode(), cache_dir.encode() if cache_dir else None, n_threads, len(devices), handles)
