"""Loaded models at a level: the one interface a front end plans requests through.

`LoadedModels` (models sharing a tokenizer: the token level) and
`runtime.bytelevel.ByteModels` (models of any tokenizers: the byte and mixed levels) both
implement `Models`. A front end loads once (`ensemble.load_at`) and then plans, refuses what
the models cannot serve and reports without asking which level it is: the level is a property
of the models (`level`), decided where they were named (`config.specs.decide_level`) and, where
one model serves two levels, per request (`config.resolve.request_level`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol
from collections.abc import Iterable, Sequence

from ..core.level import Level

if TYPE_CHECKING:
    from ..config.specs import GenerationConfig
    from ..core.combiners import BoundCombiner, Combiner
    from .bytelevel.results import BytePlan
    from .completion import Completion
    from .plan import Plan


class Models(Protocol):
    """What every front end may ask of loaded models, whatever their level."""

    n_ctx: int
    second_member: int | None

    @property
    def level(self) -> Level: ...

    @property
    def names(self) -> list[str]: ...

    @property
    def n_params(self) -> list[int]: ...

    @property
    def combiner(self) -> BoundCombiner: ...

    def bind(self, combiner: Combiner | BoundCombiner) -> BoundCombiner: ...

    def plan(self, prompt: Any, config: GenerationConfig, combiner: Combiner | BoundCombiner | None = None, *, param: str = "prompt",
             second_prompt: Any = None, level: Level | None = None) -> Plan | BytePlan: ...  # fmt: skip

    def complete(self, plan: Any, n: int = 1) -> list[Completion]: ...

    def prefill_plan(self, plan: Any) -> Plan | None: ...

    def refuse_unread(self, given: Iterable[str], *, json: bool = True, remedy: str = "add --level byte") -> None: ...

    def refuse_unserved(self, asked: Sequence[tuple[bool, str]]) -> None: ...

    def own_tokens(self) -> int | None: ...

    def close(self) -> None: ...

