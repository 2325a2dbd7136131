"""`localcos score` against llama.cpp's own `llama-perplexity`, side by side.

Builds `llama-perplexity` once from the llama.cpp source that llama-cpp-python compiled (the pinned
sdist, cached) and, for a synthetic model (32k vocabulary) and one with a real tokenizer (Qwen2's
151,936-token vocabulary), runs it and localcos's scorer on the same text, `--ctx` and batch,
interleaved: the perplexities (they must agree within 0.5%) and the scored tokens per second
(llama-perplexity's own log-softmax is part of its time, as the combination is part of ours).
Then two 152k-vocabulary models together: how much of the time the combination takes on the host.

    .venv/bin/python benchmarks/vs_llama_perplexity.py                        # docs + README, ctx 512
    .venv/bin/python benchmarks/vs_llama_perplexity.py --file my.txt --ctx 1024 --rounds 5
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from localcos import Ensemble, WeightedEnsemble
from localcos.backend import default_threads
from localcos.paths import cache_dir
from localcos.runtime.scoring import SCORING_LOGIT_ROWS
from localcos.testing import llamacpp_sdist
from localcos.testing.reference import tool_args
from localcos.scoring import perplexity as score
from localcos.tools.bench import RssSampler, current_rss_mb
from localcos.models.writer import ModelSpec, cached_model

ROOT = Path(__file__).resolve().parents[1]
SYNTHETIC = ModelSpec(vocab_size=32000, n_embd=512, n_layer=4, n_head=8, n_ff=1408, dtype="f16", seed=81, name="ppl-synthetic")
QWEN2 = ModelSpec(arch="qwen2", n_embd=512, n_layer=4, n_head=8, n_ff=1408, dtype="f16", seed=82, name="ppl-qwen2")
FINAL = re.compile(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)")


def _stamp(what: str, log: str) -> float:
    """Seconds since start at llama.cpp's log line saying `what` (its stamp: min.s.ms.us; a line
    may follow a progress line that ended without a newline, so the stamp is searched, not matched)."""
    m = re.search(r"(\d+)\.(\d+)\.(\d+)\.(\d+) \w " + re.escape(what), log)
    if m is None:
        raise SystemExit(f"llama-perplexity printed no '{what}' line")
    mins, s, ms, us = map(int, m.groups())
    return mins * 60 + s + ms / 1e3 + us / 1e6


def run_llama_perplexity(binary: Path, model: Path, text: Path, n_ctx: int, threads: int) -> tuple[float, float]:
    """(perplexity, seconds from the first window to the final estimate)."""
    cmd = [str(binary), "-m", str(model), "-f", str(text), "-c", str(n_ctx), "-b", str(n_ctx), "-t", str(threads), *tool_args()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    log = proc.stdout + proc.stderr
    final = FINAL.search(log)
    if proc.returncode != 0 or final is None:
        raise SystemExit(f"llama-perplexity failed ({proc.returncode}): {log.strip().splitlines()[-3:]}")
    return float(final.group(1)), _stamp("Final estimate", log) - _stamp("perplexity: calculating perplexity", log)


def run_localcos(ens: Ensemble, text: str, n_ctx: int) -> tuple[score.PerplexityResult, float, float]:
    """(result, seconds, seconds inside llama.cpp)."""
    llama0 = sum(m.stats.seconds for m in ens.models)
    t0 = time.perf_counter()
    result = score.perplexity(ens, text, [ens.combiner], n_ctx=n_ctx)
    seconds = time.perf_counter() - t0
    return result, seconds, sum(m.stats.seconds for m in ens.models) - llama0


def compare(binary: Path, name: str, model: Path, text_path: Path, n_ctx: int, rounds: int, threads: int) -> None:
    text = text_path.read_text()
    theirs, ours, ppl_theirs, ppl_ours, scored = [], [], 0.0, 0.0, 0
    with Ensemble.load([model], n_ctx=n_ctx, n_batch=n_ctx, max_logit_rows=SCORING_LOGIT_ROWS, n_threads=threads) as ens:
        run_localcos(ens, text, n_ctx)  # warm up
        for _ in range(rounds):
            ppl_theirs, seconds = run_llama_perplexity(binary, model, text_path, n_ctx, threads)
            result, mine, _ = run_localcos(ens, text, n_ctx)
            scored = result.members[0].count
            ppl_ours = result.members[0].perplexity
            theirs.append(scored / seconds)
            ours.append(scored / mine)
    t, o = statistics.median(theirs), statistics.median(ours)
    diff = abs(ppl_ours / ppl_theirs - 1)
    print(f"{name:<34}{ppl_theirs:>14.4f}{ppl_ours:>14.4f}{diff:>8.3%}{t:>12.0f}{o:>12.0f}{o / t:>7.2f}x   ({scored} tokens scored, {result.windows} windows)")
    if diff > 0.005:
        print(f"  WARNING: the perplexities differ by {diff:.3%} (more than 0.5%)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--file", help="the text (default: this repository's README and docs/algorithm.md)")
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=default_threads())
    args = p.parse_args()

    if args.file:
        text_path = Path(args.file)
    else:
        text_path = cache_dir() / "bench-text.txt"
        text_path.write_text((ROOT / "README.md").read_text() + "\n" + (ROOT / "docs" / "algorithm.md").read_text())
    print("building llama-perplexity from the llama-cpp-python sdist's llama.cpp (once; minutes) ...", flush=True)
    binary = llamacpp_sdist.build(["llama-perplexity"]) / "llama-perplexity"
    where = cache_dir() / "synthetic"
    qwen2 = replace(QWEN2, tokenizer=str(llamacpp_sdist.vocab_file("qwen2")))
    synthetic, real = cached_model(SYNTHETIC, where), cached_model(qwen2, where)
    print(f"{text_path}, --ctx {args.ctx}, {args.threads} threads, medians of {args.rounds} interleaved rounds\n")
    print(f"{'one model':<34}{'llama-ppl PPL':>14}{'localcos PPL':>14}{'diff':>8}{'llama tok/s':>12}{'ours tok/s':>12}{'ratio':>8}")
    compare(binary, "synthetic 32k vocab, F16", synthetic, text_path, args.ctx, args.rounds, args.threads)
    compare(binary, "Qwen2 tokenizer 152k vocab, F16", real, text_path, args.ctx, args.rounds, args.threads)

    # two models at 152k: the combination's share of the time, and host memory
    sibling = cached_model(replace(qwen2, noise=0.3, name="ppl-qwen2-sibling"), where)
    text = text_path.read_text()
    with Ensemble.load(
        [real, sibling],
        WeightedEnsemble([0.5, 0.5]),
        n_ctx=args.ctx,
        n_batch=args.ctx,
        max_logit_rows=SCORING_LOGIT_ROWS,
        n_threads=args.threads,
    ) as ens:
        run_localcos(ens, text, args.ctx)  # warm up (llama.cpp sizes its output buffers)
        shares, speeds = [], []
        base = current_rss_mb()
        with RssSampler(interval=0.01) as rss:
            for _ in range(args.rounds):
                result, seconds, llama = run_localcos(ens, text, args.ctx)
                shares.append((seconds - llama) / seconds)
                speeds.append(result.combined[0].count / seconds)
    print(
        f"\ntwo models, 152k vocab (WE 0.5/0.5): {statistics.median(speeds):.0f} scored tokens/s, "
        f"host share (combination, log-softmax, bookkeeping) {statistics.median(shares):.1%}, "
        f"peak host memory +{rss.peak - base:.0f} MiB over the loaded models"
    )


if __name__ == "__main__":
    main()
