"""Statistics over several generations, for the CLI's summary and JSON output."""

from __future__ import annotations

from typing import Sequence

from .ensemble import GenerationStats, speedup_estimate


def aggregate_stats(stats: Sequence[GenerationStats]) -> dict:
    """Totals over completions of one run, with rates recomputed from the totals."""
    if not stats:
        raise ValueError("no stats")
    first = stats[0]
    tokens = sum(s.tokens for s in stats)
    seconds = sum(s.seconds for s in stats)
    proposed = sum(s.proposed for s in stats)
    accepted = sum(s.accepted for s in stats)
    rollbacks = sum(s.rollbacks for s in stats)
    verifications = sum(s.verifications for s in stats)
    llama_seconds = sum(s.llama_seconds for s in stats)
    models = []
    for i, m in enumerate(first.models):
        calls = sum(s.models[i].calls for s in stats)
        models.append(
            {
                "name": m.name,
                "calls": calls,
                "tokens": sum(s.models[i].tokens for s in stats),
                "seconds": sum(s.models[i].seconds for s in stats),
                "calls_per_token": calls / tokens if tokens else None,
            }
        )
    total_calls = sum(m["calls"] for m in models)
    return {
        "method": first.method,
        "combiner": first.combiner,
        "completions": len(stats),
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds if seconds > 0 and tokens else None,
        "calls": [m["calls"] for m in models],
        "models": models,
        "calls_per_token": total_calls / tokens if tokens else None,
        "proposed": proposed,
        "accepted": accepted,
        "acceptance_rate": accepted / (accepted + rollbacks) if accepted + rollbacks else None,
        "mean_accepted": accepted / verifications if verifications else None,
        "verifications": verifications,
        "bonus": sum(s.bonus for s in stats),
        "rollbacks": rollbacks,
        "llama_seconds": llama_seconds,
        "host_seconds": max(0.0, seconds - llama_seconds),
        "host_fraction": max(0.0, seconds - llama_seconds) / seconds if seconds > 0 else None,
        "prompt_tokens": first.prompt_tokens,
        "prompt_seconds": sum(s.prompt_seconds for s in stats),
        "gamma": first.gamma,
        "proposer": first.proposer,
        "speedup_estimate": None
        if any(s.ensemble_llama_seconds is None for s in stats)
        else speedup_estimate(sum(s.ensemble_llama_seconds or 0.0 for s in stats), llama_seconds),
    }
