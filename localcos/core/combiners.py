"""Combination functions: how the models' next-token distributions become one distribution r.

A combiner takes one logits array per model (in the user's model order), each of shape
[positions, vocab], and a temperature, and returns r as probabilities of the same shape. Built in:

* `WeightedEnsemble` (`we`): r = sum_k w_k softmax(l_k / T)                (probability level)
* `Contrastive` (`cd`):      r = softmax((l_expert - mu * l_amateur) / T)  (logit level), with the
  optional plausibility constraint of Li et al. (2023): only tokens with
  p_expert(x) >= alpha * max p_expert may be chosen.
* `LogitMix` (`logit-mix`):  r = softmax(sum_k w_k l_k / T)                 (logit level)
* `CustomCombiner`: any user function, at the logit or probability level.

Greedy decoding (T = 0) computes r at T = 1; the sampler then takes its argmax.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import ConfigError, check_range
from .sampling import softmax
from .sizes import largest


def normalise_weights(weights: Sequence[float], n_models: int) -> tuple[float, ...]:
    """Check one finite, non-negative weight per model with a positive sum; scale to sum 1."""
    w = [float(x) for x in weights]
    if len(w) != n_models:
        raise ConfigError(f"got {len(w)} weights for {n_models} models; give one weight per model", param="weights")
    if any(not math.isfinite(x) for x in w):
        raise ConfigError("weights must be finite numbers", param="weights")
    if any(x < 0 for x in w):
        raise ConfigError(f"weights must be >= 0, got {', '.join(f'{x:g}' for x in w)}", param="weights")
    total = sum(w)
    if total <= 0:
        raise ConfigError("weights must have a positive sum", param="weights")
    return tuple(x / total for x in w)


MAX_MU = 1e6  # mu x logits stays finite in float32


def check_mu(mu: float, what: str) -> float:
    """The one rule of contrastive decoding's mu: finite, 0 <= mu <= MAX_MU."""
    return check_range(mu, what, minimum=0, maximum=MAX_MU)


def check_plausibility(alpha: float, what: str) -> float:
    """The one rule of the plausibility threshold alpha: 0 < alpha <= 1."""
    return check_range(alpha, what, above=0, maximum=1)


def check_gate(gate: float, what: str) -> float:
    """The one rule of a gate (the lead model's top probability at which it decides alone):
    0 < gate <= 1."""
    return check_range(gate, what, above=0, maximum=1)


class Combiner(ABC):
    """Turns per-model logits into the combined distribution r."""

    name: str = "combiner"
    # True when r is a function of the models' softmax(l_k / T) alone, computed by `mix`: the
    # decoder then reuses the softmax a proposer already computed for its draft token.
    mixes_probs: bool = False

    def bind(self, n_models: int, n_params: Sequence[int]) -> BoundCombiner:
        """This combiner fitted to an ensemble of `n_models` models (`ConfigError` if it does not
        fit, e.g. weights for another number of models), with its defaults filled in: the only
        kind the decoder and the scorer take. `n_params` (parameter counts, in model order) lets a
        combiner pick roles, such as the expert of contrastive decoding. A generation binds its
        combiner once."""
        return BoundCombiner(self.fit(n_models, n_params), n_models)

    def fit(self, n_models: int, n_params: Sequence[int]) -> Combiner:
        """The combiner with its defaults filled in for this ensemble, checked against it; a
        combiner with parameters that depend on the ensemble overrides this."""
        return self

    @abstractmethod
    def combine(self, logits: Sequence[np.ndarray], temperature: float) -> np.ndarray:
        """r for every row: [positions, vocab] probabilities (float32, rows sum to 1)."""

    def mix(self, probs: Sequence[np.ndarray]) -> np.ndarray:
        """r from softmax(l_k / T) per model, for combiners with `mixes_probs`. Must not change
        `probs` (the decoder keeps them)."""
        raise NotImplementedError(f"{self.name} combines logits")

    def describe(self) -> str:
        return self.name

    def uses(self, n_models: int) -> tuple[bool, ...]:
        """Which models r depends on (bound combiners). The decoder never evaluates a model for r
        that r does not use, and passes None in its place to `combine` and `mix`."""
        return (True,) * n_models

    def single_model(self) -> int | None:
        """The model i when r is exactly softmax(l_i / T), its own distribution (single-target
        speculative decoding: weights 0 and 1); the decoder then skips the combination."""
        return None

    def lead_of(self) -> int | None:
        """The model this combination itself puts first (fitted), where a gate's lead is not
        named: None where it puts none first (then the largest leads: `default_lead`)."""
        return None


class BoundCombiner:
    """A combiner fitted to one ensemble (`Combiner.bind`): what the decoder, the scorer and the
    statistics take. What they ask of it is known once here: which models r uses, whether r is
    one model's own distribution, and its description. Its parameters (`weights`, `expert`,
    `mu`, ...) read through to the fitted combiner."""

    def __init__(self, combiner: Combiner, n_models: int) -> None:
        self.combiner = combiner
        self.n_models = n_models
        self.used: tuple[bool, ...] = combiner.uses(n_models)  # the models r depends on
        self.single: int | None = combiner.single_model()  # r = softmax(l_i / T) of this model
        self.mixes_probs = combiner.mixes_probs
        self.name = combiner.name
        self.description = combiner.describe()
        # gated (`Gated`): r is the lead's own distribution where the gate is shut, `inner`'s
        # combination where it opens; the decoder asks the other models only there
        self.gate: Gated | None = combiner if isinstance(combiner, Gated) and self.single is None else None
        self.inner: BoundCombiner = BoundCombiner(self.gate.inner, n_models) if self.gate is not None else self
        self._shut_asks = tuple(u and (self.gate is None or i == self.gate.lead) for i, u in enumerate(self.used))

    def lead_model(self, n_params: Sequence[int]) -> int:
        """The model that leads: the gate's lead, the model r is alone, else `default_lead` (what
        a byte-level text's length is counted in: its tokens)."""
        if isinstance(self.combiner, Gated):
            assert self.combiner.lead is not None
            return self.combiner.lead
        if self.single is not None:
            return self.single
        return default_lead(self.combiner, n_params)

    def asks(self, opened: bool) -> tuple[bool, ...]:
        """The models r needs at a position, the one rule of lazy members at every level: those it
        uses where the gate opens (`opened`) or where no gate stands; where a gate is shut, the
        lead alone. A model not asked for is not evaluated there."""
        return self.used if opened else self._shut_asks

    def bind(self, n_models: int, n_params: Sequence[int]) -> BoundCombiner:
        """Itself, when it is bound for this many models already."""
        if n_models == self.n_models:
            return self
        return self.combiner.bind(n_models, n_params)

    def combine(self, logits: Sequence[np.ndarray | None], temperature: float) -> np.ndarray:
        return self.combiner.combine(logits, temperature)  # type: ignore[arg-type]

    def mix(self, probs: Sequence[np.ndarray | None]) -> np.ndarray:
        return self.combiner.mix(probs)  # type: ignore[arg-type]

    def describe(self) -> str:
        return self.description

    def uses(self, n_models: int) -> tuple[bool, ...]:
        return self.used

    def single_model(self) -> int | None:
        return self.single

    def __getattr__(self, name: str) -> object:
        return getattr(self.__dict__["combiner"], name)

    def __repr__(self) -> str:
        return f"BoundCombiner({self.description})"


class _Weighted(Combiner):
    """A combiner with one weight per model (default: equal weights)."""

    def __init__(self, weights: Sequence[float] | None = None) -> None:
        self.weights: tuple[float, ...] | None = None if weights is None else tuple(weights)

    def fit(self, n_models: int, n_params: Sequence[int]) -> _Weighted:
        weights = self.weights if self.weights is not None else [1.0] * n_models
        return type(self)(normalise_weights(weights, n_models))

    def describe(self) -> str:
        return f"{self.name}(" + ",".join(f"{w:g}" for w in self.weights or ()) + ")"

    def uses(self, n_models: int) -> tuple[bool, ...]:
        assert self.weights is not None, "bind() the combiner first"
        return tuple(w > 0 for w in self.weights)  # a model of weight 0 adds nothing to r

    def single_model(self) -> int | None:
        # weights sum to 1: one positive weight is 1, and r = softmax(l_i / T) (both levels)
        assert self.weights is not None, "bind() the combiner first"
        used = [i for i, w in enumerate(self.weights) if w > 0]
        return used[0] if len(used) == 1 else None


class WeightedEnsemble(_Weighted):
    """Probability-level weighted ensemble: r = sum_k w_k softmax(l_k / T)."""

    name = "we"
    mixes_probs = True

    def combine(self, logits: Sequence[np.ndarray], temperature: float) -> np.ndarray:
        assert self.weights is not None, "bind() the combiner first"
        return self.mix([softmax(z, temperature) if w else None for w, z in zip(self.weights, logits)])

    def mix(self, probs: Sequence[np.ndarray | None]) -> np.ndarray:
        """sum_k w_k p_k as a new array; models with weight 0 may pass None."""
        assert self.weights is not None, "bind() the combiner first"
        r: np.ndarray | None = None
        for w, p in zip(self.weights, probs):
            if w == 0.0:
                continue
            assert p is not None
            if r is None:
                r = np.multiply(p, np.float32(w), dtype=np.float32)
            else:
                r += np.float32(w) * p
        assert r is not None
        return r


class Contrastive(Combiner):
    """Contrastive decoding: r = softmax((l_expert - mu * l_amateur) / T).

    Args:
        mu: the amateur's weight (>= 0; 0.1 in the CoS paper).
        plausibility: alpha of Li et al.: keep only tokens with p_expert >= alpha * max p_expert
            (p_expert at temperature 1). None (the paper's setting) keeps every token.
        expert: index of the expert model; default the model with more parameters (ties: the
            second). The other model is the amateur.
    """

    name = "cd"

    def __init__(self, mu: float = 0.1, plausibility: float | None = None, expert: int | None = None) -> None:
        check_mu(mu, "mu")
        if plausibility is not None:
            check_plausibility(plausibility, "plausibility alpha")
        self.mu = float(mu)
        self.plausibility = plausibility
        self.expert = expert

    def fit(self, n_models: int, n_params: Sequence[int]) -> Contrastive:
        if n_models != 2:
            raise ConfigError(f"contrastive decoding combines exactly 2 models (an amateur and an expert), got {n_models}", param="combine")
        expert = self.expert
        if expert is None:
            expert = 0 if n_params[0] > n_params[1] else 1
        if expert not in (0, 1):
            raise ConfigError(f"expert must be model 0 or 1, got {expert}", param="expert")
        return Contrastive(self.mu, self.plausibility, expert)

    @property
    def amateur(self) -> int:
        assert self.expert is not None
        return 1 - self.expert

    def lead_of(self) -> int | None:
        return self.expert

    def uses(self, n_models: int) -> tuple[bool, ...]:
        assert self.expert is not None, "bind() the combiner first"
        return tuple(i == self.expert or self.mu > 0 for i in range(2))  # mu = 0: the expert alone

    def single_model(self) -> int | None:
        return self.expert if self.mu == 0 and self.plausibility is None else None

    def combine(self, logits: Sequence[np.ndarray], temperature: float) -> np.ndarray:
        assert self.expert is not None, "bind() the combiner first"
        expert = np.asarray(logits[self.expert], dtype=np.float32)
        if self.mu == 0:
            z = expert.copy()  # the amateur is not evaluated (see uses())
        else:
            with np.errstate(invalid="ignore"):
                z = expert - np.float32(self.mu) * np.asarray(logits[self.amateur], dtype=np.float32)
        z[np.isneginf(expert)] = -np.inf  # banned tokens: -inf - mu * -inf is nan
        if self.plausibility is not None:
            # p_expert(x) >= alpha * max p_expert  <=>  l(x) >= max l + log(alpha)
            cut = expert.max(axis=-1, keepdims=True) + math.log(self.plausibility)
            z[expert < cut] = -np.inf
        return softmax(z, temperature)

    def describe(self) -> str:
        alpha = f",alpha={self.plausibility:g}" if self.plausibility is not None else ""
        return f"cd(mu={self.mu:g},expert={self.expert}{alpha})"


MAX_SCALE = 20.0  # guidance's scale: beyond it the negative member's logits would swamp the row


def check_scale(scale: float, what: str) -> float:
    """The one rule of guidance's scale: finite, 0 < scale <= MAX_SCALE (1: the positive member
    alone; above 1 toward what its prompt adds to the negative's)."""
    return check_range(scale, what, above=0, maximum=MAX_SCALE)


class Guidance(Combiner):
    """Classifier-free guidance between two members, one model under two prompts (Sanchez et al.
    2023): r = softmax((l_neg + s * (l_pos - l_neg)) / T), the positive member reading the
    prompt, the negative one a weaker prompt. s = 1 is the positive member alone (the negative
    is then never evaluated); s > 1 pushes toward what the prompt adds.

    Args:
        scale: s (0 < s <= MAX_SCALE).
        positive: index of the positive member; default the one with more parameters (a member
            reading a second prompt counts one fewer than its model: the one reading the prompt).
    """

    name = "cfg"

    def __init__(self, scale: float = 1.5, positive: int | None = None) -> None:
        self.scale = check_scale(float(scale), "cfg scale")
        self.positive = positive

    def fit(self, n_models: int, n_params: Sequence[int]) -> Guidance:
        if n_models != 2:
            raise ConfigError(f"guidance (--cfg-scale) combines exactly 2 members, a prompt and a negative prompt; got {n_models}", param="cfg_scale")
        positive = self.positive
        if positive is None:
            positive = 0 if n_params[0] >= n_params[1] else 1
        if positive not in (0, 1):
            raise ConfigError(f"the positive member must be 0 or 1, got {positive}", param="cfg_scale")
        return Guidance(self.scale, positive)

    @property
    def negative(self) -> int:
        assert self.positive is not None, "bind() the combiner first"
        return 1 - self.positive

    def lead_of(self) -> int | None:
        return self.positive

    def uses(self, n_models: int) -> tuple[bool, ...]:
        assert self.positive is not None, "bind() the combiner first"
        return tuple(i == self.positive or self.scale != 1 for i in range(2))  # s = 1: the positive alone

    def single_model(self) -> int | None:
        return self.positive if self.scale == 1 else None

    def combine(self, logits: Sequence[np.ndarray], temperature: float) -> np.ndarray:
        assert self.positive is not None, "bind() the combiner first"
        positive = np.asarray(logits[self.positive], dtype=np.float32)
        if self.scale == 1:
            return softmax(positive, temperature)  # the negative is not evaluated (see uses())
        negative = np.asarray(logits[self.negative], dtype=np.float32)
        with np.errstate(invalid="ignore"):
            z = negative + np.float32(self.scale) * (positive - negative)
        z[np.isneginf(positive)] = -np.inf  # banned tokens: inf - inf is nan
        return softmax(z, temperature)

    def describe(self) -> str:
        return f"cfg(s={self.scale:g},positive={self.positive})"


class LogitMix(_Weighted):
    """Logit-level mixture: r = softmax(sum_k w_k l_k / T) (e.g. decoding-time realignment)."""

    name = "logit-mix"

    def combine(self, logits: Sequence[np.ndarray], temperature: float) -> np.ndarray:
        assert self.weights is not None, "bind() the combiner first"
        z: np.ndarray | None = None
        for w, row in zip(self.weights, logits):
            if w != 0.0:
                term = np.float32(w) * np.asarray(row, dtype=np.float32)
                z = term if z is None else z + term
        assert z is not None
        return softmax(z, temperature)


class CustomCombiner(Combiner):
    """A user-written combination function.

    Args:
        fn: called with a list of per-model arrays of shape [positions, vocab] in model order,
            returning one array of that shape.
        level: "logits": fn gets raw logits and returns combined logits; r = softmax(out / T).
            "probs": fn gets softmax(l_k / T) per model and returns (unnormalised) probabilities.
        name: shown in stats.
    """

    def __init__(self, fn: Callable[[list[np.ndarray]], np.ndarray], level: str = "logits", name: str | None = None) -> None:
        if level not in ("logits", "probs"):
            raise ConfigError(f"custom combiner level must be 'logits' or 'probs', got {level!r}", param="combine_level")
        if not callable(fn):
            raise ConfigError("a custom combiner must be callable", param="combine")
        self.fn = fn
        self.level = level
        self.name = name or str(getattr(fn, "__name__", "custom"))

    def combine(self, logits: Sequence[np.ndarray], temperature: float) -> np.ndarray:
        if self.level == "logits":
            out = np.asarray(self.fn([np.asarray(z, dtype=np.float64) for z in logits]), dtype=np.float64)
            self._check_shape(out, logits[0])
            if np.isnan(out).any():
                raise ConfigError(f"combiner {self.name} returned NaN logits", param="combine")
            return softmax(out, temperature)
        out = np.array(self.fn([softmax(z, temperature) for z in logits]), dtype=np.float64)
        self._check_shape(out, logits[0])
        if not np.isfinite(out).all() or (out < 0).any():
            raise ConfigError(f"combiner {self.name} must return finite, non-negative probabilities", param="combine")
        total = out.sum(axis=-1, keepdims=True)
        if (total <= 0).any():
            raise ConfigError(f"combiner {self.name} returned a distribution with zero mass", param="combine")
        return (out / total).astype(np.float32)

    def _check_shape(self, out: np.ndarray, like: np.ndarray) -> None:
        if out.shape != np.shape(like):
            raise ConfigError(f"combiner {self.name} returned shape {out.shape}, expected {np.shape(like)}", param="combine")


def default_lead(combiner: Combiner, n_params: Sequence[int]) -> int:
    """The model that leads where the settings name none: the combiner's own (`Combiner.lead`:
    contrastive decoding's expert, guidance's positive member), else the largest."""
    own = combiner.lead_of()
    return largest(n_params) if own is None else own


class Gated(Combiner):
    """`inner`'s combination only where the lead model is unsure: r is the lead's own
    distribution, softmax(l_lead / T), at every position where its top probability (at
    temperature 1) is at least `gate`, and `inner`'s r elsewhere (SAFE, GaC: combining at every
    token drags a strong model toward a weaker one). Still a function of the models' rows at each
    position, so every method stays exact; the decoders evaluate the other models only where the
    gate opens (`BoundCombiner.asks`: lazy members, at every level).

    Args:
        inner: the combination where the gate opens.
        gate: the lead's top probability at or above which it decides alone (0 < gate <= 1; 1
            opens the gate wherever the lead is not certain); kept as `threshold`.
        lead: the lead model's index; default the expert of contrastive decoding, else the model
            with the most parameters (ties: the last).
    """

    def __init__(self, inner: Combiner, gate: float, lead: int | None = None) -> None:
        if isinstance(inner, Gated):
            raise ConfigError("a gated combiner is gated once", param="gate")
        self.inner = inner
        self.threshold = check_gate(gate, "gate")
        self.lead = lead
        self.name = inner.name

    def fit(self, n_models: int, n_params: Sequence[int]) -> Gated:
        inner = self.inner.fit(n_models, n_params)
        lead = default_lead(inner, n_params) if self.lead is None else self.lead
        if not 0 <= lead < n_models:
            raise ConfigError(f"lead must be a model index from 0 to {n_models - 1}, got {lead}", param="lead")
        return Gated(inner, self.threshold, lead)

    def shut(self, top: float | np.ndarray) -> bool | np.ndarray:
        """The gate's one rule: the lead decides alone where its top probability `top` (at
        temperature 1: of a token, of a byte symbol, of a whole token at the mixed level) is at
        least the threshold; elsewhere the gate opens."""
        return top >= self.threshold

    def opens(self, lead_logits: np.ndarray) -> np.ndarray:
        """Where the gate opens, for rows of the lead's logits ([positions, vocab])."""
        z = np.asarray(lead_logits, dtype=np.float32)
        top = z.max(axis=-1, keepdims=True)
        mass = np.exp(z - top).sum(axis=-1, dtype=np.float64)  # 1 / (the top probability)
        return ~np.asarray(self.shut(1.0 / mass))

    def compose(self, lead: np.ndarray, opened: np.ndarray, inner: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """r from the gate's decisions, the one composition of every level: `lead` (the lead's own
        distribution, [positions, vocab], filled in and returned) where the gate is shut, and
        `inner(opened)` (the inner combination at the rows where it opens) there. `opened`: one
        bool per row, decided once per position by the caller (`opens` on the lead's logits, or
        `shut` on its top probability)."""
        if opened.any():
            lead[opened] = inner(opened)
        return lead

    def combine(self, logits: Sequence[np.ndarray | None], temperature: float, opened: np.ndarray | None = None) -> np.ndarray:
        """r for every row; where the gate opens is `opened` where the caller decided it (the
        other models' rows may be None where it is shut), else decided here from the lead's logits."""
        assert self.lead is not None, "bind() the combiner first"
        lead = np.asarray(logits[self.lead], dtype=np.float32)
        return self.compose(softmax(lead, temperature), self.opens(lead) if opened is None else opened,
                            lambda rows: self.inner.combine(_rows_of(logits, rows), temperature))

    def uses(self, n_models: int) -> tuple[bool, ...]:
        return tuple(u or i == self.lead for i, u in enumerate(self.inner.uses(n_models)))

    def single_model(self) -> int | None:
        # the inner combination is the lead's own distribution: so is r, wherever the gate stands
        return self.lead if self.inner.single_model() == self.lead else None

    def describe(self) -> str:
        return f"{self.inner.describe()}+gate({self.threshold:g},lead={self.lead})"


def _rows_of(logits: Sequence[np.ndarray | None], rows: np.ndarray) -> list[np.ndarray]:
    """Those rows of each member's logits; a member r does not use stays None (what `combine`
    takes in its place, as the decoder passes it)."""
    return [None if z is None else np.asarray(z)[rows] for z in logits]  # type: ignore[misc]


def load_function(spec: str) -> Callable[[list[np.ndarray]], np.ndarray]:
    """The function named by ``path/to/file.py:function`` or ``package.module:function``: the
    file is executed (the module imported) to find it. Only the user's own command line, Python
    code or models.toml names one; a server request never does (see `settings.parse_served_combine`)."""
    if ":" not in spec:
        raise ConfigError(f"custom combiner must look like FILE.py:FUNCTION or MODULE:FUNCTION, got {spec!r}", param="combine")
    where, func = spec.rsplit(":", 1)
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise ConfigError(f"combiner file not found: {where}", param="combine")
            mod_spec = importlib.util.spec_from_file_location(f"localcos_user_{path.stem}", path)
            assert mod_spec and mod_spec.loader
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[mod_spec.name] = module
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ConfigError:
        raise
    except Exception as e:  # the user's module failed to import
        raise ConfigError(f"cannot import combiner module {where}: {type(e).__name__}: {e}", param="combine") from e
    fn = getattr(module, func, None)
    if fn is None:
        raise ConfigError(f"{where} has no function {func}", param="combine")
    return fn


def custom_name(spec: str) -> str:
    """The name a custom combiner ``WHERE:FUNCTION`` is shown by: FUNCTION."""
    return spec.rsplit(":", 1)[-1]


def load_custom(spec: str, level: str = "logits") -> CustomCombiner:
    """A `CustomCombiner` from ``path/to/file.py:function`` or ``package.module:function``."""
    return CustomCombiner(load_function(spec), level=level, name=custom_name(spec))


@dataclass(frozen=True)
class CombinerKind:
    """A built-in combiner the settings layer names (`--combine NAME`, a request's `combine`, a
    preset's): how it is made from the combination's values (`make`, called with the ones it
    `reads`, by name: weights, mu, plausibility, expert, scale) and what `--help` says of it.
    Its lead, where a gate's is not named, is its class's own rule (`Combiner.lead`)."""

    name: str
    make: Callable[..., Combiner]
    reads: tuple[str, ...]
    help: str


COMBINERS: dict[str, CombinerKind] = {}


def register(kind: CombinerKind) -> CombinerKind:
    """Add a combiner to the ones every front end can name: parsing, `--help`, presets and the
    server's requests take it from here."""
    COMBINERS[kind.name] = kind
    return kind


register(CombinerKind("we", lambda weights: WeightedEnsemble(weights), ("weights",), "weighted ensemble, r = sum w_i softmax(l_i / T)"))
register(CombinerKind("cd", lambda mu, plausibility, expert: Contrastive(mu, plausibility, expert), ("mu", "plausibility", "expert"),
                      "contrastive decoding, r = softmax((l_expert - mu l_amateur) / T)"))  # fmt: skip
register(CombinerKind("logit-mix", lambda weights: LogitMix(weights), ("weights",), "r = softmax(sum w_i l_i / T)"))
register(CombinerKind("cfg", lambda scale: Guidance(scale), ("scale",), "classifier-free guidance of a model against itself under a second prompt"))

def combiner_names() -> str:
    """The names a --combine takes, for messages and help: the registry's, then a function."""
    return ", ".join(COMBINERS) + " or FILE.py:FUNCTION"


def make_combiner(
    kind: str,
    *,
    weights: Sequence[float] | None = None,
    mu: float = 0.1,
    plausibility: float | None = None,
    expert: int | None = None,
    level: str = "logits",
    gate: float | None = None,
    lead: int | None = None,
    scale: float = 1.5,
) -> Combiner:
    """A combiner by its registered name (`COMBINERS`), or FILE.py:FUNCTION / MODULE:FUNCTION;
    with `gate`, combined only where the lead model is unsure (`gated`). Weights given to a
    combiner that reads none are refused, not ignored."""
    values = {"weights": weights, "mu": mu, "plausibility": plausibility, "expert": expert, "scale": scale}
    registered = COMBINERS.get(kind)
    if registered is None:
        if ":" not in kind:
            raise ConfigError(f"unknown combiner {kind!r}; use {combiner_names()}", param="combine")
        return gated(load_custom(kind, level), gate, lead)
    if weights is not None and "weights" not in registered.reads:
        # named as the keywords here; the settings layer names them as flags or fields (`config.specs.check_for_models`)
        raise ConfigError(f"weights does not apply to {kind}; it reads {', '.join(registered.reads)}", param="weights", code="unsupported_parameter")
    return gated(registered.make(**{name: values[name] for name in registered.reads}), gate, lead)


def gated(inner: Combiner, gate: float | None, lead: int | None = None) -> Combiner:
    """`inner` combined only where the lead model is unsure (`Gated`), or `inner` itself without
    a gate (a lead without a gate is refused: it would have no effect)."""
    if gate is None:
        if lead is not None:
            raise ConfigError("--lead names the model a --gate leaves alone where it is sure: give --gate too", param="lead")
        return inner
    return Gated(inner, gate, lead)
