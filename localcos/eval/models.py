"""The models of an eval run (`EvalModels`): loaded once for every configuration, at the run's
level, and a completion under each configuration at the level it names."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Sequence

from ..core.level import Level
from .codeeval import Generated

if TYPE_CHECKING:
    from ..config import Settings
    from ..ensemble import Ensemble
    from .configs import EvalConfig


class EvalModels:
    """The run's models, loaded once for every configuration: at the token level an `Ensemble`,
    at the byte and mixed levels `ByteModels`; a model that also decodes alone on its own tokens
    there (`load_alone`) is loaded a second time, by itself (`Ensemble.member`)."""

    def __init__(self, settings: "Settings", run: Level, progress: Callable[[int, int, str], None] | None = None) -> None:
        from ..ensemble import Ensemble

        self.settings = settings
        self.run = run
        self.alone: dict[int, Ensemble] = {}  # model index -> that model alone, on its own tokens
        if run.in_bytes:
            from ..runtime.bytelevel import ByteModels

            self.models: Ensemble | ByteModels = ByteModels.load(settings.load, settings.combiner(), progress=progress)
        else:
            self.models = Ensemble.from_spec(settings.load, settings.combiner(), progress=progress)

    @property
    def names(self) -> list[str]:
        return self.models.names

    def load_alone(self, members: Sequence[int], say: Callable[[str], None] = lambda line: None) -> None:
        from ..ensemble import Ensemble

        for i in members:
            say(f"localcos: {self.names[i]} also alone, on its own tokens")
            self.alone[i] = Ensemble.member(self.settings.load, i)

    def generate(self, prompt: str, config: "EvalConfig") -> Generated:
        """A completion of `prompt` under `config`, at its level (`max_tokens` the same length at
        every level: tokens, the lead's at the byte and mixed levels); its length in tokens, or in
        characters in a run at the byte or mixed level (every configuration's speed in one unit)."""
        settings = config.settings
        if config.own_tokens:
            assert config.member is not None, "parse_config refuses --level token for a combination"
            own = self.alone[config.member].generate(prompt, config=replace(settings.generation, method="ensemble", gamma=None))
            return Generated(own.text, len(own.text), own.stats.seconds, own.stats.llama_seconds)
        if self.run.in_bytes:
            from ..runtime.bytelevel import ByteModels, run_to_end
            from ..runtime.generation import completion_rng

            assert isinstance(self.models, ByteModels)
            plan = self.models.plan(self.models.prompts(prompt), settings.generation, combiner=settings.combiner(), level=config.level)
            b = run_to_end(self.models.start(plan, completion_rng(settings.generation.seed, 0)))
            return Generated(b.text, b.stats.chars, b.stats.seconds, b.stats.llama_seconds)
        c = self.models.generate(prompt, config=settings.generation, combiner=settings.combiner())  # type: ignore[union-attr]
        return Generated(c.text, len(c.token_ids), c.stats.seconds, c.stats.llama_seconds)

    def close(self) -> None:
        for ens in self.alone.values():
            ens.close()
        self.models.close()

    def __enter__(self) -> "EvalModels":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
