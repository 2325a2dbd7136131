"""OpenAI's protocol over the Python API: validated requests (`requests.py`) become plans, plans
run on the engine thread, and their results become responses in the shapes the official clients
read (`openai` for Python and the rest), with a `localcos` object of statistics.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from ..chat import ChatFormatter, Message
from ..grammar import Constraint, ToolCallFormat, tool_call_format, tool_grammar
from ..ensemble import Completion, Ensemble, GenerationConfig
from ..errors import Cancelled, ConfigError, LocalcosError, PromptTooLongError, RemoteError, TokenizerMismatchError
from ..scoring import ScoreCache, score_tokens
from ..settings import Settings
from ..stats import GenerationStats
from .engine import Generation, Job
from .requests import ChatCompletionRequest, ChatMessage, CompletionRequest, GenerationRequest


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
    scores: ScoreCache = field(default_factory=ScoreCache)  # echo scoring's shared prefixes


# --- planning requests ---------------------------------------------------------------------------
# The bodies arrive validated (`requests.py`); planning adds what needs the loaded ensemble:
# the model name, tokens (the template rendered), the context length, the combination bound to the
# models. It runs in a worker thread, off the event loop (tokenising a 16 MiB body takes a while),
# and touches only the models' vocabularies, which llama.cpp lets any thread read.


def check_model(served: Served, model: str | None) -> None:
    if model is not None and model != served.alias:
        raise APIError(404, f"The model {model!r} does not exist; this server serves {served.alias!r}", param="model", code="model_not_found")


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
    tools: ToolCalls | None = None  # the reply may be tool calls, written in this format
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


def _settings_for(served: Served, request: GenerationRequest, max_tokens: int, constraint: Constraint | None = None) -> Settings:
    """The server's settings with the request's options over them (each value was parsed where
    it entered; what depends on several of them, and on the models, is checked here).
    `constraint`: the tools' grammar, in place of any other."""
    values = request.settings_values()
    if constraint is not None:
        values.update(json_schema=None, json_object=False, grammar=constraint)
    if max_tokens > 0:
        values["max_tokens"] = max_tokens
    try:
        return served.settings.with_values(values, json=True, parsed=True)
    except ConfigError as e:
        raise APIError(400, str(e), param=e.param, code="invalid_value") from None


def _combiner(served: Served, settings: Settings) -> Any:
    """The request's combination, bound to the ensemble now: a misfit (weights for another
    number of models, cd over three) is this request's 400, not an error in the queue."""
    try:
        return served.ensemble.bind(settings.combiner())
    except ConfigError as e:
        raise APIError(400, str(e), param=e.param, code="invalid_value") from None


def check_token_ids(served: Served, tokens: Sequence[int], param: str) -> None:
    """Token ids a client sent are ids of this vocabulary."""
    n_vocab = served.ensemble.n_vocab
    bad = next((t for t in tokens if t >= n_vocab), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is outside the vocabulary of {n_vocab}", param=param)


def _check_length(served: Served, tokens: list[int], param: str) -> None:
    ens = served.ensemble
    if not tokens:
        raise APIError(400, "the prompt is empty", param=param)
    check_token_ids(served, tokens, param)
    if len(tokens) >= ens.n_ctx:
        raise APIError(
            400,
            f"This model's context holds {ens.n_ctx} tokens; the prompt has {len(tokens)}. Shorten it, or serve with a larger --ctx.",
            param=param,
            code="context_length_exceeded",
        )


def plan_completion(served: Served, request: CompletionRequest) -> Plan:
    """POST /v1/completions: tokens and settings for a validated body."""
    check_model(served, request.model)
    max_tokens = served.settings.generation.max_tokens if request.max_tokens is None else request.max_tokens
    settings = _settings_for(served, request, max_tokens)
    prompts, texts = [], []
    ens = served.ensemble
    for p in request.prompt:
        if isinstance(p, str):
            # with echo, nothing is added to what was sent: its tokens are the ones scored
            try:
                tokens = ens.tokenize(p, add_bos=False) if request.echo else ens.tokenize(p)
            except TokenizerMismatchError as e:
                raise APIError(400, str(e), param="prompt") from None
            _check_length(served, tokens, "prompt")
            texts.append(p)
        else:
            tokens = p
            _check_length(served, tokens, "prompt")
            texts.append(ens.detokenize(tokens))
        prompts.append(tokens)
    return Plan(
        "completion", prompts, texts, settings.generation, _combiner(served, settings), request.n, request.stream, max_tokens,
        request.echo, request.logprobs, include_usage=request.include_usage, return_token_ids=request.return_token_ids,
    )  # fmt: skip


def messages(request_messages: Sequence[ChatMessage]) -> list[Message]:
    return [Message(m.role, m.text, tool_calls=m.calls(), tool_call_id=m.tool_call_id) for m in request_messages]


def render(served: Served, request_messages: Sequence[ChatMessage], tools: Sequence[dict] | None = None) -> list[int]:
    """The conversation's prompt tokens, through the models' chat template (400 without one),
    which also describes `tools` (OpenAI's function definitions) to the models."""
    if served.formatter is None:
        raise APIError(400, "these models carry no chat template; use /v1/completions", param="messages")
    conversation = messages(request_messages)
    if served.settings.system and conversation[0].role != "system":
        conversation = [Message("system", served.settings.system), *conversation]
    try:
        return served.formatter.tokens(conversation, tools=tools)
    except LocalcosError as e:
        raise APIError(400, str(e), param="messages") from None


@dataclass(frozen=True)
class ToolCalls:
    """How this request's reply may call tools: the template's format and its markers' ids."""

    format: ToolCallFormat
    open_id: int | None  # the markers as single special tokens, when they are
    close_id: int | None


def _tools(served: Served, request: ChatCompletionRequest) -> tuple[ToolCalls, Constraint, list[dict]]:
    """The tools of a request: the format the models write calls in, the grammar the reply must
    follow (text and/or calls, as tool_choice says), and the definitions for the template."""
    model = served.ensemble.models[served.settings.chat_template_model]
    fmt = tool_call_format(model)
    if fmt is None:
        raise APIError(400, "these models' chat template does not describe tool calls (localcos knows <tool_call> ones, as Qwen2.5's)", param="tools")
    definitions = [t.model_dump(exclude_none=True) for t in request.tools or ()]
    try:
        constraint = tool_grammar(fmt, definitions, request.choice, request.parallel_tool_calls)
    except ConfigError as e:
        raise APIError(400, str(e), param="tool_choice" if "tool_choice" in str(e) else "tools", code="invalid_value") from None
    ids = [model.tokenize(m, add_bos=False, special=True)[0] if fmt.special else None for m in (fmt.open, fmt.close)]
    return ToolCalls(fmt, ids[0], ids[1]), constraint, definitions


def plan_chat(served: Served, request: ChatCompletionRequest) -> Plan:
    """POST /v1/chat/completions: render the chat template for a validated body."""
    check_model(served, request.model)
    limit = request.token_limit
    max_tokens = served.settings.generation.max_tokens if limit is None else limit
    tools, constraint, definitions = _tools(served, request) if request.tools else (None, None, None)
    settings = _settings_for(served, request, max_tokens, constraint)
    tokens = render(served, request.messages, definitions)
    _check_length(served, tokens, "messages")
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    return Plan(
        "chat", [tokens], [""], settings.generation, _combiner(served, settings), request.n, request.stream, max_tokens, False,
        logprobs, include_usage=request.include_usage, return_token_ids=request.return_token_ids, tools=tools,
    )  # fmt: skip


# --- running -----------------------------------------------------------------------------------


@dataclass
class Choice:
    index: int
    prompt: int
    completion: Completion | None
    logprobs: dict | None = None
    calls: list[dict] | None = None  # the tool calls the reply made (OpenAI's tool_calls)


def generations(plan: Plan) -> list[Generation]:
    """What the engine generates for `plan`: every prompt times n choices, in choice order."""
    if plan.max_tokens == 0:
        return []
    out = []
    for p, tokens in enumerate(plan.prompts):
        for j in range(plan.n):
            config = plan.config
            if plan.n > 1 and config.seed is not None:
                config = replace(config, seed=config.seed + j)  # n choices: n different draws
            out.append(Generation(p * plan.n + j, tokens, config, plan.combiner))
    return out


def prepare(served: Served, plan: Plan, job: Job, slot: int) -> None:
    """Before an echo request's generations (in the engine's thread): score its prompts, so the
    generations share the prompts' cells and `finish` takes their scores from the cache,
    evaluating only what was generated. A prompt that starts like one scored before (the same
    context, another choice) costs only its new tokens."""
    for tokens in plan.prompts:
        if len(tokens) > 1:
            score_tokens(served.ensemble, tokens, 1, combiners=[plan.combiner], members=False, top=max(plan.logprobs or 0, 1),
                         cancelled=lambda: job.cancelled, slot=slot, reuse=served.scores)  # fmt: skip


def finish(served: Served, plan: Plan, job: Job, slot: int) -> list[Choice]:
    """The choices of a job whose generations are done (in the engine's thread): with echo or
    logprobs, scored under r in slot `slot`. A cancelled job's choices are whatever was done."""
    choices = []
    for p, tokens in enumerate(plan.prompts):
        for j in range(plan.n):
            index = p * plan.n + j
            completion = job.completions.get(index)
            if plan.max_tokens > 0 and completion is None:
                continue  # cancelled before it started
            choice = Choice(index, p, completion, calls=tool_calls(served, plan, completion))
            if (plan.logprobs is not None or plan.echo) and not job.cancelled:
                try:
                    choice.logprobs = _logprobs(served, plan, tokens, completion, lambda: job.cancelled, slot)
                except Cancelled:
                    return choices
            choices.append(choice)
    return choices


def _generated(completion: Completion | None) -> list[int]:
    """The generated tokens, with the end token that ended them (scored like any other)."""
    if completion is None:
        return []
    return completion.token_ids + ([completion.end_token] if completion.end_token is not None else [])


def _piece(ens: Ensemble, token: int) -> str:
    return ens.models[0].piece(token, special=True).decode("utf-8", errors="replace")


def _logprobs(served: Served, plan: Plan, prompt: list[int], completion: Completion | None, cancelled: Callable[[], bool], slot: int) -> dict:
    """Log-probabilities under r at temperature 1: of the prompt's tokens too with echo (the
    first one has none), and of the generated ones; `top` alternatives per position. Raises
    `Cancelled` when `cancelled()` turns true between two llama.cpp calls."""
    ens = served.ensemble
    generated = _generated(completion)
    tokens = prompt + generated
    start = 1 if plan.echo else len(prompt)
    top = plan.logprobs or 0
    if len(tokens) > start:
        scores = score_tokens(ens, tokens, start, combiners=[plan.combiner], members=False, top=max(top, 1), cancelled=cancelled, slot=slot, reuse=served.scores)
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


def tool_calls(served: Served, plan: Plan, completion: Completion | None) -> list[dict] | None:
    """The tool calls a reply made, in OpenAI's shape (None: a text reply): each call's JSON
    between the format's markers (the grammar made it valid; a call cut short by max_tokens is
    left out)."""
    if plan.tools is None or completion is None:
        return None
    fmt = plan.tools.format
    segments: list[str] = []
    if fmt.special:
        current: list[int] | None = None
        for token in completion.token_ids:
            if token == plan.tools.open_id:
                current = []
            elif token == plan.tools.close_id and current is not None:
                segments.append(served.ensemble.detokenize(current))
                current = None
            elif current is not None:
                current.append(token)
    else:
        segments = re.findall(re.escape(fmt.open) + r"(.*?)" + re.escape(fmt.close), completion.text, re.S)
    calls = []
    for text in segments:
        try:
            call = json.loads(text)
        except json.JSONDecodeError:
            continue
        function = {"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)}
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function", "function": function})
    return calls or None


def opens_a_call(plan: Plan, first_token: int, text: str) -> bool | None:
    """Whether a reply that starts with `first_token` and `text` is a tool call (whose JSON is
    then not streamed as text); None while the text could still become the call's marker."""
    assert plan.tools is not None
    if plan.tools.format.special:
        return first_token == plan.tools.open_id
    start, marker = text.lstrip(), plan.tools.format.open
    if start.startswith(marker):
        return True
    return None if marker.startswith(start) else False


def _finish(c: Choice) -> str:
    if c.completion is None:
        return "length"
    if c.calls:
        return "tool_calls"
    return "stop" if c.completion.finish_reason == "stop" else "length"


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
                "message": _message(c),
                "logprobs": c.logprobs,
                "finish_reason": _finish(c),
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
                "finish_reason": _finish(c),
                **_extras(plan, c),
            }
            for c in choices
        ]
    body["usage"] = usage(plan, choices)
    body["localcos"] = statistics(choices)
    return body


def _message(c: Choice) -> dict[str, Any]:
    if c.calls:
        return {"role": "assistant", "content": None, "tool_calls": c.calls}
    return {"role": "assistant", "content": c.completion.text if c.completion else ""}


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
    out = [chunk(served, plan, c.index, None, _finish(c)) for c in choices]
    for event, c in zip(out, choices):
        event["choices"][0].update(_extras(plan, c))
        if c.calls:  # the calls whole, in the closing event (their text was not streamed)
            event["choices"][0]["delta"]["tool_calls"] = [{"index": k, **call} for k, call in enumerate(c.calls)]
    if out:
        out[-1]["localcos"] = statistics(choices)
    if plan.include_usage:
        tail = {key: value for key, value in chunk(served, plan, 0, None).items() if key != "choices"}
        out.append({**tail, "choices": [], "usage": usage(plan, choices)})
    return out
