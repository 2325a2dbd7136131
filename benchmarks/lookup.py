"""Drafts looked up in the context, on the trained pair: cos with lookup against cos without.

Qwen2.5-Coder 0.5B + 1.5B (models.toml's coder-0.5b, coder-1.5b; `localcos models pull
coder-we`), WE 0.5/0.5, through the models' chat template. Three kinds of prompt: code to
rewrite (the answer repeats the code), a text to rewrite (it repeats phrases), and questions with
nothing to look up. For each prompt and temperature, interleaved and with the same seeds: the
standard ensemble, cos with --lookup off, auto and on (each at the same gamma). Reported per kind:
tokens/s, the ratio to cos without lookup (the worst prompt too), looked-up tokens accepted /
proposed, calls per token per model, and the host time spent finding drafts as a share of the
generation's time.

    .venv/bin/python benchmarks/lookup.py
    .venv/bin/python benchmarks/lookup.py --temperatures 0 --max-tokens 96 --gamma 3
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from localcos import Ensemble, WeightedEnsemble
from localcos.chat import ChatFormatter, Message
from localcos.core import lookup as lookup_module
from localcos.config import parse_gamma
from localcos.stats import GenerationStats
from localcos.models.registry import Registry

CODE = '''def moving_average(values, window):
    result = []
    for i in range(len(values)):
        start = max(0, i - window + 1)
        chunk = values[start:i + 1]
        result.append(sum(chunk) / len(chunk))
    return result
'''
CODE2 = '''class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, word):
        if word in self.counts:
            self.counts[word] = self.counts[word] + 1
        else:
            self.counts[word] = 1
'''
TEXT = (
    "The committee met on Tuesday to discuss the budget for the coming year. After a long debate, the members "
    "agreed to increase spending on the library and to reduce the cost of the annual festival. The chair said "
    "that the decision would be reviewed in six months."
)
PROMPTS = {
    "code": [
        f"Add type hints to this function and return the whole function:\n```python\n{CODE}```",
        f"Rename the method add to increment and return the whole class:\n```python\n{CODE2}```",
    ],
    "rewrite": [
        f"Rewrite this text, replacing 'committee' with 'council':\n\n{TEXT}",
        f"Correct the punctuation of this text and return it in full:\n\n{TEXT.replace('. ', ' ').replace(',', '')}",
    ],
    "nothing": ["Write a haiku about autumn rain.", "Name three prime numbers greater than 100 and explain why they are prime."],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--gamma", default="auto")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    registry = Registry.load(user=False)
    paths = [registry.pull(name, progress=print) for name in ("coder-0.5b", "coder-1.5b")]
    gamma = parse_gamma(args.gamma)
    configs = [("ensemble", "off"), ("cos", "off"), ("cos", "auto"), ("cos", "on")]

    # host time spent finding drafts, measured where it is spent
    found = {"seconds": 0.0}
    continuation = lookup_module.ContextIndex.continuation

    def timed(self, tail, settings):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return continuation(self, tail, settings)
        finally:
            found["seconds"] += time.perf_counter() - t0

    lookup_module.ContextIndex.continuation = timed  # type: ignore[method-assign]

    stats: dict[tuple, list[GenerationStats]] = defaultdict(list)
    per_prompt: dict[tuple, float] = {}
    lookup_seconds: dict[tuple, float] = defaultdict(float)
    with Ensemble.load(paths, WeightedEnsemble([0.5, 0.5]), n_ctx=2048) as ens:
        formatter = ChatFormatter(ens)
        ens.generate("warm up", method="ensemble", max_tokens=4)
        for r in range(args.rounds):
            for temperature in (float(t) for t in args.temperatures.split(",")):
                for kind, prompts in PROMPTS.items():
                    for k, text in enumerate(prompts):
                        tokens = formatter.tokens([Message("user", text)])
                        for method, mode in configs:
                            found["seconds"] = 0.0
                            out = ens.generate(tokens, method=method, gamma=None if method == "ensemble" else gamma, lookup=mode,
                                               temperature=temperature, max_tokens=args.max_tokens, seed=100 * r + k, ignore_eos=True)  # fmt: skip
                            key = (temperature, kind, method, mode)
                            stats[key].append(out.stats)
                            lookup_seconds[key] += found["seconds"]
                            per_prompt[(*key, k, r)] = out.stats.tokens_per_second or 0.0
                            print(f"  T={temperature:g} {kind} {k} {method}/{mode}: {out.stats.summary()}", flush=True)
    print(f"\n{'T':>3} {'prompts':<8}{'config':<14}{'tok/s':>8}{'vs cos':>8}{'worst':>7}{'looked up':>12}{'calls/tok':>12}{'finding':>9}")
    for key in sorted(stats, key=lambda k: (k[0], list(PROMPTS).index(k[1]), configs.index((k[2], k[3])))):
        temperature, kind, method, mode = key
        total = GenerationStats.aggregate(stats[key])
        base = GenerationStats.aggregate(stats[(temperature, kind, "cos", "off")])
        ratios = [
            per_prompt[(*key, k, r)] / per_prompt[(temperature, kind, "cos", "off", k, r)]
            for k in range(len(PROMPTS[kind]))
            for r in range(args.rounds)
        ]
        looked = f"{total.lookup_accepted}/{total.lookup_proposed}" if total.lookup_proposed else "-"
        calls = "/".join(f"{c:.2f}" for c in total.model_calls_per_token())
        share = lookup_seconds[key] / total.seconds if total.seconds else 0.0
        config = method if method == "ensemble" else f"cos lookup {mode}"
        print(
            f"{temperature:>3g} {kind:<8}{config:<14}{total.tokens_per_second or 0:>8.1f}"
            f"{(total.tokens_per_second or 0) / (base.tokens_per_second or 1):>7.2f}x"
            f"{min(ratios):>6.2f}x{looked:>12}{calls:>12}{share:>9.2%}"
        )


if __name__ == "__main__":
    main()
