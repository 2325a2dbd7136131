"""The level the settings decided (`config.specs.decide_level`), held against what else they ask
(`decoding_level`): the options only one level reads, refused at the other; a model's bytes."""

from __future__ import annotations

from typing import TYPE_CHECKING
from collections.abc import Iterable, Sequence

from ...backend import Model
from ...core.bytelevel import ByteVocab
from ...core.level import Level
from ...config.specs import check_level
from ...errors import ConfigError

if TYPE_CHECKING:
    from ...config.specs import Settings


def byte_vocab(model: Model) -> ByteVocab:
    """The model's vocabulary as byte strings (built once per model)."""
    vocab = getattr(model, "_byte_vocab", None)
    if vocab is None:
        pieces = model.pieces()
        ends = [t for t in range(model.n_vocab) if model.is_eog(t)]
        vocab = ByteVocab(pieces, ends, model.name)
        model._byte_vocab = vocab  # type: ignore[attr-defined]
    return vocab


BYTE_OPTIONS = ("byte_paths", "byte_prune", "byte_gamma")  # read by the byte level only


def decoding_level(settings: Settings, also_given: Sequence[str] = (), *, scoring: bool = False, parallel_flag: str = "--parallel") -> Level:
    """The level the models of `settings` decode at (`settings.load.level`), the one place a front end
    asks. An option given (in `settings`, or `also_given`: options a front end took itself) that
    the level chosen would not read is refused in one line: the byte level's own for models that
    decode at the token level; at the byte and mixed levels what they do not decode
    (`config.specs.check_level`: a gamma in tokens, a proposer, lookup, another method,
    lookahead...), --chat-template-model (each model reads a conversation in its own template
    there) and --parallel above 1 (a byte-level generation takes every model's sequences: one at
    a time). With `scoring` (`localcos score`, which reads the probabilities of a given text), the
    mixed level (a way of decoding) and a second prompt's member at the byte level are refused
    too. So these are refused before any model loads. `parallel_flag`: what the front end calls
    the sequences decoded at once (the bench's --sequences)."""
    level = settings.load.level
    if scoring and level is Level.MIXED:
        raise ConfigError("--level mixed is a way of decoding (whole tokens where the lead is sure); score reads the byte level's "
                          "probabilities of a given text: --level byte", param="level")  # fmt: skip
    if scoring and level.in_bytes and settings.load.second_prompt:
        raise ConfigError("--negative-prompt: score reads a second prompt's member at the token level (models of one tokenizer, "
                          "--level token); at the byte level it reads one text", param="negative_prompt")  # fmt: skip
    if level.in_bytes:
        # the gate belongs to a combination, checked where one is resolved (eval's variants each bring their own)
        check_level(level, settings.generation, gated=True)
        if (settings.load.parallel or 1) > 1:
            raise ConfigError(f"{parallel_flag}: the byte level decodes one generation at a time (models with different tokenizers)",
                              param=parallel_flag.removeprefix("--"))  # fmt: skip
        if "chat_template_model" in settings.given:
            raise ConfigError("--chat-template-model: at the byte level each model reads the conversation in its own chat template",
                              param="chat_template_model")  # fmt: skip
        return level
    refuse_byte_options([*settings.given, *also_given])
    return level


def refuse_byte_options(given: Iterable[str], *, json: bool = False, remedy: str = "add --level byte") -> None:
    """The one rule for models that decode at the token level: an option only the byte level
    reads (`BYTE_OPTIONS`), among the options `given`, is a `ConfigError` (named as a flag, or
    with `json` as a request's field or a keyword), saying how to decode at the byte level
    (`remedy`)."""
    from ...config.options import OPTIONS

    unread = [name for name in BYTE_OPTIONS if name in given]
    if unread:
        raise ConfigError(f"{OPTIONS[unread[0]].what(json)}: these models share a tokenizer and decode at the token level, where "
                          f"it does nothing; {remedy} to decode them at the byte level", param=unread[0])  # fmt: skip
