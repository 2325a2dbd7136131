"""The models of an eval run (`EvalModels`): loaded once for every configuration, at the run's
level, and a completion under each configuration at the level it names."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING
from collections.abc import Callable, Sequence

from ..core.level import Level
from .codeeval import Generated
from .contrast import TRANSFORMS

if TYPE_CHECKING:
    from ..config import LoadSpec, Settings
    from ..infill import Infill
    from ..ensemble import Ensemble, LevelEnsemble
    from .configs import EvalConfig

NOTHING_TO_CHANGE = "{}: nothing to change in this task; decoded by the lead model alone"


class EvalModels:
    """The run's models, loaded once for every configuration (`ensemble.load_at`: at the token
    level an `Ensemble`, at the byte and mixed levels its byte-level facade), each configuration
    planned and completed on them without asking which (`runtime.models.Models`, `runtime.run.complete`); a model that also decodes alone on its own tokens
    there (`load_alone`) does so on the same loaded model (`Ensemble.beside`).

    `load` provisions what every configuration needs (`configs.run_load`): with its
    `second_prompt` (a configuration reads a second prompt made from each task's:
    `--contrast-prompt`), the lead model is also a member reading it, loaded once: `models`
    holds that member, `plain` is the same loaded models without it (their lookahead branches
    kept), which the other configurations decode on. With its `lookahead`, the sequences of the
    branches are made as the models load."""

    def __init__(self, settings: Settings, run: Level, load: LoadSpec, progress: Callable[[int, int, str], None] | None = None) -> None:
        from ..core.combiners import WeightedEnsemble
        from ..ensemble import load_at

        self.settings = settings
        self.run = run
        self.alone: dict[int, Ensemble] = {}  # model index -> that model alone, on its own tokens
        second_prompt = load.second_prompt
        self.models: LevelEnsemble = load_at(load, WeightedEnsemble() if second_prompt else settings.combiner(), progress=progress)
        self.plain: LevelEnsemble = self.models.without_second(settings.combiner()) if second_prompt else self.models

    @property
    def names(self) -> list[str]:
        return self.plain.names

    def load_alone(self, members: Sequence[int], say: Callable[[str], None] = lambda line: None) -> None:
        from ..ensemble import Ensemble

        for i in members:
            say(f"localcos: {self.names[i]} also alone, on its own tokens")
            self.alone[i] = Ensemble.beside(self.plain, i)

    def generate(self, prompt: str | Infill, config: EvalConfig) -> Generated:
        """A completion of `prompt` under `config`, at its level (`max_tokens` the same length at
        every level: tokens, the lead's at the byte and mixed levels); its length in the run's
        unit (`Level.unit`: tokens, or characters in a run at the byte or mixed level: every
        configuration's speed in one unit). A configuration reading a second prompt made from
        the task's reads it on the second member; where the task gives nothing to change, the
        lead decodes alone (said in `note`)."""
        settings, unit = config.settings, self.run.unit
        if config.own_tokens:
            assert config.member is not None, "parse_config refuses --level token for a combination"
            own = self.alone[config.member].generate(prompt, config=replace(settings.generation, method="ensemble", gamma=None))
            return Generated(own.text, own.measured(unit), own.stats.seconds, own.stats.llama_seconds)
        models, combiner, second, note = self.plain, settings.combiner(), None, None
        if config.contrast is not None:
            assert isinstance(prompt, str), "cli.eval refuses a second prompt for an infilling task"
            second = self._second_prompt(config.contrast, prompt)
            if second is None:
                combiner, note = _alone(len(self.plain.loaded), self._lead(), combiner), NOTHING_TO_CHANGE.format(config.contrast)
            else:
                models = self.models
        plan = models.plan(prompt, settings.generation, combiner, second_prompt=second, level=config.level)
        from ..runtime.run import complete  # llama.cpp's layer: loaded with the models, not with eval's settings

        (c,) = complete(models, plan)
        return Generated(c.text, c.measured(unit), c.stats.seconds, c.stats.llama_seconds, note)

    def writes_script(self, config: EvalConfig) -> bool:
        """Whether `config`'s models write a whole script for a task (the evalplus phrasing, as
        it resolves for the model whose template phrases the prompt), not its continuation."""
        from ..phrasing import WHOLE_SCRIPTS, resolved

        return resolved(config.settings.generation.phrasing, self.plain.loaded[self._lead()]) in WHOLE_SCRIPTS

    def _lead(self) -> int:
        from ..core.sizes import largest

        return largest([m.n_params for m in self.plain.loaded])

    def _second_prompt(self, contrast: str, prompt: str) -> str | list[int] | None:
        """The second prompt of `contrast` for a task's `prompt`: text (`TRANSFORMS`), or the lead's
        tokens of its chat template's rendering (instruct: the task as an instruction, the
        assistant's turn repeating the code so both members continue the same text); None
        where the task gives nothing to change."""
        if contrast in TRANSFORMS:
            return TRANSFORMS[contrast](prompt)
        from ..phrasing import phrased_tokens

        lead = self.plain.loaded[self._lead()]
        return phrased_tokens([lead], prompt, contrast) if lead.chat_template else None

    def close(self) -> None:
        self.models.close()  # the models alone decode on its models (`Ensemble.beside`)

    def __enter__(self) -> EvalModels:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _alone(n: int, lead: int, configured):  # (int, int, Combiner) -> Combiner
    """Model `lead` of `n` alone (weight 1; the others never evaluated), behind the configured
    combination's gate where it has one (the mixed level decides whole tokens by it)."""
    from ..core.combiners import Gated, WeightedEnsemble

    alone = WeightedEnsemble([1.0 if i == lead else 0.0 for i in range(n)])
    return Gated(alone, configured.threshold, lead=lead) if isinstance(configured, Gated) else alone
