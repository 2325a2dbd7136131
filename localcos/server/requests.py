"""The request bodies the server takes, declared once as pydantic models (FastAPI validates them).

Every localcos option a request may set is validated by the settings layer's own parser for it
(`config.OPTIONS[name].check`), so a value means the same in a request as on the command line
and is checked once, here, where it enters. The other fields are OpenAI's; those localcos does
not implement are refused unless left at their neutral value, and an unknown field is refused:
nothing a client asks for is dropped silently. Over HTTP `combine` takes a built-in combiner
only (`config.parse.parse_served_combine`): nothing a request says is imported or executed.

A validation failure becomes a 400 in OpenAI's error shape naming the field (`app.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from collections.abc import Callable

from pydantic import BaseModel, BeforeValidator, ConfigDict, StrictBool, StrictStr, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from ..errors import ConfigError, check_range, param_of
from ..grammar import Constraint, gbnf, json_object, json_schema
from ..infill import Infill
from ..config import OPTIONS
from ..config.parse import Gamma, parse_int, parse_served_combine

MAX_CHOICES = 16
MAX_TOP_LOGPROBS = 20
# request fields that are options of the settings layer (localcos's extras included)
SETTINGS_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "seed", "stop", "method", "gamma", "byte_gamma", "combine", "weights", "mu",
    "plausibility", "expert", "gate", "lead", "proposer", "ignore_eos", "lookup", "lookup_ngram", "lookup_tokens", "negative_prompt",
    "cfg_scale", "phrasing", "lookahead", "lookahead_threshold", "infill_layout",
)  # fmt: skip


def _checked(parse: Callable[[Any, str], Any]) -> BeforeValidator:
    """A field validated by a settings-layer parser `parse(value, what)`; its one-line error
    becomes the field's error."""

    def validate(value: Any, info: ValidationInfo) -> Any:
        try:
            return parse(value, info.field_name or "")
        except ConfigError as e:
            raise PydanticCustomError("invalid_value", "{message}", {"message": str(e), "code": e.code}) from None

    return BeforeValidator(validate)


def _option(name: str) -> BeforeValidator:
    return _checked(lambda value, what: OPTIONS[name].check(value, json=True))


def _integer(minimum: int, maximum: int | None = None) -> BeforeValidator:
    def parse(value: Any, what: str) -> int:
        return int(check_range(parse_int(value, what, minimum=minimum), what, maximum=maximum))

    return _checked(parse)


def _neutral(*allowed: Any) -> BeforeValidator:
    """An OpenAI field localcos does not implement: accepted only at its neutral value."""

    def parse(value: Any, what: str) -> Any:
        if value not in allowed:
            raise ConfigError(f"{what} is not supported by localcos", code="unsupported_parameter", param=param_of(what))
        return value

    return _checked(parse)


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_prompt(value: Any, what: str) -> list[str | list[int]]:
    """OpenAI's prompt: a string, a list of strings, a list of token ids, or a list of lists of
    token ids; as a list of strings and token-id lists."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(_is_token_id(x) for x in value):
            return [list(value)]
        if all(isinstance(x, str) for x in value):
            return list(value)
        if all(isinstance(x, list) and x and all(_is_token_id(t) for t in x) for x in value):
            return [list(x) for x in value]
    raise ConfigError(f"{what} must be a string, a list of strings, a list of token ids (integers >= 0) or a list of such lists", param=param_of(what))


def parse_token_ids(value: Any, what: str) -> list[int]:
    """A list of token ids (integers >= 0; the vocabulary's size is checked with the models)."""
    if isinstance(value, list) and all(_is_token_id(x) for x in value):
        return list(value)
    raise ConfigError(f"{what} must be a list of token ids (integers >= 0)", param=param_of(what))


class _Body(BaseModel):
    """A request body: unknown fields are refused, and JSON null means "not given"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class SettingsFields(_Body):
    """The settings-layer options every generating route takes, OpenAI's or Ollama's (in its
    `options`): the sampling fields both APIs name alike, and localcos's own."""

    temperature: Annotated[float | None, _option("temperature")] = None
    top_p: Annotated[float | None, _option("top_p")] = None
    top_k: Annotated[int | None, _option("top_k")] = None
    min_p: Annotated[float | None, _option("min_p")] = None
    seed: Annotated[int | None, _option("seed")] = None  # -1: a fresh random seed
    stop: Annotated[tuple[str, ...] | None, _option("stop")] = None
    method: Annotated[str | None, _option("method")] = None
    gamma: Annotated[Gamma, _option("gamma")] = None
    combine: Annotated[str | None, _checked(parse_served_combine)] = None
    weights: Annotated[tuple[float, ...] | None, _option("weights")] = None
    mu: Annotated[float | None, _option("mu")] = None
    plausibility: Annotated[float | None, _option("plausibility")] = None
    expert: Annotated[int | None, _option("expert")] = None
    gate: Annotated[float | None, _option("gate")] = None
    lead: Annotated[int | None, _option("lead")] = None
    negative_prompt: Annotated[str | None, _option("negative_prompt")] = None  # the second prompt's member's (text completions)
    cfg_scale: Annotated[float | None, _option("cfg_scale")] = None
    proposer: Annotated[int | Literal["lookup"] | None, _option("proposer")] = None
    lookahead: Annotated[tuple[int, int] | None, _option("lookahead")] = None  # "off": a server's lookahead lifted
    lookahead_threshold: Annotated[float | None, _option("lookahead_threshold")] = None


class GenerationRequest(SettingsFields):
    """What both OpenAI generating routes take: OpenAI's sampling fields and localcos's extras."""

    model: StrictStr | None = None
    max_tokens: Annotated[int | None, _integer(0)] = None
    n: Annotated[int, _integer(1, MAX_CHOICES)] = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    # settings-layer options beside `SettingsFields`'
    ignore_eos: Annotated[bool | None, _option("ignore_eos")] = None
    byte_gamma: Annotated[int | Literal["auto"] | None, _option("byte_gamma")] = None
    lookup: Annotated[str | None, _option("lookup")] = None
    lookup_ngram: Annotated[tuple[int, int] | None, _option("lookup_ngram")] = None
    lookup_tokens: Annotated[int | None, _option("lookup_tokens")] = None
    # vLLM's extra: prompt_token_ids and token_ids on each choice
    return_token_ids: StrictBool = False
    # OpenAI fields without an effect on what is generated
    user: StrictStr | None = None
    # OpenAI fields localcos does not implement: refused unless neutral
    presence_penalty: Annotated[float | None, _neutral(0, 0.0)] = None
    frequency_penalty: Annotated[float | None, _neutral(0, 0.0)] = None
    logit_bias: Annotated[dict | None, _neutral({})] = None

    # structured output: OpenAI's response_format, and llama.cpp's grammar (GBNF text)
    response_format: Annotated[ResponseFormat | None, _checked(parse_response_format)] = None
    grammar: Annotated[Constraint | None, _checked(lambda v, what: gbnf(v, what) if isinstance(v, str) else _not_text(what))] = None

    def settings_values(self) -> dict[str, Any]:
        """The settings-layer options this request sets, parsed (for `Settings.with_values`)."""
        values = {name: getattr(self, name) for name in SETTINGS_FIELDS if name in self.model_fields_set}
        if self.response_format is not None:  # "text" lifts a constraint the server starts with
            constraint = self.response_format.constraint
            values.update(json_schema=None, json_object=False, grammar=None)
            if constraint is not None and constraint.kind == "json_object":
                values["json_object"] = True
            elif constraint is not None:
                values["json_schema"] = constraint
        if self.grammar is not None:
            values["grammar"] = self.grammar
        return values

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


@dataclass(frozen=True)
class ResponseFormat:
    """OpenAI's response_format, checked: its type and the constraint it makes (None: text)."""

    type: str
    constraint: Constraint | None


def parse_response_format(value: Any, what: str) -> ResponseFormat:
    """{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema":
    {"name": ..., "schema": {...}, "strict": ...}}; the schema compiled and checked now, before
    any model call. Nothing here reads a file: a request gives the schema itself."""
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ConfigError(f'{what} must be an object with a type: "text", "json_object" or "json_schema"', param=param_of(what))
    kind = value["type"]
    extra = set(value) - {"type", "json_schema"}
    if extra:
        raise ConfigError(f"{what} has fields localcos does not know: {', '.join(sorted(extra))}", param=param_of(what))
    if kind == "text":
        return ResponseFormat(kind, None)
    if kind == "json_object":
        return ResponseFormat(kind, json_object())
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ConfigError(f'{what}.json_schema must be an object with a schema: {{"name": ..., "schema": {{...}}}}', param=param_of(what))
        return ResponseFormat(kind, json_schema(spec["schema"], f"{what}.json_schema.schema"))
    raise ConfigError(f'{what}.type must be "text", "json_object" or "json_schema", got {kind!r}', param=param_of(what))


def _not_text(what: str) -> Any:
    raise ConfigError(f"{what} must be a GBNF grammar's text", param=param_of(what))


class StreamOptions(_Body):
    include_usage: StrictBool = False
    continuous_usage_stats: Annotated[bool | None, _neutral(False)] = None


class CompletionRequest(GenerationRequest):
    """POST /v1/completions."""

    prompt: Annotated[list[str | list[int]], _checked(parse_prompt)]
    echo: StrictBool = False
    logprobs: Annotated[int | None, _integer(0, MAX_TOP_LOGPROBS)] = None
    best_of: Annotated[int | None, _neutral(1)] = None
    suffix: StrictStr | None = None  # fill-in-the-middle: the text after the one to write (the prompt's is before it)
    phrasing: Annotated[str | None, _option("phrasing")] = None  # how a text prompt is read (a chat's prompt is its own)
    infill_layout: Annotated[str | None, _option("infill_layout")] = None  # with suffix: how the FIM prompt is laid out

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        if self.stream and (self.logprobs is not None or self.echo):
            raise _field_error("stream", "logprobs and echo are not supported with stream")
        if self.max_tokens == 0 and not self.echo:
            raise _field_error("max_tokens", "max_tokens must be >= 1 (0 only with echo)")
        if self.suffix and self.echo:
            raise _field_error("suffix", "suffix fills in the middle between the prompt and it: echo returns a prompt as sent, give one of them")
        if self.suffix and any(not isinstance(p, str) for p in self.prompt):
            raise _field_error("suffix", "suffix needs a text prompt (the text before the middle), not token ids")
        return self


    def prompts(self) -> list[str | list[int] | Infill]:
        """The prompts as read: each text with the suffix after it is what to fill in between them."""
        if not self.suffix:
            return list(self.prompt)
        return [Infill(p, self.suffix) for p in self.prompt if isinstance(p, str)]


class TextPart(_Body):
    type: Literal["text"]
    text: StrictStr


class FunctionCall(_Body):
    name: StrictStr
    arguments: StrictStr  # JSON text, as OpenAI sends it


class ToolCall(_Body):
    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: StrictStr
    content: StrictStr | list[TextPart] = ""
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls, sent back with their results
    tool_call_id: StrictStr | None = None  # a tool message: the call it answers

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def calls(self) -> tuple[dict[str, Any], ...]:
        """The tool calls as chat templates read them: arguments as an object where they parse."""
        out = []
        for call in self.tool_calls or ():
            try:
                arguments: Any = json.loads(call.function.arguments)
            except json.JSONDecodeError:
                arguments = call.function.arguments
            out.append({"name": call.function.name, "arguments": arguments})
        return tuple(out)


class FunctionDefinition(_Body):
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict | None = None  # a JSON schema (checked when the tools' grammar is compiled)
    strict: StrictBool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: dict

    @property
    def name(self) -> str:
        name = self.function.get("name")
        if not isinstance(name, str):
            raise PydanticCustomError("invalid_value", "tool_choice.function.name must be a string")
        return name


class ChatCompletionRequest(GenerationRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_completion_tokens: Annotated[int | None, _integer(1)] = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[int | None, _integer(0, MAX_TOP_LOGPROBS)] = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    functions: Annotated[list | None, _neutral([])] = None
    parallel_tool_calls: StrictBool = True
    modalities: Annotated[list | None, _neutral(["text"])] = None

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if not self.messages:
            raise _field_error("messages", "messages must be a non-empty list of {role, content}")
        if self.stream and self.logprobs:
            raise _field_error("stream", "logprobs are not supported with stream")
        if self.max_tokens == 0:
            raise _field_error("max_tokens", "max_tokens must be >= 1")
        if self.tool_choice is not None and not self.tools and self.tool_choice != "none":
            raise _field_error("tool_choice", "tool_choice needs tools")
        if self.tools and (self.response_format is not None and self.response_format.constraint is not None or self.grammar is not None):
            raise _field_error("tools", "tools and a response_format or grammar together: give one constraint")
        return self

    @property
    def choice(self) -> str:
        """tool_choice as a name: none, auto (the default with tools), required, or a tool's name."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.name
        return self.tool_choice or "auto"

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(_Body):
    """POST /tokenize (vLLM's): a text, or chat messages rendered with the chat template."""

    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool = True

    @model_validator(mode="after")
    def _check(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise _field_error("prompt", "give prompt (a string) or messages, one of them")
        if self.messages is not None and not self.messages:
            raise _field_error("messages", "messages must be a non-empty list of {role, content}")
        return self


class DetokenizeRequest(_Body):
    """POST /detokenize (vLLM's)."""

    model: StrictStr | None = None
    tokens: Annotated[list[int], _checked(parse_token_ids)]


def _field_error(param: str, message: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_value", "{message}", {"message": message, "param": param})


GenerationRequest.model_rebuild()
CompletionRequest.model_rebuild()
ChatCompletionRequest.model_rebuild()
