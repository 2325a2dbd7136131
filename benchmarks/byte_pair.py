"""The byte level on trained models: what combining two tokenizers costs.

SmolLM2-135M-Instruct (its own tokenizer) with Qwen2.5-Coder-0.5B-Instruct, combined at the byte
level (WE 0.5/0.5), against the 0.5B alone on its usual token path (and on the 0.5B's own text,
forced by a grammar of that one string: the cost of the byte level on equal text, apart from what
the combination chooses to write), and with byte-level cos (the
two take turns drafting bytes, the other scores them in one call) against that ensemble; and the same-tokenizer Qwen
pair (0.5B + 1.5B) through the byte path against its token path (the standard ensemble). One
process, every configuration on the same prompts and seeds, interleaved prompt by prompt.
Reported: characters per second, the ratios, calls per model per character and the paths held.

    .venv/bin/python benchmarks/byte_pair.py --prompts 3 --chars 160 --temperatures 0,1
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from localcos import Ensemble
from localcos.config.options import OPTIONS
from localcos.config.specs import GenerationConfig, LoadSpec
from localcos.core.combiners import WeightedEnsemble
from localcos.grammar import gbnf
from localcos.models.registry import Registry
from localcos.runtime.bytelevel import ByteModels, run_to_end
from localcos.runtime.generation import completion_rng
from localcos.runtime.profile import cpu_name
from localcos.tools.prompts import builtin_prompts


SAME_TEXT = "smollm+0.5B, 0.5B's text"  # the byte-level ensemble forced to write what the 0.5B alone wrote


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--chars", type=int, default=160, help="characters per completion")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--paths", type=int, default=OPTIONS["byte_paths"].default)
    ap.add_argument("--prune", type=float, default=OPTIONS["byte_prune"].default)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--gammas", default="auto,8", help="byte-level cos of the cross pair at these draft lengths (bytes, or auto); empty: none")
    args = ap.parse_args()
    registry = Registry.load(user=False)
    small, coder, big = (registry.pull(n) for n in ("smollm2-135m", "coder-0.5b", "coder-1.5b"))
    print(f"CPU: {cpu_name()}")
    prompts = [text for _, text in builtin_prompts()][: args.prompts]
    we = WeightedEnsemble([0.5, 0.5])
    alone = Ensemble.load([coder], n_ctx=args.ctx)
    qwen_tokens = Ensemble.load([coder, big], n_ctx=args.ctx, combiner=we)
    level = dict(n_ctx=args.ctx, level="byte", byte_paths=args.paths, byte_prune=args.prune)
    cross = ByteModels.load(LoadSpec.make([small, coder], **level), we)
    qwen_bytes = ByteModels.load(LoadSpec.make([coder, big], **level), we)
    for t in [float(x) for x in args.temperatures.split(",")]:
        gammas = [OPTIONS["byte_gamma"].check(g) for g in args.gammas.split(",") if g]
        cos_names = [f"smollm+0.5B cos {g}" for g in gammas]
        speeds: dict[str, list[float]] = {k: [] for k in ("0.5B alone", "smollm+0.5B byte", SAME_TEXT, *cos_names, "qwen pair token", "qwen pair byte")}
        judged = {k: [0, 0] for k in cos_names}  # accepted, drafted
        totals: dict[str, list[float]] = {k: [0.0, 0.0] for k in speeds}  # chars, seconds
        calls: dict[str, list[list[float]]] = {k: [] for k in ("smollm+0.5B byte", SAME_TEXT, *cos_names, "qwen pair byte")}
        paths: dict[str, list[list[int]]] = {k: [] for k in calls}
        for i, prompt in enumerate(prompts):
            # token path: max_tokens chosen so the text is about as long; speed is chars / s
            texts = {}
            for name, ens in (("0.5B alone", alone), ("qwen pair token", qwen_tokens)):
                c = ens.generate(prompt, max_tokens=args.chars // 3, temperature=t, seed=i, method="ensemble")
                speeds[name].append(len(c.text) / c.stats.seconds)
                totals[name][0] += len(c.text)
                totals[name][1] += c.stats.seconds
                texts[name] = c.text
            own_text = gbnf("root ::= " + json.dumps(texts["0.5B alone"], ensure_ascii=False), "the 0.5B's text")
            runs = [("smollm+0.5B byte", cross, "ensemble", 8, None), (SAME_TEXT, cross, "ensemble", 8, own_text),
                    *((n, cross, "cos", g, None) for n, g in zip(cos_names, gammas)), ("qwen pair byte", qwen_bytes, "ensemble", 8, None)]  # fmt: skip
            for name, models, method, gamma, grammar in runs:
                chars = len(texts["0.5B alone"]) if grammar else args.chars
                config = GenerationConfig(method=method, max_tokens=chars, temperature=t, byte_gamma=gamma, grammar=grammar)
                c = run_to_end(models.start(models.plan(models.prompts(prompt), config), completion_rng(i)))
                if method == "cos":
                    judged[name][0] += c.stats.accepted
                    judged[name][1] += c.stats.drafted
                speeds[name].append(c.stats.chars_per_second)
                totals[name][0] += c.stats.chars
                totals[name][1] += c.stats.seconds
                calls[name].append([k / max(c.stats.chars, 1) for k in c.stats.calls])
                paths[name].append(c.stats.most_paths)
        med = {k: c / s for k, (c, s) in totals.items()}  # a completion that ends at once weighs nothing
        print(f"\nT={t:g}, {len(prompts)} prompts, ~{args.chars} chars each, prune {args.prune:g}, {args.paths} paths at most (chars/s over all prompts)")
        for k, v in med.items():
            print(f"  {k:26s} {v:7.1f} chars/s   per prompt: " + ", ".join(f"{x:.1f}" for x in speeds[k]))
        print(f"  smollm+0.5B byte / 0.5B alone:   {med['smollm+0.5B byte'] / med['0.5B alone']:.2f}x (worst prompt "
              f"{min(a / b for a, b in zip(speeds['smollm+0.5B byte'], speeds['0.5B alone']) if a):.2f}x)")
        print(f"  {SAME_TEXT} / 0.5B alone:  {med[SAME_TEXT] / med['0.5B alone']:.2f}x (worst prompt "
              f"{min(a / b for a, b in zip(speeds[SAME_TEXT], speeds['0.5B alone']) if a):.2f}x)")
        print(f"  qwen pair byte / token path:     {med['qwen pair byte'] / med['qwen pair token']:.2f}x (worst prompt "
              f"{min(a / b for a, b in zip(speeds['qwen pair byte'], speeds['qwen pair token'])):.2f}x)")
        for k in cos_names:
            a, d = judged[k]
            print(f"  {k} / byte ensemble:  {med[k] / med['smollm+0.5B byte']:.2f}x (worst prompt "
                  f"{min(a / b for a, b in zip(speeds[k], speeds['smollm+0.5B byte']) if b):.2f}x), {a}/{d} draft bytes accepted")
        for k in calls:
            c = np.mean(calls[k], axis=0)
            p = np.max(paths[k], axis=0)
            print(f"  {k}: calls per char per model " + ", ".join(f"{x:.2f}" for x in c) + "; most paths " + ", ".join(map(str, p)))
    for m in (alone, qwen_tokens, cross, qwen_bytes):
        m.close()


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"\n({time.time() - t0:.0f} s)")
