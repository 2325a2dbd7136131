"""Where the cursor's line goes in a fill-in-the-middle prompt: at the end of the prefix (what
localcos's and llama.cpp's `/infill` do with `prompt`) or after the middle token (what
llama-server's README says), and how the layouts (`--infill-layout`: the makers', the makers'
with the cursor's token healed, the cached one) compare there, judged by running the programs.

Every HumanEval problem, the middle non-blank line of its canonical solution being typed: cut at a
character strictly inside its code (the cursor, often inside a word; seeded per problem, so every
run cuts the same places), the rest of the line not yet written. The lines above the cursor are
`input_prefix`, the line up to the cursor is `prompt` (the typed part), the line's end and the
lines below are `input_suffix`, as llama.vim and llama.vscode send them; the model writes the
rest of the line. One `localcos serve` of the model (as made; greedy,
n_predict 48, no cache between requests) answers each arm (`--arms`, the first the baseline):

- `makers`: typed at the end of the prefix: `POST /infill` with those fields;
- `makers-healed`, `cached`: the same with `infill_layout` set so;
- `after-middle`: typed after `<|fim_middle|>`: `POST /v1/completions` with the prompt's token
  ids, the same prefix and suffix tokens (the suffix cut to the same budget) and the typed
  tokens after the middle token.

The program is the prefix, the typed part, the model's middle and the suffix, then the problem's
test, run in eval's sandbox (`--sandbox none`: not contained, as eval's flag): the middle as
generated, and cut as an editor's `n_indent` cuts it (the cursor line's indentation, as llama.vim
sends it: a new line indented less ends the middle; localcos's own rule, applied to both layouts
alike). Printed for each: pass@1 of each arm with its 95% interval, and its paired difference
to the first (won, lost, exact McNemar p). No parameter is chosen here: every problem is reported.

    .venv/bin/python benchmarks/infill_cursor.py                       # the 1.5B (localcos models pull coder-1.5b)
    .venv/bin/python benchmarks/infill_cursor.py --problems 0:20 --json cursor.json
    .venv/bin/python benchmarks/infill_cursor.py --arms makers,makers-healed,cached
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from localcos.backend import Model
from localcos.core.text import TextAssembler
from localcos.eval import sandbox
from localcos.eval.codetasks import CodeTask, humaneval_problems
from localcos.eval.paired import paired, wilson
from localcos.infill import Budget, Infill, fim_prompt
from localcos.models.registry import Registry
from localcos.runtime.profile import cpu_name
from localcos.testing.loopback import ServeProcess

N_PREDICT = 48
ARMS = ("makers", "makers-healed", "cached", "after-middle")


@dataclass(frozen=True)
class Cursor:
    """A problem with the cursor inside a line of its solution."""

    task: CodeTask  # prompt: the lines above and the typed part; suffix: the line's end and the lines below
    above: str
    typed: str
    rest: str  # the line's end (its new line) and the lines below
    indent: int  # the line's indentation (llama.vim's n_indent)


def cursors() -> list[Cursor]:
    """One cursor per HumanEval problem: its solution's middle non-blank line typed up to a random
    character of its code (at least one character typed, at least one to write)."""
    found = []
    for problem in humaneval_problems():
        number = int(problem["task_id"].split("/")[1])
        lines = problem["canonical_solution"].splitlines(keepends=True)
        marked = [i for i, line in enumerate(lines) if line.strip()]
        i = marked[len(marked) // 2]
        line = lines[i].rstrip("\n")
        indent = len(line) - len(line.lstrip())
        rng = np.random.default_rng(np.random.SeedSequence(0, spawn_key=(number,)))
        cut = int(rng.integers(indent + 1, len(line))) if len(line) - indent > 1 else len(line)
        above = problem["prompt"] + "".join(lines[:i])
        typed, rest = line[:cut], lines[i][len(line) :] + "".join(lines[i + 1 :])
        task = CodeTask(f"Cursor/{problem['task_id']}", above + typed, problem["test"], problem["entry_point"], suffix=rest)
        found.append(Cursor(task, above, typed, rest, indent))
    return found


def editor_cut(middle: str, indent: int) -> str:
    """The middle as `/infill` ends it with `n_indent` = `indent` (localcos's rule, llama-server's)."""
    text = TextAssembler(lambda _: middle.encode(), indent=indent)
    text.push(0)
    text.finish()
    return text.text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="coder-1.5b", help="a model's name (models.toml) or a GGUF file (default coder-1.5b)")
    parser.add_argument("--problems", default=":", help="a slice of the 164 problems, START:STOP (default all)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--sandbox", default=sandbox.CONTAINED, choices=(sandbox.CONTAINED, sandbox.UNCONTAINED))
    parser.add_argument("--json", help="write each problem's texts and verdicts here")
    parser.add_argument("--arms", default="makers,after-middle", help=f"what to compare, the first the baseline: some of {', '.join(ARMS)}")
    args = parser.parse_args()
    arms = args.arms.split(",")
    if not arms or any(a not in ARMS for a in arms):
        parser.error(f"--arms: some of {', '.join(ARMS)}, got {args.arms}")
    start, _, stop = args.problems.partition(":")
    chosen = cursors()[int(start or 0) : int(stop) if stop else None]
    sandbox.require(args.sandbox)
    path = Registry.load(user=False).resolve(args.model)
    vocab = Model(path, vocab_only=True)
    window, ctx = 512, 4096
    budget = Budget(window, ctx, N_PREDICT)  # /infill's, at the server's batch and context
    threads = ["--threads", str(args.threads)] if args.threads else []
    print(f"{len(chosen)} problems, {path.name}, greedy, n_predict {N_PREDICT}; {cpu_name()}", flush=True)
    serve = ServeProcess(["--models", str(path), "--ctx", str(ctx), "--batch-size", str(window), "--parallel", "1", *threads], start_timeout=300)
    records = []
    t0 = time.perf_counter()

    def middle(client: httpx.Client, c: Cursor, arm: str) -> str:
        if arm != "after-middle":
            answer = client.post("/infill", json={"input_prefix": c.above, "prompt": c.typed, "input_suffix": c.rest, "n_predict": N_PREDICT,
                                                  "temperature": 0, "cache_prompt": False, "infill_layout": arm})  # fmt: skip
            answer.raise_for_status()
            return answer.json()["content"]
        # the same prompt with the typed tokens moved after the middle token (the suffix cut as /infill cut it)
        typed = vocab.tokenize(c.typed, add_bos=False, special=True)
        cut = Budget(window, ctx, N_PREDICT, budget.suffix_tokens(len(typed)))
        tokens = fim_prompt(vocab, Infill(c.above, c.rest), cut).tokens + typed
        answer = client.post("/v1/completions", json={"prompt": tokens, "max_tokens": N_PREDICT, "temperature": 0})
        answer.raise_for_status()
        return answer.json()["choices"][0]["text"]

    try:
        with httpx.Client(base_url=serve.url, timeout=600) as client:
            for n, c in enumerate(chosen, 1):
                written = [middle(client, c, arm) for arm in arms]
                middles = [*written, *(editor_cut(m, c.indent) for m in written)]
                verdicts = [sandbox.run_program(c.task.program(m), sandbox=args.sandbox) for m in middles]
                records.append({"task_id": c.task.task_id, "typed": c.typed, "arms": arms, "middles": middles,
                                "passed": [v.passed for v in verdicts], "results": [v.result for v in verdicts]})  # fmt: skip
                print(f"[{n}/{len(chosen)}] {c.task.task_id} {' '.join(['fail', 'pass'][v.passed] for v in verdicts)} "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    finally:
        serve.stop()
    for title, at in (("the middle as generated", 0), ("the middle cut at the cursor line's indentation (n_indent)", len(arms))):
        print(f"\n{title}\n{'arm':<16}{'pass@1':>8}  95% interval          vs {arms[0]}")
        base = [r["passed"][at] for r in records]
        for k, arm in enumerate(arms):
            passed = [r["passed"][at + k] for r in records]
            lo, hi = wilson(sum(passed), len(passed))
            line = f"{arm:<16}{100 * sum(passed) / len(passed):>7.1f}%  {100 * lo:.1f}-{100 * hi:.1f} ({sum(passed)}/{len(passed)})"
            if k:
                d = paired(passed, base)
                same = sum(r["middles"][at] == r["middles"][at + k] for r in records)
                line += f"   {100 * d.difference:+.1f} points, won {d.won}, lost {d.lost}, p {d.p:.2g}, same middle {same}"
            print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
