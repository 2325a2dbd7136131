"""Models loaded for byte-level decoding (`ByteModels`): each with its sequences, byte vocabulary
and call profile; requests planned once (`plan`) and started (`start`)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from ...backend import Model
from ...backend.model import MAX_SEQUENCES
from ...config.levels import check_level
from ...config.specs import GenerationConfig, check_second_member, check_second_prompt, required_second_prompt
from ...core.bytelevel import check_prune
from ...core.combiners import BoundCombiner, Gated
from ...core.hostmem import keep_freed_memory
from ...core.level import Level
from ...core.speedmodel import CallProfile, Costs
from ...errors import ConfigError
from ...grammar import Matcher, byte_symbols
from ...infill import Infill
from ..members import Members
from ..plan import check_fits
from ..profile import profile as call_profile
from .generation import ByteGeneration
from .level import byte_vocab
from .member import ByteMember
from ..completion import Completion, cancelled_completion
from .results import BytePlan

if TYPE_CHECKING:
    from ...config.specs import LoadSpec
    from ...core.combiners import Combiner


# cells of the KV cache per lane, in contexts (`--ctx`): a lane's tokenisations of one text share
# their prefixes' cells, so a few contexts hold them (a context per tokenisation, as generation
# reserves, would make the cache, and the attention's span over it, far larger)
LANE_CELLS = 4


class ByteModels(Members):
    """Models loaded for byte-level decoding: each with `max_paths` sequences in one unified KV
    cache, and its byte vocabulary. Its members: each model reading the prompt and, with
    `second_prompt`, the lead model a second time (its next `max_paths` sequences) reading a
    second prompt, as `LoadedModels`'s; `models` is per member, `loaded` once each."""

    def __init__(
        self, models: Sequence[Model], combiner: BoundCombiner | Combiner, *, max_paths: int, prune: float,
        profiles: Sequence[CallProfile] | None = None, level: Level = Level.BYTE, second_prompt: bool = False,
    ) -> None:  # fmt: skip
        keep_freed_memory()  # every row's vocabulary-sized arrays come and go (see core.hostmem)
        lead = self._add_members(models, second_prompt)
        slots = [m.slots[:max_paths] for m in models]
        if lead is not None:  # the second prompt's member: the lead's next max_paths sequences
            slots.append(models[lead].slots[max_paths : 2 * max_paths])
        self.level = level  # what a request decodes at unless it names another: byte, or mixed
        self.combiner = combiner
        # each member's call cost by rows (`runtime.profile`): what --byte-gamma auto plans with
        if profiles is None:
            own = {id(m): call_profile(m) for m in self.loaded}
            profiles = [own[id(m)] for m in self.models]
        self.costs = Costs(list(profiles))
        self.members = [ByteMember(m, max_paths=max_paths, prune=prune, price=p, slots=s) for m, p, s in zip(self.models, self.costs.profiles, slots)]
        self.n_ctx = min(m.n_ctx for m in self.models)

    @classmethod
    def load(
        cls,
        spec: LoadSpec,
        combiner,
        *,
        progress: Callable[[int, int, str], None] | None = None,
        lanes: int = 1,
    ) -> ByteModels:
        """Load every model of `spec` with `spec.byte_paths` sequences; paths pruned at
        `spec.byte_prune`. `lanes`: texts scored at once (`lanes`), each with sequences of its
        own, `LANE_CELLS` contexts of cells each (fewer where llama.cpp's sequences run out)."""
        from ..loaded import load_models, second_prompt_host

        if not spec.level.in_bytes:
            raise ConfigError(f"level {spec.level.value}: the byte level's models load for level byte or mixed (at the token level, "
                              "Ensemble loads them; ensemble.load_at picks by level)", param="level")  # fmt: skip
        if any(spec.rpc):  # a model on RPC servers decodes one sequence; its paths need byte_paths of them
            raise ConfigError("--rpc: not available at the byte level (each model holds --byte-paths sequences here; "
                              "a model on RPC servers decodes one)", param="rpc")  # fmt: skip
        lanes = max(1, min(lanes, MAX_SEQUENCES // spec.byte_paths))
        cells = None if lanes == 1 else spec.n_ctx * LANE_CELLS * lanes
        lead = second_prompt_host(spec)  # it holds the second prompt's member's paths too

        def build(models: list[Model]) -> ByteModels:
            for m in models:
                byte_vocab(m)
            own = {id(m): call_profile(m, spec.calibrate) for m in models}
            made = cls(models, combiner, max_paths=spec.byte_paths, prune=spec.byte_prune, level=spec.level, second_prompt=spec.second_prompt,
                       profiles=[own[id(m)] for m in (models + ([models[lead]] if lead is not None else []))])  # fmt: skip
            return made

        def open_model(i: int, path: Path, options: dict) -> Model:
            return Model(path, n_seq=spec.byte_paths * lanes * (2 if i == lead else 1), cells=cells, **options)

        return load_models(spec, open_model, build, progress=progress, max_logit_rows=max(32, spec.byte_paths * min(lanes, 4)))

    def lanes(self) -> list[list[ByteMember]]:
        """Members that score texts side by side (`scoring.bytescore`), one list per text, one
        member per model: the loaded members first, then members on the models' other sequences
        (as many lanes as every model has `byte_paths` sequences for), pruned as they are."""
        k = self.members[0].view.max_paths
        count = min(len(m.slots) for m in self.models) // k
        out = [self.members]
        for lane in range(1, count):
            out.append([ByteMember(m.model, max_paths=k, prune=m.view.prune, price=m.price, slots=m.model.slots[lane * k : (lane + 1) * k])
                        for m in self.members])  # fmt: skip
        return out


    def document_starts(self) -> list[list[int]]:
        """Each model's context for a text of its own: its BOS, or where it has none its
        end-of-text token (what its training put between documents)."""
        return [[m.bos if m.bos >= 0 else m.eos] for m in self.models]

    def prompts(self, text: str | Infill, second: str | None = None, phrasing: str = "raw", config: GenerationConfig | None = None) -> list[list[int]]:
        """The prompt text in each model's own tokens as `phrasing` says (raw: each adds BOS as
        its metadata says; instruct: each model's own chat template), or what to fill in at a
        cursor through each model's own FIM tokens under `config`, and `second` in the lead's
        for a member reading a second prompt (left out where None: `plan` then reads the
        request's negative_prompt)."""
        from ...infill import infill_prompt
        from ...phrasing import phrased_tokens

        if isinstance(text, str):
            out = [phrased_tokens([m], text, phrasing) for m in self.loaded]
        else:
            assert config is not None, "an infill is read under its generation's settings"
            out = [infill_prompt(m, text, config).tokens for m in self.loaded]  # the makers' layout (`check_level`)
        if self.second_member is not None and second is not None:
            out.append(self.models[self.second_member].tokenize(second))
        return out

    def without_second(self, combiner: Combiner):  # -> an instance of type(self)
        """These models as loaded, without the member reading a second prompt
        (`LoadedModels.without_second`)."""
        first = self.members[0].view
        return type(self)(self.loaded, combiner, max_paths=first.max_paths, prune=first.prune, profiles=self.costs.profiles[: len(self.loaded)],
                          level=self.level)  # fmt: skip

    def own_tokens(self) -> int | None:
        """The model whose own tokens serve the requests this level does not decode (sampling,
        log-probabilities, tools...: `config.levels.request_level`), on the weights and context
        loaded here: one model loaded for the mixed level; None for anything else."""
        return 0 if self.level is Level.MIXED and len(self.loaded) == 1 else None

    def prefill_plan(self, plan: BytePlan) -> None:
        """None: a byte-level generation begins every prompt afresh, so there is nothing to warm
        (`LoadedModels.prefill_plan`)."""
        return None

    def refuse_unread(self, given: Iterable[str], *, json: bool = True, remedy: str = "") -> None:
        """Nothing: every option reads at the byte level, or is refused when the request is planned."""

    def refuse_unserved(self, asked: Sequence[tuple[bool, str]]) -> None:
        """A `ConfigError` (unsupported_parameter) for the first of `asked` ((asked, "param" or
        "param: what")) that needs one vocabulary: token ids, log-probabilities, echo's scores,
        tool-call grammars."""
        for wanted, what in asked:
            if wanted:
                raise ConfigError(f"{what}: not available at the byte level (these models have different tokenizers)",
                                  param=what.split(":")[0], code="unsupported_parameter")  # fmt: skip

    @property
    def parallel(self) -> int:
        """Generations decoded at once: one (its paths take the models' sequences)."""
        return 1

    def plan(
        self,
        prompt: str | Infill | Sequence[Sequence[int]],
        config: GenerationConfig,
        combiner: Combiner | BoundCombiner | None = None,
        *,
        param: str = "prompt",
        second_prompt: str | Sequence[int] | None = None,
        level: Level | None = None,
    ) -> BytePlan:
        """A byte-level completion of `prompt` (text, read as `config.phrasing` says in each
        model's own tokens, an `Infill` through each model's own FIM tokens, or each model's prompt
        tokens: `prompts`) under `config`, checked once here for every front end: `combiner`
        bound to the models (default the loaded one); a prompt longer than a model's context is
        refused (`ConfigError`, naming `param`), and what the level does not decode
        (`config.levels.check_level`: a gamma in tokens, a method other than ensemble and cos, a
        proposer, lookup, ...). `level`: the byte or the mixed level (default: the level the
        models loaded for). Where a member reads a second prompt, it reads `second_prompt` (its
        model's tokens, a chat's rendering; or text, in its tokens), or the last of the prompts
        where they are one more than the models, or `config.negative_prompt` (in the lead's
        tokens)."""
        prompts = self.prompts(prompt, phrasing=config.phrasing, config=config) if isinstance(prompt, (str, Infill)) else list(prompt)
        level = self.level if level is None else level
        config = config.for_models(len(self.models), level)
        check_second_member(config, self.second_member is not None, json=True)
        prompts = list(prompts)
        if second_prompt is not None:
            second_model = self.second_model()  # there is one to read it
            prompts = [*prompts[: len(self.loaded)], second_model.tokenize(second_prompt) if isinstance(second_prompt, str) else list(second_prompt)]
        if self.second_member is not None and len(prompts) == len(self.loaded):
            second = required_second_prompt(config.negative_prompt)
            prompts.append(self.models[self.second_member].tokenize(second) if isinstance(second, str) else list(second))
        if self.second_member is not None:
            check_second_prompt(prompts[0], prompts[-1], json=True)
        for m, p in zip(self.models, prompts):
            check_fits(len(p), m.n_ctx, param, m.name)
        bound = self.combiner if combiner is None else self.bind(combiner)
        check_level(level, config, isinstance(bound.combiner, Gated))
        assert config.method in ("ensemble", "cos"), "for_models names the method, check_level allows these"
        return BytePlan(tuple(tuple(p) for p in prompts), config, bound, config.method, level)

    def cancelled_completion(self, plan: BytePlan) -> Completion:
        """`plan`'s completion cancelled before it started."""
        return cancelled_completion(self.names, plan.method, plan.combiner.description, plan.level)

    def start(self, plan: BytePlan, rng: np.random.Generator, cancelled: Callable[[], bool] | None = None) -> ByteGeneration:
        """The generation of `plan` drawing from `rng` (`run()` drives it); one at a time."""
        config = plan.config
        lead = self.models[plan.combiner.lead_model(self.n_params)]
        return ByteGeneration(self.members, plan.prompts, plan.combiner, config.sampler(), rng, max_tokens=config.max_tokens,
                              count_tokens=lambda data: len(lead.tokenize(data, add_bos=False)),
                              stop=config.stop, n_indent=config.n_indent, t_max_predict_ms=config.t_max_predict_ms, n_ctx=self.n_ctx,
                              ignore_end=config.ignore_eos, method=plan.method,
                              gamma=config.byte_gamma, costs=self.costs, cancelled=cancelled, names=self.names,
                              constraint=None if config.constraint is None else Matcher(byte_symbols(), config.constraint),
                              level=plan.level)  # fmt: skip

    @contextmanager
    def pruning(self, prune: float) -> Iterator[None]:
        """Every model's paths pruned (and folded) at `prune` inside the block, as loaded after
        it: scoring a given text keeps every tokenisation (prune 0), whatever generation uses."""
        prune = check_prune(prune)
        loaded = [m.view.prune for m in self.members]
        for m in self.members:
            m.view.prune = prune
        try:
            yield
        finally:
            for m, p in zip(self.members, loaded):
                m.view.prune = p
