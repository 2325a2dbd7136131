"""Planning a request: the one place where settings meet the loaded models.

`plan` turns a prompt, a `GenerationConfig` and a combiner into a `Plan`: the prompt's tokens,
checked against the vocabulary and the context; the settings checked against the number of
models; the combiner bound to the models, once; the sampler, the strategy and its proposal
lengths, the lookup settings and the constraint, each made once. Every completion of the request
runs from the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol
from collections.abc import Sequence

from ..config.specs import GenerationConfig, check_for_models, check_second_prompt, required_second_prompt
from ..core.combiners import BoundCombiner, Combiner
from ..core.strategies import StrategyChoice, choose_strategy
from ..core.lookup import LookupSettings
from ..core.sampling import Sampler
from ..errors import ConfigError, PromptTooLongError
from ..grammar import Constraint
from ..core.text import Cursor
from ..infill import Infill, infill_prompt
from ..core.sizes import largest

if TYPE_CHECKING:
    from ..backend import Model
    from ..core.sampling import InfillSampler


class PlannedModels(Protocol):
    """What planning reads of the loaded models (`runtime.loaded.LoadedModels`, which plans
    through this module): their vocabulary, context, members and default combination."""

    @property
    def n_vocab(self) -> int: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def loaded(self) -> list[Model]: ...  # each model once
    @property
    def models(self) -> list[Model]: ...  # each member's model (a second prompt's member: its model again)
    @property
    def n_params(self) -> list[int]: ...
    @property
    def second_member(self) -> int | None: ...
    @property
    def branches(self) -> int: ...
    @property
    def end_tokens(self) -> frozenset[int]: ...
    @property
    def combiner(self) -> BoundCombiner: ...
    def bind(self, combiner: Combiner | BoundCombiner) -> BoundCombiner: ...
    def infill_sampler(self) -> InfillSampler: ...


Prompt = str | Sequence[int] | Infill  # text, token ids, or what to fill in at a cursor


@dataclass(frozen=True)
class Plan:
    """A checked request: what every completion of it generates from, and how."""

    prompt: tuple[int, ...]
    config: GenerationConfig
    combiner: BoundCombiner
    sampler: Sampler
    strategy: StrategyChoice
    max_length: int  # prompt + completion, at most
    end_tokens: frozenset[int]  # the tokens that end a completion (none with ignore_eos)
    banned: tuple[int, ...]  # tokens no model may propose nor r sample (ignore_eos)
    lookup: LookupSettings | None  # drafts looked up in the context, when they may ride along
    constraint: Constraint | None
    second_prompt: tuple[int, ...] | None = None  # what the member reading a second prompt reads
    cursor: Cursor | None = None  # a middle's cursor where its layout heals a token or cuts at the suffix (`infill.FimPrompt`)

    @property
    def prompt_length(self) -> int:
        """The prompt's length as usage counts it: the request's prompt tokens."""
        return len(self.prompt)

    @property
    def prompts(self) -> list[tuple[int, ...]]:
        """Each member's prompt: the request's, and the second prompt for its member (last)."""
        return [self.prompt] * (self.members - (self.second_prompt is not None)) + ([self.second_prompt] if self.second_prompt is not None else [])

    @property
    def members(self) -> int:
        return self.combiner.n_models

    @property
    def evaluated(self) -> tuple[bool, ...]:
        """The members whose prompt this request evaluates before it decodes: those r uses and,
        where models draft at a fixed gamma, every member (any may propose). Under --gamma auto a
        member r does not use (a drafter of weight 0) reads its prompt only when the plan first
        has it draft, the prompt then priced as part of that choice (`AutoGamma.choose`): where
        drafts would not repay it, it reads nothing. A member that reads nothing (guidance's
        negative at scale 1, a model of weight 0 under the ensemble's step) asks for no row:
        the calls of the members that share its model are then exactly what they are without
        it, so the text is theirs alone, not theirs up to llama.cpp's batch noise."""
        drafts = self.strategy.models_draft and not self.strategy.auto
        return tuple(used or drafts for used in self.combiner.used)


def check_token_ids(loaded: PlannedModels, tokens: Sequence[int], param: str = "prompt") -> None:
    """Token ids a caller sent are ids of the shared vocabulary."""
    bad = next((t for t in tokens if not 0 <= t < loaded.n_vocab), None)
    if bad is not None:
        raise ConfigError(f"token id {bad} is outside the shared vocabulary of {loaded.n_vocab}", param=param)


def prompt_tokens(loaded: PlannedModels, prompt: str | Sequence[int], param: str = "prompt", phrasing: str = "raw",
                  lead: int | None = None) -> list[int]:  # fmt: skip
    """The tokens of a prompt (text, read as `phrasing` says through the chat template of member
    `lead`, default the largest model; or token ids, read as they are), checked: not empty, ids
    of the vocabulary, and shorter than the context (so at least one token can follow)."""
    if isinstance(prompt, str):
        from ..phrasing import phrased_tokens

        model = largest([m.n_params for m in loaded.loaded]) if lead is None else next(j for j, m in enumerate(loaded.loaded) if m is loaded.models[lead])
        tokens = phrased_tokens(loaded.loaded, prompt, phrasing, lead=model) if prompt else []
    else:
        tokens = [int(t) for t in prompt]
    if not tokens:
        raise ConfigError("the prompt is empty", param=param)
    check_token_ids(loaded, tokens, param)
    check_fits(len(tokens), loaded.n_ctx, param)
    return tokens


def check_fits(n_tokens: int, n_ctx: int, param: str = "prompt", reader: str = "") -> None:
    """A prompt of `n_tokens` leaves room in a context of `n_ctx` for a token to follow (a
    `PromptTooLongError` naming `param` otherwise); `reader`: whose tokens they are, where
    models count them apart (the byte level)."""
    if n_tokens >= n_ctx:
        whose = f" for {reader}" if reader else ""
        raise PromptTooLongError(f"the prompt has {n_tokens} tokens{whose} but the context holds {n_ctx}; shorten the prompt or raise --ctx",
                                 param=param)  # fmt: skip


def plan(
    loaded: PlannedModels,
    prompt: Prompt,
    config: GenerationConfig,
    combiner: Combiner | BoundCombiner | None = None,
    *,
    param: str = "prompt",
    second_prompt: str | Sequence[int] | None = None,
) -> Plan:
    """The plan of generating from `prompt` (text, or token ids) with `config` and `combiner`
    (default: the ensemble's) on `loaded`; where it has a member reading a second prompt, that
    one reads `second_prompt` (text or token ids: a chat's own rendering), default
    `config.negative_prompt`. Bad input raises a `ConfigError` or a `PromptTooLongError` whose
    `param` names the setting at fault (`param` names the prompt)."""
    n_params = loaded.n_params
    has_second = loaded.second_member is not None
    bound = loaded.combiner if combiner is None else loaded.bind(combiner)
    # the default method counts the members that could draft: not a second prompt's member r does not
    # use (guidance at scale 1), which as a drafter would be evaluated for nothing but its drafts
    idle = has_second and not bound.used[loaded.second_member]  # type: ignore[index]
    config = config.for_models(len(n_params) - idle)
    check_for_models(config, len(loaded.loaded), json=True, second_prompt=has_second)
    # phrased as the model that leads reads it (one model's own template where r is that model alone)
    lead = bound.lead_model(n_params)
    fim = None
    if isinstance(prompt, Infill):  # read through the lead's FIM tokens
        fim = infill_prompt(loaded.models[largest(n_params) if lead is None else lead], prompt, config)
        prompt = fim.tokens
    tokens = prompt_tokens(loaded, prompt, param, config.phrasing, lead=lead)
    second = None
    if has_second:
        wanted = required_second_prompt(config.negative_prompt if second_prompt is None else second_prompt)
        if isinstance(prompt, str) and isinstance(wanted, str):
            check_second_prompt(prompt, wanted, json=True)
        second = tuple(prompt_tokens(loaded, wanted, "negative_prompt"))
        check_second_prompt(tokens, second, json=True)
    if config.lookahead is not None and config.lookahead[0] > loaded.branches:
        raise ConfigError(f"lookahead of {config.lookahead[0]} candidates: these models were loaded for "
                          + (f"at most {loaded.branches}" if loaded.branches else "none")
                          + " (give --lookahead when they load: its sequences are made then)", param="lookahead")  # fmt: skip
    assert config.method is not None, "for_models names the method"
    strategy = choose_strategy(config.method, config.gamma, config.proposer, n_params, config.lookahead, config.lookahead_threshold)
    sampler = config.sampler()
    if config.samplers is not None and "infill" in config.samplers:
        sampler = replace(sampler, infill=loaded.infill_sampler())
    lookup = None
    if config.lookup != "off" and strategy.lookup_in_cos:
        lookup = LookupSettings(config.lookup, *config.lookup_ngram, config.lookup_tokens)
    return Plan(
        prompt=tuple(tokens),
        config=config,
        combiner=bound,
        sampler=sampler,
        strategy=strategy,
        # every member's sequence fits the context (positions counted in the request's prompt's)
        max_length=len(tokens) + min(config.max_tokens, loaded.n_ctx - max(len(tokens), len(second or ()))),
        end_tokens=frozenset() if config.ignore_eos else loaded.end_tokens,
        banned=tuple(sorted(loaded.end_tokens)) if config.ignore_eos else (),
        lookup=lookup,
        constraint=config.constraint,
        second_prompt=second,
        cursor=None if fim is None else fim.cursor,
    )
