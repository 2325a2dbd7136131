"""What a byte-level generation is asked to do (`BytePlan`) and what it did (`ByteStats`,
`ByteCompletion`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any
from collections.abc import Sequence

from ...config.specs import GenerationConfig
from ...core.combiners import BoundCombiner
from ...core.level import Level


_FIRST = {"aggregate": "first"}  # what describes a request: the first completion's
_MOST = {"aggregate": max}


@dataclass
class ByteStats:
    """What a byte-level generation did."""

    level: Level = field(default=Level.BYTE, metadata=_FIRST)  # the byte or the mixed level
    bytes: int = 0
    chars: int = 0
    tokens: int = 0  # the text in the lead model's tokens (what max_tokens counts; 0 where nothing counts them)
    seconds: float = 0.0
    prompt_seconds: float = 0.0
    llama_seconds: float = 0.0  # of `seconds`, inside llama.cpp (every model's calls)
    calls: list[int] = field(default_factory=list)  # llama_decode calls per model
    rows: list[int] = field(default_factory=list)  # path rows evaluated per model
    most_paths: list[int] = field(default_factory=list, metadata=_MOST)
    restarts: list[int] = field(default_factory=list)  # paths rebuilt from the model's tokenisation
    dropped: list[float] = field(default_factory=list)  # each model's probability mass pruned
    folded: list[int] = field(default_factory=list)  # paths folded into a heavier one at their position
    finish_reason: str = field(default="", metadata=_FIRST)
    method: str = field(default="ensemble", metadata=_FIRST)
    combiner: str = field(default="", metadata=_FIRST)  # its description
    names: list[str] = field(default_factory=list, metadata=_FIRST)  # the models'
    drafted: int = 0  # draft symbols judged (cos)
    accepted: int = 0
    missed: list[int] = field(default_factory=list)  # rows a draft's scoring had not evaluated ahead
    ensemble_steps: int = 0  # cos: rounds where no model drafted (--byte-gamma auto's choice, or no room)
    gate_decided: int = 0  # with a gated combiner: positions it decided (symbols; a whole token at the mixed level's token step)
    gate_opened: int = 0  # of them, where the gate opened (the models were combined)
    token_bytes: int = 0  # the mixed level: bytes decoded as the lead's whole tokens (the rest byte by byte)
    completions: int = 1
    finish_reasons: dict[str, int] = field(default_factory=dict, metadata=_FIRST)  # of several completions (`aggregate`)

    @classmethod
    def aggregate(cls, stats: Sequence[ByteStats]) -> ByteStats:
        """Totals over completions of one request, read from the fields themselves: counters
        summed, per-model lists summed model by model, the most paths held the largest, what
        describes the request (level, method, combiner, names) the first's."""
        if not stats:
            raise ValueError("no stats")
        values: dict[str, Any] = {}
        for f in fields(cls):
            column = [getattr(s, f.name) for s in stats]
            how = f.metadata.get("aggregate", sum)
            if how == "first":
                values[f.name] = column[0]
            elif isinstance(column[0], list):
                values[f.name] = [how(per_model) for per_model in zip(*column)]
            else:
                values[f.name] = how(column)
        reasons: dict[str, int] = {}
        for s in stats:
            for reason, count in (s.finish_reasons or {s.finish_reason: 1}).items():
                reasons[reason] = reasons.get(reason, 0) + count
        values["finish_reasons"] = reasons
        values["finish_reason"] = stats[0].finish_reason if len(reasons) == 1 else ""
        return cls(**values)

    @property
    def chars_per_second(self) -> float:
        return self.chars / self.seconds if self.seconds > 0 else 0.0

    @property
    def host_fraction(self) -> float | None:
        """The share of the decoding time outside llama.cpp (the byte views, combining, sampling)."""
        return (self.seconds - self.llama_seconds) / self.seconds if self.seconds > 0 else None

    def to_dict(self) -> dict:
        return {
            "level": self.level.value,
            "bytes": self.bytes,
            "chars": self.chars,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 4),
            "prompt_seconds": round(self.prompt_seconds, 4),
            "llama_seconds": round(self.llama_seconds, 4),
            "chars_per_second": round(self.chars_per_second, 2),
            "calls_per_char": [round(c / max(self.chars, 1), 3) for c in self.calls],
            "calls": self.calls,
            "rows": self.rows,
            "most_paths": self.most_paths,
            "restarts": self.restarts,
            "dropped_mass": [float(f"{d:.3g}") for d in self.dropped],
            "folded": self.folded,
            "finish_reason": self.finish_reason,
            **({"completions": self.completions, "finish_reasons": self.finish_reasons} if self.completions > 1 else {}),
            "method": self.method,
            "combiner": self.combiner,
            **(
                {"drafted": self.drafted, "accepted": self.accepted, "missed_rows": self.missed, "ensemble_steps": self.ensemble_steps}
                if self.method == "cos"
                else {}
            ),
            **({"gate_decided": self.gate_decided, "gate_opened": self.gate_opened} if self.gate_decided else {}),
            **({"token_bytes": self.token_bytes} if self.level is Level.MIXED else {}),
        }

    def summary(self, names: Sequence[str]) -> str:
        per_model = ", ".join(
            f"{n}: {c / max(self.chars, 1):.2f} calls/char, {p} paths at most, {d:.2g} mass dropped, {f} folded, {r} restarts"
            for n, c, p, d, f, r in zip(names, self.calls, self.most_paths, self.dropped, self.folded, self.restarts)
        )
        drafts = (
            f"; {self.accepted}/{self.drafted} draft symbols accepted, {self.ensemble_steps} ensemble steps" if self.method == "cos" else ""
        )
        gate = f"; gate open {self.gate_opened}/{self.gate_decided}" if self.gate_decided else ""
        level = "byte level"
        if self.level is Level.MIXED:
            level = f"mixed level ({self.token_bytes}/{self.bytes} bytes as whole tokens)"
        return f"{level}: {self.chars} chars in {self.seconds:.2f} s ({self.chars_per_second:.1f} chars/s); {per_model}{drafts}{gate}"


@dataclass
class ByteCompletion:
    """One completion generated at the byte level."""

    text: str
    data: bytes
    finish_reason: str  # "stop" (the end symbol or a stop string), "length" (max_tokens or the context), "cancelled"
    stats: ByteStats
    end_token = None  # the byte level ends on its end symbol, not on one model's token

    @property
    def length(self) -> int:
        """Its length in what max_tokens counts: the lead model's tokens."""
        return self.stats.tokens

    def to_dict(self) -> dict:
        return {"text": self.text, "finish_reason": self.finish_reason}


@dataclass(frozen=True)
class BytePlan:
    """One byte-level completion to run (`ByteModels.plan` checks it): each model's prompt in its
    own tokens, the generation settings, the combination bound to the models, the method and the
    level (byte, or mixed)."""

    prompts: tuple[tuple[int, ...], ...]
    config: GenerationConfig
    combiner: BoundCombiner
    method: str  # "ensemble" or "cos"
    level: Level = Level.BYTE

    @property
    def prompt(self) -> tuple[int, ...]:
        """The first model's prompt tokens (what a server's usage counts)."""
        return self.prompts[0]
