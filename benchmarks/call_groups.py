"""Calls grouped by their measured cost: sequences decoded together, their rows in the calls the
models' profiles say cost least (`CallProfile.group`), against one call for all (what the
scheduler did before it read the profiles for this). On some CPUs a call of two or three rows
costs more than as many one-row calls (Qwen2.5-Coder-0.5B Q4_K_M on a 2-core Zen 5); there the
grouping splits them, elsewhere it changes nothing. One process, the two ways taking turns on the
same prompts and seeds at each level; tokens per second over all sequences, and the ratio.

    .venv/bin/python benchmarks/call_groups.py --levels 2,3,4 --rounds 3
"""

from __future__ import annotations

import argparse
import time

from localcos import Ensemble, WeightedEnsemble
from localcos.core.speedmodel import CallProfile
from localcos.models.registry import Registry
from localcos.runtime.profile import cpu_name
from localcos.tools.prompts import builtin_prompts


def one_call(profile: CallProfile) -> CallProfile:
    """The same profile, grouping as if no split ever paid (one call for all that fit)."""
    copy = CallProfile(dict(profile.seconds))
    copy.__dict__["splits_pay"] = False  # the cached answer `group` reads
    return copy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="coder-0.5b,coder-1.5b")
    ap.add_argument("--levels", default="2,3,4", help="sequences decoded at once")
    ap.add_argument("--methods", default="ensemble,cos")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=1.0)
    args = ap.parse_args()
    registry = Registry.load(user=False)
    paths = [registry.pull(n) for n in args.models.split(",")]
    levels = [int(x) for x in args.levels.split(",")]
    prompts = [text for _, text in builtin_prompts()]
    print(f"CPU: {cpu_name()}")
    with Ensemble.load(paths, WeightedEnsemble(), n_ctx=1024, parallel=max(levels)) as ens:
        measured = list(ens.profiles)
        for m, p in zip(ens.models, measured):
            print(f"{m.name}: b(2..4) {', '.join(f'{p.batch_cost(k):.2f}' for k in (2, 3, 4))}; grouping of 2, 3, 4 one-row requests: "
                  + "; ".join(str([len(g) for g in p.group([1] * k)]) for k in (2, 3, 4)))  # fmt: skip
        ways = {"grouped": measured, "one call": [one_call(p) for p in measured]}
        for method in args.methods.split(","):
            gamma = "auto" if method == "cos" else None
            for level in levels:
                totals = {w: [0, 0.0] for w in ways}
                for r in range(args.rounds):
                    prompt = prompts[r % len(prompts)]
                    for way, profiles in (ways.items() if r % 2 == 0 else reversed(ways.items())):
                        ens.profiles = profiles
                        t0 = time.perf_counter()
                        done = ens.generate_many(prompt, level, method=method, gamma=gamma, max_tokens=args.tokens, seed=r,
                                                 temperature=args.temperature, ignore_eos=True)  # fmt: skip
                        totals[way][1] += time.perf_counter() - t0
                        totals[way][0] += sum(len(c.token_ids) for c in done)
                speed = {w: n / s for w, (n, s) in totals.items()}
                print(f"{method:>8} {level} sequences: grouped {speed['grouped']:.1f} tok/s, one call {speed['one call']:.1f} tok/s, "
                      f"ratio {speed['grouped'] / speed['one call']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
