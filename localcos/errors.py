"""Exceptions raised by localcos.

Every error a user can cause by bad input is a `LocalcosError`; its message is one line that says
what is wrong and what to do. The CLI prints that line and exits with status 2.
"""

from __future__ import annotations


class LocalcosError(Exception):
    """Base class of all errors caused by bad input or configuration."""


class ModelFileError(LocalcosError):
    """A model file is missing, unreadable, not a GGUF file, or cannot be loaded by llama.cpp."""


class TokenizerMismatchError(LocalcosError):
    """The models of an ensemble do not share one tokenizer."""


class ConfigError(LocalcosError):
    """Bad settings: weights, mu, sampling parameters, method options, models.toml.

    `param` names the setting at fault when one is (the server reports it as OpenAI's `param`).
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class PromptTooLongError(LocalcosError):
    """The prompt does not fit into the context window."""


class ModelNotAvailableError(LocalcosError):
    """A model named in models.toml or on the hub is not on disk and cannot be downloaded."""


class RpcUnavailableError(LocalcosError):
    """An RPC server is asked for, but the loaded llama.cpp was built without its RPC backend."""


class RemoteError(LocalcosError):
    """An RPC server could not be reached, or failed while a model on it was in use."""


class Cancelled(Exception):
    """Work was stopped on request between two llama.cpp calls (not an error of the user's)."""
