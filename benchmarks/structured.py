"""Structured output through `localcos serve`: extraction under a JSON schema, ensemble against cos.

Starts `localcos serve --preset coder-we` (the trained Qwen2.5-Coder pair; `localcos models pull
coder-we`) with one sequence at a time, then sends --prompts extraction requests through the
openai client with OpenAI's `response_format` (a JSON schema of four fields). Each prompt is
answered by the constrained ensemble and by constrained cos in turn (same seed, interleaved), so
the ratio is measured side by side. Reported: answers that parse and validate under the schema,
per method; aggregate tokens/s of decoding (the server's own timing after the prompt: the second
request of a prompt finds it in the KV cache, so wall time would favour it; the order alternates
too) and cos / ensemble (the worst prompt too); acceptance, and looked-up tokens accepted /
proposed.

    .venv/bin/python benchmarks/structured.py
    .venv/bin/python benchmarks/structured.py --prompts 10 --temperature 1 --gamma 3
"""

from __future__ import annotations

import argparse
import json

from localcos.testing.loopback import ServeProcess

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "occupation": {"type": "string"},
    },
    "required": ["name", "age", "city", "occupation"],
    "additionalProperties": False,
}
PEOPLE = [
    ("Maria Lopez", 34, "Valencia", "nurse"),
    ("Tom Becker", 51, "Hamburg", "carpenter"),
    ("Aiko Tanaka", 28, "Osaka", "software engineer"),
    ("James O'Neill", 45, "Dublin", "bus driver"),
    ("Fatima Khan", 39, "Lahore", "architect"),
    ("Lars Nilsson", 62, "Uppsala", "retired teacher"),
    ("Chen Wei", 23, "Chengdu", "student"),
    ("Amara Obi", 31, "Lagos", "journalist"),
]
TEMPLATES = [
    "{name} is a {age}-year-old {occupation} who lives in {city}.",
    "Last week I met {name}, {age}, in {city}; they work as a {occupation}.",
    "Profile: works as {occupation}. Home town: {city}. Age {age}. Full name {name}.",
]


def prompts(n: int) -> list[tuple[str, tuple]]:
    out = []
    for i in range(n):
        person = PEOPLE[i % len(PEOPLE)]
        text = TEMPLATES[i % len(TEMPLATES)].format(name=person[0], age=person[1], city=person[2], occupation=person[3])
        out.append((f"Extract the person described in this text as JSON.\n\n{text}", person))
    return out


def valid(text: str) -> bool:
    """Whether `text` is a JSON object of exactly SCHEMA's fields with their types."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    types = {"string": str, "integer": int}
    fields = SCHEMA["properties"]
    return (
        isinstance(value, dict)
        and set(value) == set(fields)
        and all(isinstance(value[k], types[fields[k]["type"]]) and not isinstance(value[k], bool) for k in fields)
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="coder-we")
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--gamma", default="auto")
    p.add_argument("--max-tokens", type=int, default=96)
    args = p.parse_args()

    from openai import OpenAI

    server = ServeProcess(["--preset", args.preset, "--parallel", "1", "--ctx", "2048"], start_timeout=600)
    try:
        client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600)
        response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
        methods = ["ensemble", "cos"]
        totals = {m: {"tokens": 0, "seconds": 0.0, "valid": 0, "accepted": 0, "tested": 0, "lookup": [0, 0]} for m in methods}
        worst = float("inf")
        print(f"{args.preset}: {args.prompts} extraction prompts, JSON schema of 4 fields, T={args.temperature:g}, cos gamma {args.gamma}", flush=True)
        for i, (prompt, _) in enumerate(prompts(args.prompts)):
            rates = {}
            for method in methods if i % 2 == 0 else methods[::-1]:
                out = client.chat.completions.create(
                    model=args.preset,
                    messages=[{"role": "user", "content": prompt}],
                    temperature=args.temperature,
                    max_tokens=args.max_tokens,
                    seed=i,
                    response_format=response_format,  # type: ignore[arg-type]
                    extra_body={"method": method} | ({"gamma": args.gamma} if method != "ensemble" else {}),
                )
                stats = out.model_extra["localcos"]  # type: ignore[index]
                seconds = stats["seconds"]
                t = totals[method]
                t["tokens"] += out.usage.completion_tokens  # type: ignore[union-attr]
                t["seconds"] += seconds
                t["valid"] += valid(out.choices[0].message.content or "")
                t["accepted"] += stats.get("accepted", 0)
                t["tested"] += stats.get("accepted", 0) + stats.get("rejected", 0)
                t["lookup"][0] += stats.get("lookup_accepted", 0)
                t["lookup"][1] += stats.get("lookup_proposed", 0)
                rates[method] = out.usage.completion_tokens / seconds  # type: ignore[union-attr]
            worst = min(worst, rates["cos"] / rates["ensemble"])
            print(f"  prompt {i + 1}/{args.prompts}: ensemble {rates['ensemble']:.2f} tok/s, cos {rates['cos']:.2f} tok/s", flush=True)
        print(f"\n{'method':<10}{'valid':>8}{'tok/s':>9}{'vs ens':>8}{'accept':>8}{'lookup acc/prop':>17}")
        base = totals["ensemble"]["tokens"] / totals["ensemble"]["seconds"]
        for method in methods:
            t = totals[method]
            rate = t["tokens"] / t["seconds"]
            accept = f"{t['accepted'] / t['tested']:.0%}" if t["tested"] else "-"
            print(f"{method:<10}{t['valid']:>5}/{args.prompts:<2}{rate:>9.2f}{rate / base:>7.2f}x{accept:>8}{t['lookup'][0]:>9}/{t['lookup'][1]}")
        print(f"cos / ensemble on the worst prompt: {worst:.2f}x")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
