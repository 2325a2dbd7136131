"""One GGUF model in its own llama.cpp context, driven through the low-level batch API.

A `Model` owns a llama.cpp model and context with a single sequence (id 0) in its KV cache, and
always knows exactly which tokens that cache holds (`Model.tokens`). `evaluate` appends tokens and
returns the logits of just the positions asked for, copied out of llama.cpp's output rows
(`llama_get_logits`); nothing proportional to n_ctx x n_vocab is ever allocated (the high-level
`Llama(logits_all=True)` keeps such a buffer). `truncate` removes KV entries with `seq_rm`, which
is how speculative decoding rolls back rejected drafts.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

# llama.cpp's libraries load before NumPy's: on a CUDA 13 build (H100, NumPy 2.5, Python 3.12)
# loading them after NumPy made llama_model_load_from_file segfault in print_info (its C++
# stream calls bound to copies of libstdc++ symbols exported by libggml-cuda); plain llama-cpp-python
# crashed the same way when NumPy came first.
import llama_cpp  # isort: skip
import numpy as np

from ..errors import Cancelled, ModelFileError
from ..paths import env_switch

GGUF_MAGIC = b"GGUF"
MIN_CTX = 8
SPLIT_MODES = {
    "none": llama_cpp.LLAMA_SPLIT_MODE_NONE,
    "layer": llama_cpp.LLAMA_SPLIT_MODE_LAYER,
    "row": llama_cpp.LLAMA_SPLIT_MODE_ROW,
}
FLASH_ATTN = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}

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


def _last_llama_error() -> str:
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


def check_gguf_file(path: str | os.PathLike[str]) -> Path:
    """Raise `ModelFileError` unless `path` is a readable file that starts with the GGUF magic."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelFileError(f"model file not found: {p}")
    if not p.is_file():
        raise ModelFileError(f"not a file: {p}")
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelFileError(f"cannot read {p}: {e.strerror}") from e
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{p} is not a GGUF file (it does not start with the GGUF magic bytes)")
    return p


@dataclass
class ModelStats:
    """Work done by one model: llama_decode calls, tokens evaluated, seconds inside llama.cpp."""

    calls: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def reset(self) -> None:
        self.calls, self.tokens, self.seconds = 0, 0, 0.0

    def snapshot(self) -> "ModelStats":
        return ModelStats(self.calls, self.tokens, self.seconds)

    def minus(self, earlier: "ModelStats") -> "ModelStats":
        return ModelStats(
            self.calls - earlier.calls, self.tokens - earlier.tokens, self.seconds - earlier.seconds
        )


class Model:
    """A GGUF model loaded into its own llama.cpp context (one sequence in the KV cache).

    Args:
        path: the GGUF file.
        n_ctx: context length in tokens (KV cache size).
        n_gpu_layers: layers to offload to the GPU; -1 offloads all (needs a GPU build).
        n_threads: CPU threads for llama.cpp (default: `default_threads()`).
        n_batch: the largest number of tokens passed to one llama_decode call.
        main_gpu: the GPU that holds the whole model when `split_mode` is "none".
        split_mode: how to spread the model over several GPUs: "none", "layer" or "row".
        flash_attn: "auto" (llama.cpp decides), "on" or "off".
        extra_buffers: let llama.cpp repack weights for faster CPU kernels (default:
            `default_extra_buffers()`).
        max_logit_rows: the most logits rows one llama_decode call returns (llama.cpp sizes its
            output buffer for them, n_vocab floats each, and refuses more); `evaluate` splits its
            calls to respect it. `localcos score` raises it (`scoring.SCORING_LOGIT_ROWS`) for fewer calls.
        vocab_only: load only the vocabulary (fast; for tokenizer checks); `evaluate` is then
            unavailable.
        devices: the ggml devices (`ggml_backend_dev_t` addresses) to offload layers to, instead
            of every one llama.cpp finds: how `backend.worker` puts a model on RPC servers.
        load_progress: called with the fraction loaded while llama.cpp loads the weights.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_ctx: int = 4096,
        n_gpu_layers: int = 0,
        n_threads: int | None = None,
        n_batch: int = 512,
        main_gpu: int = 0,
        split_mode: str = "layer",
        flash_attn: str = "auto",
        extra_buffers: bool | None = None,
        max_logit_rows: int = 64,
        vocab_only: bool = False,
        devices: Sequence[int] = (),
        load_progress: Callable[[float], None] | None = None,
    ) -> None:
        self.path = check_gguf_file(path)
        self.name = self.path.name
        if n_ctx < MIN_CTX:
            raise ValueError(f"n_ctx must be at least {MIN_CTX}")
        if split_mode not in SPLIT_MODES:
            raise ValueError(f"split_mode must be one of {', '.join(SPLIT_MODES)}")
        if flash_attn not in FLASH_ATTN:
            raise ValueError(f"flash_attn must be one of {', '.join(FLASH_ATTN)}")
        # what this model was asked for, as given (llama.cpp may clamp some of it)
        self.n_gpu_layers = n_gpu_layers
        self.main_gpu = main_gpu
        self.split_mode = split_mode
        self.flash_attn = flash_attn
        self._model = None
        self._ctx = None
        self._batch = None

        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers if n_gpu_layers >= 0 else 0x7FFFFFFF
        mparams.main_gpu = main_gpu
        mparams.split_mode = SPLIT_MODES[split_mode]
        mparams.use_extra_bufts = default_extra_buffers() if extra_buffers is None else extra_buffers
        mparams.vocab_only = vocab_only
        if devices:  # NULL-terminated; llama.cpp copies the list while loading
            device_list = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
            mparams.devices = ctypes.cast(device_list, ctypes.c_void_p)
        if load_progress is not None:
            report = load_progress

            def on_progress(fraction: float, user_data: ctypes.c_void_p) -> bool:
                report(fraction)
                return True

            progress_callback = llama_cpp.llama_progress_callback(on_progress)
            mparams.progress_callback = progress_callback
        _last_llama_error()
        self._model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not self._model:
            detail = _last_llama_error() or "llama.cpp could not load it"
            raise ModelFileError(
                f"cannot load {self.path}: {_clean_llama_error(detail)}; download the file again or check "
                "that this llama.cpp build supports its architecture"
            )

        # llama.cpp's own count of layers on devices (GPUs, RPC servers), as it logged it
        self.offloaded: str | None = None if vocab_only else _offloaded_layers()
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.n_params: int = llama_cpp.llama_model_n_params(self._model)
        self.size_bytes: int = llama_cpp.llama_model_size(self._model)
        self.n_ctx_train: int = llama_cpp.llama_model_n_ctx_train(self._model)
        self.n_layer: int = llama_cpp.llama_model_n_layer(self._model)
        self.n_embd: int = llama_cpp.llama_model_n_embd(self._model)
        self.bos: int = llama_cpp.llama_vocab_bos(self._vocab)
        self.eos: int = llama_cpp.llama_vocab_eos(self._vocab)
        self.add_bos: bool = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.tokens: list[int] = []
        self.stats = ModelStats()
        # Logits are returned for ids below this bound: an ensemble lowers it to the vocabulary
        # its members share when one of them pads its embedding matrix.
        self.logits_vocab: int = self.n_vocab
        # token -> its bytes: filled by whichever thread asks first (a server tokenises off the
        # engine thread); llama.cpp's vocabulary is read-only and safe to read from any thread
        self._pieces: dict[int, bytes] = {}
        # (tokens in the cache, llama.cpp's KV positions) after the last call that changed the
        # cache, published by the thread that drives this model for other threads to read
        self.cache_state: tuple[int, int] = (0, 0)
        self._prefill_row: tuple[tuple[int, ...], np.ndarray] | None = None  # see prefill()
        self.n_ctx = 0
        if vocab_only:
            return

        self.n_batch = max(1, min(n_batch, n_ctx))
        self.n_threads = n_threads or default_threads()
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        self.max_logit_rows = max(1, min(max_logit_rows, self.n_batch))
        cparams.n_outputs_max = self.max_logit_rows
        cparams.no_perf = True
        cparams.flash_attn_type = FLASH_ATTN[flash_attn]
        self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            detail = _last_llama_error() or "llama.cpp could not create a context"
            self.close()
            raise ModelFileError(f"cannot create a context for {self.path}: {_clean_llama_error(detail)}")
        self.n_ctx: int = min(n_ctx, llama_cpp.llama_n_ctx(self._ctx))
        self._memory = llama_cpp.llama_get_memory(self._ctx)

        # One reusable batch; numpy views over its arrays make filling it cheap.
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        b = self._batch
        self._batch_token = np.ctypeslib.as_array(b.token, shape=(self.n_batch,))
        self._batch_pos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
        self._batch_logits = np.ctypeslib.as_array(b.logits, shape=(self.n_batch,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(self.n_batch,))[:] = 1
        for i in range(self.n_batch):
            b.seq_id[i][0] = 0


    # --- metadata -------------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text (None if absent)."""
        buf = ctypes.create_string_buffer(4096)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    @property
    def label(self) -> str:
        """A short name for people: the GGUF's general.name, else the file name."""
        return self.meta("general.name") or self.name

    @property
    def chat_template(self) -> str | None:
        t = llama_cpp.llama_model_chat_template(self._model, None)
        return t.decode("utf-8", errors="replace") if t else None

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, ...)."""
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def token_text(self, token: int) -> bytes:
        """The vocabulary entry of a token id, as stored in the GGUF file."""
        return llama_cpp.llama_vocab_get_text(self._vocab, token) or b""

    def vocab_fingerprint(self, n: int | None = None) -> str:
        """SHA-256 over the text of token ids [0, n) (default: all)."""
        h = hashlib.sha256()
        for t in range(self.n_vocab if n is None else n):
            h.update(self.token_text(t))
            h.update(b"\0")
        return h.hexdigest()

    # --- text -----------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_bos: bool | None = None, special: bool = False) -> list[int]:
        """Token ids of `text`; BOS is added as the model's metadata says unless `add_bos` is given."""
        data = text.encode("utf-8")
        add = self.add_bos if add_bos is None else add_bos
        cap = len(data) + 8
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, cap, add, special)
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, cap, add, special)
        return list(buf[:n])

    def piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes a token stands for in generated text."""
        if not special:
            cached = self._pieces.get(token)
            if cached is not None:
                return cached
        buf = ctypes.create_string_buffer(64)  # one per call: pieces are read from several threads
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        piece = buf.raw[:n]
        if not special:
            self._pieces[token] = piece
        return piece

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    # --- evaluation -------------------------------------------------------------------------------
    def evaluate(
        self, tokens: Sequence[int], n_logits: int | None = None, *, cancelled: Callable[[], bool] | None = None
    ) -> np.ndarray:
        """Append `tokens` to the KV cache and return logits for the last `n_logits` of them.

        Row i of the result is the model's next-token logits after the i-th of those tokens, as a
        float32 array of shape [n_logits, logits_vocab]. `n_logits` defaults to all tokens; 0
        evaluates without returning logits. Tokens go in calls of up to `n_batch`; when
        `cancelled()` turns true between two calls, `Cancelled` is raised and the cache holds
        the tokens evaluated so far (`tokens` stays exact).
        """
        n = len(tokens)
        n_logits = n if n_logits is None else n_logits
        if not 0 <= n_logits <= n:
            raise ValueError("n_logits must be between 0 and len(tokens)")
        self._check_room(n)
        out = np.empty((n_logits, self.logits_vocab), dtype=np.float32)
        first_logit = n - n_logits
        done = 0
        while done < n:
            if cancelled is not None and cancelled():
                raise Cancelled(f"{self.name}: cancelled after {done} of {n} tokens")
            chunk = min(self.n_batch, n - done)
            lo = min(max(first_logit - done, 0), chunk)
            if chunk - lo > self.max_logit_rows:  # llama.cpp returns at most that many rows a call
                chunk = lo + self.max_logit_rows
            rows = self._decode(tokens[done : done + chunk], lo, chunk)
            out[done + lo - first_logit : done + chunk - first_logit] = rows[:, : self.logits_vocab]
            done += chunk
        return out

    def evaluate_view(self, tokens: Sequence[int], first: int, end: int) -> np.ndarray:
        """Append `tokens` (at most `n_batch`) in one llama_decode call and return llama.cpp's own
        logits rows after tokens[first:end], without copying them: a read-only view of shape
        [end - first, logits_vocab], valid until this model's next call. For scoring long texts
        with host memory bounded by what the caller takes of it at a time."""
        n = len(tokens)
        if n > self.n_batch:
            raise ValueError(f"evaluate_view takes at most n_batch = {self.n_batch} tokens, got {n}")
        if not 0 <= first <= end <= n:
            raise ValueError("need 0 <= first <= end <= len(tokens)")
        if end - first > self.max_logit_rows:
            raise ValueError(f"evaluate_view returns at most max_logit_rows = {self.max_logit_rows} rows, asked {end - first}")
        self._check_room(n)
        rows = self._decode(tokens, first, end)[:, : self.logits_vocab]
        rows.flags.writeable = False
        return rows

    def _check_room(self, n: int) -> None:
        if self.n_ctx == 0:
            raise RuntimeError(f"{self.name} was loaded with vocab_only")
        if len(self.tokens) + n > self.n_ctx:
            raise ValueError(
                f"{self.name}: evaluating {n} tokens at position {len(self.tokens)} exceeds the context of {self.n_ctx}"
            )

    def _decode(self, tokens: Sequence[int], out_from: int, out_to: int) -> np.ndarray:
        """One llama_decode of `tokens` (at most n_batch) after the cache, with logits for the
        tokens in [out_from, out_to): returns those rows, [out_to - out_from, n_vocab], as a view
        valid until the next call. Counts the call and keeps `self.tokens` exact."""
        start = len(self.tokens)
        t0 = time.perf_counter()
        try:
            rows = self._run_batch(start, tokens, out_from, out_to)
        except BaseException:
            self._publish()  # a failed call removed what it added
            raise
        self.tokens.extend(int(t) for t in tokens)
        self._publish()
        self.stats.calls += 1
        self.stats.tokens += len(tokens)
        self.stats.seconds += time.perf_counter() - t0
        return rows

    def _run_batch(self, start: int, tokens: Sequence[int], out_from: int, out_to: int) -> np.ndarray:
        """llama_decode of `tokens` at positions start.. ; llama.cpp's own output rows, in place."""
        chunk = len(tokens)
        self._batch.n_tokens = chunk
        self._batch_token[:chunk] = tokens
        self._batch_pos[:chunk] = np.arange(start, start + chunk)
        flags = self._batch_logits[:chunk]
        flags[:] = 0
        flags[out_from:out_to] = 1
        rc = llama_cpp.llama_decode(self._ctx, self._batch)
        if rc != 0:
            # the cache may hold part of the batch now: drop it, keep `tokens` exact
            llama_cpp.llama_memory_seq_rm(self._memory, 0, start, -1)
            raise RuntimeError(f"{self.name}: llama_decode failed with status {rc}")
        if out_to == out_from:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        ptr = llama_cpp.llama_get_logits(self._ctx)  # the output rows, in batch order
        return np.ctypeslib.as_array(ptr, shape=(out_to - out_from, self.n_vocab))

    def prefill(self, prompt: Sequence[int], *, cancelled: Callable[[], bool] | None = None) -> np.ndarray:
        """Bring the KV cache to exactly `prompt` and return the logits row after it.

        What the cache already holds of the prompt is kept (a chat's earlier turns, the same
        prompt again); at least the last token is evaluated again for its row, unless the row of
        this very prompt is still known from the last call. `cancelled` as in `evaluate`.
        """
        key = tuple(prompt)
        keep = common_prefix(self.tokens, prompt)
        if keep == len(prompt) and self._prefill_row is not None and self._prefill_row[0] == key:
            self.truncate(keep)
            return self._prefill_row[1]
        keep = min(keep, len(prompt) - 1)
        self.truncate(keep)
        row = self.evaluate(prompt[keep:], 1, cancelled=cancelled)[0]
        self._prefill_row = (key, row)
        return row

    def warm_up(self, timed_calls: int = 3) -> list[float]:
        """Run one throw-away call, as llama.cpp's own tools do after loading (the first call pays
        for paging in the weights and starting threads), then `timed_calls` single-token calls;
        returns their seconds. Leaves the cache empty and the counters at zero."""
        if self.tokens:
            raise RuntimeError("warm_up() runs on an empty cache, before any evaluation")
        token = self.bos if self.bos >= 0 else 0
        self.evaluate([token], 1)
        seconds = []
        for _ in range(timed_calls):
            t0 = time.perf_counter()
            self.evaluate([token], 1)
            seconds.append(time.perf_counter() - t0)
        self.reset()
        self.stats.reset()
        return seconds

    def kv_length(self) -> int:
        """How many positions llama.cpp's KV cache holds (equals len(self.tokens) unless
        something went wrong: a consistency check)."""
        if self._ctx is None:
            return 0
        return int(llama_cpp.llama_memory_seq_pos_max(self._memory, 0)) + 1

    def truncate(self, n: int) -> None:
        """Remove every token at position >= n from the KV cache."""
        if n >= len(self.tokens):
            return
        if n < 0:
            raise ValueError("n must be >= 0")
        self._remove_from(n)
        del self.tokens[n:]
        self._publish()

    def _publish(self) -> None:
        self.cache_state = (len(self.tokens), self.kv_length())

    def _remove_from(self, n: int) -> None:
        if not llama_cpp.llama_memory_seq_rm(self._memory, 0, n, -1):
            raise RuntimeError(f"{self.name}: llama.cpp could not remove cache entries from position {n}")

    def reset(self) -> None:
        """Empty the KV cache."""
        self.truncate(0)

    # --- lifetime ----------------------------------------------------------------------------------
    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Free the llama.cpp context and model (also done when the object is collected)."""
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"Model({self.name!r}, n_vocab={self.n_vocab}, n_params={self.n_params}, n_ctx={self.n_ctx})"


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _clean_llama_error(text: str) -> str:
    text = " ".join(text.split())
    for prefix in ("llama_model_load: error loading model: ", "llama_model_load_from_file_impl: "):
        if prefix in text:
            text = text.split(prefix, 1)[1]
    return text.rstrip(".") or "unknown llama.cpp error"
