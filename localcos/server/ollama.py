"""Ollama's API beside OpenAI's (`localcos serve`): the routes the tools written for Ollama call
(`/api/tags`, `/api/show`, `/api/version`, `/api/ps`, `/api/chat`, `/api/generate`), over the
same engine, settings and chat template as the OpenAI routes, so one request gets one text
whichever API asks.

Bodies are declared here as pydantic models whose every localcos option is validated by the
settings layer's own parser (`requests._option`); Ollama's `options` carries them, localcos's own
(`combine`, `gate`, `negative_prompt`...) as OpenAI's `extra_body` does. An option Ollama knows
and localcos does not implement is refused unless neutral, a load-time one points at serve's
flag, an unknown one is refused: nothing a client asks for is dropped silently. Errors are
Ollama's shape, `{"error": "..."}` (`app.py`).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cached_property
from typing import Annotated, Any, Literal
from collections.abc import Sequence

from pydantic import StrictBool, StrictStr, model_validator

from ..backend.gguf_file import GGUFInfo, read_info
from ..chat import Message
from ..errors import ConfigError, param_of
from ..grammar import Constraint, json_object, json_schema
from ..infill import FimTokens, Infill
from . import protocol
from .protocol import APIError, ServedEnsemble
from .requests import SettingsFields, _Body, _checked, _integer, _neutral, _option

VERSION = "0.6.0"  # the Ollama API these routes follow (clients that ask for a version read it)
# Ollama's options read where the models load: set when `localcos serve` starts, not per request
LOAD_TIME = {
    "num_gpu": "--n-gpu-layers", "main_gpu": "--main-gpu", "num_thread": "--threads", "num_batch": "--batch-size", "use_mmap": None,
    "use_mlock": None, "numa": None, "low_vram": None, "f16_kv": None, "vocab_only": None, "logits_all": None, "embedding_only": None,
}  # fmt: skip


def _load_time(name: str) -> Any:
    flag = LOAD_TIME[name]

    def parse(value: Any, what: str) -> Any:
        where = f" (localcos serve {flag})" if flag else ""
        raise ConfigError(f"options.{what}: set where the models load, when the server starts{where}", code="unsupported_parameter",
                          param=param_of(what))  # fmt: skip

    return _checked(parse)


def parse_format(value: Any, what: str) -> Constraint | None:
    """Ollama's format: "json" (one JSON object), a JSON schema (an object), or "" (none)."""
    if value == "":
        return None
    if value == "json":
        return json_object()
    if isinstance(value, dict):
        return json_schema(value, what)
    raise ConfigError(f'{what} must be "json" or a JSON schema (an object)', param=param_of(what))


def _refused(what: str, instead: str) -> Any:
    """A field localcos does not serve on these routes: accepted only empty or false."""

    def parse(value: Any, name: str) -> Any:
        if value in (None, False, "", [], {}):
            return value
        raise ConfigError(f"{name}: {what} (on localcos: {instead})", code="unsupported_parameter", param=param_of(name))

    return _checked(parse)


class Options(SettingsFields):
    """Ollama's `options`: its sampling and length options, and localcos's own (`SettingsFields`)."""

    num_predict: Annotated[int | None, _integer(-2)] = None  # -1: until the end or the context; -2: the context
    num_ctx: Annotated[int | None, _integer(1)] = None
    phrasing: Annotated[str | None, _option("phrasing")] = None  # how /api/generate's raw prompt is read
    infill_layout: Annotated[str | None, _option("infill_layout")] = None  # how /api/generate's suffix is read
    # Ollama's options localcos does not implement: refused unless neutral
    repeat_penalty: Annotated[float | None, _neutral(1, 1.0)] = None
    presence_penalty: Annotated[float | None, _neutral(0, 0.0)] = None
    frequency_penalty: Annotated[float | None, _neutral(0, 0.0)] = None
    mirostat: Annotated[int | None, _neutral(0)] = None
    tfs_z: Annotated[float | None, _neutral(1, 1.0)] = None
    typical_p: Annotated[float | None, _neutral(1, 1.0)] = None
    # these change nothing while the penalties are neutral and the context is never shifted
    repeat_last_n: int | None = None
    penalize_newline: StrictBool | None = None
    num_keep: int | None = None
    # read where the models load
    num_gpu: Annotated[Any, _load_time("num_gpu")] = None
    main_gpu: Annotated[Any, _load_time("main_gpu")] = None
    num_thread: Annotated[Any, _load_time("num_thread")] = None
    num_batch: Annotated[Any, _load_time("num_batch")] = None
    use_mmap: Annotated[Any, _load_time("use_mmap")] = None
    use_mlock: Annotated[Any, _load_time("use_mlock")] = None
    numa: Annotated[Any, _load_time("numa")] = None
    low_vram: Annotated[Any, _load_time("low_vram")] = None
    f16_kv: Annotated[Any, _load_time("f16_kv")] = None
    vocab_only: Annotated[Any, _load_time("vocab_only")] = None
    logits_all: Annotated[Any, _load_time("logits_all")] = None
    embedding_only: Annotated[Any, _load_time("embedding_only")] = None


# the options that are settings-layer options (num_predict is max_tokens, by the routes)
SETTINGS = (*SettingsFields.model_fields, "phrasing", "infill_layout")


class OllamaRequest(_Body):
    """What /api/chat and /api/generate share."""

    model: StrictStr
    stream: StrictBool = True  # Ollama streams unless told not to
    format: Annotated[Constraint | None, _checked(parse_format)] = None
    options: Options = Options()
    keep_alive: float | StrictStr | None = None  # accepted: the models stay loaded while the server runs
    think: Annotated[Any, _refused("thinking is not separated from the answer", "leave think out")] = None
    logprobs: Annotated[Any, _refused("log-probabilities are served by /v1/completions and /v1/chat/completions", "use those")] = None
    top_logprobs: Annotated[Any, _refused("log-probabilities are served by /v1/completions and /v1/chat/completions", "use those")] = None

    def settings_values(self) -> dict[str, Any]:
        """The settings-layer options this request sets, parsed (as `GenerationRequest`'s)."""
        values = {name: getattr(self.options, name) for name in SETTINGS if name in self.options.model_fields_set}
        if self.format is not None:
            values.update(json_schema=None, json_object=False, grammar=None)
            if self.format.kind == "json_object":
                values["json_object"] = True
            else:
                values["json_schema"] = self.format
        return values

    def max_tokens(self, served: ServedEnsemble) -> int:
        """num_predict as max_tokens: Ollama's default (-1) and -2 are the context's room."""
        n = self.options.num_predict
        return served.ensemble.n_ctx if n is None or n < 0 else n

    def check_context(self, served: ServedEnsemble) -> None:
        n = self.options.num_ctx
        if n is not None and n > served.ensemble.n_ctx:
            raise APIError(400, f"options.num_ctx {n}: the models were loaded with a context of {served.ensemble.n_ctx} tokens "
                                "(localcos serve --ctx N)", param="num_ctx")  # fmt: skip


class OllamaMessage(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: StrictStr = ""
    images: Annotated[Any, _refused("images are not read: the models are text models", "send text")] = None
    thinking: Annotated[Any, _refused("thinking is not separated from the answer", "leave it out")] = None
    tool_calls: Annotated[Any, _refused("tools are served by /v1/chat/completions", "use that route")] = None
    tool_name: StrictStr | None = None


class ChatRequest(OllamaRequest):
    """POST /api/chat."""

    messages: list[OllamaMessage]
    tools: Annotated[Any, _refused("tools are served by /v1/chat/completions", "use that route")] = None

    @model_validator(mode="after")
    def _check(self) -> ChatRequest:
        if not self.messages:
            raise protocol_error("messages", "messages must be a non-empty list of {role, content}")
        return self


class GenerateRequest(OllamaRequest):
    """POST /api/generate."""

    prompt: StrictStr = ""
    system: StrictStr | None = None
    raw: StrictBool = False
    suffix: StrictStr | None = None  # fill-in-the-middle: the text after the one to write (the prompt's is before it)
    template: Annotated[Any, _refused("the model's own chat template is used", "leave template out, or send raw")] = None
    context: Annotated[Any, _refused("the context of an earlier answer is not kept", "send the whole prompt, or use /api/chat")] = None
    images: Annotated[Any, _refused("images are not read: the models are text models", "send text")] = None


class ShowRequest(_Body):
    model: StrictStr | None = None
    name: StrictStr | None = None  # older clients' field
    verbose: StrictBool = False


def protocol_error(param: str, message: str) -> Any:
    from .requests import _field_error

    return _field_error(param, message)


# --- what the models are ---------------------------------------------------------------------------


@dataclass
class Described:
    """The served models as Ollama describes a model: their GGUF headers, read once."""

    served: ServedEnsemble

    @cached_property
    def infos(self) -> list[GGUFInfo]:
        return [read_info(p, tokens=False) for p in self.served.settings.load.paths]

    @cached_property
    def modified(self) -> str:
        return timestamp(max(p.stat().st_mtime for p in self.served.settings.load.paths))

    @cached_property
    def size(self) -> int:
        return sum(p.stat().st_size for p in self.served.settings.load.paths)

    @cached_property
    def digest(self) -> str:
        """An identity of the served files (their names, sizes and times), not a blob's digest."""
        files = "\n".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in self.served.settings.load.paths)
        return hashlib.sha256(files.encode()).hexdigest()

    def details(self) -> dict[str, Any]:
        lead = max(self.infos, key=lambda i: i.n_params)
        return {"parent_model": "", "format": "gguf", "family": lead.architecture, "families": list(dict.fromkeys(i.architecture for i in self.infos)),
                "parameter_size": "+".join(parameter_size(i.n_params) for i in self.infos), "quantization_level": lead.quantization}  # fmt: skip

    def card(self) -> dict[str, Any]:
        """The model as /api/tags and /api/ps list it."""
        name = self.served.alias
        return {"name": name, "model": name, "modified_at": self.modified, "size": self.size, "digest": self.digest, "details": self.details()}

    def show(self) -> dict[str, Any]:
        """POST /api/show's answer: details, each model's header values, the template."""
        infos = self.infos
        info: dict[str, Any] = {"general.architecture": infos[0].architecture, "general.parameter_count": sum(i.n_params for i in infos),
                                "localcos.models": [i.label for i in infos], "localcos.combiner": self.served.ensemble.combiner.description,
                                "localcos.level": self.served.level.value, "localcos.context_length": self.served.ensemble.n_ctx}  # fmt: skip
        for i in infos:
            for key, value in i.metadata.items():
                if isinstance(value, (int, float, str, bool)) and not key.startswith("tokenizer.chat_template"):
                    info.setdefault(key, value)
        formatter = self.served.formatter
        template = (formatter.template if formatter is not None else None) or ""
        fim = self.fim
        if fim is not None:  # Ollama's way of saying a model fills in (a client such as Continue looks for .Suffix), the chat's after it
            template = f"{{{{- if .Suffix }}}}{fim[0]}{{{{ .Prompt }}}}{fim[1]}{{{{ .Suffix }}}}{fim[2]}{{{{- else }}}}{template or ''}{{{{- end }}}}"
        capabilities = ["completion", *(["insert"] if fim is not None else [])]
        return {"license": "", "modelfile": "", "parameters": "", "template": template or "", "details": self.details(), "model_info": info,
                "modified_at": self.modified, "capabilities": capabilities}  # fmt: skip

    @cached_property
    def fim(self) -> tuple[str, str, str] | None:
        """The texts of the lead model's prefix, suffix and middle tokens, where it has them."""
        ensemble = self.served.ensemble
        models = ensemble.loaded
        lead = max(models, key=lambda m: m.n_params)
        try:
            tokens = FimTokens.of(lead)
        except ConfigError:
            return None
        text = [lead.piece(t, special=True).decode("utf-8", errors="replace") for t in (tokens.prefix, tokens.suffix, tokens.middle)]
        return text[0], text[1], text[2]


def parameter_size(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def timestamp(seconds: float | None = None) -> str:
    """RFC 3339 in UTC, as Ollama writes `created_at`."""
    return datetime.fromtimestamp(time.time() if seconds is None else seconds, tz=timezone.utc).isoformat().replace("+00:00", "Z")


# --- planning ----------------------------------------------------------------------------------------


def check_model(served: ServedEnsemble, model: str) -> None:
    """The served model, by its name (`/api/tags`'), with Ollama's default tag or without."""
    if model not in (served.alias, served.alias + ":latest"):
        raise APIError(404, f"model {model!r} not found; this server serves {served.alias!r}", param="model", code="model_not_found")


def plan_chat(served: ServedEnsemble, body: ChatRequest) -> protocol.Request:
    """POST /api/chat: the conversation through the models' chat template, as /v1/chat/completions
    renders it."""
    check_model(served, body.model)
    body.check_context(served)
    max_tokens = body.max_tokens(served)
    settings = protocol.settings_for(served, body, max(max_tokens, 1))
    models = served.decide(settings.generation, needs_tokens=False)
    conversation = [Message(m.role, m.content) for m in body.messages]
    plans = protocol.chat_plans(served, settings, conversation, models)
    return protocol.Request("chat", plans, [""], 1, body.stream, max_tokens)


def plan_generate(served: ServedEnsemble, body: GenerateRequest) -> protocol.Request:
    """POST /api/generate: the prompt (and system message) through the chat template, as Ollama
    does; raw, or for models without a template, the prompt as it is (`/v1/completions`'); with a
    suffix, what to fill in between them, through the models' FIM tokens (raw or not: a FIM
    prompt reads no chat template)."""
    check_model(served, body.model)
    body.check_context(served)
    max_tokens = body.max_tokens(served)
    settings = protocol.settings_for(served, body, max(max_tokens, 1))
    models = served.decide(settings.generation, needs_tokens=False)
    if body.suffix:  # the model's fill-in-the-middle tokens, as Ollama's template for a code model reads .Prompt and .Suffix
        if body.system is not None:
            raise APIError(400, "system: fill-in-the-middle reads the prompt and the suffix alone (leave system out)", param="system")
        plans = protocol.plans_of(models, settings, [Infill(body.prompt, body.suffix)], "prompt")
    elif body.raw or served.templates(models) is None:
        if body.system is not None:
            raise APIError(400, "system: a raw prompt is read as it is (leave system out, or raw)", param="system")
        plans = protocol.plans_of(models, settings, [body.prompt], "prompt")
    else:
        conversation = ([Message("system", body.system)] if body.system is not None else []) + [Message("user", body.prompt)]
        plans = protocol.chat_plans(served, settings, conversation, models)
    return protocol.Request("completion", plans, [body.prompt], 1, body.stream, max_tokens)


# --- answering -----------------------------------------------------------------------------------------


def piece(served: ServedEnsemble, request: protocol.Request, text: str) -> dict[str, Any]:
    """One streamed line: a piece of the answer."""
    line: dict[str, Any] = {"model": served.alias, "created_at": timestamp()}
    if request.route == "chat":
        line["message"] = {"role": "assistant", "content": text}
    else:
        line["response"] = text
    line["done"] = False
    return line


def final(served: ServedEnsemble, request: protocol.Request, choices: Sequence[protocol.Choice], started: float, text: str = "") -> dict[str, Any]:
    """The last line (the whole answer when not streamed, `text`): why it ended and what it cost,
    in nanoseconds as Ollama counts them, and localcos's statistics."""
    line = piece(served, request, text)
    completion = choices[0].completion if choices else None
    usage = protocol.usage(request, choices)
    stats = completion.stats if completion is not None else None
    line.update(
        done=True,
        done_reason="stop" if completion is not None and completion.finish_reason == "stop" else "length",
        total_duration=int((time.monotonic() - started) * 1e9),
        load_duration=0,  # the models stay loaded while the server runs
        prompt_eval_count=usage.prompt_tokens,
        prompt_eval_duration=int((getattr(stats, "prompt_seconds", 0.0) or 0.0) * 1e9),
        eval_count=usage.completion_tokens,
        eval_duration=int((getattr(stats, "seconds", 0.0) or 0.0) * 1e9),
        localcos=protocol.statistics(request, choices),
    )
    return line


def answer(served: ServedEnsemble, request: protocol.Request, choices: Sequence[protocol.Choice], started: float) -> dict[str, Any]:
    """The whole answer of a request that does not stream."""
    completion = choices[0].completion if choices else None
    return final(served, request, choices, started, completion.text if completion is not None else "")


def error(message: str) -> dict[str, Any]:
    """An error in Ollama's shape."""
    return {"error": message}
