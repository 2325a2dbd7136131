"""Exceptions raised by localcos.

Every error a user can cause by bad input is a `LocalcosError`; its message is one line that says
what is wrong and what to do. The CLI prints that line and exits with status 2; the server answers
it in OpenAI's error shape, taking the field at fault from `param` and its kind from `code` (never
from the message's wording).
"""

from __future__ import annotations


class LocalcosError(Exception):
    """Base class of all errors caused by bad input or configuration.

    `param` names the setting or request field at fault when one is; `code` says what kind of
    fault it is (OpenAI's error codes: "invalid_value", "invalid_type", "unsupported_parameter",
    "context_length_exceeded", ...), so a front end routes on it, never on the message.
    """

    code: str | None = None

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code


class ModelFileError(LocalcosError):
    """A model file is missing, unreadable, not a GGUF file, or cannot be loaded by llama.cpp."""


class ModelHeaderError(ModelFileError):
    """A GGUF file's header is damaged: a length, count, type or offset that the file cannot
    hold. The message names the field and its byte offset."""


class IncompleteModelError(ModelFileError):
    """A GGUF file whose tensor data runs past its end (an interrupted download or copy)."""


class StorageError(LocalcosError):
    """localcos could not write a file: the disk is full, read-only, not writable, or a folder
    on the way is a file. Nothing half-written is left under the target's name."""


class TokenizerMismatchError(LocalcosError):
    """The models of an ensemble do not share one tokenizer."""


class ConfigError(LocalcosError):
    """Bad settings: weights, mu, sampling parameters, method options, models.toml; `param`
    always names the setting at fault."""

    code = "invalid_value"

    def __init__(self, message: str, param: str, code: str | None = None) -> None:
        super().__init__(message, param, code)


class PromptTooLongError(LocalcosError):
    """The prompt does not fit into the context window."""

    code = "context_length_exceeded"


class ModelNotAvailableError(LocalcosError):
    """A model named in models.toml or on the hub is not on disk and cannot be downloaded."""


class RpcUnavailableError(LocalcosError):
    """An RPC server is asked for, but the loaded llama.cpp was built without its RPC backend."""


class RemoteError(LocalcosError):
    """An RPC server could not be reached, or failed while a model on it was in use."""

    code = "rpc_server_lost"


class Cancelled(Exception):
    """Work was stopped on request between two llama.cpp calls (not an error of the user's)."""


def param_of(what: str) -> str:
    """The setting a message's `what` names, as `LocalcosError.param` carries it: "--max-tokens"
    and "max_tokens" are max_tokens, "response_format.json_schema.schema" is response_format,
    "models.toml: rpc of NAME" is rpc."""
    word = (what.split(": ", 1)[1] if what.startswith("models.toml: ") else what).split()[0]
    return word.lstrip("-").replace("-", "_").split(".")[0]


def check_range(number: float, what: str, *, minimum: float | None = None, maximum: float | None = None, above: float | None = None) -> float:
    """`number` unless it is not finite or out of range: the one wording of such errors
    (`ConfigError` naming `what`), whichever layer owns the range."""
    if number != number or number in (float("inf"), float("-inf")):
        raise ConfigError(f"{what} must be a finite number, got {number!r}", param=param_of(what))
    for bound, broken, relation in ((minimum, lambda b: number < b, ">="), (maximum, lambda b: number > b, "<="), (above, lambda b: number <= b, ">")):
        if bound is not None and broken(bound):
            raise ConfigError(f"{what} must be {relation} {bound:g}, got {number:g}", param=param_of(what))
    return number
