"""What loaded models keep at every level: their members (each model reading the prompt and,
where one reads a second prompt, the lead model again), the default combination bound to them,
each member's call costs, their names, and closing them. `LoadedModels` (the token level) and
`bytelevel.ByteModels` (the byte and mixed levels) are both `Members`."""

from __future__ import annotations

from collections.abc import Sequence

from ..backend import Model
from ..core.combiners import BoundCombiner, Combiner
from ..core.sizes import largest, member_params
from ..core.speedmodel import CallProfile, Costs
from ..errors import ConfigError


def member_names(names: Sequence[str], second_member: int | None) -> list[str]:
    """Members' names for people and statistics: each model's `names`, the member reading a
    second prompt so marked (the same model twice otherwise reads as one)."""
    return [name + (" (second prompt)" if i == second_member else "") for i, name in enumerate(names)]


class Members:
    """Loaded models and their members. `loaded`: each model once, as loaded; `models`: per
    member, the models and, where a member reads a second prompt, the lead (the largest,
    `core.sizes.largest`) again, last (`second_member`). `costs` and `profiles` are per member."""

    loaded: list[Model]
    models: list[Model]
    second_member: int | None
    costs: Costs
    _combiner: BoundCombiner

    def _add_members(self, models: Sequence[Model], second_prompt: bool) -> int | None:
        """Set the members of `models` (and the second prompt's, where `second_prompt`); the index
        of the model it repeats, or None."""
        self.loaded = list(models)
        self.models = list(models)
        self.second_member = None
        if not second_prompt:
            return None
        lead = largest([m.n_params for m in self.loaded])
        self.models.append(self.loaded[lead])
        self.second_member = len(self.models) - 1
        return lead

    def second_model(self) -> Model:
        """The model whose member reads a second prompt (the lead); a `ConfigError` where none does."""
        if self.second_member is None:
            raise ConfigError("second_prompt: no member of these models reads a second prompt (load them with one)", param="negative_prompt")
        return self.models[self.second_member]

    @property
    def n_params(self) -> list[int]:
        """Each member's parameter count, what a combination chooses roles by where the settings
        leave them open: the member reading a second prompt counts one fewer than its model, so
        the one reading the prompt is the expert, the lead and the positive member."""
        return member_params([m.n_params for m in self.loaded], self.second_member is not None)

    @property
    def names(self) -> list[str]:
        """The members' names for people (GGUF general.name, else the file name)."""
        return member_names([m.label for m in self.models], self.second_member)

    @property
    def run_names(self) -> list[str]:
        """The members as a generation's statistics name them: each model's file, the second
        prompt's member so marked."""
        return member_names([m.name for m in self.models], self.second_member)

    @property
    def combiner(self) -> BoundCombiner:
        """The default combination function (bound to these members; a `Combiner` set here is bound)."""
        return self._combiner

    @combiner.setter
    def combiner(self, combiner: Combiner | BoundCombiner) -> None:
        self._combiner = self.bind(combiner)

    def bind(self, combiner: Combiner | BoundCombiner) -> BoundCombiner:
        """`combiner` fitted to these members, with its defaults filled in (`ConfigError` if it does
        not fit, e.g. weights for another number of models); a combiner bound to them already is
        taken as it is."""
        return combiner.bind(len(self.models), self.n_params)

    @property
    def profiles(self) -> list[CallProfile]:
        """Each member's call costs by rows per call, which every auto plan is made from."""
        return self.costs.profiles

    @profiles.setter
    def profiles(self, profiles: Sequence[CallProfile]) -> None:
        """Plan with these costs instead (e.g. to see what another machine would do)."""
        if len(profiles) != len(self.models):
            raise ValueError(f"{len(profiles)} profiles for {len(self.models)} models")
        self.costs = Costs(profiles)

    def close(self) -> None:
        for m in self.loaded:
            m.close()

    def __enter__(self):  # -> Self
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
