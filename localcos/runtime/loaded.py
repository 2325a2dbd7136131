"""The loaded models of one ensemble and what is known about them: their shared vocabulary, end
tokens, context, slots, call costs, and the default combination, bound to them once."""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
from collections.abc import Callable, Iterable, Sequence

from ..backend import Model, RemoteModel, set_verbose, shared_vocab_size, tokenize_alike
from ..backend.slot import Slot
from ..core.combiners import BoundCombiner, Combiner, WeightedEnsemble
from ..core.hostmem import keep_freed_memory
from ..core.level import Level
from ..core.sizes import largest
from ..core.healing import TokenBytes
from ..core.sampling import InfillSampler
from ..core.speedmodel import CallProfile, Costs, MeasuredCalls
from ..config.levels import refuse_byte_options
from ..config.specs import require_models
from ..errors import ConfigError
from ..grammar import Vocabulary
from .members import Members
from .plan import Plan, Prompt, plan as plan_request
from .profile import profile as call_profile

if TYPE_CHECKING:
    from ..config.specs import GenerationConfig, LoadSpec

T = TypeVar("T")


def model_options(spec: LoadSpec, i: int, max_logit_rows: int) -> dict:
    """`Model`'s keyword arguments for model i of `spec` (its sequences aside)."""
    return dict(
        n_ctx=spec.n_ctx,
        n_gpu_layers=spec.n_gpu_layers[i],
        n_threads=spec.n_threads,
        n_batch=spec.n_batch,
        main_gpu=spec.main_gpu,
        split_mode=spec.split_mode,
        flash_attn=spec.flash_attn,
        max_logit_rows=max_logit_rows,
    )


def load_models(
    spec: LoadSpec,
    open_model: Callable[[int, Path, dict], Model],
    build: Callable[[list[Model]], T],
    *,
    progress: Callable[[int, int, str], None] | None = None,
    max_logit_rows: int = 64,
) -> T:
    """The one load loop: each model of `spec` opened in turn by `open_model(i, path, options)`
    (`model_options`), `progress(i, n, name)` told before, and warmed up (the first call pages
    the weights in: not a generation's); then `build(models)`. Should anything fail, every model
    opened is closed again."""
    if spec.verbose:
        set_verbose(True)
    models: list[Model] = []
    try:
        for i, path in enumerate(spec.paths):
            if progress:
                progress(i, len(spec.paths), os.fspath(path))
            models.append(open_model(i, path, model_options(spec, i, max_logit_rows)))
            models[-1].warm_up(timed_calls=0)
        return build(models)
    except BaseException:
        for m in models:
            m.close()
        raise


def second_prompt_host(spec: LoadSpec) -> int | None:
    """The model that also holds the sequences of the member reading a second prompt (the
    largest, by its file's header, as `LoadedModels` and `ByteModels` pick it once loaded), or
    None where no member reads one."""
    if not spec.second_prompt:
        return None
    from ..backend import read_info

    return largest([read_info(p, tokens=False).n_params for p in spec.paths])


class LoadedModels(Members):
    """Models sharing one tokenizer, loaded, with what decoding needs to know of them.

    Its members are what a combination combines and a decoding method drives: each model reading
    the prompt and, with `second_prompt`, the lead model a second time, reading a second prompt
    (a negative prompt, a contrast, another phrasing: `Plan.prompts`). The two members of one
    model share its weights (loaded once) and its calls; each has its own sequences (half of the
    model's). `models`, `n_params`, `names` and `profiles` are per member (a model twice where
    it is two members); `loaded` the models as loaded, once each.

    Args:
        models: loaded models (see `LoadedModels.from_spec`), their caches empty.
        combiner: default combination function (default: equal-weight `WeightedEnsemble`).
        profiles: each member's call costs by rows per call (default: measured now on this
            machine, or read from the cache of earlier measurements; see `runtime.profile`).
        calibrate: measure the profiles again instead of reading the cache.
        second_prompt: the lead model (the largest, `core.sizes.largest`) is also a member reading a second
            prompt, on the second half of its sequences.
        branches: sequences each sequence has beside it for lookahead's branches
            (`core.strategies.Lookahead`): the last ones of each model, `branches` per sequence
            in order.
    """

    def __init__(
        self,
        models: Sequence[Model],
        combiner: Combiner | None = None,
        *,
        profiles: Sequence[CallProfile] | None = None,
        calibrate: bool = False,
        second_prompt: bool = False,
        branches: int = 0,
    ) -> None:
        require_models(len(models))
        keep_freed_memory()  # vocabulary-sized arrays come and go every token (see core.hostmem)
        lead = self._add_members(models, second_prompt)
        self.n_vocab = shared_vocab_size(self.loaded)
        for m in self.loaded:
            m.logits_vocab = self.n_vocab
        self.n_ctx = min(m.n_ctx for m in self.loaded)
        # each member's sequences: a model's own, or the halves of the lead's (the first of the
        # model's sequences; lookahead's branches, where it has any, after them)
        self.branches = branches
        self.member_slots: list[list[Slot]] = [list(m.slots[: len(m.slots) // (branches + 1)]) for m in self.loaded]
        spare = [iter(m.slots[len(own) :]) for m, own in zip(self.loaded, self.member_slots)]
        self._branches: dict[Slot, list[Slot]] = {
            main: [next(rest) for _ in range(branches)] for mains, rest in zip(self.member_slots, spare) for main in mains
        }
        for main, others in self._branches.items():
            for branch in others:
                branch.partner = main  # a lookahead call counts once, for the sequence itself
        if lead is not None:  # the second prompt's member: the second half of the lead's sequences
            half = len(self.member_slots[lead]) // 2
            self.member_slots[lead], second = self.member_slots[lead][:half], self.member_slots[lead][half:]
            self.member_slots.append(second)
            for slot, partner in zip(second, self.member_slots[lead]):
                slot.partner = partner  # a call both members share counts once
        self.parallel = min(len(s) for s in self.member_slots)  # sequences decoded at once
        first = self.loaded[0]
        self.end_tokens = frozenset(t for t in range(self.n_vocab) if first.is_eog(t))
        self._combiner = self.bind(combiner or WeightedEnsemble())
        # what a call of k rows costs each model here: --gamma auto, lookup's auto mode, the load
        # back-off and the speedup estimate plan with it
        measured: list[MeasuredCalls | None] = []
        if profiles is None:
            own = {id(m): call_profile(m, calibrate) for m in self.loaded}
            profiles = [own[id(m)] for m in self.models]
            # a profile measured here is corrected by what the calls measure; one given is kept as given
            measured = [getattr(m, "call_times", None) for m in self.models]
        self.profiles = list(profiles)
        self.costs = Costs(self.profiles, measured=measured)
        self._vocabulary: Vocabulary | None = None  # the constraints' view of the vocabulary
        self._token_bytes: TokenBytes | None = None  # the tokens by their bytes (the cursor's token healed)
        self._infill: InfillSampler | None = None
        self._vocabulary_lock = threading.Lock()

    @classmethod
    def from_spec(
        cls,
        spec: LoadSpec,
        combiner: Combiner | None = None,
        *,
        progress: Callable[[int, int, str], None] | None = None,
        max_logit_rows: int = 64,
        extra_slots: int = 0,
    ):  # -> an instance of cls
        """Load every model of `spec` (each into its own llama.cpp context) and check their
        tokenizers. `progress(i, n, name)` is called before model i of n is loaded;
        `max_logit_rows` is the most logits rows one call returns (decoding needs a few,
        scoring more); `extra_slots` sequences beyond `spec.parallel` (a server's slot for
        scoring). A model on RPC servers is a `RemoteModel`, driven from a worker process."""
        if spec.level.in_bytes:
            raise ConfigError(f"the {spec.level.value} level loads through runtime.bytelevel.ByteModels (ensemble.load_at picks by level); "
                              f"leave out level {spec.level.value} here", param="level")  # fmt: skip
        parallel = (spec.parallel or 1) + extra_slots
        lead = second_prompt_host(spec)
        candidates, rolled = spec.lookahead or (0, 0)

        def open_model(i: int, path: Path, options: dict) -> Model:
            if spec.rpc[i]:
                return RemoteModel(path, rpc=spec.rpc[i], timeout=spec.rpc_timeout, **options)
            sequences = parallel * (2 if i == lead else 1)
            if not candidates:
                return Model(path, n_seq=sequences, **options)
            # a branch shares its sequence's cells (seq_cp) and adds what it rolls out
            cells = sequences * (spec.n_ctx + candidates * (rolled + 2))
            return Model(path, n_seq=sequences * (candidates + 1), cells=cells, **options)

        def build(models: list[Model]) -> LoadedModels:
            return cls(models, combiner, calibrate=spec.calibrate, second_prompt=spec.second_prompt, branches=candidates)

        return load_models(spec, open_model, build, progress=progress, max_logit_rows=max_logit_rows)

    def branch_slots(self, member: int, slot: int) -> list[Slot]:
        """The sequences beside sequence `slot` of `member` for lookahead's branches (none where
        the models were loaded without them)."""
        return self._branches[self.member_slots[member][slot]]

    def sequence(self, member: int, slot: int, branch: int = 0) -> Slot:
        """Sequence `slot` of `member` (branch 0), or its lookahead branch `branch` (1 on)."""
        own = self.member_slots[member][slot]
        return own if branch == 0 else self._branches[own][branch - 1]

    # --- the ensemble ------------------------------------------------------------------------------
    @property
    def level(self) -> Level:
        """The level these models decode at: the token level (`ByteModels` says its own)."""
        return Level.TOKEN

    # --- the front ends' interface (`runtime.models.Models`) ---------------------------------------
    def plan(self, prompt: Prompt, config: GenerationConfig, combiner: Combiner | BoundCombiner | None = None, *, param: str = "prompt",
             second_prompt: str | Sequence[int] | None = None, level: Level | None = None) -> Plan:  # fmt: skip
        """`runtime.plan.plan` of `prompt` (text, token ids, an `Infill`) on these models.
        `level`: the token level or None (`ByteModels.plan` takes the byte or mixed level)."""
        if level not in (None, Level.TOKEN):
            raise ConfigError(f"level {Level(level).value}: these models share a tokenizer and decode at the token level", param="level")
        return plan_request(self, prompt, config, combiner, param=param, second_prompt=second_prompt)

    def without_second(self, combiner: Combiner):  # -> an instance of type(self)
        """These models as loaded, without the member reading a second prompt (its sequences
        unused), combined by `combiner`: what a run decodes on where only some of its
        configurations read a second prompt. Closing either closes the models."""
        alike = type(self)(self.loaded, combiner, profiles=self.profiles[: len(self.loaded)], branches=self.branches)
        alike.costs = Costs(alike.profiles, measured=self.costs.measured[: len(self.loaded)])
        return alike

    def prefill_plan(self, plan: Plan) -> Plan:
        """`plan` evaluating its prompt and generating nothing: its cells kept for the next request
        that starts the same way (an editor's warm-up)."""
        return replace(plan, max_length=len(plan.prompt))

    def refuse_unread(self, given: Iterable[str], *, json: bool = True, remedy: str = "add --level byte") -> None:
        """A `ConfigError` for an option among `given` that these models would not read: one only
        the byte level reads (`config.levels.refuse_byte_options`)."""
        refuse_byte_options(given, json=json, remedy=remedy)

    def refuse_unserved(self, asked: Sequence[tuple[bool, str]]) -> None:
        """Nothing: one vocabulary serves token ids, log-probabilities, echo and tool grammars
        (`ByteModels.refuse_unserved` refuses them)."""

    def own_tokens(self) -> int | None:
        """None: these models decode on their own tokens already (`ByteModels.own_tokens`)."""
        return None

    def tokenize(self, text: str, *, add_bos: bool | None = None, special: bool = False) -> list[int]:
        """Tokens of `text` (BOS as the models' metadata says unless `add_bos` is given; special
        tokens such as <|im_start|> parsed only with `special`); all models must agree."""
        return tokenize_alike(self.models, text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.models[0].detokenize(tokens)

    def infill_sampler(self) -> InfillSampler:
        """llama.cpp's infill sampler over this vocabulary (built once, on first use; any thread)."""
        with self._vocabulary_lock:
            if self._infill is None:
                end = np.zeros(self.n_vocab, dtype=bool)
                end[sorted(self.end_tokens)] = True
                first = self.models[0]
                self._infill = InfillSampler(end, first.piece, first.eot if first.eot >= 0 else first.eos)
            return self._infill

    def token_bytes(self) -> TokenBytes:
        """The shared vocabulary's tokens by their bytes, for healing the cursor's token (built
        once, on first use; any thread)."""
        with self._vocabulary_lock:
            if self._token_bytes is None:
                self._token_bytes = TokenBytes(self.models[0].pieces()[: self.n_vocab])
            return self._token_bytes

    def vocabulary(self) -> Vocabulary:
        """The vocabulary as constraints see it (built once, on first use; any thread)."""
        with self._vocabulary_lock:
            if self._vocabulary is None:
                self._vocabulary = Vocabulary.of_model(self.models[0], self.n_vocab, sorted(self.end_tokens))
            return self._vocabulary
