"""What generations cost and how they went: one statistics type for every level and front end.

A `GenerationStats` holds counters (totals over one or more completions); every rate is derived
from them, so the statistics of many completions are the sum of their counters
(`GenerationStats.aggregate`, read from the fields' own metadata) and rates are never averaged.
The CLI's summary line and ``--json``, the bench's rows, the chat's panel and the server's
``localcos`` object all read it, at every level: a field that a level does not count is null in
`to_dict` (each field says which levels count it).

Words, the same in code, JSON and the README:
  proposed       draft tokens submitted to verification
  accepted       draft tokens accepted (the byte and mixed levels: draft symbols)
  rejected       draft tokens rejected (each rejection rolls the KV caches back and resamples
                 one token from the residual distribution)
  verifications  verification passes
  bonus          bonus tokens committed (sampled by a model right after scoring others' drafts)
  lookup_proposed, lookup_accepted
                 of the draft tokens: those looked up in the context (no model call)
  held_proposed, held_accepted
                 of the draft tokens: those the models' cells held after the prompt from an
                 earlier request (an editor's last suggestion, its first characters since typed)
  calls          llama_decode calls, per model
  gate_decided, gate_opened
                 with a gated combiner: tokens committed, and those where the gate opened (the
                 models were combined; elsewhere r was the lead model's own distribution)
  looked_ahead, lookahead_changed
                 with --lookahead: positions looked ahead from (r unsure there), and those where
                 a branch other than r's likeliest token won
  prompt_evaluated
                 of the prompt's tokens, those the models evaluated for it (the most any model
                 did); the others were in their caches from an earlier request
  bytes, chars   the byte and mixed levels: the text's length in bytes and characters
  drafted        the byte and mixed levels: draft symbols judged (cos)
  rows           the byte and mixed levels: path rows evaluated, per model (a model's `tokens`)
  most_paths, restarts, dropped_mass, folded, missed_rows
                 the byte and mixed levels, per model: the most paths held at once, paths rebuilt
                 from the model's tokenisation, probability mass pruned, paths folded into a
                 heavier one, rows a draft's scoring had not evaluated ahead
  ensemble_steps cos at the byte level: rounds where no model drafted
  token_bytes    the mixed level: bytes decoded as the lead's whole tokens
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any
from collections.abc import Sequence

from .core.level import Level


@dataclass
class ModelRunStats:
    """One model's work: llama_decode calls, tokens evaluated (at the byte and mixed levels: path
    rows), seconds inside llama.cpp."""

    name: str
    calls: int = 0
    tokens: int = 0
    seconds: float = 0.0


# how a field totals over completions (default: summed; lists model by model) and which levels
# count it (default: every level)
_FIRST = "first"  # what describes a request: the first completion's
_TOKEN = (Level.TOKEN,)
_BYTES = (Level.BYTE, Level.MIXED)


# the host's share of a run's wall time up to which the summary shows the ensemble estimate
ESTIMATE_HOST_SHARE = 0.1


def _meta(aggregate: Any = sum, levels: tuple[Level, ...] = tuple(Level)) -> dict[str, Any]:
    return {"aggregate": aggregate, "levels": levels}


@dataclass
class GenerationStats:
    """Counters of one or more generations with one set of models and one setting, at one level."""

    method: str = field(metadata=_meta(_FIRST))
    combiner: str = field(metadata=_meta(_FIRST))  # its description
    models: list[ModelRunStats] = field(metadata=_meta("models"))
    level: Level = field(default=Level.TOKEN, metadata=_meta(_FIRST))
    completions: int = 1
    tokens: int = 0  # generated tokens (the byte and mixed levels: the text in the lead model's tokens; 0 where nothing counts them)
    seconds: float = 0.0  # wall time of decoding (after the prompt)
    prompt_seconds: float = 0.0
    accepted: int = 0
    gate_decided: int = 0
    gate_opened: int = 0
    seed: int | None = field(default=None, metadata=_meta(_FIRST))
    finish_reason: str = field(default="", metadata=_meta("reasons"))  # "" where completions ended differently
    finish_reasons: dict[str, int] = field(default_factory=dict, metadata=_meta("reasons"))
    # the token level
    prompt_tokens: int = field(default=0, metadata=_meta(levels=_TOKEN))
    prompt_evaluated: int = field(default=0, metadata=_meta(levels=_TOKEN))  # of them, those a model evaluated (the rest were in its cache)
    proposed: int = field(default=0, metadata=_meta(levels=_TOKEN))
    rejected: int = field(default=0, metadata=_meta(levels=_TOKEN))
    verifications: int = field(default=0, metadata=_meta(levels=_TOKEN))
    bonus: int = field(default=0, metadata=_meta(levels=_TOKEN))
    lookup_proposed: int = field(default=0, metadata=_meta(levels=_TOKEN))
    lookup_accepted: int = field(default=0, metadata=_meta(levels=_TOKEN))
    held_proposed: int = field(default=0, metadata=_meta(levels=_TOKEN))
    held_accepted: int = field(default=0, metadata=_meta(levels=_TOKEN))
    looked_ahead: int = field(default=0, metadata=_meta(levels=_TOKEN))
    lookahead_changed: int = field(default=0, metadata=_meta(levels=_TOKEN))
    # proposal length per model (None: ensemble, or chosen online)
    gamma: list[int] | None = field(default=None, metadata=_meta(_FIRST, _TOKEN))
    proposer: int | None = field(default=None, metadata=_meta(_FIRST, _TOKEN))
    # --gamma auto: its plans and how often each was chosen, "I:G" (model I drafts G tokens) or
    # "none" (no draft: the ensemble's step, or the pending drafts verified) -> count
    plans: dict[str, int] = field(default_factory=dict, metadata=_meta("counts", _TOKEN))
    # what the standard ensemble would spend inside llama.cpp on these tokens: one single-token
    # call per model per token, at single-token call times measured on this ensemble
    ensemble_llama_seconds: float | None = field(default=None, metadata=_meta("known", _TOKEN))
    # the byte and mixed levels (per-model lists: one entry per model, as `models`)
    bytes: int = field(default=0, metadata=_meta(levels=_BYTES))
    chars: int = field(default=0, metadata=_meta(levels=_BYTES))
    drafted: int = field(default=0, metadata=_meta(levels=_BYTES))
    ensemble_steps: int = field(default=0, metadata=_meta(levels=_BYTES))
    most_paths: list[int] = field(default_factory=list, metadata=_meta(max, _BYTES))
    restarts: list[int] = field(default_factory=list, metadata=_meta(levels=_BYTES))
    dropped_mass: list[float] = field(default_factory=list, metadata=_meta(levels=_BYTES))
    folded: list[int] = field(default_factory=list, metadata=_meta(levels=_BYTES))
    missed_rows: list[int] = field(default_factory=list, metadata=_meta(levels=_BYTES))
    token_bytes: int = field(default=0, metadata=_meta(levels=(Level.MIXED,)))

    # --- derived ----------------------------------------------------------------------------------
    @property
    def llama_seconds(self) -> float:
        """Seconds inside llama.cpp (every model's llama_decode calls)."""
        return sum(m.seconds for m in self.models)

    @property
    def host_seconds(self) -> float:
        """Seconds outside llama.cpp: combining, sampling, verifying, text (measured around the
        llama.cpp calls, so never more than `seconds`)."""
        return self.seconds - self.llama_seconds

    @property
    def host_fraction(self) -> float | None:
        return self.host_seconds / self.seconds if self.seconds > 0 else None

    @property
    def calls(self) -> list[int]:
        return [m.calls for m in self.models]

    @property
    def tokens_per_second(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 and self.tokens else None

    @property
    def tested(self) -> int:
        """Draft tokens that got a verdict (those after a rejection in the same pass did not)."""
        return self.accepted + self.rejected

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / (accepted + rejected): estimates 1 - TV(r, q)."""
        return self.accepted / self.tested if self.tested else None

    @property
    def lookup_acceptance(self) -> float | None:
        """Looked-up draft tokens accepted / proposed."""
        return self.lookup_accepted / self.lookup_proposed if self.lookup_proposed else None

    @property
    def gate_open_rate(self) -> float | None:
        """Of the tokens a gated combiner decided, the share where the gate opened."""
        return self.gate_opened / self.gate_decided if self.gate_decided else None

    @property
    def mean_accepted(self) -> float | None:
        """Accepted draft tokens per verification pass."""
        return self.accepted / self.verifications if self.verifications else None

    @property
    def calls_per_token(self) -> float | None:
        """llama_decode calls of all models per generated token (the standard ensemble: n)."""
        return sum(self.calls) / self.tokens if self.tokens else None

    def model_calls_per_token(self) -> list[float | None]:
        return [m.calls / self.tokens if self.tokens else None for m in self.models]

    @property
    def speedup_estimate(self) -> float | None:
        """The standard ensemble's estimated llama.cpp time for these tokens over this run's."""
        if self.ensemble_llama_seconds is None or self.llama_seconds <= 0:
            return None
        return self.ensemble_llama_seconds / self.llama_seconds

    @property
    def shown_speedup_estimate(self) -> float | None:
        """`speedup_estimate` where it speaks for the wall time people see: the host's share of
        this run at most `ESTIMATE_HOST_SHARE` (beyond it, time outside llama.cpp, which the
        estimate does not price, moves the speed as much as the calls do)."""
        share = self.host_fraction
        return self.speedup_estimate if share is not None and share <= ESTIMATE_HOST_SHARE else None

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.models]

    @property
    def rows(self) -> list[int]:
        """The byte and mixed levels: path rows evaluated, per model."""
        return [m.tokens for m in self.models]

    @property
    def chars_per_second(self) -> float | None:
        return self.chars / self.seconds if self.seconds > 0 and self.chars else None

    @property
    def calls_per_char(self) -> list[float] | None:
        return [m.calls / self.chars for m in self.models] if self.chars else None

    # --- combining and showing --------------------------------------------------------------------
    @classmethod
    def aggregate(cls, stats: Sequence[GenerationStats]) -> GenerationStats:
        """Totals over completions of one request, read from the fields themselves: counters
        summed, per-model lists summed model by model (the most paths: the largest), what
        describes the request (level, method, combiner, seed, gamma) the first's, the standard
        ensemble's estimate summed where every completion has one."""
        if not stats:
            raise ValueError("no stats")
        first = stats[0]
        if any(len(s.models) != len(first.models) for s in stats):
            raise ValueError("stats of different sets of models")
        values: dict[str, Any] = {}
        for f in fields(cls):
            column = [getattr(s, f.name) for s in stats]
            how = f.metadata.get("aggregate", sum)
            if how == _FIRST:
                values[f.name] = column[0]
            elif how == "models":
                values[f.name] = [ModelRunStats(m.name, *(sum(getattr(s.models[i], k) for s in stats) for k in ("calls", "tokens", "seconds")))
                                  for i, m in enumerate(first.models)]  # fmt: skip
            elif how == "known":
                values[f.name] = None if any(v is None for v in column) else sum(column)
            elif how == "reasons":
                continue
            elif how == "counts":
                values[f.name] = _added(column)
            elif isinstance(column[0], list):
                values[f.name] = [how(per_model) for per_model in zip(*column)]
            else:
                values[f.name] = how(column)
        reasons = _added([s.finish_reasons or {s.finish_reason: 1} for s in stats])
        values["finish_reasons"] = reasons
        values["finish_reason"] = next(iter(reasons)) if len(reasons) == 1 else ""
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Counters and derived rates, for JSON: the same keys at every level, null where this
        level does not count a value."""
        d = asdict(self)
        d["level"] = self.level.value
        for f in fields(self):
            if self.level not in f.metadata.get("levels", tuple(Level)):
                d[f.name] = None
        for m, calls_per_token in zip(d["models"], self.model_calls_per_token()):
            m["calls_per_token"] = calls_per_token
        for key, levels in _DERIVED.items():
            d[key] = getattr(self, key) if self.level in levels else None
        return d

    def summary(self) -> str:
        """One line for people."""
        return _REPORTS[self.level].summary(self)

    @property
    def length(self) -> int:
        """The text's length in its level's unit (`Level.unit`): tokens, or characters at the byte
        and mixed levels."""
        return _REPORTS[self.level].length(self)

    @property
    def per_second(self) -> float | None:
        """`length` per second of decoding."""
        return _REPORTS[self.level].per_second(self)

    @property
    def acceptance(self) -> str:
        """What of the drafts was accepted, for people: a rate at the token level, accepted of
        judged draft symbols at the byte and mixed levels; "-" where nothing drafted."""
        return _REPORTS[self.level].acceptance(self)

    @property
    def context_tokens(self) -> int | None:
        """The tokens the text takes in the context, or None at the byte and mixed levels (each
        model counts it in its own tokens)."""
        return _REPORTS[self.level].context_tokens(self)

    def per_model(self) -> tuple[str, list[str]]:
        """What the chat's panel says of each model: a heading and one line per model."""
        return _REPORTS[self.level].per_model(self)


def level_details(level: Level, stats: GenerationStats | None) -> list[tuple[str, str]]:
    """The chat panel's name/value lines that only `level` counts (at the token level: drafts'
    mean length, looked-up tokens, calls per token, the estimated speedup), from `stats` (the
    last reply's; None: none yet, every value "-")."""
    return _REPORTS[level].details(stats)


def reply_progress(level: Level, pieces: int, text: str) -> tuple[int, int | None]:
    """A streaming reply's length in `level`'s unit (`Level.unit`) and the tokens it adds to the
    context, from the pieces streamed so far and their text: at the token level each piece is a
    token; at the byte and mixed levels the pieces are text (length: characters) and each model
    counts it in its own tokens (None)."""
    return _REPORTS[level].progress(pieces, text)


def _added(counts: Sequence[dict[str, int]]) -> dict[str, int]:
    """Counts by key, summed over dicts (a key's first appearance sets its place)."""
    total: dict[str, int] = {}
    for c in counts:
        for key, n in c.items():
            total[key] = total.get(key, 0) + n
    return total


def plan_counts(plans: dict[tuple[int, int], int]) -> dict[str, int]:
    """--gamma auto's (proposer, gamma) -> count as `GenerationStats.plans` keys them."""
    return _added([{f"{proposer}:{gamma}" if gamma else "none": n} for (proposer, gamma), n in plans.items()])


def describe_plans(s: GenerationStats) -> str:
    """--gamma auto's plans for people, likeliest first: "coder-0.5b 4 x9, 3 x2; no draft x3"."""
    drafts: dict[str, list[str]] = {}
    for key, n in sorted(s.plans.items(), key=lambda kv: -kv[1]):
        if key != "none":
            proposer, gamma = key.split(":")
            drafts.setdefault(s.models[int(proposer)].name, []).append(f"{gamma} x{n}")
    parts = [f"{name} {', '.join(lengths)}" for name, lengths in drafts.items()]
    if "none" in s.plans:
        parts.append(f"no draft x{s.plans['none']}")
    return "; ".join(parts)


def dash(x: float | None, spec: str, suffix: str = "") -> str:
    """`x` formatted by `spec` (and `suffix`), or "-" where it is None."""
    return "-" if x is None else format(x, spec) + suffix


class _TokenReport:
    """How the statistics of a generation at the token level read for people."""

    def summary(self, s: GenerationStats) -> str:
        parts = [
            s.method,
            f"{s.tokens} tokens in {s.seconds:.2f}s",
            f"{s.tokens_per_second:.1f} tok/s" if s.tokens_per_second else "- tok/s",
        ]
        if s.acceptance_rate is not None:
            parts.append(f"acceptance {s.acceptance_rate:.0%} ({s.accepted}/{s.tested})")
            parts.append(f"mean accepted {s.mean_accepted:.2f}")
        if s.lookup_proposed:
            parts.append(f"looked up {s.lookup_accepted}/{s.lookup_proposed}")
        if s.held_proposed:
            parts.append(f"held {s.held_accepted}/{s.held_proposed}")
        if s.gate_decided:
            parts.append(f"gate open {s.gate_opened}/{s.gate_decided}")
        if s.looked_ahead:
            parts.append(f"looked ahead {s.looked_ahead}x, changed {s.lookahead_changed}")
        parts.append("calls " + "/".join(str(c) for c in s.calls))
        if s.host_fraction is not None:
            parts.append(f"host {s.host_fraction:.0%}")
        if s.plans:
            parts.append(f"planned {describe_plans(s)}")
        if s.method != "ensemble" and s.shown_speedup_estimate:
            parts.append(f"~{s.shown_speedup_estimate:.2f}x the ensemble (est.)")
        if s.seed is not None:
            parts.append(f"seed {s.seed}")
        return " | ".join(parts)

    def length(self, s: GenerationStats) -> int:
        return s.tokens

    def per_second(self, s: GenerationStats) -> float | None:
        return s.tokens_per_second

    def context_tokens(self, s: GenerationStats) -> int | None:
        return s.tokens

    def progress(self, pieces: int, text: str) -> tuple[int, int | None]:
        return pieces, pieces

    def acceptance(self, s: GenerationStats) -> str:
        return dash(s.acceptance_rate, ".0%")

    def details(self, s: GenerationStats | None) -> list[tuple[str, str]]:
        speedup = None
        if s is not None:
            speedup = s.shown_speedup_estimate if s.method != "ensemble" else (1.0 if s.tokens else None)
        return [
            ("mean accepted", dash(s.mean_accepted if s else None, ".2f")),
            ("looked up", f"{s.lookup_accepted}/{s.lookup_proposed}" if s and s.lookup_proposed else "-"),
            ("calls/token", dash(s.calls_per_token if s else None, ".2f")),
            ("speedup (est.)", dash(speedup, ".2f", "x")),
        ]

    def per_model(self, s: GenerationStats) -> tuple[str, list[str]]:
        return "calls per model", [f"{m.name[:18]:<18} {m.calls}" for m in s.models]


class _ByteReport:
    """How the statistics of a generation at the byte level read for people."""

    def heading(self, s: GenerationStats) -> str:
        return "byte level"

    def summary(self, s: GenerationStats) -> str:
        chars = max(s.chars, 1)
        per_model = ", ".join(
            f"{m.name}: {m.calls / chars:.2f} calls/char, {p} paths at most, {d:.2g} mass dropped, {f} folded, {r} restarts"
            for m, p, d, f, r in zip(s.models, s.most_paths, s.dropped_mass, s.folded, s.restarts)
        )
        drafts = f"; {s.accepted}/{s.drafted} draft symbols accepted, {s.ensemble_steps} ensemble steps" if s.method == "cos" else ""
        gate = f"; gate open {s.gate_opened}/{s.gate_decided}" if s.gate_decided else ""
        speed = f"{s.chars_per_second or 0.0:.1f} chars/s"
        seed = f"; seed {s.seed}" if s.seed is not None else ""
        return f"{self.heading(s)}: {s.chars} chars in {s.seconds:.2f} s ({speed}); {per_model}{drafts}{gate}{seed}"

    def length(self, s: GenerationStats) -> int:
        return s.chars

    def per_second(self, s: GenerationStats) -> float | None:
        return s.chars_per_second

    def context_tokens(self, s: GenerationStats) -> int | None:
        return None

    def progress(self, pieces: int, text: str) -> tuple[int, int | None]:
        return len(text), None

    def acceptance(self, s: GenerationStats) -> str:
        return f"{s.accepted}/{s.drafted}" if s.drafted else "-"

    def details(self, s: GenerationStats | None) -> list[tuple[str, str]]:
        return []

    def per_model(self, s: GenerationStats) -> tuple[str, list[str]]:
        return "calls/char, paths", [f"{m.name[:14]:<14} {m.calls / max(s.chars, 1):.2f} {paths}" for m, paths in zip(s.models, s.most_paths)]


class _MixedReport(_ByteReport):
    """The byte level's report, saying how much of the text was the lead's whole tokens."""

    def heading(self, s: GenerationStats) -> str:
        return f"mixed level ({s.token_bytes}/{s.bytes} bytes as whole tokens)"


# how each level's statistics read for people (the summary line, the chat's panel)
_REPORTS: dict[Level, _TokenReport | _ByteReport] = {Level.TOKEN: _TokenReport(), Level.BYTE: _ByteReport(), Level.MIXED: _MixedReport()}


# the rates `to_dict` adds, and the levels that have them
_DERIVED: dict[str, tuple[Level, ...]] = {
    "llama_seconds": tuple(Level), "host_seconds": tuple(Level), "host_fraction": tuple(Level), "calls": tuple(Level),
    "calls_per_token": tuple(Level), "gate_open_rate": tuple(Level), "tokens_per_second": tuple(Level),
    "acceptance_rate": _TOKEN, "lookup_acceptance": _TOKEN, "mean_accepted": _TOKEN,
    "speedup_estimate": _TOKEN,
    "rows": _BYTES, "chars_per_second": _BYTES, "calls_per_char": _BYTES,
}  # fmt: skip
