"""What a multiple-choice item costs through `localcos serve`, as lm-evaluation-harness asks for it.

lm-evaluation-harness's `local-completions` model sends every choice of an item as its own
request: the context's token ids followed by the choice's, with `echo: true, logprobs: 1,
max_tokens: 1, temperature: 0`, one request after another. This sends --items such items (a
context of about --context tokens, 4 choices of a few tokens each) to a server of this checkout
and, with --baseline REV, to one of an earlier commit of localcos started the same way (its code
from `git archive`), one server at a time, and prints seconds per item for each, their ratio and
the tokens each server's models evaluated per item.

    .venv/bin/python benchmarks/eval_choices.py                                  # the demo pair
    .venv/bin/python benchmarks/eval_choices.py --preset coder-we --items 4 --baseline b0269d1
"""

from __future__ import annotations

import argparse
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import httpx

from localcos.testing.loopback import ServeProcess

ROOT = Path(__file__).resolve().parents[1]
WORDS = [
    "the",
    "river",
    "runs",
    "past",
    "the",
    "old",
    "mill",
    "and",
    "the",
    "village",
    "by",
    "the",
    "sea",
    "where",
    "the",
    "market",
    "opens",
    "in",
    "the",
    "morning",
]


def items(tokenize, n_items: int, context_tokens: int) -> list[tuple[list[int], list[list[int]]]]:
    out = []
    for i in range(n_items):
        words = [WORDS[(7 * i + 3 * k) % len(WORDS)] for k in range(context_tokens)]
        context = tokenize(" ".join(words))[:context_tokens]
        choices = [tokenize(" " + " ".join(WORDS[(i + c + k) % len(WORDS)] for k in range(2 + c))) for c in range(4)]
        out.append((context, choices))
    return out


def measure(server: ServeProcess, work: list[tuple[list[int], list[list[int]]]]) -> tuple[float, float]:
    """Seconds per item, and tokens the models evaluated per item (the largest of the models)."""
    client = httpx.Client(timeout=600)
    body = {"max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0}
    client.post(server.url + "/v1/completions", json={**body, "prompt": work[0][0][:8]})  # warm up
    before = evaluated(server)
    t0 = time.perf_counter()
    for context, choices in work:
        for choice in choices:
            r = client.post(server.url + "/v1/completions", json={**body, "prompt": context + choice})
            r.raise_for_status()
    seconds = (time.perf_counter() - t0) / len(work)
    return seconds, (evaluated(server) - before) / len(work)


def evaluated(server: ServeProcess) -> float:
    models = server.health()["models"]
    if "evaluated_tokens" not in models[0]:
        return float("nan")  # an older server does not report it
    return max(m["evaluated_tokens"] for m in models)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", help="A,B (default: the synthetic demo pair)")
    p.add_argument("--preset", help="a models.toml preset instead (e.g. coder-we)")
    p.add_argument("--items", type=int, default=8)
    p.add_argument("--context", type=int, default=300, help="context tokens per item (default 300)")
    p.add_argument("--baseline", help="a git revision of localcos to compare with (started from its own code)")
    args = p.parse_args()
    models = ["--models", args.models] if args.models else ["--preset", args.preset] if args.preset else ["--demo"]
    server_args = [*models, "--ctx", "2048"]

    from localcos import Ensemble
    from localcos.config import resolve

    settings = resolve(
        {"models": args.models} if args.models else {"preset": args.preset} if args.preset else {}, defaults={"synthetic": "demo"}
    )
    with Ensemble.load(settings.load.paths, n_ctx=64) as ens:
        work = items(lambda text: ens.tokenize(text, add_bos=False), args.items, args.context)
    print(f"{args.items} items: a context of {len(work[0][0])} tokens and 4 choices of {', '.join(str(len(c)) for c in work[0][1])} tokens "
          f"({settings.name}); lm-eval's requests, one after another")  # fmt: skip

    results = {}
    server = ServeProcess(server_args, start_timeout=600)
    try:
        results["this checkout"] = measure(server, work)
    finally:
        server.stop()
    if args.baseline:
        with tempfile.TemporaryDirectory(prefix="localcos-baseline-") as tmp:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline], capture_output=True, check=True).stdout
            with open(Path(tmp) / "src.tar", "wb") as f:
                f.write(archive)
            with tarfile.open(Path(tmp) / "src.tar") as tar:
                tar.extractall(tmp, filter="data")
            (Path(tmp) / "localcos" / "tui").symlink_to(Path(tmp) / "tui")
            # its own code: first on the path, and the working directory (python -m puts it first)
            server = ServeProcess(server_args, env={"PYTHONPATH": tmp}, start_timeout=600, cwd=tmp)
            try:
                results[f"localcos {args.baseline}"] = measure(server, work)
            finally:
                server.stop()
    print(f"\n{'server':<24}{'s / item':>10}{'evaluated tokens / item':>26}")
    for name, (seconds, tokens) in results.items():
        print(f"{name:<24}{seconds:>10.2f}{tokens:>26.0f}")
    if args.baseline:
        (now, _), (then, _) = results["this checkout"], results[f"localcos {args.baseline}"]
        print(f"\nan item takes {now / then:.0%} of the time it took at {args.baseline}")


if __name__ == "__main__":
    main()
