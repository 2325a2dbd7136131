"""Chat prompts: messages formatted with the chat template stored in a model's GGUF metadata.

Templates are Jinja2, rendered by llama-cpp-python's own formatter (`Jinja2ChatFormatter`, which
follows Hugging Face's: a sandboxed environment, `messages`, `add_generation_prompt`, `bos_token`,
`eos_token`, `raise_exception`, `tojson`, loop controls), so a prompt is exactly what
llama-cpp-python makes of the same metadata.
Models of one ensemble may carry different templates; one designated model's template is used
(default: the first) and the rendered prompt must tokenise identically for every model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol
from collections.abc import Sequence

from .backend import tokenize_alike
from .errors import ConfigError, PromptTooLongError


@dataclass(frozen=True)
class Message:
    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    # an assistant's tool calls ({"name", "arguments"} each), a tool result's call id
    tool_calls: tuple[dict[str, Any], ...] = field(default=())
    tool_call_id: str | None = None

    def as_template_input(self) -> dict[str, Any]:
        """The message as chat templates read it (Hugging Face's convention)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [{"type": "function", "function": call} for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


def render(
    template: str,
    messages: Sequence[Message],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
    tools: Sequence[dict[str, Any]] | None = None,
    owner: str | None = None,
) -> str:
    """Render a chat template (Jinja2) for `messages` (and the `tools` it may describe, OpenAI's
    function definitions), as llama-cpp-python does; errors name the template's `owner` (a
    model), when given."""
    import jinja2
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    whose = f"{owner}'s chat template" if owner else "the chat template"
    try:
        formatter = Jinja2ChatFormatter(template, eos_token=eos_token, bos_token=bos_token, add_generation_prompt=add_generation_prompt)
        # llama-cpp-python's formatter types its messages as OpenAI's TypedDicts; these are their dicts
        return formatter(messages=[m.as_template_input() for m in messages], tools=list(tools) if tools else None).prompt  # type: ignore[misc, arg-type]
    except jinja2.TemplateError as e:
        raise ConfigError(f"cannot render {whose}: {e}", param="messages") from None
    except ValueError as e:  # the template's raise_exception(...)
        raise ConfigError(f"{whose} refused the conversation: {e}", param="messages") from None


def special_text(model, token: int) -> str:
    """A special token's text as a template writes it (`bos_token`, `eos_token`); "" for none."""
    return model.token_text(token).decode("utf-8", errors="replace") if token >= 0 else ""


def add_bos_after(text: str, bos: str) -> bool | None:
    """How a rendered prompt is tokenized: BOS as the model's metadata says (None), unless the
    template already wrote it (False)."""
    return False if bos and text.startswith(bos) else None


def own_prompt(model, messages: Sequence[Message]) -> list[int]:
    """The conversation in `model`'s own chat template and special tokens (which it carries:
    `OwnTemplates` checks)."""
    bos = special_text(model, model.bos)
    text = render(model.chat_template, messages, bos_token=bos, eos_token=special_text(model, model.eos), owner=model.name)
    return model.tokenize(text, add_bos=add_bos_after(text, bos), special=True)


class ChatFormatter:
    """Turns a conversation into prompt tokens for an ensemble.

    Args:
        ensemble: the `Ensemble` (its models' GGUF chat templates and tokenizers are used).
        template_model: index of the model whose template formats messages (default 0).
    """

    def __init__(self, ensemble, template_model: int = 0) -> None:
        models = ensemble.models
        if not 0 <= template_model < len(models):
            raise ConfigError(f"chat template model must be an index from 0 to {len(models) - 1}", param="chat_template_model")
        self.ensemble = ensemble
        self.model = models[template_model]
        template = self.model.chat_template
        if not template:
            raise ConfigError(
                f"{self.model.path} has no chat template in its GGUF metadata; choose another model's "
                "template (--chat-template-model) or generate without --chat",
                param="chat_template_model",
            )
        self.template = template
        others = [m.name for m in models if m.chat_template and m.chat_template != template]
        missing = [m.name for m in models if not m.chat_template]
        self.note: str | None = None
        if others or missing:
            self.note = f"the models carry different chat templates; formatting with the one of {self.model.name}"
        self.bos = special_text(self.model, self.model.bos)
        self.eos = special_text(self.model, self.model.eos)

    def text(self, messages: Sequence[Message], add_generation_prompt: bool = True, tools: Sequence[dict[str, Any]] | None = None) -> str:
        return render(self.template, messages, bos_token=self.bos, eos_token=self.eos, add_generation_prompt=add_generation_prompt, tools=tools)

    @staticmethod
    def size(prompt: Sequence[int]) -> int:
        """A prompt's length in tokens."""
        return len(prompt)

    def tokens(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """Prompt tokens for the conversation; identical for every model or an error.

        Special tokens in the rendered text (<|im_start|> ...) are parsed as special tokens; BOS
        is added as each model's metadata says unless the template already wrote it.
        """
        text = self.text(messages, tools=tools)
        return tokenize_alike(self.ensemble.models, text, what="the chat prompt", add_bos=add_bos_after(text, self.bos), special=True)

    def second_tokens(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """The conversation as a member reading a second prompt reads it: through the same template."""
        return self.tokens(messages, tools)


class OwnTemplates:
    """Turns a conversation into each model's own prompt tokens, through its own chat template
    (the byte level: models of different tokenizers); `ChatFormatter`'s face for `Conversation`.

    Args:
        models: the loaded models (`runtime.bytelevel.ByteModels`); every one needs a template.
    """

    note: str | None = None
    template: str | None = None  # no one template: each model reads its own

    def __init__(self, models) -> None:
        self.models = list(models.loaded)  # each model once: a member reading a second prompt reads `second_tokens`
        self.byte_models = models
        for m in self.models:
            if not m.chat_template:
                raise ConfigError(f"{m.path} has no chat template in its GGUF metadata; at the byte level every model formats "
                                  "the conversation itself: generate without --chat", param="chat_template_model")  # fmt: skip

    def tokens(self, messages: Sequence[Message]) -> list[list[int]]:
        """Each model's prompt tokens for the conversation (no tools: their calls would be each
        model's own special tokens; the server refuses them at the byte level)."""
        return [own_prompt(m, messages) for m in self.models]

    def second_tokens(self, messages: Sequence[Message]) -> list[int]:
        """The conversation as the member reading a second prompt reads it: in its model's (the
        lead's) own template; last among the prompts a byte-level plan reads."""
        return own_prompt(self.byte_models.second_model(), messages)

    @staticmethod
    def size(prompts: Sequence[Sequence[int]]) -> int:
        """The longest model's prompt, in its tokens (what must fit each context)."""
        return max(len(p) for p in prompts)


def chat_templates(models, template_model: int = 0) -> ChatFormatter | OwnTemplates:
    """What renders a conversation for `models` (loaded at their level, `models.level`): one
    template for every model at the token level (`template_model`'s), each model's own at the
    byte and mixed levels (their tokens differ). A `ConfigError` where a template is missing."""
    # the chat's business: models of different tokenizers render the conversation in as many templates
    return OwnTemplates(models) if models.level.in_bytes else ChatFormatter(models, template_model)


def second_conversation(messages: Sequence[Message], negative: str | None, guide_system: bool) -> list[Message] | None:
    """The conversation a member reading a second prompt reads: without its system message
    (`guide_system`: guidance toward what the system message asks), or with its last user
    message replaced by `negative`; None where neither is asked for."""
    if guide_system:
        return [m for m in messages if m.role != "system"]
    if negative is None:
        return None
    last = max(i for i, m in enumerate(messages) if m.role == "user")
    return [*messages[:last], Message("user", negative), *messages[last + 1 :]]


class Templates(Protocol):
    """What renders a conversation: one chat template for all models (`ChatFormatter`, token
    ids), or each model its own (`OwnTemplates`, one list of ids per model)."""

    note: str | None  # what the user should know of the templates chosen, if anything

    def tokens(self, messages: Sequence[Message]) -> Any: ...
    def second_tokens(self, messages: Sequence[Message]) -> list[int]: ...
    def size(self, prompt: Any) -> int: ...

    @property
    def template(self) -> str | None:
        """The one template every model reads, where there is one (what a client is shown)."""
        ...


class Conversation:
    """A multi-turn conversation that always fits the context.

    `prompt(user_text)` adds the user's message and returns the prompt tokens for the reply,
    dropping the oldest turns (never the system message) when prompt plus reply would not fit.
    """

    def __init__(self, formatter: Templates, n_ctx: int, system: str | None = None) -> None:
        self.formatter = formatter
        self.n_ctx = n_ctx
        self.system = system
        self.messages: list[Message] = []

    def _all(self) -> list[Message]:
        return ([Message("system", self.system)] if self.system else []) + self.messages

    def prompt(self, user_text: str, reply_tokens: int) -> tuple[Any, int]:
        """Add the user's message; return (prompt tokens, number of messages dropped to fit).

        Raises `PromptTooLongError` if even the newest message alone does not fit.
        """
        self.messages.append(Message("user", user_text))
        try:
            return self.fit(reply_tokens)
        except PromptTooLongError:
            self.messages.pop()
            raise

    def fit(self, reply_tokens: int) -> tuple[Any, int]:
        """The prompt for a reply to the messages as they are (the last one the user's), the
        oldest turns dropped until it fits: (prompt tokens, messages dropped)."""
        dropped = 0
        while True:
            tokens = self.formatter.tokens(self._all())
            if self.formatter.size(tokens) + min(reply_tokens, max(1, self.n_ctx // 4)) <= self.n_ctx:
                return tokens, dropped
            if len(self.messages) <= 1:
                raise PromptTooLongError(
                    f"the message has {self.formatter.size(tokens)} tokens with the chat template; the context holds {self.n_ctx}"
                )
            # drop the oldest turn: a user message and the reply that follows it
            drop = 2 if len(self.messages) > 2 and self.messages[1].role == "assistant" else 1
            del self.messages[:drop]
            dropped += drop

    def second_prompt(self, negative: str | None, guide_system: bool) -> list[int] | None:
        """The second prompt's tokens for the reply `prompt` prepared (`second_conversation`)."""
        second = second_conversation(self._all(), negative, guide_system)
        return None if second is None else self.formatter.second_tokens(second)

    def reply(self, text: str) -> None:
        """Record the assistant's reply (also a partial one)."""
        self.messages.append(Message("assistant", text))

    def clear(self) -> None:
        self.messages.clear()
