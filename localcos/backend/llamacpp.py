"""llama.cpp in this process: its backend started once, its log kept (the recent lines, for a
failed load's message) and echoed only when asked, and the defaults for its threads and weight
buffers."""

from __future__ import annotations

import ctypes
import os
import threading
from collections import deque

# llama.cpp's libraries load before NumPy's: on a CUDA 13 build (H100, NumPy 2.5, Python 3.12)
# loading them after NumPy made llama_model_load_from_file segfault in print_info (its C++
# stream calls bound to copies of libstdc++ symbols exported by libggml-cuda); plain llama-cpp-python
# crashed the same way when NumPy came first.
import llama_cpp  # isort: skip

from ..paths import env_switch

# --- llama.cpp logging -------------------------------------------------------------------------
# llama.cpp logs every load step to stderr. We keep the recent lines (an error message from a
# failed load is shown to the user) and print them only when LOCALCOS_VERBOSE is set.
_LOG_LINES: deque[str] = deque(maxlen=200)
_LOG_ERRORS: deque[str] = deque(maxlen=20)
_LOG_LOCK = threading.Lock()
_VERBOSE = bool(os.environ.get("LOCALCOS_VERBOSE"))


_GGML_LOG_ERROR, _GGML_LOG_CONT = 4, 5  # ggml_log_level
_last_level = 0


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    global _last_level
    line = text.decode("utf-8", errors="replace")
    if level == _GGML_LOG_CONT:
        level = _last_level
    _last_level = level
    with _LOG_LOCK:
        _LOG_LINES.append(line)
        if level == _GGML_LOG_ERROR:
            _LOG_ERRORS.append(line.strip())
    if _VERBOSE:
        import sys

        print(line, end="", file=sys.stderr, flush=True)


def _install_logging() -> None:
    llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))


_install_logging()
llama_cpp.llama_backend_init()


def set_verbose(verbose: bool) -> None:
    """Echo llama.cpp's own log lines to stderr (off by default)."""
    global _VERBOSE
    _VERBOSE = verbose
    _install_logging()


def _offloaded_layers() -> str | None:
    """"N/M" from llama.cpp's last "offloaded N/M layers" load line, if it logged one."""
    with _LOG_LOCK:
        for line in reversed(_LOG_LINES):
            if "offloaded " in line and " layers to GPU" in line:
                return line.split("offloaded ", 1)[1].split(" layers", 1)[0]
    return None


def last_llama_error() -> str:
    """The most telling llama.cpp error logged since the last call (the first one: later lines
    only say that loading failed)."""
    with _LOG_LOCK:
        errors = [e for e in _LOG_ERRORS if e]
        _LOG_ERRORS.clear()
    return errors[0] if errors else ""


def default_threads() -> int:
    """Threads for llama.cpp: every core the process may use, halved on larger machines where
    the count includes SMT siblings (llama.cpp runs best on physical cores)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        n = os.cpu_count() or 1
    return n if n <= 4 else max(4, n // 2)


def amx_in_use() -> bool:
    """True when this llama.cpp build runs AMX kernels on this CPU."""
    return b"AMX_INT8 = 1" in (llama_cpp.llama_print_system_info() or b"")


def default_extra_buffers() -> bool:
    """Whether llama.cpp may repack weights into its extra CPU buffer types.

    Off where llama.cpp would use its AMX kernels: they segfault in ggml_backend_amx_mul_mat on
    some Sapphire Rapids machines (llama.cpp issue #20824; seen on the machines localcos is
    tested on). LOCALCOS_EXTRA_BUFFERS=1 or =0 overrides.
    """
    switch = env_switch("LOCALCOS_EXTRA_BUFFERS")
    return not amx_in_use() if switch is None else switch
