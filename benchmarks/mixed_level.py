"""Where the mixed level's time goes against the model alone, on the texts both write alike.

One model, greedy, the prompts of a code task (as `localcos eval` reads them, with its stops),
each decoded by the model on its own tokens (the token level) and at the mixed level (gate 0.5,
one model's greedy default), one after the other on one loaded model (`Ensemble.beside`). On the
problems where both wrote the same text it splits the mixed level's time into its parts: the
whole-token steps' llama.cpp calls (one row each), the byte steps' calls (rows per call), the
host's work, and compares each with the token level's calls. With `--temperature` above 0 the
texts are draws (a seed per problem), and the two levels are timed over all of them. Choose
parameters on a task's validation split only.

    .venv/bin/python benchmarks/mixed_level.py --model ~/.cache/localcos/packaged/coder-1.5b.gguf --task /data/mbpp-choose.jsonl --problems 0:40
    .venv/bin/python benchmarks/mixed_level.py --model ~/.cache/localcos/packaged/coder-0.5b.gguf --problems 0:40 --temperature 0.7 --top-p 0.9
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from localcos import ByteEnsemble, Ensemble
from localcos.core.combiners import Gated, WeightedEnsemble
from localcos.eval.codetasks import STOPS, load_tasks, select
from localcos.runtime.bytelevel.member import ByteMember
from localcos.runtime.profile import cpu_name


@dataclass
class Parts:
    """Seconds and calls of one level over the shared texts."""

    seconds: float = 0.0  # the completion's own (its prompt excluded)
    llama: float = 0.0  # in llama.cpp calls
    calls: int = 0
    rows: int = 0
    chars: int = 0
    token_calls: int = 0  # the mixed level's whole-token steps
    token_llama: float = 0.0


class TokenSteps:
    """Counts the llama.cpp time of the mixed level's whole-token steps (`ByteMember.take_token`)."""

    def __init__(self) -> None:
        self.calls, self.seconds = 0, 0.0
        self._take = ByteMember.take_token
        steps = self

        def take_token(member: ByteMember, k: int, log_p: float | None = None) -> None:
            before = member.model.stats.seconds
            steps._take(member, k, log_p)
            steps.calls += 1
            steps.seconds += member.model.stats.seconds - before

        ByteMember.take_token = take_token  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a GGUF file")
    ap.add_argument("--task", default="humaneval")
    ap.add_argument("--problems", default=None, help="START:STOP of the task's problems")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--gate", type=float, default=0.5)
    ap.add_argument("--temperature", type=float, default=0.0, help="above 0: sampled (seed = the problem's index), timed over all problems")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    path = args.model
    _, tasks = load_tasks(args.task)
    tasks = select(tasks, args.problems)
    steps = TokenSteps()
    settings = dict(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens, stop=list(STOPS), method="ensemble")
    sampled = args.temperature > 0  # texts are draws: the two levels are timed over all of them
    token, mixed = Parts(), Parts()
    shared = differ = 0
    with ByteEnsemble.load([path], Gated(WeightedEnsemble(), args.gate), level="mixed") as ens:
        alone = Ensemble.beside(ens, 0)  # the same weights and context: the calls cost the same
        for n, task in enumerate(tasks):
            t0, s0 = steps.calls, steps.seconds  # the token level takes no byte-level steps
            if n % 2:  # each level first on every second problem: what a warm cache gives goes to both
                m = ens.generate(task.prompt, seed=n, **settings)
                a = alone.generate(task.prompt, seed=n, **settings)
            else:
                a = alone.generate(task.prompt, seed=n, **settings)
                m = ens.generate(task.prompt, seed=n, **settings)
            if a.text != m.text and not sampled:
                differ += 1
                continue
            shared += 1
            token.seconds += a.stats.seconds
            token.llama += a.stats.llama_seconds
            token.calls += sum(a.stats.calls)
            token.chars += len(a.text)
            mixed.seconds += m.stats.seconds
            mixed.llama += m.stats.llama_seconds
            mixed.calls += sum(m.stats.calls)
            mixed.rows += sum(m.stats.rows)
            mixed.chars += len(m.text)
            mixed.token_calls += steps.calls - t0
            mixed.token_llama += steps.seconds - s0
            print(
                f"[{n + 1}/{len(tasks)}] {task.task_id}: {'sampled' if sampled else 'same text'}, "
                f"token level {a.stats.seconds:.2f} s, mixed {m.stats.seconds:.2f} s",
                flush=True,
            )
    if sampled:
        rate = (mixed.chars / mixed.seconds) / (token.chars / token.seconds)
        print(f"\n{args.model} | {len(tasks)} texts sampled at T={args.temperature:g}, top-p {args.top_p:g} | {cpu_name()}")
        print(
            f"token level: {token.chars} chars in {token.seconds:.1f} s ({token.chars / token.seconds:.1f} chars/s), host {token.seconds - token.llama:.1f} s"
        )
        print(
            f"mixed level: {mixed.chars} chars in {mixed.seconds:.1f} s ({mixed.chars / mixed.seconds:.1f} chars/s) = {rate:.3f}x, "
            f"host {mixed.seconds - mixed.llama:.1f} s, {mixed.calls} calls against {token.calls}"
        )
        return
    print(f"\n{args.model} | {shared} shared texts, {differ} differ | {cpu_name()}")
    tok_call = token.llama / max(token.calls, 1)
    byte_calls = mixed.calls - mixed.token_calls
    byte_llama = mixed.llama - mixed.token_llama
    print(
        f"token level: {token.seconds:.1f} s ({token.llama:.1f} in {token.calls} calls, {1000 * tok_call:.1f} ms each; host {token.seconds - token.llama:.1f})"
    )
    print(f"mixed level: {mixed.seconds:.1f} s = {token.seconds / max(mixed.seconds, 1e-9):.3f}x")
    print(
        f"  whole-token steps: {mixed.token_calls} calls, {mixed.token_llama:.1f} s ({1000 * mixed.token_llama / max(mixed.token_calls, 1):.1f} ms each)"
    )
    print(
        f"  byte steps: {byte_calls} calls, {mixed.rows - mixed.token_calls} rows, {byte_llama:.1f} s "
        f"({1000 * byte_llama / max(byte_calls, 1):.1f} ms each; {byte_calls + mixed.token_calls - token.calls:+d} calls on the token level's)"
    )
    print(f"  host: {mixed.seconds - mixed.llama:.1f} s (token level {token.seconds - token.llama:.1f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "model": args.model,
                    "cpu": cpu_name(),
                    "shared": shared,
                    "differ": differ,
                    "token": token.__dict__,
                    "mixed": mixed.__dict__,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
