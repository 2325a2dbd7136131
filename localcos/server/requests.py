"""The request bodies the server takes, declared once as pydantic models (FastAPI validates them).

Every localcos option a request may set is validated by the settings layer's own parser for it
(`settings.OPTIONS[name].check`), so a value means the same in a request as on the command line
and is checked once, here, where it enters. The other fields are OpenAI's; those localcos does
not implement are refused unless left at their neutral value, and an unknown field is refused:
nothing a client asks for is dropped silently. Over HTTP `combine` takes a built-in combiner
only (`settings.parse_served_combine`): nothing a request says is imported or executed.

A validation failure becomes a 400 in OpenAI's error shape naming the field (`app.py`).
"""

from __future__ import annotations

from typing import Annotated, Any, Callable, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, StrictBool, StrictStr, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from ..errors import ConfigError
from ..ensemble import Gamma
from ..settings import OPTIONS, parse_int, parse_served_combine

MAX_CHOICES = 16
MAX_TOP_LOGPROBS = 20
# request fields that are options of the settings layer (localcos's extras included)
SETTINGS_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "seed", "stop", "method", "gamma", "combine", "weights", "mu",
    "plausibility", "expert", "proposer", "ignore_eos",
)  # fmt: skip


def _checked(parse: Callable[[Any, str], Any]) -> BeforeValidator:
    """A field validated by a settings-layer parser `parse(value, what)`; its one-line error
    becomes the field's error."""

    def validate(value: Any, info: ValidationInfo) -> Any:
        try:
            return parse(value, info.field_name or "")
        except ConfigError as e:
            raise PydanticCustomError("invalid_value", "{message}", {"message": str(e)}) from None

    return BeforeValidator(validate)


def _option(name: str) -> BeforeValidator:
    return _checked(lambda value, what: OPTIONS[name].check(value, json=True))


def _integer(minimum: int, maximum: int | None = None) -> BeforeValidator:
    def parse(value: Any, what: str) -> int:
        number = parse_int(value, what, minimum=minimum)
        if maximum is not None and number > maximum:
            raise ConfigError(f"{what} must be <= {maximum}, got {number}")
        return number

    return _checked(parse)


def _neutral(*allowed: Any) -> BeforeValidator:
    """An OpenAI field localcos does not implement: accepted only at its neutral value."""

    def parse(value: Any, what: str) -> Any:
        if value not in allowed:
            raise ConfigError(f"{what} is not supported by localcos")
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
    raise ConfigError(f"{what} must be a string, a list of strings, a list of token ids (integers >= 0) or a list of such lists")


def parse_token_ids(value: Any, what: str) -> list[int]:
    """A list of token ids (integers >= 0; the vocabulary's size is checked with the models)."""
    if isinstance(value, list) and all(_is_token_id(x) for x in value):
        return list(value)
    raise ConfigError(f"{what} must be a list of token ids (integers >= 0)")


class _Body(BaseModel):
    """A request body: unknown fields are refused, and JSON null means "not given"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


class GenerationRequest(_Body):
    """What both generating routes take: OpenAI's sampling fields and localcos's extras."""

    model: StrictStr | None = None
    max_tokens: Annotated[int | None, _integer(0)] = None
    n: Annotated[int, _integer(1, MAX_CHOICES)] = 1
    stream: StrictBool = False
    stream_options: "StreamOptions | None" = None
    # settings-layer options
    temperature: Annotated[float | None, _option("temperature")] = None
    top_p: Annotated[float | None, _option("top_p")] = None
    top_k: Annotated[int | None, _option("top_k")] = None
    min_p: Annotated[float | None, _option("min_p")] = None
    seed: Annotated[int | None, _option("seed")] = None  # -1: a fresh random seed
    stop: Annotated[tuple[str, ...] | None, _option("stop")] = None
    ignore_eos: Annotated[bool | None, _option("ignore_eos")] = None
    method: Annotated[str | None, _option("method")] = None
    gamma: Annotated[Gamma, _option("gamma")] = None
    combine: Annotated[str | None, _checked(parse_served_combine)] = None
    weights: Annotated[tuple[float, ...] | None, _option("weights")] = None
    mu: Annotated[float | None, _option("mu")] = None
    plausibility: Annotated[float | None, _option("plausibility")] = None
    expert: Annotated[int | None, _option("expert")] = None
    proposer: Annotated[int | None, _option("proposer")] = None
    # vLLM's extra: prompt_token_ids and token_ids on each choice
    return_token_ids: StrictBool = False
    # OpenAI fields without an effect on what is generated
    user: StrictStr | None = None
    # OpenAI fields localcos does not implement: refused unless neutral
    presence_penalty: Annotated[float | None, _neutral(0, 0.0)] = None
    frequency_penalty: Annotated[float | None, _neutral(0, 0.0)] = None
    logit_bias: Annotated[dict | None, _neutral({})] = None

    def settings_values(self) -> dict[str, Any]:
        """The settings-layer options this request sets, parsed (for `Settings.with_values`)."""
        return {name: getattr(self, name) for name in SETTINGS_FIELDS if name in self.model_fields_set}

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class StreamOptions(_Body):
    include_usage: StrictBool = False
    continuous_usage_stats: Annotated[bool | None, _neutral(False)] = None


class CompletionRequest(GenerationRequest):
    """POST /v1/completions."""

    prompt: Annotated[list[str | list[int]], _checked(parse_prompt)]
    echo: StrictBool = False
    logprobs: Annotated[int | None, _integer(0, MAX_TOP_LOGPROBS)] = None
    best_of: Annotated[int | None, _neutral(1)] = None
    suffix: Annotated[str | None, _neutral("")] = None

    @model_validator(mode="after")
    def _check(self) -> "CompletionRequest":
        if self.stream and (self.logprobs is not None or self.echo):
            raise _field_error("stream", "logprobs and echo are not supported with stream")
        if self.max_tokens == 0 and not self.echo:
            raise _field_error("max_tokens", "max_tokens must be >= 1 (0 only with echo)")
        return self


class TextPart(_Body):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(_Body):
    role: StrictStr
    content: StrictStr | list[TextPart] = ""
    name: StrictStr | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(GenerationRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_completion_tokens: Annotated[int | None, _integer(1)] = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[int | None, _integer(0, MAX_TOP_LOGPROBS)] = None
    tools: Annotated[list | None, _neutral([])] = None
    tool_choice: Annotated[str | None, _neutral("none")] = None
    functions: Annotated[list | None, _neutral([])] = None
    parallel_tool_calls: StrictBool | None = None
    response_format: Annotated[dict | None, _neutral({"type": "text"})] = None
    modalities: Annotated[list | None, _neutral(["text"])] = None

    @model_validator(mode="after")
    def _check(self) -> "ChatCompletionRequest":
        if not self.messages:
            raise _field_error("messages", "messages must be a non-empty list of {role, content}")
        if self.stream and self.logprobs:
            raise _field_error("stream", "logprobs are not supported with stream")
        if self.max_tokens == 0:
            raise _field_error("max_tokens", "max_tokens must be >= 1")
        return self

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
    def _check(self) -> "TokenizeRequest":
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
