"""OpenAI's protocol over the runtime: validated requests (`requests.py`) are planned (one
runtime plan per prompt), their generations run on the engine thread, and their results become
the declared responses (`responses.py`) that the official clients read (`openai` for Python and
the rest), with a `localcos` object of statistics.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast
from collections.abc import Callable, Sequence

from ..chat import ChatFormatter, Message, OwnTemplates, second_conversation
from ..config import Settings
from ..config.specs import GenerationConfig
from ..core.combiners import BoundCombiner
from ..core.level import Level
from ..errors import Cancelled, LocalcosError, RemoteError
from ..grammar import Constraint, ToolCallFormat, tool_call_format, tool_grammar
from ..runtime.completion import Completion
from ..runtime.loaded import LoadedModels
from ..runtime.models import LevelViews, Models
from ..runtime.plan import Plan, check_token_ids
from ..runtime.scoring import ScoreCache, score_tokens
from ..stats import GenerationStats
from . import responses as out
from .engine import Generation, Job
from .requests import ChatCompletionRequest, ChatMessage, CompletionRequest

if TYPE_CHECKING:
    from ..runtime.models import LevelPlan


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
        return out.ErrorBody(error=out.ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)).body()


def from_localcos(e: LocalcosError, param: str | None = None) -> APIError:
    """A library error as the API's 400 (its `param`, else `param`, names the field; its `code`
    says what kind of fault); a lost RPC server as 502 (the next request loads the model again,
    so a client's retry may succeed)."""
    if isinstance(e, RemoteError):
        return APIError(502, str(e), type="server_error", code=e.code)
    return APIError(400, str(e), param=e.param or param, code=e.code)


@dataclass
class ServedEnsemble:
    """What the server serves: the loaded models as `runtime.models.LevelViews` holds them (with,
    for one model loaded for the mixed level, its own tokens beside it) and how to talk about
    them. Every route plans through `runtime.models.Models`, on the models a request decodes on
    (`decide`, the views' answer), with the templates the views give for them (`templates`)."""

    views: LevelViews[Models, ChatFormatter | OwnTemplates]  # templates None: the models carry no chat template
    settings: Settings
    alias: str
    created: int = field(default_factory=lambda: int(time.time()))
    scores: ScoreCache = field(default_factory=ScoreCache)  # echo scoring's shared prefixes

    @property
    def ensemble(self) -> Models:
        """The models as loaded, at the level they were loaded for."""
        return self.views.loaded

    @property
    def formatter(self) -> ChatFormatter | OwnTemplates | None:
        """What renders a conversation for the models as loaded."""
        return self.views.templates

    @property
    def token_models(self) -> LoadedModels:
        """The models where they decode at the token level: what every path that needs one
        vocabulary reads (the byte level refuses those requests before they get here)."""
        models = self.views.token_models
        assert isinstance(models, LoadedModels), "refused where token ids mean nothing first"
        return models

    def decide(self, generation: GenerationConfig, needs_tokens: bool) -> Models:
        """The models a request with these settings decodes on (`LevelViews.decides`)."""
        return self.views.decides(generation, needs_tokens=needs_tokens)

    @property
    def one_vocabulary(self) -> bool:
        """Whether token ids mean one thing here (the tokenizer routes need it)."""
        return self.views.one_vocabulary

    def templates(self, models: Models) -> ChatFormatter | OwnTemplates | None:
        """What renders a conversation for `models` (the token view's own, else the loaded
        models': at the byte levels each model's own template)."""
        return self.views.templates_for(models)

    @property
    def level(self) -> Level:
        """The level its models were loaded for (a request may decode at another: `decide`)."""
        return self.ensemble.level


# --- planning requests ---------------------------------------------------------------------------
# The bodies arrive validated (`requests.py`); planning adds what needs the loaded ensemble:
# the model name, tokens (the template rendered), the context length, the combination bound to the
# models. It runs in a worker thread, off the event loop (tokenising a 16 MiB body takes a while),
# and touches only the models' vocabularies, which llama.cpp lets any thread read.


def check_tokens(served: ServedEnsemble, tokens: Sequence[int], param: str) -> None:
    """Token ids a client sent are ids of this vocabulary (400 naming `param` otherwise)."""
    try:
        check_token_ids(served.token_models, tokens, param)
    except LocalcosError as e:
        raise from_localcos(e) from None


def check_model(served: ServedEnsemble, model: str | None) -> None:
    if model is not None and model != served.alias:
        raise APIError(404, f"The model {model!r} does not exist; this server serves {served.alias!r}", param="model", code="model_not_found")


@dataclass
class Request:
    """A checked request: what to generate from which prompts (one runtime plan each), and how
    to answer."""

    route: Literal["completion", "chat", "infill"]
    plans: list[LevelPlan]  # at the level of the models it decodes on
    prompt_texts: list[str]
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

    @property
    def prompts(self) -> list[list[int]]:
        return [list(p.prompt) for p in self.plans]

    @property
    def combiner(self) -> BoundCombiner:
        """The request's combination, bound to the models once (every prompt's plan shares it)."""
        return self.plans[0].combiner


def settings_for(served: ServedEnsemble, request: Any, max_tokens: int, constraint: Constraint | None = None) -> Settings:
    """The server's settings with the options of `request` (a body with `settings_values()`: an
    OpenAI or an Ollama route's) over them (each value was parsed where it entered; what depends
    on the models is checked when the request is planned). `constraint`: the tools' grammar, in
    place of any other."""
    values = request.settings_values()
    try:
        served.ensemble.refuse_unread(values, json=True, remedy="start the server with --level byte")
    except LocalcosError as e:
        raise from_localcos(e) from None
    if constraint is not None:
        values.update(json_schema=None, json_object=False, grammar=constraint)
    if max_tokens > 0:
        values["max_tokens"] = max_tokens
    try:
        return served.settings.with_values(values, json=True, parsed=True, check=False)
    except LocalcosError as e:
        raise from_localcos(e) from None


def plans_of(models: Models, settings: Settings, prompts: Sequence[Any], param: str, second: list[int] | None = None) -> list[LevelPlan]:
    """One runtime plan per prompt on `models` (what the request decodes on: `decide`), the
    combination bound to them once for all of them: a misfit (weights for another number of
    models, cd over three, a prompt too long, a second prompt without its member, what the level
    does not decode) is this request's 400, not an error in the queue. A prompt is what the
    models' `plan` reads (text, an `Infill`, token ids, a rendered conversation). `second`: what
    the second prompt's member reads, where it is not the request's negative_prompt (a chat's)."""
    try:
        bound = models.bind(settings.combiner())
        return [models.plan(p, settings.generation, bound, param=param, second_prompt=second) for p in prompts]
    except LocalcosError as e:
        raise from_localcos(e, param) from None


def refuse_unserved(models: Models, asked: Sequence[tuple[bool, str]]) -> None:
    """400 for the first field asked for ((asked, "param" or "param: what")) that `models` cannot
    serve (at the byte level: what needs one vocabulary)."""
    try:
        models.refuse_unserved(asked)
    except LocalcosError as e:
        raise from_localcos(e) from None


def plan_completion(served: ServedEnsemble, request: CompletionRequest) -> Request:
    """POST /v1/completions: tokens and settings for a validated body."""
    check_model(served, request.model)
    max_tokens = served.settings.generation.max_tokens if request.max_tokens is None else request.max_tokens
    settings = settings_for(served, request, max_tokens)
    token_ids = any(not isinstance(p, str) for p in request.prompt)
    models = served.decide(settings.generation, request.echo or request.logprobs is not None or request.return_token_ids or token_ids)
    refuse_unserved(models, [(token_ids, "prompt: token ids (send text)"), (request.echo, "echo"), (request.logprobs is not None, "logprobs"),
                             (request.return_token_ids, "return_token_ids")])  # fmt: skip
    prompts = request.prompts()
    if request.echo:  # nothing is added to what was sent: its tokens are the ones scored
        if models.second_member is not None:
            raise APIError(400, "echo scores the prompt as one text: not on a server whose model also reads a second prompt (serve --negative-prompt)",
                           param="echo")  # fmt: skip
        if settings.generation.phrasing != "raw":
            raise APIError(400, "echo returns the prompt as sent: not with phrasing instruct (a request's, or serve --phrasing)", param="echo")
        prompts = [served.token_models.tokenize(p, add_bos=False) if isinstance(p, str) else p for p in prompts]
    plans = plans_of(models, settings, prompts, "prompt")
    texts = [p if isinstance(p, str) else served.token_models.detokenize(p) for p in request.prompt]
    return Request(
        "completion", plans, texts, request.n, request.stream, max_tokens, request.echo, request.logprobs,
        include_usage=request.include_usage, return_token_ids=request.return_token_ids,
    )  # fmt: skip


def chat_plans(served: ServedEnsemble, settings: Settings, conversation: list[Message], models: Models,
               definitions: list[dict] | None = None) -> list[LevelPlan]:  # fmt: skip
    """The plan of a conversation on `models` through their chat template (at the byte levels
    each model's own), which describes the `definitions` of tools; where a member reads a second
    prompt, the conversation as it reads it. The one way every chat route renders a chat."""
    second = None
    if models.second_member is not None:  # as the second prompt's member reads it
        other = second_conversation(conversation, settings.generation.negative_prompt, served.settings.guide_system)
        second = None if other is None else cast("list[int]", render_messages(served, other, models, definitions, second=True))
    return plans_of(models, settings, [render_messages(served, conversation, models, definitions)], "messages", second)


def messages(request_messages: Sequence[ChatMessage]) -> list[Message]:
    return [Message(m.role, m.text, tool_calls=m.calls(), tool_call_id=m.tool_call_id) for m in request_messages]


def render(served: ServedEnsemble, request_messages: Sequence[ChatMessage], tools: Sequence[dict] | None = None) -> list[int]:
    """The conversation's prompt tokens on the models' one vocabulary, through their chat
    template (400 without one), which also describes `tools` (OpenAI's function definitions)."""
    return cast("list[int]", render_messages(served, messages(request_messages), served.token_models, tools))


def render_messages(served: ServedEnsemble, conversation: list[Message], models: Models, tools: Sequence[dict] | None = None,
                    second: bool = False) -> list[int] | list[list[int]]:  # fmt: skip
    """A conversation already read rendered for `models` (a second prompt's is made from the
    request's), as `render`; at the byte levels in each model's own template."""
    formatter = served.templates(models)
    if formatter is None:
        raise APIError(400, "these models carry no chat template; use /v1/completions", param="messages")
    if served.settings.system and conversation[0].role != "system":
        conversation = [Message("system", served.settings.system), *conversation]
    try:
        # the byte level's requests carry no tools (`_byte_chat` refuses them)
        if tools:
            assert isinstance(formatter, ChatFormatter), "the byte level refuses tools first"
            return (formatter.second_tokens if second else formatter.tokens)(conversation, tools=tools)
        return formatter.second_tokens(conversation) if second else formatter.tokens(conversation)
    except LocalcosError as e:
        raise from_localcos(e, "messages") from None


@dataclass(frozen=True)
class ToolCalls:
    """How this request's reply may call tools: the template's format and its markers' ids."""

    format: ToolCallFormat
    open_id: int | None  # the markers as single special tokens, when they are
    close_id: int | None


def _tools(served: ServedEnsemble, request: ChatCompletionRequest) -> tuple[ToolCalls, Constraint, list[dict]]:
    """The tools of a request: the format the models write calls in, the grammar the reply must
    follow (text and/or calls, as tool_choice says), and the definitions for the template."""
    model = served.token_models.models[served.settings.chat_template_model]
    fmt = tool_call_format(model)
    if fmt is None:
        raise APIError(400, "these models' chat template does not describe tool calls (localcos knows <tool_call> ones, as Qwen2.5's)", param="tools")
    definitions = [t.model_dump(exclude_none=True) for t in request.tools or ()]
    try:
        constraint = tool_grammar(fmt, definitions, request.choice, request.parallel_tool_calls)
    except LocalcosError as e:
        raise from_localcos(e, "tools") from None
    ids = [model.tokenize(m, add_bos=False, special=True)[0] if fmt.special else None for m in (fmt.open, fmt.close)]
    return ToolCalls(fmt, ids[0], ids[1]), constraint, definitions


def plan_chat(served: ServedEnsemble, request: ChatCompletionRequest) -> Request:
    """POST /v1/chat/completions: render the chat template for a validated body."""
    check_model(served, request.model)
    limit = request.token_limit
    max_tokens = served.settings.generation.max_tokens if limit is None else limit
    settings = settings_for(served, request, max_tokens)
    models = served.decide(settings.generation, needs_tokens=request.logprobs or bool(request.tools) or request.return_token_ids)
    refuse_unserved(models, [(bool(request.logprobs), "logprobs"), (bool(request.tools), "tools"), (request.return_token_ids, "return_token_ids")])
    tools, constraint, definitions = _tools(served, request) if request.tools else (None, None, None)
    if constraint is not None:
        settings = settings_for(served, request, max_tokens, constraint)
    plans = chat_plans(served, settings, messages(request.messages), models, definitions)
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    return Request(
        "chat", plans, [""], request.n, request.stream, max_tokens, False, logprobs,
        include_usage=request.include_usage, return_token_ids=request.return_token_ids, tools=tools,
    )  # fmt: skip


# --- running -----------------------------------------------------------------------------------


@dataclass
class Choice:
    index: int
    prompt: int
    completion: Completion | None
    logprobs: dict | None = None
    calls: list[dict] | None = None  # the tool calls the reply made (OpenAI's tool_calls)


def generations(request: Request) -> list[Generation]:
    """What the engine generates for `request`: every prompt times n choices, in choice order;
    choice j of a prompt draws from random stream j of the seed (`completion_rng`), as completion
    j of `Ensemble.generate_many` does."""
    if request.max_tokens == 0:
        return []
    return [Generation(p * request.n + j, plan, j) for p, plan in enumerate(request.plans) for j in range(request.n)]


def prepare(served: ServedEnsemble, request: Request, job: Job, slot: int) -> None:
    """Before an echo request's generations (in the engine's thread): score its prompts, so the
    generations share the prompts' cells and `collect_choices` takes their scores from the cache,
    evaluating only what was generated. A prompt that starts like one scored before (the same
    context, another choice) costs only its new tokens."""
    for tokens in request.prompts:
        if len(tokens) > 1:
            score_tokens(served.token_models, tokens, 1, combiners=[request.combiner], members=False, top=max(request.logprobs or 0, 1),
                         cancelled=lambda: job.cancelled, slot=slot, reuse=served.scores)  # fmt: skip


def collect_choices(served: ServedEnsemble, request: Request, job: Job, slot: int) -> list[Choice]:
    """The choices of a job whose generations are done (in the engine's thread): with echo or
    logprobs, scored under r in slot `slot`. A cancelled job's choices are whatever was done."""
    choices: list[Choice] = []
    for p, tokens in enumerate(request.prompts):
        for j in range(request.n):
            index = p * request.n + j
            completion = job.completions.get(index)
            if request.max_tokens > 0 and completion is None:
                continue  # cancelled before it started
            choice = Choice(index, p, completion, calls=tool_calls(served, request, completion))
            if (request.logprobs is not None or request.echo) and not job.cancelled:
                try:
                    plan = request.plans[p]
                    assert isinstance(plan, Plan), "the byte level refuses logprobs and echo first"
                    choice.logprobs = _logprobs(served, request, tokens, completion, lambda: job.cancelled, slot, plan.second_prompt)
                except Cancelled:
                    return choices
            choices.append(choice)
    return choices


def _generated(completion: Completion | None) -> list[int]:
    """The generated tokens, with the end token that ended them (scored like any other)."""
    if completion is None:
        return []
    assert completion.token_ids is not None, "logprobs and echo are served at the token level (request_level)"
    return completion.token_ids + ([completion.end_token] if completion.end_token is not None else [])


def _piece(ens: LoadedModels, token: int) -> str:
    return ens.models[0].piece(token, special=True).decode("utf-8", errors="replace")


def _logprobs(served: ServedEnsemble, request: Request, prompt: list[int], completion: Completion | None, cancelled: Callable[[], bool], slot: int,
              second: Sequence[int] | None = None) -> dict:  # fmt: skip
    """Log-probabilities under r at temperature 1: of the prompt's tokens too with echo (the
    first one has none), and of the generated ones; `top` alternatives per position (a second
    prompt's member reading `second` in place of the prompt, as it did generating). Raises
    `Cancelled` when `cancelled()` turns true between two llama.cpp calls."""
    ens = served.token_models
    generated = _generated(completion)
    tokens = prompt + generated
    start = 1 if request.echo else len(prompt)
    top = request.logprobs or 0
    if len(tokens) > start:
        scores = score_tokens(ens, tokens, start, combiners=[request.combiner], members=False, top=max(top, 1), cancelled=cancelled, slot=slot,
                              reuse=served.scores if second is None else None, second=None if second is None else (second, len(prompt)))  # fmt: skip
        values = [float(x) for x in scores.logprobs]
        tops = scores.top or []
    else:
        values, tops = [], []
    shown = tokens[start - 1 :] if request.echo else tokens[start:]
    logprob_list: list[float | None] = ([None] if request.echo else []) + values
    top_list: list[dict | None] = ([None] if request.echo else [])
    for token, lp, alternatives in zip(tokens[start:], values, tops):
        entry = {_piece(ens, t): v for t, v in alternatives[:top]} if top else {}
        entry[_piece(ens, token)] = lp  # the token itself is always there
        top_list.append(entry)
    if request.route == "chat":
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


def tool_calls(served: ServedEnsemble, request: Request, completion: Completion | None) -> list[dict] | None:
    """The tool calls a reply made, in OpenAI's shape (None: a text reply): each call's JSON
    between the format's markers (the grammar made it valid; a call cut short by max_tokens is
    left out)."""
    if request.tools is None or completion is None:
        return None
    fmt = request.tools.format
    segments: list[str] = []
    if fmt.special:
        assert completion.token_ids is not None, "tools are served at the token level (request_level)"
        current: list[int] | None = None
        for token in completion.token_ids:
            if token == request.tools.open_id:
                current = []
            elif token == request.tools.close_id and current is not None:
                segments.append(served.token_models.detokenize(current))
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


def opens_a_call(request: Request, first_token: int, text: str) -> bool | None:
    """Whether a reply that starts with `first_token` and `text` is a tool call (whose JSON is
    then not streamed as text); None while the text could still become the call's marker."""
    assert request.tools is not None
    if request.tools.format.special:
        return first_token == request.tools.open_id
    start, marker = text.lstrip(), request.tools.format.open
    if start.startswith(marker):
        return True
    return None if marker.startswith(start) else False


def _finish(c: Choice) -> str:
    if c.completion is None:
        return "length"
    if c.calls:
        return "tool_calls"
    return "stop" if c.completion.finish_reason == "stop" else "length"


def _extras(request: Request, c: Choice) -> dict[str, Any]:
    """vLLM's extras of a finished choice: stop_reason (the end-of-generation token id that
    ended the text; None when max_tokens or a stop string did), and the token ids when asked."""
    extra: dict[str, Any] = {"stop_reason": c.completion.end_token if c.completion is not None else None}
    if request.return_token_ids:
        extra["prompt_token_ids"] = request.prompts[c.prompt]
        extra["token_ids"] = c.completion.token_ids if c.completion else []
    return extra


def usage(request: Request, choices: Sequence[Choice]) -> out.Usage:
    prompt_tokens = sum(p.prompt_length for p in request.plans)
    completion_tokens = sum(c.completion.length for c in choices if c.completion is not None)
    return out.Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens)


def statistics(request: Request, choices: Sequence[Choice]) -> dict | None:
    """The `localcos` object of an answer: its choices' statistics, one shape at every level."""
    stats = [c.completion.stats for c in choices if c.completion is not None]
    if not stats:
        return None
    return GenerationStats.aggregate(stats).to_dict()


def _tool_calls(calls: list[dict], streamed: bool = False) -> list[out.ToolCall]:
    # index only where streamed (a field set is a field sent)
    return [out.ToolCall(**({"index": k} if streamed else {}), **call) for k, call in enumerate(calls)]  # type: ignore[arg-type]


def response(served: ServedEnsemble, request: Request, choices: Sequence[Choice]) -> dict:
    """The whole answer of a request that does not stream."""
    if request.route == "chat":
        return out.ChatCompletion(
            id="chatcmpl-" + request.id, created=request.created, model=served.alias,
            choices=[
                out.ChatChoice(index=c.index, message=_message(c), logprobs=c.logprobs, finish_reason=_finish(c), **_extras(request, c))
                for c in choices
            ],
            usage=usage(request, choices), localcos=statistics(request, choices),
        ).body()  # fmt: skip
    return out.TextCompletion(
        id="cmpl-" + request.id, created=request.created, model=served.alias,
        choices=[
            out.TextChoice(
                index=c.index, text=(request.prompt_texts[c.prompt] if request.echo else "") + (c.completion.text if c.completion else ""),
                logprobs=c.logprobs, finish_reason=_finish(c), **_extras(request, c),
            )
            for c in choices
        ],
        usage=usage(request, choices), localcos=statistics(request, choices),
    ).body()  # fmt: skip


def _message(c: Choice) -> out.Message:
    if c.calls:
        return out.Message(content=None, tool_calls=_tool_calls(c.calls))
    return out.Message(content=c.completion.text if c.completion else "")


def chunk(served: ServedEnsemble, request: Request, index: int, text: str | None, finish: str | None = None, first: bool = False,
          extras: dict[str, Any] | None = None, calls: list[dict] | None = None) -> out.ChatCompletionChunk | out.TextCompletion:  # fmt: skip
    """One server-sent event of a streaming answer (`extras` and `calls` in a choice's last)."""
    extras = extras or {}
    if request.route == "chat":
        delta = out.Delta()
        if first:
            delta = out.Delta(role="assistant", content="")
        if text:
            delta = out.Delta(**({"role": "assistant"} if first else {}), content=text)  # type: ignore[arg-type]  # role only on the first
        if calls:
            delta = out.Delta(tool_calls=_tool_calls(calls, streamed=True))
        choice = out.ChatChunkChoice(index=index, delta=delta, logprobs=None, finish_reason=finish, **extras)
        return out.ChatCompletionChunk(id="chatcmpl-" + request.id, created=request.created, model=served.alias, choices=[choice])
    text_choice = out.TextChoice(index=index, text=text or "", logprobs=None, finish_reason=finish, **extras)
    return out.TextCompletion(id="cmpl-" + request.id, created=request.created, model=served.alias, choices=[text_choice])


def final_chunks(served: ServedEnsemble, request: Request, choices: Sequence[Choice]) -> list[dict]:
    """The closing events: each choice's finish reason (the last one with the statistics), then,
    if the client asked (stream_options.include_usage), a usage event without choices."""
    events = [chunk(served, request, c.index, None, _finish(c), extras=_extras(request, c), calls=c.calls) for c in choices]
    if events:
        events[-1].localcos = statistics(request, choices)
    if request.include_usage:
        tail = chunk(served, request, 0, None)
        tail.choices = []
        tail.usage = usage(request, choices)
        events.append(tail)
    return [e.body() for e in events]
