"""localcos `sd` and `cos` against llama.cpp's own C++ speculative decoding, side by side.

With weights 0,1 an ensemble is one target model drafted by a small one: plain speculative
decoding, what llama.cpp's `llama-speculative` example does in C++. This builds that example once
from the same llama.cpp source that llama-cpp-python compiled (the pinned sdist, cached), writes a
synthetic pair (a 2-layer drafter and a 16-layer target of one family, F16), and runs
`llama-speculative`, localcos `sd` and localcos `cos` on the same pair, prompt, draft length and
token count, greedy, interleaved; it prints each one's decoding tok/s (prompt excluded) and the
ratios, medians over the rounds.

    .venv/bin/python benchmarks/vs_llama_speculative.py                  # 300 tokens, draft 4, 3 rounds
    .venv/bin/python benchmarks/vs_llama_speculative.py --tokens 200 --draft 3 --rounds 5
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
from dataclasses import replace

from localcos import Ensemble, WeightedEnsemble
from localcos.backend import default_threads
from localcos.paths import cache_dir
from localcos.testing import llamacpp_sdist
from localcos.testing.reference import tool_args
from localcos.models.writer import ModelSpec, cached_model

PROMPT = "The small model writes a draft and the large model checks it. When both agree"
DRAFTER = ModelSpec(vocab_size=32000, n_embd=1024, n_layer=2, n_head=16, n_ff=2816, dtype="f16", seed=71, name="spec-drafter")
TARGET = replace(DRAFTER, extra_layers=14, extra_scale=0.05, name="spec-target")
SPEED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
ACCEPT = re.compile(r"accept\s+=\s+([\d.]+)%")


def run_llama_speculative(binary, drafter, target, tokens: int, draft: int, threads: int) -> tuple[float, float]:
    """(decoding tok/s, acceptance %) as llama-speculative reports them."""
    cmd = [
        str(binary), "-m", str(target), "-md", str(drafter), "-p", PROMPT, "-n", str(tokens),
        "--spec-draft-n-max", str(draft), "--temp", "0", "--ignore-eos", "-t", str(threads), "-c", "2048",
        "--seed", "1", *tool_args(),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    speed, accept = SPEED.search(log), ACCEPT.search(log)
    if proc.returncode != 0 or speed is None:
        raise SystemExit(f"llama-speculative failed ({proc.returncode}): {log.strip().splitlines()[-3:]}")
    return float(speed.group(3)), float(accept.group(1)) if accept else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=300)
    p.add_argument("--draft", type=int, default=4, help="draft length (gamma)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=default_threads())
    args = p.parse_args()

    print("building llama-speculative from the llama-cpp-python sdist's llama.cpp (once; minutes) ...", flush=True)
    binary = llamacpp_sdist.build(["llama-speculative"]) / "llama-speculative"
    where = cache_dir() / "synthetic"
    drafter, target = cached_model(DRAFTER, where), cached_model(TARGET, where)
    print(f"drafter {drafter.name} (2 layers), target {target.name} (16 layers), F16; {args.tokens} tokens, draft {args.draft}, greedy")

    results: dict[str, list[float]] = {"llama-speculative": [], "localcos sd": [], "localcos cos": []}
    accept: dict[str, list[float]] = {k: [] for k in results}
    with Ensemble.load([drafter, target], WeightedEnsemble([0, 1]), n_ctx=2048, n_threads=args.threads) as ens:
        ens.generate(PROMPT, method="ensemble", max_tokens=8, temperature=0, ignore_eos=True)  # warm up
        for r in range(args.rounds):
            speed, rate = run_llama_speculative(binary, drafter, target, args.tokens, args.draft, args.threads)
            results["llama-speculative"].append(speed)
            accept["llama-speculative"].append(rate)
            for method, gamma in (("sd", args.draft), ("cos", (args.draft, 1))):
                out = ens.generate(PROMPT, method=method, gamma=gamma, proposer=0, max_tokens=args.tokens, temperature=0, ignore_eos=True)
                results[f"localcos {method}"].append(out.stats.tokens_per_second or 0.0)
                accept[f"localcos {method}"].append(100 * (out.stats.acceptance_rate or 0.0))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f} tok/s" for k, v in results.items()), flush=True)
    base = statistics.median(results["llama-speculative"])
    print(f"\n{'':<20}{'tok/s':>8}{'ratio':>8}{'accept':>8}   (medians of {args.rounds} interleaved rounds)")
    for name, speeds in results.items():
        median = statistics.median(speeds)
        print(f"{name:<20}{median:>8.1f}{median / base:>7.2f}x{statistics.median(accept[name]):>7.0f}%")


if __name__ == "__main__":
    main()
