"""`localcos serve`: the ensemble behind an OpenAI-compatible HTTP API."""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import TYPE_CHECKING

from ..errors import ConfigError, LocalcosError
from .options import add_options, is_loopback, listen, loading_progress, note, option_values, resolve, say

DEFAULTS = {"temperature": 1.0, "max_tokens": 256, "ctx": 4096}
API_KEY_ENV = "LOCALCOS_API_KEY"

if TYPE_CHECKING:
    from ..runtime.models import Models


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the ensemble over an OpenAI-compatible HTTP API",
        description="Serve an ensemble over OpenAI's HTTP API (/v1/chat/completions, /v1/completions, /v1/models, "
        "/health, /tokenize, /detokenize, /tokenizer_info): any OpenAI client can use it. The options below are "
        "every request's defaults; a request may change the sampling ones and, in extra_body, method, gamma, "
        "combine (a built-in combiner: a request never names code; --combine FILE.py:FUNCTION here makes a custom "
        "combiner every request's default), weights and mu. Up to --parallel generations decode together, their "
        "rows sharing llama_decode calls; a new request joins as soon as one ends (arrival order). It speaks "
        "Ollama's API too (/api/chat, /api/generate, /api/tags...). Safe to leave running: it answers only requests "
        "whose Host names this server "
        "(--allowed-hosts adds names) and, from web pages, only the origins given with --cors; bodies must be "
        "application/json.",
    )
    p.add_argument("--demo", action="store_true", help="serve the small synthetic demo pair (random text; for trying clients)")
    add_options(p, ["server"])
    add_options(
        p,
        ["models", "hardware", "combination", "method", "level", "sampling", "output", "chat"],
        defaults=DEFAULTS,
        exclude={"synthetic", "synthetic_dtype"},
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from ..chat import ChatFormatter, OwnTemplates, chat_templates
    from ..config import resolve_server
    from ..config.levels import decoding_level
    from ..ensemble import Ensemble
    from ..runtime.models import LevelViews

    try:
        import uvicorn

        from ..server.app import create_app
        from ..server.engine import Engine
        from ..server.guard import GuardPolicy
        from ..server.protocol import ServedEnsemble
    except ImportError as e:  # pragma: no cover - both are dependencies of the package
        raise LocalcosError(f"localcos serve needs FastAPI and uvicorn ({e}); pip install fastapi uvicorn") from None

    if args.demo and (args.models or args.preset):
        raise ConfigError("--demo serves the synthetic demo pair; leave out --models/--preset, or --demo", param="demo")
    server = resolve_server(
        {**option_values(args), "api_key": args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None}
    )
    port, api_key = server.port, server.api_key
    listener = listen(server.host, port)  # held from now on: fail before loading anything when it is taken
    port = listener.getsockname()[1]  # --port 0: the free port the system chose
    if not is_loopback(server.host) and api_key is None:
        note(
            f"warning: listening on {server.host} without an API key: anyone who can reach this address can use "
            f"the models; set --api-key or {API_KEY_ENV}"
        )
    try:
        settings = resolve(args, {**DEFAULTS, "synthetic": "demo"} if args.demo else DEFAULTS)
        decoding_level(settings)  # what the level does not decode, refused before anything loads
        settings = _sequences(settings)
        parallel = settings.load.parallel or 1

        def load() -> LevelViews[Models, ChatFormatter | OwnTemplates]:
            ens = _load(settings)
            # one model loaded for the mixed level also serves its own tokens, on the same loaded model:
            # the requests the mixed level does not serve (sampling, logprobs, tools...) decode there
            return LevelViews(ens, Ensemble.token_view(ens))

        engine = Engine(load, max_queue=server.max_queue)  # loads in its own thread, the one that decodes
        views: LevelViews[Models, ChatFormatter | OwnTemplates] = engine.views
        ens, token = views.loaded, views.token
    except BaseException:
        listener.close()
        raise
    try:
        formatter: ChatFormatter | OwnTemplates | None = None
        token_formatter: ChatFormatter | None = None
        try:  # at the byte level every model renders a conversation in its own template
            formatter = chat_templates(ens, settings.chat_template_model)
            if formatter.note:
                note(formatter.note)
            token_formatter = ChatFormatter(token, 0) if token is not None else None
        except ConfigError:
            pass
        alias = server.alias or settings.name.replace(" + ", "+")  # the preset, the demo set, or the files
        served = ServedEnsemble(replace(views, templates=formatter, token_templates=token_formatter), settings, alias)
        policy = GuardPolicy(server.host, port, allowed_hosts=server.allowed_hosts, cors=server.cors)
        app = create_app(served, engine, api_key=api_key, policy=policy)
        shown = f"[{server.host}]" if ":" in server.host else server.host
        url = f"http://{shown}:{port}"
        say(
            f"localcos serve: {alias} ({ens.combiner.description}, method {settings.generation.method}, "
            f"{parallel} sequence{'s' if parallel > 1 else ''} at once, {ens.level.value} level) at {url}/v1"
        )
        if formatter is None:
            say("  the models carry no chat template: /v1/chat/completions answers 400, /v1/completions works")
        auth = ' -H "Authorization: Bearer $LOCALCOS_API_KEY"' if api_key else ""
        say(
            f"  try: curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} "
            f'-d \'{{"model": "{alias}", "messages": [{{"role": "user", "content": "Hello"}}]}}\''
        )
        say("  OpenAI clients: base_url=" + f"{url}/v1" + ("" if api_key else ", api_key=anything") + "; Ctrl-C stops")
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3, access_log=False)

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: object) -> None:
                engine.cancel_all()  # Ctrl-C: requests in flight are answered now, not cut off later
                super().handle_exit(sig, frame)  # type: ignore[arg-type]

        with contextlib.suppress(KeyboardInterrupt):  # uvicorn shuts down gracefully, then re-raises the signal
            Server(config).run(sockets=[listener])
        say("localcos serve: stopped")
    finally:
        listener.close()
        engine.shutdown()  # waits for a llama.cpp call in flight
        if engine.stopped:
            ens.close()
    return 0


def _sequences(settings):
    """The settings with the sequences decoded at once: --parallel, by default as many as the
    context allows (`LoadSpec.decoding_together`)."""
    from dataclasses import replace

    return replace(settings, load=settings.load.decoding_together(8))


def _load(settings):
    """The models loaded to serve `settings`: at the token level a sequence more for scoring
    (echo, logprobs), what it evaluated kept for the next request."""
    from ..ensemble import load_at

    remote = any(settings.load.rpc)
    return load_at(settings.load, settings.combiner(), progress=loading_progress, extra_slots=0 if remote else 1)
