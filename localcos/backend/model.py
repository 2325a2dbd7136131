"""One GGUF model in its own llama.cpp context, driven through the low-level batch API.

A `Model` owns a llama.cpp model and a context whose KV cache holds `n_seq` sequences (llama.cpp's
seq_id), one `Slot` each; a slot always knows exactly which tokens its sequence holds
(`Slot.tokens`). `Slot.evaluate` appends tokens and returns the logits of just the positions asked
for, copied out of llama.cpp's output rows (`llama_get_logits`); nothing proportional to n_ctx x
n_vocab is ever allocated (the high-level `Llama(logits_all=True)` keeps such a buffer).
`Slot.truncate` removes KV entries with `seq_rm`, which is how speculative decoding rolls back
rejected drafts. `Model.decode` puts several slots' tokens into one llama_decode call (batched
decoding of many sequences). Slot 0 is the model's own: `Model.evaluate`, `Model.tokens` and the
rest act on it, as for a model with one sequence.

llama.cpp is not batch-invariant: a token's cells and rows round differently with the shape of
the call that computed them and with where the cache puts them. So a generation that must not
depend on what the process did before starts with `Slot.start_prompt` (or, for a scheduler that
interleaves the calls, `Model.restore_prompt` and `prompt_calls`): the cache emptied, the prompt
in the calls a fresh process makes, and only cells computed exactly that way put back.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from collections.abc import Callable, Sequence

# llama.cpp's libraries load before NumPy's (see `llamacpp`)
from .llamacpp import _offloaded_layers, default_extra_buffers, default_threads, last_llama_error  # isort: skip
import llama_cpp  # isort: skip
import numpy as np

from ..errors import ModelFileError
from .gguf_file import check_model_file, model_label, read_info
from .slot import PROMPT_CHUNK, CallTimes, ModelStats, Slot, charged_slots, common_prefix
import contextlib

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

@dataclass(frozen=True)
class KeptPrompt:
    """A prompt evaluated as a fresh process evaluates it (`Model.keep_prompt`): its tokens,
    llama.cpp's state of the sequence that held exactly them, and the logits row after them."""

    tokens: tuple[int, ...]
    state: np.ndarray  # llama_state_seq_get_data's bytes
    row: np.ndarray


MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ: the most sequences one context holds
_SHARED = object()  # `Model._sole` once a second sequence had cells since the last reset


class Model:
    """A GGUF model loaded into its own llama.cpp context (one sequence in the KV cache).

    Args:
        path: the GGUF file.
        n_ctx: context length in tokens, of each sequence.
        n_seq: sequences the KV cache holds at once (slots; batched decoding of many sequences).
            They share one cache (llama.cpp's unified KV cache) of n_ctx x n_seq cells, so any
            mix of their tokens goes into one llama_decode call and a shared prefix is shared.
        cells: the cache's cells in all, where the sequences share most of their tokens (the
            byte level's tokenisations of one text): default n_ctx x n_seq.
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
        n_seq: int = 1,
        n_gpu_layers: int = 0,
        n_threads: int | None = None,
        n_batch: int = 512,
        main_gpu: int = 0,
        split_mode: str = "layer",
        flash_attn: str = "auto",
        extra_buffers: bool | None = None,
        max_logit_rows: int = 64,
        vocab_only: bool = False,
        cells: int | None = None,
        devices: Sequence[int] = (),
        load_progress: Callable[[float], None] | None = None,
    ) -> None:
        self.path = check_model_file(path)  # llama.cpp never reads a damaged or partial file
        self.name = self.path.name
        if n_ctx < MIN_CTX:
            raise ValueError(f"n_ctx must be at least {MIN_CTX}")
        if n_seq < 1:
            raise ValueError("n_seq must be at least 1")
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
        self._batch: llama_cpp.llama_batch | None = None

        self._load(n_gpu_layers, main_gpu, split_mode, extra_buffers, vocab_only, devices, load_progress)
        self._read_facts()
        self.n_ctx = 0
        self.slots = [Slot(self, 0)]
        self._kept: KeptPrompt | None = None  # the last prompt evaluated the fresh way
        # the one slot that has had cells since the last reset (None: none yet; _SHARED: several)
        self._sole: object = None
        if not vocab_only:
            self._open_context(n_ctx, n_seq, cells, n_threads, n_batch, max_logit_rows, flash_attn)
            self._make_batch()

    def _load(self, n_gpu_layers: int, main_gpu: int, split_mode: str, extra_buffers: bool | None, vocab_only: bool,
              devices: Sequence[int], load_progress: Callable[[float], None] | None) -> None:  # fmt: skip
        """Load the weights (or the vocabulary alone) as asked; one line naming the file where
        llama.cpp cannot."""
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers if n_gpu_layers >= 0 else 0x7FFFFFFF
        mparams.main_gpu = main_gpu
        mparams.split_mode = SPLIT_MODES[split_mode]
        mparams.use_extra_bufts = default_extra_buffers() if extra_buffers is None else extra_buffers
        self.extra_buffers = bool(mparams.use_extra_bufts)
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
        last_llama_error()
        self._model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not self._model:
            detail = last_llama_error() or "llama.cpp could not load it"
            raise ModelFileError(
                f"cannot load {self.path}: {_clean_llama_error(detail)}; download the file again or check "
                "that this llama.cpp build supports its architecture"
            )
        # llama.cpp's own count of layers on devices (GPUs, RPC servers), as it logged it
        self.offloaded: str | None = None if vocab_only else _offloaded_layers()

    def _read_facts(self) -> None:
        """What the loaded model says of itself: vocabulary, sizes, special tokens."""
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.n_params: int = llama_cpp.llama_model_n_params(self._model)
        self.size_bytes: int = llama_cpp.llama_model_size(self._model)
        self.n_ctx_train: int = llama_cpp.llama_model_n_ctx_train(self._model)
        self.n_layer: int = llama_cpp.llama_model_n_layer(self._model)
        self.n_embd: int = llama_cpp.llama_model_n_embd(self._model)
        self.bos: int = llama_cpp.llama_vocab_bos(self._vocab)
        self.eos: int = llama_cpp.llama_vocab_eos(self._vocab)
        self.eot: int = llama_cpp.llama_vocab_eot(self._vocab)  # -1 where it has none
        self.add_bos: bool = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.stats = ModelStats()  # every call, whichever slots took part
        self.call_times = CallTimes()  # what its calls took by rows: the auto plans check the profile against it
        # Logits are returned for ids below this bound: an ensemble lowers it to the vocabulary
        # its members share when one of them pads its embedding matrix.
        self.logits_vocab: int = self.n_vocab
        # token -> its bytes: filled by whichever thread asks first (a server tokenises off the
        # engine thread); llama.cpp's vocabulary is read-only and safe to read from any thread
        self._pieces: dict[int, bytes] = {}

    def _open_context(self, n_ctx: int, n_seq: int, cells: int | None, n_threads: int | None, n_batch: int, max_logit_rows: int,
                      flash_attn: str) -> None:  # fmt: skip
        """The llama.cpp context: one KV cache for every sequence, and the slots over it."""
        self.n_batch = max(1, min(n_batch, n_ctx))
        self.n_threads = n_threads or default_threads()
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = cells or n_ctx * n_seq
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = n_seq
        # one cache for every sequence: a call mixes any sequences' rows in one ubatch (separate
        # caches split a call by sequence), and seq_cp shares a prefix's cells instead of copying
        cparams.kv_unified = True
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        self.max_logit_rows = max(1, min(max_logit_rows, self.n_batch))
        cparams.n_outputs_max = max(self.max_logit_rows, n_seq)  # llama.cpp reserves a row per sequence
        cparams.no_perf = True
        cparams.flash_attn_type = FLASH_ATTN[flash_attn]
        self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            detail = last_llama_error() or "llama.cpp could not create a context"
            self.close()
            raise ModelFileError(f"cannot create a context for {self.path}: {_clean_llama_error(detail)}")
        total = llama_cpp.llama_n_ctx(self._ctx)
        self.n_ctx = min(n_ctx, total if cells else total // n_seq)
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self.slots = [Slot(self, i) for i in range(n_seq)]

    def _make_batch(self) -> None:
        """One reusable batch over NumPy arrays (one sequence id per row), so filling it is a few
        vectorised assignments; the arrays live as long as the model."""
        n = self.n_batch
        self._batch_token = np.zeros(n, dtype=np.int32)
        self._batch_pos = np.zeros(n, dtype=np.int32)
        self._batch_seq = np.zeros(n, dtype=np.int32)
        self._batch_n_seq = np.ones(n, dtype=np.int32)
        self._batch_logits = np.zeros(n, dtype=np.int8)
        seq_ptr = ctypes.POINTER(llama_cpp.llama_seq_id)
        self._batch_seq_ptrs = (seq_ptr * n)(
            *[ctypes.cast(self._batch_seq.ctypes.data + 4 * i, seq_ptr) for i in range(n)]
        )
        batch = self._batch = llama_cpp.llama_batch()
        # llama-cpp-python declares these fields as arrays; the C struct holds pointers, which these are
        batch.token = self._batch_token.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token))  # type: ignore[assignment]
        batch.pos = self._batch_pos.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_pos))  # type: ignore[assignment]
        batch.n_seq_id = self._batch_n_seq.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))  # type: ignore[assignment]
        batch.seq_id = self._batch_seq_ptrs  # type: ignore[assignment]
        batch.logits = self._batch_logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))  # type: ignore[assignment]

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
        """A short name for people (`gguf_file.model_label`)."""
        return model_label(self.meta("general.name"), self.path)

    @property
    def chat_template(self) -> str | None:
        t = llama_cpp.llama_model_chat_template(self._model, None)
        return t.decode("utf-8", errors="replace") if t else None

    def fim_tokens(self) -> dict[str, int | None]:
        """Its fill-in-the-middle tokens as llama.cpp found them (the header's ids, else by their
        text): prefix, suffix, middle, pad, repo, sep; None where it has none (`infill.FimTokens`)."""
        found = {"prefix": llama_cpp.llama_vocab_fim_pre, "suffix": llama_cpp.llama_vocab_fim_suf, "middle": llama_cpp.llama_vocab_fim_mid,
                 "pad": llama_cpp.llama_vocab_fim_pad, "repo": llama_cpp.llama_vocab_fim_rep, "sep": llama_cpp.llama_vocab_fim_sep}  # fmt: skip
        ids = {name: int(get(self._vocab)) for name, get in found.items()}
        return {name: token if 0 <= token < self.n_vocab else None for name, token in ids.items()}

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, ...)."""
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def token_text(self, token: int) -> bytes:
        """The vocabulary entry of a token id, as stored in the GGUF file."""
        return llama_cpp.llama_vocab_get_text(self._vocab, token) or b""

    def vocab_fingerprint(self, n: int | None = None) -> str:
        """SHA-256 over the text of token ids [0, n) (default: all), from the file's token list:
        the texts llama.cpp loaded (`token_text`), read without a call per token."""
        return read_info(self.path).vocab_fingerprint(self.n_vocab if n is None else n)

    # --- text -----------------------------------------------------------------------------------
    def tokenize(self, text: str | bytes, *, add_bos: bool | None = None, special: bool = False) -> list[int]:
        """Token ids of `text` (or of raw bytes); BOS is added as the model's metadata says unless
        `add_bos` is given."""
        data = text if isinstance(text, bytes) else text.encode("utf-8")
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

    def pieces(self) -> list[bytes]:
        """Every token's piece, by id (as `piece`): one buffer for the whole vocabulary."""
        buf = ctypes.create_string_buffer(256)
        to_piece, vocab, cache = llama_cpp.llama_token_to_piece, self._vocab, self._pieces
        out = []
        for token in range(self.n_vocab):
            n = to_piece(vocab, token, buf, 256, 0, False)
            piece = buf.raw[:n] if n >= 0 else self.piece(token)
            cache[token] = piece
            out.append(piece)
        return out

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    # --- evaluation: slot 0, as a model with one sequence ---------------------------------------
    @property
    def slot0(self) -> Slot:
        return self.slots[0]

    @property
    def tokens(self) -> list[int]:
        """The tokens slot 0's sequence holds."""
        return self.slots[0].tokens

    @property
    def cache_state(self) -> tuple[int, int]:
        """(tokens, llama.cpp's KV positions) summed over the slots, as the thread that drives the
        model published them after its last call (for other threads: never a call into a busy
        context)."""
        states = [slot.cache_state for slot in self.slots]
        return sum(t for t, _ in states), sum(k for _, k in states)

    def evaluate(self, tokens: Sequence[int], n_logits: int | None = None, *, cancelled: Callable[[], bool] | None = None) -> np.ndarray:
        """`Slot.evaluate` on slot 0."""
        return self.slots[0].evaluate(tokens, n_logits, cancelled=cancelled)

    def evaluate_view(self, tokens: Sequence[int], first: int, end: int) -> np.ndarray:
        """`Slot.evaluate_view` on slot 0."""
        return self.slots[0].evaluate_view(tokens, first, end)

    def prefill(self, prompt: Sequence[int], *, cancelled: Callable[[], bool] | None = None) -> np.ndarray:
        """`Slot.prefill` on slot 0."""
        return self.slots[0].prefill(prompt, cancelled=cancelled)

    def truncate(self, n: int) -> None:
        """`Slot.truncate` on slot 0."""
        self.slots[0].truncate(n)

    def reset(self) -> None:
        """Empty every slot, and llama.cpp's cache as a new context's (every cell free, free cells
        searched from the first): what is evaluated next is computed, cell for cell, as in a
        process that has just loaded the model."""
        self._clear()
        for slot in self.slots:
            slot.tokens.clear()
            slot._prefill_row = None
            slot._publish()
        self._sole = None

    @property
    def prompt_chunk(self) -> int:
        """The most prompt tokens one call evaluates: a prompt goes in calls of this many tokens
        from its start (`prompt_calls`)."""
        return min(PROMPT_CHUNK, self.n_batch)

    def restore_prompt(self, slot: Slot, prompt: Sequence[int]) -> np.ndarray | None:
        """Begin `prompt` in `slot` as a fresh process does: the cache emptied (`reset`), then
        what the last kept prompt (`keep_prompt`) holds of it exactly put back: the whole prompt
        with the row after it where it is the same prompt, else its first calls of
        `prompt_chunk` tokens where both prompts had the same tokens in them (the call that gives
        the row after the prompt is always made again). Returns the row after the prompt, or
        None: then the rest goes in `prompt_calls` from what `slot` holds."""
        self.reset()
        kept = self._kept
        if kept is None or not prompt:
            return None
        prompt = tuple(prompt)
        row: np.ndarray | None = None
        if kept.tokens == prompt:
            n, row = len(prompt), kept.row
        else:
            n = min(common_prefix(kept.tokens, prompt), len(prompt) - 1) // self.prompt_chunk * self.prompt_chunk
        if n == 0:
            return None
        self._load_state(slot.seq_id, kept.state)
        if n < len(kept.tokens):
            self.remove_cells(slot.seq_id, n)
        slot.tokens.extend(prompt[:n])
        slot._publish()
        self._sole = slot
        return row

    def keep_prompt(self, slot: Slot, prompt: Sequence[int], row: np.ndarray) -> None:
        """Keep `prompt`'s cells and the row after it for `restore_prompt`, when they are what a
        fresh process computes: `slot` holds exactly `prompt`, no other slot had cells since
        `restore_prompt` emptied the cache, and the caller made the rest of it in `prompt_calls`
        from where `restore_prompt` left it. Otherwise nothing is kept."""
        if self._sole is not slot or slot.tokens != list(prompt) or not prompt:
            return
        state = self._save_state(slot.seq_id)
        if state is not None:
            self._kept = KeptPrompt(tuple(prompt), state, np.array(row, dtype=np.float32))

    def kv_length(self) -> int:
        """How many positions llama.cpp's KV cache holds for slot 0 (equals len(self.tokens)
        unless something went wrong: a consistency check)."""
        return self.slots[0].kv_length()

    # --- evaluation: any slots, one call ---------------------------------------------------------
    def decode(self, parts: Sequence[tuple[Slot, Sequence[int], int, int]]) -> list[np.ndarray]:
        """One llama_decode call over several slots: each part (slot, tokens, out_from, out_to)
        appends `tokens` to its slot and asks for the logits after tokens[out_from:out_to].
        Returns each part's rows, [out_to - out_from, logits_vocab], as views of llama.cpp's
        output buffer valid until the model's next call. At most `n_batch` tokens and
        `max_logit_rows` rows in all; each slot at most once; the call and its tokens are counted
        for the model and for each slot, a call that slots of one partner share once
        (`charged_slots`)."""
        n = sum(len(tokens) for _, tokens, _, _ in parts)
        n_rows = sum(out_to - out_from for _, _, out_from, out_to in parts)
        if n > self.n_batch or n_rows > self.max_logit_rows:
            raise ValueError(f"{self.name}: a call of {n} tokens and {n_rows} rows exceeds n_batch {self.n_batch} or {self.max_logit_rows} rows")
        for slot, tokens, _, _ in parts:
            slot._check_room(len(tokens))
        t0 = time.perf_counter()
        try:
            rows = self._run_batch(parts)
        except BaseException:
            for slot, _, _, _ in parts:
                slot._publish()  # a failed call removed what it added
            raise
        seconds = time.perf_counter() - t0
        out = []
        offset = 0
        charged = charged_slots([slot for slot, *_ in parts])
        for slot, tokens, out_from, out_to in parts:
            self._note_cells(slot)
            out.append(rows[offset : offset + out_to - out_from, : self.logits_vocab])
            offset += out_to - out_from
            slot.tokens.extend(int(t) for t in tokens)
            slot._publish()
            slot.stats.tokens += len(tokens)
            if slot in charged:
                slot.stats.calls += 1
                slot.stats.seconds += seconds
        self.stats.calls += 1
        self.stats.tokens += n
        self.stats.seconds += seconds
        self.call_times.record(n, seconds)
        return out

    def _run_batch(self, parts: Sequence[tuple[Slot, Sequence[int], int, int]]) -> np.ndarray:
        """llama_decode of every part's tokens at its slot's next positions; llama.cpp's own output
        rows (every part's asked rows, in order), in place."""
        row = 0
        for slot, tokens, out_from, out_to in parts:
            k = len(tokens)
            start = len(slot.tokens)
            self._batch_token[row : row + k] = tokens
            self._batch_pos[row : row + k] = np.arange(start, start + k)
            self._batch_seq[row : row + k] = slot.seq_id
            flags = self._batch_logits[row : row + k]
            flags[:] = 0
            flags[out_from:out_to] = 1
            row += k
        assert self._batch is not None, "a model loaded with vocab_only decodes nothing"
        self._batch.n_tokens = row
        rc = llama_cpp.llama_decode(self._ctx, self._batch)
        if rc != 0:
            # the cache may hold part of the batch now: drop it, keep every slot's tokens exact
            for slot, _, _, _ in parts:
                llama_cpp.llama_memory_seq_rm(self._memory, slot.seq_id, len(slot.tokens), -1)
            raise RuntimeError(f"{self.name}: llama_decode failed with status {rc}")
        n_rows = sum(out_to - out_from for _, _, out_from, out_to in parts)
        if n_rows == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        ptr = llama_cpp.llama_get_logits(self._ctx)  # the output rows, in batch order
        return np.ctypeslib.as_array(ptr, shape=(n_rows, self.n_vocab))

    def _note_cells(self, slot: Slot) -> None:
        """`slot` has cells now: whether one slot alone had cells since the last reset."""
        if self._sole is None:
            self._sole = slot
        elif self._sole is not slot:
            self._sole = _SHARED

    def _clear(self) -> None:
        """llama.cpp's cache as a new context's. The cells' old contents stay: a free cell is
        masked out, and attention gives it exactly zero weight."""
        if self._ctx is not None:
            llama_cpp.llama_memory_clear(self._memory, False)

    def _save_state(self, seq_id: int) -> np.ndarray | None:
        """llama.cpp's state of one sequence (its cells), as bytes."""
        size = llama_cpp.llama_state_seq_get_size(self._ctx, seq_id)
        state = np.empty(size, dtype=np.uint8)
        if llama_cpp.llama_state_seq_get_data(self._ctx, state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, seq_id) != size:
            return None
        return state

    def _load_state(self, seq_id: int, state: np.ndarray) -> None:
        """Put a sequence's saved cells (`_save_state`) back into sequence `seq_id`."""
        if not llama_cpp.llama_state_seq_set_data(self._ctx, state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), state.size, seq_id):
            raise RuntimeError(f"{self.name}: llama.cpp could not restore a kept prompt's cells")

    def remove_cells(self, seq_id: int, n: int) -> None:
        """Remove slot `seq_id`'s positions from n on from llama.cpp's cache."""
        if not llama_cpp.llama_memory_seq_rm(self._memory, seq_id, n, -1):
            raise RuntimeError(f"{self.name}: llama.cpp could not remove cache entries from position {n}")

    def share_cells(self, source: int, target: int, n: int) -> None:
        """Let slot `target` hold slot `source`'s first n positions (the same cells: no copy)."""
        llama_cpp.llama_memory_seq_cp(self._memory, source, target, 0, n)
        self._note_cells(self.slots[target])

    def kv_positions(self, seq_id: int) -> int:
        if self._ctx is None:
            return 0
        return int(llama_cpp.llama_memory_seq_pos_max(self._memory, seq_id)) + 1

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
        self.slots[0].stats.reset()
        return seconds

    # --- lifetime ----------------------------------------------------------------------------------
    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Free the llama.cpp context and model (also done when the object is collected)."""
        self._batch = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        return f"Model({self.name!r}, n_vocab={self.n_vocab}, n_params={self.n_params}, n_ctx={self.n_ctx})"


def _clean_llama_error(text: str) -> str:
    text = " ".join(text.split())
    for prefix in ("llama_model_load: error loading model: ", "llama_model_load_from_file_impl: "):
        if prefix in text:
            text = text.split(prefix, 1)[1]
    return text.rstrip(".") or "unknown llama.cpp error"
