"""The infilling tasks a suffix budget changes: those of HumanEval's single-line (or multi-line)
infilling, from a first problem on, whose suffix is longer than N tokens of a model, written as a
task file for `localcos eval --task` (each other task's prompt is the same under `--infill-suffix N`
as without it, so what the budget costs in correct completions is measured on these alone).

    python benchmarks/long_suffix_tasks.py --out single_long_suffix.jsonl   # the 1.5B, 64 tokens, problems 82-163
"""

from __future__ import annotations

import argparse
import json

from localcos.eval.codetasks import INFILLING, infilling_tasks
from localcos.models.registry import Registry


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the task file to write (JSON lines)")
    p.add_argument("--kind", default="humaneval-single-line", choices=INFILLING[:2])
    p.add_argument("--model", default="coder-1.5b", help="whose tokens count (a name or a GGUF path)")
    p.add_argument("--tokens", type=int, default=64, help="the suffix budget: tasks whose suffix is longer are written")
    p.add_argument("--first-problem", type=int, default=82, help="HumanEval problem the split starts at (82: the reporting split)")
    args = p.parse_args()
    import llama_cpp

    vocab = llama_cpp.Llama(str(Registry.load().resolve(args.model)), vocab_only=True, verbose=False)
    tasks = [t for t in infilling_tasks(args.kind) if int(t.task_id.split("/")[2]) >= args.first_problem]
    long = [t for t in tasks if len(vocab.tokenize((t.suffix or "").encode(), add_bos=False, special=False)) > args.tokens]
    with open(args.out, "w", encoding="utf-8") as f:
        for t in long:
            f.write(json.dumps({"task_id": t.task_id, "prompt": t.prompt, "suffix": t.suffix, "test": t.test, "entry_point": t.entry_point}) + "\n")
    print(f"{len(long)} of {len(tasks)} tasks have a suffix of more than {args.tokens} tokens: {args.out}")


if __name__ == "__main__":
    main()
