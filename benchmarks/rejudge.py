"""Run every completion of eval results files again through today's sandbox and count the
verdicts that changed: the check that a change of the sandbox or the judge keeps what real
completions scored. Prints each changed verdict, then the counts per file.

    python benchmarks/rejudge.py RESULTS.jsonl TASK [RESULTS.jsonl TASK ...] [--timeout 10]

TASK is what the run was given as --task (humaneval, an infilling set, a file).
"""

from __future__ import annotations

import argparse
import collections
import json
from concurrent.futures import ThreadPoolExecutor

from localcos.eval.codetasks import load_tasks
from localcos.eval.sandbox import Limits, run_program


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pairs", nargs="+", metavar="RESULTS TASK")
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--memory-mb", type=int, default=1024)
    args = p.parse_args()
    if len(args.pairs) % 2:
        p.error("give each results file with its task")
    limits = Limits(seconds=args.timeout, memory_mb=args.memory_mb)
    run_program("pass")  # the boundary is checked once per process, before the first program
    for results, task in zip(args.pairs[::2], args.pairs[1::2]):
        tasks = {t.task_id: t for t in load_tasks(task)[1]}
        with open(results, encoding="utf-8") as f:
            records = [json.loads(line) for line in f.read().splitlines()[1:]]
        counts: collections.Counter[str] = collections.Counter()

        programs = [tasks[record["task_id"]].program(record["completion"]) for record in records]
        with ThreadPoolExecutor(2) as pool:  # two programs at a time: each mostly waits on its start
            outcomes = pool.map(lambda program: run_program(program, limits), programs)
            for record, (passed, result) in zip(records, ((o.passed, o.result) for o in outcomes)):
                if passed == record["passed"]:
                    counts["same verdict"] += 1
                else:
                    counts[f"was {'passed' if record['passed'] else 'failed'}, now {'passed' if passed else 'failed'}"] += 1
                    print(f"{record['task_id']} {record['config']}: was {record['result']!r}, now {result!r}", flush=True)
        print(f"{results}: {len(records)} completions; " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


if __name__ == "__main__":
    main()
