"""OpenAI's request and response shapes, over the settings layer and the Python API.

Requests are plain JSON, checked here field by field with the settings layer's parsers (so a bad
value is a 400 naming the field, never a 422 or a 500); responses are built the way the official
clients read them (`openai` for Python and the rest), with a `localcos` object of statistics.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from ..chat import ChatFormatter, Message
from ..ensemble import Completion, Ensemble, GenerationConfig
from ..errors import ConfigError, LocalcosError, PromptTooLongError, RemoteError, TokenizerMismatchError
from ..scoring import score_tokens
from ..settings import Settings, parse_int
from ..stats import GenerationStats
from .engine import Job

# request fields that are options of the settings layer (localcos's extras included)
SETTINGS_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "seed", "stop", "method", "gamma", "combine", "weights", "mu",
    "plausibility", "expert", "proposer", "ignore_eos",
)  # fmt: skip
# OpenAI fields localcos does not implement: refused unless left at their neutral value
UNSUPPORTED = {
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "logit_bias": ({},),
    "best_of": (1,),
    "suffix": ("",),
    "tools": ([],),
    "functions": ([],),
}
MAX_CHOICES = 16
MAX_TOP_LOGPROBS = 20


class APIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def from_localcos(e: LocalcosError) -> APIError:
    """A library error as the API's 400; a lost RPC server as 502 (the next request loads the
    model again, so a client's retry may succeed)."""
    if isinstance(e, RemoteError):
        return APIError(502, str(e), type="server_error", code="rpc_server_lost")
    if isinstance(e, PromptTooLongError):
        return APIError(400, str(e), param="messages" if "chat" in str(e) else "prompt", code="context_length_exceeded")
    param = getattr(e, "param", None)
    return APIError(400, str(e), param=param, code="invalid_value" if param else None)


@dataclass
class Served:
    """What the server serves: one loaded ensemble and how to talk about it."""

    ensemble: Ensemble
    settings: Settings
    alias: str
    formatter: ChatFormatter | None  # None: the models carry no chat template
    created: int = field(default_factory=lambda: int(time.time()))


# --- reading requests ---------------------------------------------------------------------------


def _check_model(served: Served, body: dict) -> None:
    model = body.get("model")
    if model is not None and model != served.alias:
        raise APIError(404, f"The model {model!r} does not exist; this server serves {served.alias!r}", param="model", code="model_not_found")


def _check_unsupported(body: dict) -> None:
    for name, neutral in UNSUPPORTED.items():
        if name in body and body[name] is not None and body[name] not in neutral:
            raise APIError(400, f"{name} is not supported by localcos", param=name, code="unsupported_parameter")


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise APIError(400, f"{name} must be true or false, got {value!r}", param=name)
    return value


def _int(body: dict, name: str, default: int, minimum: int, maximum: int | None = None) -> int:
    value = body.get(name)
    if value is None:
        return default
    try:
        number = parse_int(value, name, minimum=minimum)
    except ConfigError as e:
        raise APIError(400, str(e), param=name) from None
    if maximum is not None and number > maximum:
        raise APIError(400, f"{name} must be <= {maximum}, got {number}", param=name)
    return number


@dataclass
class Plan:
    """A checked request: what to generate from which prompts, and how to answer."""

    kind: str  # "completion" | "chat"
    prompts: list[list[int]]
    prompt_texts: list[str]
    config: GenerationConfig
    combiner: Any
    n: int
    stream: bool
    max_tokens: int  # 0: no generation (echo: score the prompt only)
    echo: bool = False
    logprobs: int | None = None  # completions: top-N; chat: top_logprobs (0 with logprobs true)
    include_usage: bool = False
    return_token_ids: bool = False  # vLLM's extra: prompt_token_ids and token_ids on each choice
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


def _settings_for(served: Served, body: dict, max_tokens: int) -> Settings:
    values = {k: body[k] for k in SETTINGS_FIELDS if k in body and body[k] is not None}
    if max_tokens > 0:
        values["max_tokens"] = max_tokens
    try:
        return served.settings.with_values(values, json=True)
    except ConfigError as e:
        raise APIError(400, str(e), param=e.param, code="invalid_value") from None


def _combiner(served: Served, settings: Settings) -> Any:
    """The request's combination, bound to the ensemble now: a misfit (weights for another
    number of models, cd over three) is this request's 400, not an error in the queue."""
    try:
        return served.ensemble.bind(settings.combiner())
    except ConfigError as e:
        raise APIError(400, str(e), param=e.param, code="invalid_value") from None


def _max_tokens(served: Served, body: dict) -> int:
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return _int(body, name, served.settings.generation.max_tokens, minimum=0)


def _prompt_list(value: Any) -> list[str | list[int]]:
    """prompt: a string, a list of strings, a list of token ids, or a list of lists of ids."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            return [value]
        if all(isinstance(x, str) for x in value):
            return list(value)
        if all(isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool) for t in x) for x in value):
            return [list(x) for x in value]
    raise APIError(400, "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids", param="prompt")


def _check_length(served: Served, tokens: list[int], param: str) -> None:
    ens = served.ensemble
    if not tokens:
        raise APIError(400, "the prompt is empty", param=param)
    bad = [t for t in tokens if not 0 <= t < ens.n_vocab]
    if bad:
        raise APIError(400, f"token id {bad[0]} is outside the vocabulary of {ens.n_vocab}", param=param)
    if len(tokens) >= ens.n_ctx:
        raise APIError(
            400,
            f"This model's context holds {ens.n_ctx} tokens; the prompt has {len(tokens)}. Shorten it, or serve with a larger --ctx.",
            param=param,
            code="context_length_exceeded",
        )


def plan_completion(served: Served, body: dict) -> Plan:
    """POST /v1/completions: check the body."""
    _check_model(served, body)
    _check_unsupported(body)
    if "prompt" not in body:
        raise APIError(400, "prompt is required", param="prompt")
    echo = _flag(body, "echo")
    stream = _flag(body, "stream")
    logprobs = body.get("logprobs")
    if logprobs is not None:
        logprobs = _int(body, "logprobs", 0, minimum=0, maximum=MAX_TOP_LOGPROBS)
    if stream and (logprobs is not None or echo):
        raise APIError(400, "logprobs and echo are not supported with stream", param="stream")
    max_tokens = _max_tokens(served, body)
    if max_tokens == 0 and not echo:
        raise APIError(400, "max_tokens must be >= 1 (0 only with echo)", param="max_tokens")
    settings = _settings_for(served, body, max_tokens)
    prompts, texts = [], []
    ens = served.ensemble
    for p in _prompt_list(body["prompt"]):
        if isinstance(p, str):
            # with echo, nothing is added to what was sent: its tokens are the ones scored
            try:
                tokens = ens.tokenize(p, add_bos=False) if echo else ens.tokenize(p)
            except TokenizerMismatchError as e:
                raise APIError(400, str(e), param="prompt") from None
            texts.append(p)
        else:
            tokens = p
            texts.append("")
        _check_length(served, tokens, "prompt")
        prompts.append(tokens)
    for i, p in enumerate(prompts):
        if not texts[i]:
            texts[i] = ens.detokenize(p)
    n = _int(body, "n", 1, minimum=1, maximum=MAX_CHOICES)
    return Plan(
        "completion", prompts, texts, settings.generation, _combiner(served, settings), n, stream, max_tokens, echo, logprobs,
        include_usage=_include_usage(body), return_token_ids=_flag(body, "return_token_ids"),
    )  # fmt: skip


def _include_usage(body: dict) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _messages(value: Any) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise APIError(400, "messages must be a non-empty list of {role, content}", param="messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(400, f"messages[{i}] must be an object with a role and a content", param="messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            parts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise APIError(400, f"messages[{i}]: only text content parts are supported", param="messages")
                parts.append(part["text"])
            content = "".join(parts)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be a string or a list of text parts", param="messages")
        out.append(Message(m["role"], content))
    return out


def plan_chat(served: Served, body: dict) -> Plan:
    """POST /v1/chat/completions: check the body and render the chat template."""
    _check_model(served, body)
    _check_unsupported(body)
    if served.formatter is None:
        raise APIError(400, "these models carry no chat template; use /v1/completions", param="messages")
    messages = _messages(body.get("messages"))
    if served.settings.system and messages[0].role != "system":
        messages = [Message("system", served.settings.system), *messages]
    stream = _flag(body, "stream")
    logprobs = None
    if _flag(body, "logprobs"):
        if stream:
            raise APIError(400, "logprobs are not supported with stream", param="stream")
        logprobs = _int(body, "top_logprobs", 0, minimum=0, maximum=MAX_TOP_LOGPROBS)
    max_tokens = _max_tokens(served, body)
    if max_tokens == 0:
        raise APIError(400, "max_tokens must be >= 1", param="max_tokens")
    settings = _settings_for(served, body, max_tokens)
    try:
        tokens = served.formatter.tokens(messages)
    except LocalcosError as e:
        raise APIError(400, str(e), param="messages") from None
    _check_length(served, tokens, "messages")
    n = _int(body, "n", 1, minimum=1, maximum=MAX_CHOICES)
    return Plan(
        "chat", [tokens], [""], settings.generation, _combiner(served, settings), n, stream, max_tokens, False, logprobs,
        include_usage=_include_usage(body), return_token_ids=_flag(body, "return_token_ids"),
    )  # fmt: skip


# --- running -----------------------------------------------------------------------------------


@dataclass
class Choice:
    index: int
    prompt: int
    completion: Completion | None
    logprobs: dict | None = None


def run(served: Served, plan: Plan, job: Job, emit: Callable[[int, str], None] | None = None) -> list[Choice]:
    """Generate every choice of `plan` (in the engine's thread); `emit(index, text)` hears each
    piece of text as it becomes final (streaming)."""
    ens = served.ensemble
    choices = []
    for p, tokens in enumerate(plan.prompts):
        for j in range(plan.n):
            index = p * plan.n + j
            if job.cancelled:
                return choices
            completion = None
            config = plan.config
            if plan.n > 1 and config.seed is not None:
                config = replace(config, seed=config.seed + j)  # n choices: n different draws
            if plan.max_tokens > 0:
                stream = ens.stream(tokens, config=config, combiner=plan.combiner)
                job.stream = stream
                for chunk in stream.chunks():
                    if emit is not None and chunk.text:
                        emit(index, chunk.text)
                completion = stream.completion
            choice = Choice(index, p, completion)
            if plan.logprobs is not None or plan.echo:
                choice.logprobs = _logprobs(ens, plan, tokens, completion)
            choices.append(choice)
    return choices


def _generated(completion: Completion | None) -> list[int]:
    """The generated tokens, with the end token that ended them (scored like any other)."""
    if completion is None:
        return []
    return completion.token_ids + ([completion.end_token] if completion.end_token is not None else [])


def _piece(ens: Ensemble, token: int) -> str:
    return ens.models[0].piece(token, special=True).decode("utf-8", errors="replace")


def _logprobs(ens: Ensemble, plan: Plan, prompt: list[int], completion: Completion | None) -> dict:
    """Log-probabilities under r at temperature 1: of the prompt's tokens too with echo (the
    first one has none), and of the generated ones; `top` alternatives per position."""
    generated = _generated(completion)
    tokens = prompt + generated
    start = 1 if plan.echo else len(prompt)
    top = plan.logprobs or 0
    if len(tokens) > start:
        scores = score_tokens(ens, tokens, start, combiners=[plan.combiner], members=False, top=max(top, 1))
        values = [float(x) for x in scores.logprobs]
        tops = scores.top or []
    else:
        values, tops = [], []
    shown = tokens[start - 1 :] if plan.echo else tokens[start:]
    logprob_list: list[float | None] = ([None] if plan.echo else []) + values
    top_list: list[dict | None] = ([None] if plan.echo else [])
    for token, lp, alternatives in zip(tokens[start:], values, tops):
        entry = {_piece(ens, t): v for t, v in alternatives[:top]} if top else {}
        entry[_piece(ens, token)] = lp  # the token itself is always there
        top_list.append(entry)
    if plan.kind == "chat":
        return {
            "content": [
                {
                    "token": _piece(ens, t),
                    "logprob": lp,
                    "bytes": list(ens.models[0].piece(t, special=True)),
                    "top_logprobs": [
                        {"token": _piece(ens, a), "logprob": v, "bytes": list(ens.models[0].piece(a, special=True))}
                        for a, v in alt[:top]
                    ],
                }
                for t, lp, alt in zip(tokens[start:], values, tops)
            ],
            "refusal": None,
        }
    strings = [_piece(ens, t) for t in shown]
    offsets, position = [], 0
    for s in strings:
        offsets.append(position)
        position += len(s)
    return {"tokens": strings, "token_logprobs": logprob_list, "top_logprobs": top_list, "text_offset": offsets}


# --- answering -------------------------------------------------------------------------------------


def _finish(completion: Completion | None) -> str:
    if completion is None:
        return "length"
    return "stop" if completion.finish_reason == "stop" else "length"


def _stop_reason(completion: Completion | None) -> int | None:
    """vLLM's stop_reason: the id of the end-of-generation token that ended the text (None when
    it ended otherwise: max_tokens, a stop string)."""
    return completion.end_token if completion is not None else None


def _extras(plan: Plan, c: Choice) -> dict[str, Any]:
    extra: dict[str, Any] = {"stop_reason": _stop_reason(c.completion)}
    if plan.return_token_ids:
        extra["prompt_token_ids"] = plan.prompts[c.prompt]
        extra["token_ids"] = c.completion.token_ids if c.completion else []
    return extra


def usage(plan: Plan, choices: Sequence[Choice]) -> dict:
    prompt_tokens = sum(len(p) for p in plan.prompts)
    completion_tokens = sum(len(c.completion.token_ids) for c in choices if c.completion is not None)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


def statistics(choices: Sequence[Choice]) -> dict | None:
    stats = [c.completion.stats for c in choices if c.completion is not None]
    return GenerationStats.aggregate(stats).to_dict() if stats else None


def response(served: Served, plan: Plan, choices: Sequence[Choice]) -> dict:
    """The whole answer of a request that does not stream."""
    body: dict[str, Any] = {"id": ("chatcmpl-" if plan.kind == "chat" else "cmpl-") + plan.id, "created": plan.created, "model": served.alias}
    if plan.kind == "chat":
        body["object"] = "chat.completion"
        body["choices"] = [
            {
                "index": c.index,
                "message": {"role": "assistant", "content": c.completion.text if c.completion else ""},
                "logprobs": c.logprobs,
                "finish_reason": _finish(c.completion),
                **_extras(plan, c),
            }
            for c in choices
        ]
    else:
        body["object"] = "text_completion"
        body["choices"] = [
            {
                "index": c.index,
                "text": (plan.prompt_texts[c.prompt] if plan.echo else "") + (c.completion.text if c.completion else ""),
                "logprobs": c.logprobs,
                "finish_reason": _finish(c.completion),
                **_extras(plan, c),
            }
            for c in choices
        ]
    body["usage"] = usage(plan, choices)
    body["localcos"] = statistics(choices)
    return body


def chunk(served: Served, plan: Plan, index: int, text: str | None, finish: str | None = None, first: bool = False) -> dict:
    """One server-sent event of a streaming answer."""
    if plan.kind == "chat":
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
            delta["content"] = ""
        if text:
            delta["content"] = text
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"id": "chatcmpl-" + plan.id, "object": "chat.completion.chunk", "created": plan.created, "model": served.alias, "choices": [choice]}
    choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}
    return {"id": "cmpl-" + plan.id, "object": "text_completion", "created": plan.created, "model": served.alias, "choices": [choice]}


def final_chunks(served: Served, plan: Plan, choices: Sequence[Choice]) -> list[dict]:
    """The closing events: each choice's finish reason (the last one with the statistics), then,
    if the client asked (stream_options.include_usage), a usage event without choices."""
    out = [chunk(served, plan, c.index, None, _finish(c.completion)) for c in choices]
    for event, c in zip(out, choices):
        event["choices"][0].update(_extras(plan, c))
    if out:
        out[-1]["localcos"] = statistics(choices)
    if plan.include_usage:
        tail = {key: value for key, value in chunk(served, plan, 0, None).items() if key != "choices"}
        out.append({**tail, "choices": [], "usage": usage(plan, choices)})
    return out
