"""The response bodies the server sends, declared once as pydantic models beside the requests
(`requests.py`), in the shapes OpenAI's clients read (and vLLM's extras: `stop_reason`,
`prompt_token_ids`, `token_ids`, the tokenizer routes).

A body is sent as `body()`: an optional field left unset is left out (a streamed delta carries
only what changed), one set to None is sent as null (OpenAI's `logprobs: null`,
`finish_reason: null`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class Body(BaseModel):
    """A response body: a field whose default is not None is always sent; one whose default is
    None only when it was set."""

    model_config = ConfigDict(extra="forbid")

    def model_post_init(self, context: Any) -> None:
        for name, info in type(self).model_fields.items():
            if not info.is_required() and info.default is not None:
                self.model_fields_set.add(name)

    def body(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class ErrorDetail(Body):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(Body):
    error: ErrorDetail


class Usage(Body):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class FunctionCall(Body):
    name: str
    arguments: str  # JSON text


class ToolCall(Body):
    index: int | None = None  # in a streamed delta only
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Body):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class Delta(Body):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChoiceExtras(Body):
    """vLLM's per-choice extras."""

    stop_reason: int | None = None  # the end-of-generation token id that ended the text
    prompt_token_ids: list[int] | None = None  # with return_token_ids
    token_ids: list[int] | None = None


class ChatChoice(ChoiceExtras):
    index: int
    message: Message
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class ChatChunkChoice(ChoiceExtras):
    index: int
    delta: Delta
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class TextChoice(ChoiceExtras):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class ChatCompletion(Body):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    localcos: dict[str, Any] | None  # the generation's statistics (`GenerationStats.to_dict`)


class ChatCompletionChunk(Body):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    localcos: dict[str, Any] | None = None


class TextCompletion(Body):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage | None = None
    localcos: dict[str, Any] | None = None


class ModelCard(Body):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "localcos"
    localcos: dict[str, Any]


class ModelList(Body):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class QueueHealth(Body):
    running: bool
    waiting: int
    served: int
    sequences: int
    parallel: int


class ModelHealth(Body):
    name: str
    cached_tokens: int  # every sequence's
    kv_positions: int
    sequences: list[int]
    calls: int  # llama_decode calls so far, and the tokens they evaluated
    evaluated_tokens: int
    rpc: str | None = None  # a model on RPC servers: where, and whether it is connected
    connected: bool | None = None


class Health(Body):
    status: Literal["ok"] = "ok"
    model: str
    queue: QueueHealth
    models: list[ModelHealth]


class TokenizerInfo(Body):
    tokenizer_class: str = "llama.cpp"
    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    add_bos_token: bool
    chat_template: str | None
    model_max_length: int
    vocab_size: int


class Tokenized(Body):
    count: int
    max_model_len: int
    tokens: list[int]


class Detokenized(Body):
    prompt: str
