"""llama.cpp used directly, as an independent reference for tests and benchmarks: loaded with the
rules localcos loads its own models by, and run in a child process.

The rules (`backend.llamacpp`): llama.cpp's extra weight buffers only where localcos allows them
(`default_extra_buffers`: not where its AMX kernels would run, which fault on some CPUs), and
localcos's default thread count. A reference that ignored them would run kernels the product
never runs, and could crash where the product does not.

A child process: a fault in llama.cpp (SIGILL, SIGSEGV) while computing a reference ends that
child, and `in_child` turns it into one failed assertion that names the signal, so the test
fails and the rest of the suite goes on.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import traceback
from contextlib import contextmanager
from typing import Any
from collections.abc import Callable, Iterator, Sequence

import llama_cpp  # isort: skip
import llama_cpp.llama_cpp as llama_cpp_c
import numpy as np

from ..backend.llamacpp import default_extra_buffers, default_threads


@contextmanager
def _model_params_with_the_rules() -> Iterator[None]:
    # llama_cpp.Llama builds its llama_model_params from this function inside __init__ and loads
    # at once: the one place to set the weight buffers it has no argument for
    default = llama_cpp_c.llama_model_default_params

    def with_rules() -> Any:
        params = default()
        params.use_extra_bufts = default_extra_buffers()
        return params

    llama_cpp_c.llama_model_default_params = with_rules
    try:
        yield
    finally:
        llama_cpp_c.llama_model_default_params = default


def reference_llama(path: str | os.PathLike[str], **kwargs: Any) -> llama_cpp.Llama:
    """llama-cpp-python's high-level `Llama` for `path` (keyword arguments as Llama takes them),
    loaded with localcos's rules: its extra buffers and threads as `backend.llamacpp` decides."""
    kwargs.setdefault("n_threads", default_threads())
    kwargs.setdefault("n_threads_batch", kwargs["n_threads"])
    kwargs.setdefault("verbose", False)
    with _model_params_with_the_rules():
        return llama_cpp.Llama(str(path), **kwargs)


def tool_args() -> list[str]:
    """The flags that give llama.cpp's own C++ tools (llama-speculative, llama-perplexity) the same
    rules: no weight repacking where localcos turns its extra buffers off."""
    return [] if default_extra_buffers() else ["--no-repack"]


# --- the references themselves (module-level: a child process imports them by name) ----------------


def all_logits(path: str, tokens: Sequence[int], n_ctx: int = 256) -> np.ndarray:
    """Every position's logits for `tokens`, from llama-cpp-python's `Llama.eval`."""
    llm = reference_llama(path, n_ctx=n_ctx, logits_all=True)
    try:
        llm.eval(list(tokens))
        return np.array(llm.scores[: len(tokens)], dtype=np.float32)
    finally:
        llm.close()


def greedy(path: str, prompt: str, n: int, n_ctx: int = 512) -> list[int]:
    """Up to `n` tokens of llama-cpp-python's own greedy generation after `prompt` (its end token
    not included)."""
    llm = reference_llama(path, n_ctx=n_ctx)
    try:
        out: list[int] = []
        for t in llm.generate(llm.tokenize(prompt.encode()), temp=0.0, top_k=1):
            if t == llm.token_eos() or len(out) == n:
                break
            out.append(t)
        return out
    finally:
        llm.close()


def greedy_combined(paths: Sequence[str], combine: Callable[[list[np.ndarray]], np.ndarray], prompt: Sequence[int], n: int,
                    prompts: Sequence[Sequence[int]] | None = None) -> list[int]:  # fmt: skip
    """Greedy collaborative decoding written straight on llama-cpp-python's `Llama`: every model
    evaluates every token, the next token is the argmax of `combine(each model's last logits)`.
    `prompts`: each model's own prompt (a model under two prompts: its path twice), else `prompt`."""
    llms = [reference_llama(p, n_ctx=128, n_batch=128, logits_all=True) for p in paths]
    try:
        for llm, own in zip(llms, prompts or [prompt] * len(llms)):
            llm.eval(list(own))
        out: list[int] = []
        for _ in range(n):
            rows = [np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64) for llm in llms]
            token = int(np.argmax(combine(rows)))
            out.append(token)
            for llm in llms:
                llm.eval([token])
        return out
    finally:
        for llm in llms:
            llm.close()


def chat_prompt(path: str, messages: list[dict[str, str]]) -> tuple[str, list[int]]:
    """(the prompt llama-cpp-python renders from the GGUF's chat template, its tokens)."""
    llm = reference_llama(path, n_ctx=64)
    try:
        handler = llama_cpp.llama_chat_format.Jinja2ChatFormatter(
            template=llm.metadata["tokenizer.chat_template"],
            eos_token=llm._model.token_get_text(llm.token_eos()),
            bos_token=llm._model.token_get_text(llm.token_bos()),
        )
        text = handler(messages=messages).prompt  # type: ignore[arg-type]  # OpenAI's TypedDicts: these are their dicts
        return text, llm.tokenize(text.encode(), add_bos=False, special=True)
    finally:
        llm.close()


def loaded_params(path: str) -> dict[str, Any]:
    """What `reference_llama` passed llama.cpp for `path`: the parameters the rules set."""
    llm = reference_llama(path, n_ctx=64)
    try:
        return {"use_extra_bufts": bool(llm.model_params.use_extra_bufts), "n_threads": llm.n_threads}
    finally:
        llm.close()


# --- a child process per reference ----------------------------------------------------------------------


def _child(conn: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        conn.send((True, fn(*args)))
    except BaseException:  # the child's own error, as text: the parent raises it
        conn.send((False, traceback.format_exc()))
    finally:
        conn.close()


def in_child(fn: Callable[..., Any], *args: Any, timeout: float = 600) -> Any:
    """`fn(*args)` computed in a new process (spawned: nothing of this one's llama.cpp state),
    its result returned. Raises AssertionError naming the signal where the child died of one (a
    fault in llama.cpp), or carrying its traceback where `fn` raised."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, fn, args), daemon=True)
    child.start()
    send.close()
    try:
        if not receive.poll(timeout):
            raise AssertionError(f"{fn.__name__} in a child process gave no answer in {timeout:g} s")
        ok, value = receive.recv()
    except EOFError:  # it died before it answered
        child.join(timeout)
        code = child.exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exited with status {code}"
        raise AssertionError(f"{fn.__name__} in a child process {how} (a fault in llama.cpp?)") from None
    finally:
        receive.close()
        child.join(timeout)
        if child.is_alive():
            child.kill()
            child.join()
    if not ok:
        raise AssertionError(f"{fn.__name__} in a child process raised:\n{value}")
    return value
