"""Loaded models at a level: the one interface a front end plans requests through.

`LoadedModels` (models sharing a tokenizer: the token level) and
`runtime.bytelevel.ByteModels` (models of any tokenizers: the byte and mixed levels) both
implement `Models`. A front end loads once (`ensemble.load_at`) and then plans, refuses what
the models cannot serve, runs its plans (`runtime.run`: `complete`, `Stream`) and reports
without asking which level it is: the level is a property of the models (`level`), decided
where they were named (`config.levels.decide_level`) and, where one model serves two levels, per
request (`config.levels.request_level`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar
from collections.abc import Iterable, Sequence

from ..config.levels import request_level
from ..core.level import Level

if TYPE_CHECKING:
    from typing import TypeAlias

    from ..backend import Model
    from ..config.specs import GenerationConfig
    from ..core.combiners import BoundCombiner, Combiner
    from .bytelevel.results import BytePlan
    from .loaded import LoadedModels
    from .plan import Plan
    from .scheduler import Rounds

    # a plan at the level of the models it was made on: what a front end holds without naming the level
    LevelPlan: TypeAlias = Plan | BytePlan


class Models(Protocol):
    """What every front end may ask of loaded models, whatever their level."""

    n_ctx: int
    second_member: int | None
    loaded: list[Model]  # each model once, as loaded
    models: list[Model]  # per member: the models, then a second prompt's member's (the lead again)

    @property
    def level(self) -> Level: ...

    @property
    def parallel(self) -> int: ...

    @property
    def names(self) -> list[str]: ...

    @property
    def n_params(self) -> list[int]: ...

    @property
    def combiner(self) -> BoundCombiner: ...

    def bind(self, combiner: Combiner | BoundCombiner) -> BoundCombiner: ...

    def plan(self, prompt: Any, config: GenerationConfig, combiner: Combiner | BoundCombiner | None = None, *, param: str = "prompt",
             second_prompt: Any = None, level: Level | None = None) -> LevelPlan: ...  # fmt: skip

    def prefill_plan(self, plan: Any) -> Plan | None: ...

    def refuse_unread(self, given: Iterable[str], *, json: bool = True, remedy: str = "add --level byte") -> None: ...

    def refuse_unserved(self, asked: Sequence[tuple[bool, str]]) -> None: ...

    def own_tokens(self) -> int | None: ...

    def close(self) -> None: ...


M = TypeVar("M", bound=Models)
T = TypeVar("T")


@dataclass(frozen=True)
class LevelViews(Generic[M, T]):
    """The loaded models as a front end holds them: the models at the level they were loaded for
    (`loaded`) and, where one model is loaded for the mixed level, that model on its own tokens
    beside them (`token`: the facade's `Ensemble.token_view`, on the same weights), each with
    what renders a conversation for it (`templates`, `token_templates`: the front end's, None
    where the models carry no template). It answers which models decode a request (`decides`),
    what renders it (`templates_for`) and whether token ids mean one thing (`one_vocabulary`),
    so a front end never asks which level it is at."""

    loaded: M
    token: M | None = None
    templates: T | None = None
    token_templates: T | None = None

    def decides(self, generation: GenerationConfig, *, needs_tokens: bool) -> M:
        """The models a request with these settings decodes on: the ones loaded, or the token view
        where the request's level is its (`config.levels.request_level`: what the mixed level does
        not decode, or what needs one vocabulary's tokens)."""
        level = request_level(self.loaded.level, generation, needs_tokens=needs_tokens, token_view=self.token is not None)
        return self.token if self.token is not None and level is Level.TOKEN else self.loaded

    def templates_for(self, models: M) -> T | None:
        """What renders a conversation for `models` (one of these views)."""
        return self.token_templates if self.token is not None and models is self.token else self.templates

    @property
    def one_vocabulary(self) -> bool:
        """Whether token ids mean one thing here: the models share a tokenizer, or one model loaded
        for the mixed level has its own tokens beside it."""
        return self.token is not None or not self.loaded.level.in_bytes

    @property
    def token_models(self) -> M:
        """The models where they decode at the token level: what every path that needs one
        vocabulary reads (only where `one_vocabulary`)."""
        assert self.one_vocabulary, "token ids are refused where they mean nothing"
        return self.loaded if self.token is None else self.token


def scheduler_for(models: Models, slots: list[int], token: LoadedModels | None = None) -> Rounds:
    """The scheduler that runs the generations of `models` (a server's engine drives any): the
    token level's over `slots` of their sequences; the byte level's, one generation at a time;
    and where one model loaded for the mixed level serves requests on its own tokens too
    (`token`, over `slots` of its sequences), both, one level at a time (`BothLevels`)."""
    from .bytescheduler import BothLevels, ByteScheduler
    from .scheduler import Scheduler

    if not models.level.in_bytes:
        return Scheduler(models, slots=slots)  # type: ignore[arg-type]
    byte = ByteScheduler(models)  # type: ignore[arg-type]
    return byte if token is None else BothLevels(byte, Scheduler(token, slots=slots))
