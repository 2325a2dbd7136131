"""`localcos serve`: the ensemble behind an OpenAI-compatible HTTP API (FastAPI).

Routes: GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions, and the
tokenizer endpoints vLLM serves and evaluation harnesses probe (GET /tokenizer_info,
POST /tokenize, POST /detokenize). Errors are OpenAI's shape, with 400 for invalid parameters
(422 never), 401 for a missing or wrong key, 404 for an unknown model or path, 413 for an
oversized body and 503 (with Retry-After) when the queue is full.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..backend import Model, RemoteModel
from ..errors import LocalcosError
from . import protocol
from .engine import Engine, Job, QueueFull
from .protocol import APIError, Served

log = logging.getLogger("localcos.server")
MAX_BODY_BYTES = 16 << 20
RETRY_AFTER_SECONDS = 2


def create_app(served: Served, *, api_key: str | None = None, max_queue: int = 64, cors: list[str] | None = None) -> FastAPI:
    """The app over a loaded ensemble (`served`); `api_key` guards every route but /health."""
    engine = Engine(served.ensemble, max_queue=max_queue)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        engine.shutdown()  # Ctrl-C: the running generation stops at its next round

    app = FastAPI(
        title="localcos", description="Collaborative decoding of local GGUF models, OpenAI-compatible.", version="1", lifespan=lifespan
    )
    app.state.engine = engine
    app.state.served = served
    if cors:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=cors, allow_methods=["*"], allow_headers=["*"])

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        message = f"no route {request.method} {request.url.path}" if e.status_code in (404, 405) else str(e.detail)
        return JSONResponse(APIError(e.status_code, message, code=code).body(), status_code=e.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        return JSONResponse(APIError(400, str(e)).body(), status_code=400)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> JSONResponse:
        # a bug: the client gets one line, the server's log the trace
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=e)
        return JSONResponse(APIError(500, f"internal error: {type(e).__name__}", type="server_error").body(), status_code=500)

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        given = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(given.encode(), api_key.encode()):
            raise APIError(401, "missing or wrong API key (Authorization: Bearer KEY)", type="invalid_request_error", code="invalid_api_key")

    async def read_json(request: Request) -> dict:
        authorize(request)
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            raise APIError(413, f"the request body is over {MAX_BODY_BYTES >> 20} MiB", code="request_too_large")
        data = bytearray()
        async for part in request.stream():
            data += part
            if len(data) > MAX_BODY_BYTES:
                raise APIError(413, f"the request body is over {MAX_BODY_BYTES >> 20} MiB", code="request_too_large")
        try:
            body = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(400, f"the body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise APIError(400, "the body must be a JSON object")
        return body

    def submit(run, finished) -> Job:
        try:
            return engine.submit(run, finished)
        except QueueFull as e:
            raise APIError(503, str(e), type="server_error", code="queue_full", headers={"Retry-After": str(RETRY_AFTER_SECONDS)}) from None

    async def answer(request: Request, plan: protocol.Plan) -> Any:
        # the job is queued before any response starts, so a full queue is still a 503
        loop = asyncio.get_running_loop()
        if plan.stream:
            items: asyncio.Queue = asyncio.Queue()

            def emit(index: int, text: str) -> None:
                loop.call_soon_threadsafe(items.put_nowait, ("text", index, text))

            job = submit(lambda job: protocol.run(served, plan, job, emit), lambda: loop.call_soon_threadsafe(items.put_nowait, ("end", 0, "")))
            return StreamingResponse(events(request, plan, job, items), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        done = asyncio.Event()
        job = submit(lambda job: protocol.run(served, plan, job), lambda: loop.call_soon_threadsafe(done.set))
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        try:
            await done.wait()
        finally:
            watcher.cancel()
            if not job.done.is_set():  # this request was cancelled: stop its generation
                job.cancel()
        if job.error is not None:
            raise _api_error(job.error)
        if job.cancelled:
            return JSONResponse(APIError(499, "the client closed the request").body(), status_code=499)
        return protocol.response(served, plan, job.result)

    async def events(request: Request, plan: protocol.Plan, job: Job, items: asyncio.Queue) -> AsyncIterator[str]:
        first = set()
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
        try:
            while True:
                kind, index, text = await items.get()
                if kind == "end":
                    break
                opening = plan.kind == "chat" and index not in first
                first.add(index)
                yield _sse(protocol.chunk(served, plan, index, text, first=opening))
            if job.error is not None:
                yield _sse(_api_error(job.error).body())
            else:
                for c in job.result or []:
                    if plan.kind == "chat" and c.index not in first:  # a choice with no text
                        yield _sse(protocol.chunk(served, plan, c.index, None, first=True))
                for event in protocol.final_chunks(served, plan, job.result or []):
                    yield _sse(event)
            yield "data: [DONE]\n\n"
        finally:
            watcher.cancel()
            if not job.done.is_set():  # the client went away: stop at the next round
                job.cancel()

    @app.get("/health")
    async def health() -> dict:
        ens = served.ensemble
        return {
            "status": "ok",
            "model": served.alias,
            "queue": {"running": engine.running is not None, "waiting": engine.waiting, "served": engine.served},
            "models": [_model_health(m) for m in ens.models],
        }

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        authorize(request)
        s = served.settings
        return {
            "object": "list",
            "data": [
                {
                    "id": served.alias,
                    "object": "model",
                    "created": served.created,
                    "owned_by": "localcos",
                    "localcos": {
                        "models": list(s.load.labels),
                        "combiner": served.ensemble.combiner.describe(),
                        "method": s.generation.method,
                        "n_ctx": served.ensemble.n_ctx,
                    },
                }
            ],
        }

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await answer(request, protocol.plan_completion(served, await read_json(request)))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await answer(request, protocol.plan_chat(served, await read_json(request)))

    @app.get("/tokenizer_info")
    async def tokenizer_info(request: Request) -> dict:
        authorize(request)
        first = served.ensemble.models[0]

        def text(token: int) -> str | None:
            return first.token_text(token).decode("utf-8", errors="replace") if token >= 0 else None

        return {
            "tokenizer_class": "llama.cpp",
            "bos_token": text(first.bos),
            "eos_token": text(first.eos),
            "pad_token": text(first.eos),
            "add_bos_token": first.add_bos,
            "chat_template": served.formatter.template if served.formatter else None,
            "model_max_length": served.ensemble.n_ctx,
            "vocab_size": served.ensemble.n_vocab,
        }

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        body = await read_json(request)
        add_special = body.get("add_special_tokens", True)
        if not isinstance(add_special, bool):
            raise APIError(400, "add_special_tokens must be true or false", param="add_special_tokens")
        try:
            if "messages" in body:
                if served.formatter is None:
                    raise APIError(400, "these models carry no chat template", param="messages")
                tokens = served.formatter.tokens(protocol._messages(body["messages"]))
            elif isinstance(body.get("prompt"), str):
                # special tokens in the text (<|im_end|>, </s>) are parsed, as vLLM does
                tokens = served.ensemble.tokenize(body["prompt"], add_bos=None if add_special else False, special=True)
            else:
                raise APIError(400, "prompt must be a string (or give messages)", param="prompt")
        except LocalcosError as e:
            raise protocol.from_localcos(e) from None
        return {"count": len(tokens), "max_model_len": served.ensemble.n_ctx, "tokens": tokens}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        body = await read_json(request)
        tokens = body.get("tokens")
        ens = served.ensemble
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < ens.n_vocab for t in tokens):
            raise APIError(400, f"tokens must be a list of token ids below {ens.n_vocab}", param="tokens")
        return {"prompt": b"".join(ens.models[0].piece(t) for t in tokens).decode("utf-8", errors="replace")}

    return app


def _model_health(model: Model) -> dict[str, Any]:
    health: dict[str, Any] = {"name": model.label, "cached_tokens": len(model.tokens), "kv_positions": model.kv_length()}
    if isinstance(model, RemoteModel):
        health.update(rpc=model.servers, connected=model.connected)
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
