"""What generations cost and how speculation went: one statistics model for every front end.

A `GenerationStats` holds counters (totals over one or more completions); every rate is derived
from them, so the statistics of many completions are the sum of their counters
(`GenerationStats.aggregate`) and rates are never averaged. The CLI's summary line and ``--json``,
the bench's rows, the chat's panel and the server's ``localcos`` object all read it.

Words, the same in code, JSON and the README:
  proposed       draft tokens submitted to verification
  accepted       draft tokens accepted
  rejected       draft tokens rejected (each rejection rolls the KV caches back and resamples
                 one token from the residual distribution)
  verifications  verification passes
  bonus          bonus tokens committed (sampled by a model right after scoring others' drafts)
  lookup_proposed, lookup_accepted
                 of the draft tokens: those looked up in the context (no model call)
  calls          llama_decode calls, per model
  gate_decided, gate_opened
                 with a gated combiner: tokens committed, and those where the gate opened (the
                 models were combined; elsewhere r was the lead model's own distribution)
  looked_ahead, lookahead_changed
                 with --lookahead: positions looked ahead from (r unsure there), and those where
                 a branch other than r's likeliest token won
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from collections.abc import Sequence


@dataclass
class ModelRunStats:
    """One model's work: llama_decode calls, tokens evaluated, seconds inside llama.cpp."""

    name: str
    calls: int = 0
    tokens: int = 0
    seconds: float = 0.0


@dataclass
class GenerationStats:
    """Counters of one or more generations with one ensemble and one setting."""

    method: str
    combiner: str
    models: list[ModelRunStats]
    completions: int = 1
    tokens: int = 0  # generated tokens
    seconds: float = 0.0  # wall time of decoding (after the prompt)
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    proposed: int = 0
    accepted: int = 0
    rejected: int = 0
    verifications: int = 0
    bonus: int = 0
    lookup_proposed: int = 0
    lookup_accepted: int = 0
    gate_decided: int = 0
    gate_opened: int = 0
    looked_ahead: int = 0
    lookahead_changed: int = 0
    gamma: list[int] | None = None  # proposal length per model (None: ensemble, or chosen online)
    proposer: int | None = None
    seed: int | None = None
    # what the standard ensemble would spend inside llama.cpp on these tokens: one single-token
    # call per model per token, at single-token call times measured on this ensemble
    ensemble_llama_seconds: float | None = None
    finish_reasons: dict[str, int] = field(default_factory=dict)

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

    # --- combining and showing --------------------------------------------------------------------
    @classmethod
    def aggregate(cls, stats: Sequence[GenerationStats]) -> GenerationStats:
        """Totals over completions of one setting (method, combiner and gamma of the first)."""
        if not stats:
            raise ValueError("no stats")
        first = stats[0]
        if any(len(s.models) != len(first.models) for s in stats):
            raise ValueError("stats of different ensembles")
        models = [
            ModelRunStats(
                m.name,
                sum(s.models[i].calls for s in stats),
                sum(s.models[i].tokens for s in stats),
                sum(s.models[i].seconds for s in stats),
            )
            for i, m in enumerate(first.models)
        ]
        reasons: dict[str, int] = {}
        for s in stats:
            for k, v in s.finish_reasons.items():
                reasons[k] = reasons.get(k, 0) + v
        counters = (
            "completions", "tokens", "seconds", "prompt_tokens", "prompt_seconds", "proposed", "accepted", "rejected", "verifications",
            "bonus", "lookup_proposed", "lookup_accepted", "gate_decided", "gate_opened", "looked_ahead", "lookahead_changed",
        )  # fmt: skip
        totals = {k: sum(getattr(s, k) for s in stats) for k in counters}
        ensemble = None if any(s.ensemble_llama_seconds is None for s in stats) else sum(s.ensemble_llama_seconds or 0.0 for s in stats)
        return replace(first, models=models, finish_reasons=reasons, ensemble_llama_seconds=ensemble, **totals)

    def to_dict(self) -> dict:
        """Counters and derived rates, for JSON."""
        d = asdict(self)
        for m, calls_per_token in zip(d["models"], self.model_calls_per_token()):
            m["calls_per_token"] = calls_per_token
        for key in (
            "llama_seconds",
            "host_seconds",
            "host_fraction",
            "calls",
            "tokens_per_second",
            "acceptance_rate",
            "lookup_acceptance",
            "gate_open_rate",
            "mean_accepted",
            "calls_per_token",
            "speedup_estimate",
        ):
            d[key] = getattr(self, key)
        return d

    def summary(self) -> str:
        """One line for people."""
        parts = [
            self.method,
            f"{self.tokens} tokens in {self.seconds:.2f}s",
            f"{self.tokens_per_second:.1f} tok/s" if self.tokens_per_second else "- tok/s",
        ]
        if self.acceptance_rate is not None:
            parts.append(f"acceptance {self.acceptance_rate:.0%} ({self.accepted}/{self.tested})")
            parts.append(f"mean accepted {self.mean_accepted:.2f}")
        if self.lookup_proposed:
            parts.append(f"looked up {self.lookup_accepted}/{self.lookup_proposed}")
        if self.gate_decided:
            parts.append(f"gate open {self.gate_opened}/{self.gate_decided}")
        if self.looked_ahead:
            parts.append(f"looked ahead {self.looked_ahead}x, changed {self.lookahead_changed}")
        parts.append("calls " + "/".join(str(c) for c in self.calls))
        if self.host_fraction is not None:
            parts.append(f"host {self.host_fraction:.0%}")
        if self.method != "ensemble" and self.speedup_estimate:
            parts.append(f"~{self.speedup_estimate:.2f}x the ensemble (est.)")
        if self.seed is not None:
            parts.append(f"seed {self.seed}")
        return " | ".join(parts)
