"""What one llama_decode call of n tokens costs, in single-token calls, per weight type.

Speculation wins when scoring several tokens in one pass costs little more than scoring one. This
measures that ratio on this machine for a synthetic set built in each weight type, with the set's
models taking turns as they do in CoS (each call appends n tokens to one model's cache).

    .venv/bin/python benchmarks/batch_cost.py                      # we-pair, all weight types
    .venv/bin/python benchmarks/batch_cost.py --set cd-pair --dtypes bf16,f16 --sizes 1,2,4,8
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from localcos.backend import Model
from localcos.models.synthetic import SETS, ensure_set
from localcos.models.weights import WEIGHT_TYPES as DTYPES


def call_times(models: list[Model], n: int, reps: int) -> float:
    """Median seconds of a call of n tokens, the models taking turns."""
    times = []
    start = [len(m.tokens) for m in models]
    for r in range(reps):
        m = models[r % len(models)]
        tokens = list(range(100, 100 + n))
        t0 = time.perf_counter()
        m.evaluate(tokens, n)
        times.append(time.perf_counter() - t0)
    for m, keep in zip(models, start):
        m.truncate(keep)
    return float(np.median(times))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", default="we-pair", choices=list(SETS))
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--sizes", default="1,2,3,4,6")
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    if sizes[0] != 1:
        p.error("--sizes must start with 1 (the unit)")
    print(f"{args.set}: median call time of n tokens, and in units of a 1-token call ({args.reps} calls each)")
    print(f"{'weights':<8}" + "".join(f"{'n=' + str(n):>16}" for n in sizes))
    for dtype in args.dtypes.split(","):
        paths = ensure_set(args.set, dtype=dtype, progress=lambda m: print(m, flush=True))
        models = [Model(path, n_ctx=2048, n_threads=args.threads) for path in paths]
        for m in models:
            m.warm_up()
            m.evaluate(list(range(10, 60)), 1)  # a short context, as after a prompt
        seconds = {n: call_times(models, n, args.reps) for n in sizes}
        single = seconds[sizes[0]]
        cells = "".join(f"{seconds[n] * 1e3:>8.2f}ms ({seconds[n] / single:.2f})" for n in sizes)
        print(f"{dtype:<8}{cells}")
        for m in models:
            m.close()


if __name__ == "__main__":
    main()
