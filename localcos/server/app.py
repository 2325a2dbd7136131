"""`localcos serve`: the ensemble behind an OpenAI-compatible HTTP API (FastAPI).

Routes: GET /health, GET /v1/models, POST /v1/completions (with `suffix`: fill-in-the-middle),
POST /v1/chat/completions, llama-server's POST /infill (editors' completion at the cursor:
`infill.py`), the tokenizer endpoints vLLM serves and evaluation harnesses probe (GET
/tokenizer_info, POST /tokenize, POST /detokenize), and Ollama's (`ollama.py`). Errors are OpenAI's shape, with 400 for invalid parameters
(422 never), 401 for a missing or wrong key, 403 for a foreign Host or Origin, 404 for an unknown
model or path, 413 for an oversized body, 415 for a body that is not JSON, and 503 (with
Retry-After) when the queue is full.

Threads: the event loop answers HTTP; request planning (tokenising, the chat template) runs in
worker threads and reads only the models' vocabularies; everything that touches a llama.cpp
context or a model's buffers runs on the engine thread (`engine.py`), and /health reads what that
thread published.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..backend import Model, RemoteModel
from ..errors import LocalcosError
from . import infill as infill_route
from . import ollama, protocol
from . import responses as out
from .engine import Engine, Job, QueueFull
from .guard import Guard, GuardPolicy, ollama_route
from .protocol import APIError, ServedEnsemble
from .requests import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest

log = logging.getLogger("localcos.server")
MAX_BODY_BYTES = 16 << 20
RETRY_AFTER_SECONDS = 2


@dataclass
class ServerState:
    """What the routes serve from: the ensemble, its engine thread, and the API key."""

    served: ServedEnsemble
    engine: Engine
    api_key: str | None = None
    described: ollama.Described | None = None  # the models as Ollama's routes describe them (read on first use)


def state(request: Request) -> ServerState:
    return request.app.state.localcos


def authorize(request: Request) -> None:
    """The one authentication check (a dependency of every route but /health)."""
    api_key = state(request).api_key
    if api_key is None:
        return
    header = request.headers.get("authorization", "")
    given = header[7:].strip() if header[:7].lower() == "bearer " else ""
    if not hmac.compare_digest(given.encode(), api_key.encode()):
        raise APIError(401, "missing or wrong API key (Authorization: Bearer KEY)", type="invalid_request_error", code="invalid_api_key")


open_routes = APIRouter()
routes = APIRouter(dependencies=[Depends(authorize)])


@open_routes.get("/health")
async def health(request: Request) -> dict:
    s = state(request)
    engine = s.engine
    queue = out.QueueHealth(running=engine.running, waiting=engine.waiting, served=engine.answered, sequences=engine.sequences, parallel=engine.parallel)
    return out.Health(model=s.served.alias, queue=queue, models=[_model_health(m) for m in s.served.ensemble.models]).body()


@routes.get("/v1/models")
async def models(request: Request) -> dict:
    served = state(request).served
    settings = served.settings
    about = {
        "models": list(settings.load.labels),
        "level": served.level.value,
        "combiner": served.ensemble.combiner.description,
        "method": settings.generation.method,
        "n_ctx": served.ensemble.n_ctx,
    }
    return out.ModelList(data=[out.ModelCard(id=served.alias, created=served.created, localcos=about)]).body()


@routes.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Any:
    s = state(request)
    return await _answer(request, s, await run_in_threadpool(protocol.plan_completion, s.served, body))


@routes.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    s = state(request)
    return await _answer(request, s, await run_in_threadpool(protocol.plan_chat, s.served, body))


@routes.post("/infill")
async def infill(body: infill_route.InfillRequest, request: Request) -> Any:
    s = state(request)
    plan = await run_in_threadpool(infill_route.plan_infill, s.served, body)
    return await _answer_infill(request, s, plan, body.response_fields)


def _one_tokenizer(served: ServedEnsemble) -> None:
    """The tokenizer routes need the models' one vocabulary (400 at the byte level; one model
    loaded for the mixed level has its own)."""
    if not served.one_vocabulary:
        raise APIError(400, "the models have different tokenizers (this server combines them at the byte level): "
                            "there is no one vocabulary to tokenize with", code="unsupported_at_byte_level")  # fmt: skip


@routes.get("/tokenizer_info")
async def tokenizer_info(request: Request) -> dict:
    served = state(request).served
    _one_tokenizer(served)
    models = served.token_models
    first = models.models[0]

    def text(token: int) -> str | None:
        return first.token_text(token).decode("utf-8", errors="replace") if token >= 0 else None

    return out.TokenizerInfo(
        bos_token=text(first.bos), eos_token=text(first.eos), pad_token=text(first.eos), add_bos_token=first.add_bos,
        chat_template=served.formatter.template if served.formatter is not None else None, model_max_length=models.n_ctx,
        vocab_size=models.n_vocab,
    ).body()  # fmt: skip


@routes.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict:
    served = state(request).served
    _one_tokenizer(served)

    def tokens() -> list[int]:
        protocol.check_model(served, body.model)
        if body.messages is not None:
            return cast("list[int]", protocol.render(served, body.messages))  # one template's tokens: the token level
        try:  # special tokens in the text (<|im_end|>, </s>) are parsed, as vLLM does
            return served.token_models.tokenize(body.prompt or "", add_bos=None if body.add_special_tokens else False, special=True)
        except LocalcosError as e:
            raise protocol.from_localcos(e, "prompt") from None

    ids = await run_in_threadpool(tokens)
    return out.Tokenized(count=len(ids), max_model_len=served.token_models.n_ctx, tokens=ids).body()


@routes.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict:
    served = state(request).served
    _one_tokenizer(served)
    protocol.check_model(served, body.model)
    protocol.check_tokens(served, body.tokens, "tokens")
    first = served.token_models.models[0]
    text = await run_in_threadpool(lambda: b"".join(first.piece(t) for t in body.tokens).decode("utf-8", errors="replace"))
    return out.Detokenized(prompt=text).body()


# --- Ollama's API (ollama.py) ----------------------------------------------------------------------


def described(request: Request) -> ollama.Described:
    s = state(request)
    if s.described is None:
        s.described = ollama.Described(s.served)
    return s.described


@routes.get("/api/version")
async def ollama_version() -> dict:
    return {"version": ollama.VERSION}


@routes.get("/api/tags")
async def ollama_tags(request: Request) -> dict:
    return {"models": [await run_in_threadpool(described(request).card)]}


@routes.get("/api/ps")
async def ollama_ps(request: Request) -> dict:
    card = await run_in_threadpool(described(request).card)
    return {"models": [{**card, "expires_at": "9999-12-31T23:59:59Z", "size_vram": 0, "context_length": state(request).served.ensemble.n_ctx}]}


@routes.post("/api/show")
async def ollama_show(body: ollama.ShowRequest, request: Request) -> dict:
    name = body.model or body.name
    if name is None:
        raise APIError(400, "model is required", param="model")
    ollama.check_model(state(request).served, name)
    return await run_in_threadpool(described(request).show)


@routes.post("/api/chat")
async def ollama_chat(body: ollama.ChatRequest, request: Request) -> Any:
    started = time.monotonic()
    s = state(request)
    return await _answer_ollama(request, s, await run_in_threadpool(ollama.plan_chat, s.served, body), started)


@routes.post("/api/generate")
async def ollama_generate(body: ollama.GenerateRequest, request: Request) -> Any:
    started = time.monotonic()
    s = state(request)
    return await _answer_ollama(request, s, await run_in_threadpool(ollama.plan_generate, s.served, body), started)


async def _answer_ollama(request: Request, s: ServerState, plan: protocol.Request, started: float) -> Any:
    """Ollama's answer: streamed as NDJSON (a line per piece, the last with `done: true`), or one
    object."""
    served = s.served
    loop = asyncio.get_running_loop()
    if not plan.stream:
        job = await _finished(request, s, plan)
        if job.error is not None:
            raise _api_error(job.error)
        return ollama.answer(served, plan, job.result or [], started)
    items: asyncio.Queue = asyncio.Queue()

    def emit(index: int, chunk: Any) -> None:  # in the engine thread
        if chunk.text:
            loop.call_soon_threadsafe(items.put_nowait, ("text", chunk.text))

    job = _submit(s, plan, lambda: loop.call_soon_threadsafe(items.put_nowait, ("end", "")), emit)

    async def lines() -> AsyncIterator[str]:
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        try:
            while True:
                kind, text = await items.get()
                if kind == "end":
                    break
                yield json.dumps(ollama.piece(served, plan, text), ensure_ascii=False) + "\n"
            if job.error is not None:
                yield json.dumps(ollama.error(_api_error(job.error).message)) + "\n"
            else:
                yield json.dumps(ollama.final(served, plan, job.result or [], started), ensure_ascii=False) + "\n"
        finally:
            watcher.cancel()
            if not job.done.is_set():
                job.cancel()

    return StreamingResponse(lines(), media_type="application/x-ndjson")


async def _answer_infill(request: Request, s: ServerState, plan: protocol.Request, fields: list[str] | None) -> Any:
    """llama-server's answer: one object (a list for several completions), or server-sent events
    of its pieces and then each completion's last object."""
    served = s.served
    if not plan.stream:
        job = await _finished(request, s, plan)
        if job.error is not None:
            raise _api_error(job.error)
        if job.cancelled:
            return JSONResponse(APIError(499, "the client closed the request").body(), status_code=499)
        return infill_route.answer(served, plan, job.result or [], fields)
    loop = asyncio.get_running_loop()
    items: asyncio.Queue = asyncio.Queue()
    counts: dict[int, int] = {}

    def emit(index: int, chunk: Any) -> None:  # in the engine thread
        counts[index] = counts.get(index, 0) + len(chunk.tokens)
        if chunk.text:
            loop.call_soon_threadsafe(items.put_nowait, ("text", index, chunk.text, counts[index]))

    job = _submit(s, plan, lambda: loop.call_soon_threadsafe(items.put_nowait, ("end", 0, "", 0)), emit)

    async def events() -> AsyncIterator[str]:
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        try:
            while True:
                kind, index, text, predicted = await items.get()
                if kind == "end":
                    break
                yield _sse(infill_route.piece(index, text, predicted))
            if job.error is not None:
                yield _sse(_api_error(job.error).body())
            else:
                for choice in job.result or []:
                    yield _sse(infill_route.result(served, plan, choice, fields))
        finally:
            watcher.cancel()
            if not job.done.is_set():
                job.cancel()

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


# --- answering ---------------------------------------------------------------------------------


def _submit(s: ServerState, plan: protocol.Request, on_done: Any, on_text: Any = None) -> Job:
    engine = s.engine
    try:
        slot = engine.scoring_slot
        prepare = (lambda job: protocol.prepare(s.served, plan, job, slot)) if plan.echo and plan.max_tokens > 0 else None
        return engine.submit(protocol.generations(plan), lambda job: protocol.collect_choices(s.served, plan, job, slot), on_text, on_done, prepare)
    except QueueFull as e:
        raise APIError(503, str(e), type="server_error", code="queue_full", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}) from None


async def _answer(request: Request, s: ServerState, plan: protocol.Request) -> Any:
    # the job is queued before any response starts, so a full queue is still a 503
    served = s.served
    loop = asyncio.get_running_loop()
    if plan.stream:
        items: asyncio.Queue = asyncio.Queue()
        # with tools: whether a choice's reply is a tool call (its JSON goes out whole, in the
        # closing event), and its first token and the text held back until that is known
        calling: dict[int, bool | None] = {}
        held: dict[int, tuple[int, str]] = {}

        def emit(index: int, chunk: Any) -> None:  # in the engine thread
            text = chunk.text
            if plan.tools is not None and calling.get(index) is None and (chunk.tokens or text):
                first, before = held.get(index, (chunk.tokens[0].token if chunk.tokens else -1, ""))
                text = before + text
                calling[index] = protocol.opens_a_call(plan, first, text)
                if calling[index] is None:
                    held[index] = (first, text)
                    return
            if calling.get(index) or not text:
                return
            loop.call_soon_threadsafe(items.put_nowait, ("text", index, text))

        job = _submit(s, plan, lambda: loop.call_soon_threadsafe(items.put_nowait, ("end", 0, "")), emit)
        return StreamingResponse(_events(request, served, plan, job, items), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    job = await _finished(request, s, plan)
    if job.error is not None:
        raise _api_error(job.error)
    if job.cancelled:
        return JSONResponse(APIError(499, "the client closed the request").body(), status_code=499)
    return protocol.response(served, plan, job.result)


async def _finished(request: Request, s: ServerState, plan: protocol.Request) -> Job:
    """A request that does not stream, queued and waited for; cancelled if its client goes."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    job = _submit(s, plan, lambda: loop.call_soon_threadsafe(done.set))
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
    try:
        await done.wait()
    finally:
        watcher.cancel()
        if not job.done.is_set():  # this request was cancelled: stop its generation
            job.cancel()
    return job


async def _events(request: Request, served: ServedEnsemble, plan: protocol.Request, job: Job, items: asyncio.Queue) -> AsyncIterator[str]:
    first = set()
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
    try:
        while True:
            kind, index, text = await items.get()
            if kind == "end":
                break
            opening = plan.route == "chat" and index not in first
            first.add(index)
            yield _sse(protocol.chunk(served, plan, index, text, first=opening).body())
        if job.error is not None:
            yield _sse(_api_error(job.error).body())
        else:
            for c in job.result or []:
                if plan.route == "chat" and c.index not in first:  # a choice with no text
                    yield _sse(protocol.chunk(served, plan, c.index, None, first=True).body())
            for event in protocol.final_chunks(served, plan, job.result or []):
                yield _sse(event)
        yield "data: [DONE]\n\n"
    finally:
        watcher.cancel()
        if not job.done.is_set():  # the client went away: stop at the next round
            job.cancel()


def _model_health(model: Model) -> out.ModelHealth:
    # published by the engine thread after its last call: never a call into a busy context
    slots = [slot.cache_state for slot in model.slots]
    health = out.ModelHealth(
        name=model.label, cached_tokens=sum(t for t, _ in slots), kv_positions=sum(k for _, k in slots), sequences=[t for t, _ in slots],
        calls=model.stats.calls, evaluated_tokens=model.stats.tokens,
    )  # fmt: skip
    if isinstance(model, RemoteModel):
        health.rpc, health.connected = model.servers, model.connected
    return health


def _api_error(error: BaseException) -> APIError:
    if isinstance(error, APIError):
        return error
    if isinstance(error, LocalcosError):
        return protocol.from_localcos(error)
    log.error("internal error in a generation", exc_info=error)
    return APIError(500, f"internal error: {type(error).__name__}", type="server_error")


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    """Cancel `job` when the client goes away (its body is read: the next message is the
    disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


# --- errors --------------------------------------------------------------------------------------


def _error(request: Request, e: APIError) -> JSONResponse:
    """An error in the shape of the API asked: Ollama's on its routes, OpenAI's elsewhere."""
    body = ollama.error(e.message) if ollama_route(request.url.path) else e.body()
    return JSONResponse(body, status_code=e.status, headers=e.headers)


async def _on_api_error(request: Request, e: APIError) -> JSONResponse:
    return _error(request, e)


async def _on_http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
    message = f"no route {request.method} {request.url.path}" if e.status_code in (404, 405) else str(e.detail)
    return _error(request, APIError(e.status_code, message, code=code))


async def _on_invalid_body(request: Request, e: RequestValidationError) -> JSONResponse:
    return _error(request, invalid_body(e.errors()))


async def _on_internal_error(request: Request, e: Exception) -> JSONResponse:
    # a bug: the client gets one line, the server's log the trace
    log.error("internal error on %s %s", request.method, request.url.path, exc_info=e)
    return _error(request, APIError(500, f"internal error: {type(e).__name__}", type="server_error"))


def invalid_body(errors: Any) -> APIError:
    """The first of pydantic's validation errors as OpenAI's 400, naming the field (`param`)."""
    error: dict[str, Any] = list(errors)[0] if errors else {"type": "", "loc": (), "msg": "invalid request body"}
    kind, loc = error.get("type", ""), [str(part) for part in error.get("loc", ())]
    if loc and loc[0] == "body":
        loc = loc[1:]
    if kind == "json_invalid":
        detail = (error.get("ctx") or {}).get("error", "")
        return APIError(400, f"the body is not valid JSON: {detail}".rstrip(": "))
    if kind in ("model_attributes_type", "dict_type", "model_type") and not loc:
        return APIError(400, "the body must be a JSON object")
    ctx = error.get("ctx") or {}
    param = ctx.get("param") or (loc[0] if loc else None)
    where = ".".join(loc) or (param or "body")
    if kind == "missing":
        return APIError(400, f"{where} is required", param=param)
    if kind == "extra_forbidden":
        return APIError(400, f"{where} is not a field localcos knows; it is refused rather than ignored", param=param, code="unsupported_parameter")
    if kind == "invalid_value":
        message = ctx.get("message") or error.get("msg", "")
        return APIError(400, message, param=param, code=ctx.get("code") or "invalid_value")
    return APIError(400, f"{where}: {error.get('msg', 'invalid value')}", param=param, code="invalid_value")


# --- the app -------------------------------------------------------------------------------------


def create_app(served: ServedEnsemble, engine: Engine, *, api_key: str | None = None, policy: GuardPolicy | None = None) -> Guard:
    """The ASGI app over a loaded ensemble (`served`) and the engine thread that runs its work,
    behind the cross-site guard (`policy`: which Host and Origin headers to answer; default
    127.0.0.1:8080 and no other origin). `api_key` guards every route but /health. The engine
    is shut down with the app's lifespan; the caller frees the models once `engine.stopped`."""
    policy = policy or GuardPolicy("127.0.0.1", 8080)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        # Ctrl-C: the running generation stops at its next llama.cpp call; wait for that call
        await run_in_threadpool(engine.shutdown)

    app = FastAPI(
        title="localcos",
        description="Collaborative decoding of local GGUF models, OpenAI-compatible.",
        version="1",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.localcos = ServerState(served, engine, api_key)
    if policy.cors:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(policy.cors), allow_methods=["*"], allow_headers=["*"])
    app.add_exception_handler(APIError, _on_api_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _on_http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _on_invalid_body)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _on_internal_error)
    app.include_router(open_routes)
    app.include_router(routes)
    return Guard(app, policy, MAX_BODY_BYTES)
