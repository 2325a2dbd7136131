"""Host cost per generated token: everything localcos does outside llama.cpp, per method.

On a GPU (or with small models anywhere) a llama_decode call takes well under a millisecond, so
the Python and NumPy work around it (combining, sampling, verifying, committing, streaming)
decides how much of CoS's saving in calls reaches the user. This runs the real `Ensemble` and
decoding strategies over stand-in models whose forward pass costs almost nothing (logits rows
looked up from a fixed table), so nearly all of the measured time is the host loop.

    .venv/bin/python benchmarks/host_loop.py                       # 32k vocabulary
    .venv/bin/python benchmarks/host_loop.py --vocab 151936 --tokens 128
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from collections.abc import Sequence

import numpy as np

from localcos import Ensemble
from localcos.backend import ModelStats
from localcos.testing.fakes import OwnSlot

POOL = 256  # distinct logits rows per model: enough that rows are not all in the CPU cache


class TableModel(OwnSlot):
    """A model whose next-token logits depend on the last token only, from a fixed random table.

    Siblings (same `seed`, different `noise_seed`) agree like the we-pair set's models do."""

    def __init__(self, vocab: int, seed: int, noise: float = 0.0, noise_seed: int = 1, n_params: int = 10**9) -> None:
        base = np.random.default_rng(seed).standard_normal((POOL, vocab), dtype=np.float32) * 3
        if noise:
            base += np.random.default_rng(noise_seed).standard_normal((POOL, vocab), dtype=np.float32) * (3 * noise)
        self.table = base
        self.n_vocab = self.logits_vocab = vocab
        self.n_params, self.n_ctx, self.n_batch = n_params, 4096, 4096
        self.bos, self.eos = 1, 2
        self.name, self.path = f"table{seed}-{noise_seed}", Path(f"/table/{seed}-{noise_seed}.gguf")
        self.tokens: list[int] = []
        self.stats = ModelStats()

    def evaluate(self, tokens: Sequence[int], n_logits: int | None = None) -> np.ndarray:
        t0 = time.perf_counter()
        n_logits = len(tokens) if n_logits is None else n_logits
        self.tokens.extend(int(t) for t in tokens)
        last = self.tokens[len(self.tokens) - n_logits :]
        out = self.table[[t % POOL for t in last]]
        self.stats.calls += 1
        self.stats.tokens += len(tokens)
        self.stats.seconds += time.perf_counter() - t0
        return out


    def is_eog(self, token: int) -> bool:
        return token == self.eos

    def token_text(self, token: int) -> bytes:
        return b"t%d" % token

    def vocab_fingerprint(self, n: int | None = None) -> str:
        return f"table-{self.n_vocab if n is None else n}"

    def piece(self, token: int, special: bool = False) -> bytes:
        return b" t%d" % token

    def close(self) -> None:
        pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--tokens", type=int, default=256, help="tokens per completion")
    p.add_argument("--repeat", type=int, default=6, help="completions per method and temperature")
    p.add_argument("--methods", default="ensemble,sd,naive-cos,cos")
    p.add_argument("--gamma", type=lambda s: s if s == "auto" else int(s), default=3, help="proposal length, or auto")
    args = p.parse_args()

    models = [TableModel(args.vocab, 21), TableModel(args.vocab, 21, noise=0.2)]
    ens = Ensemble(models)
    prompt = list(range(10, 60))
    print(f"host cost per token, 2 models, vocabulary {args.vocab}, gamma {args.gamma}, {args.tokens} tokens x {args.repeat}")
    print(f"{'method':<10}{'T':>4}{'us/token':>10}{'accept':>8}")
    for temperature in (0.0, 1.0):
        for method in args.methods.split(","):
            cfg = dict(method=method, gamma=args.gamma, temperature=temperature, max_tokens=args.tokens, ignore_eos=True)
            ens.generate(prompt, seed=0, **cfg)  # warm caches and code paths
            seconds = tokens = 0.0
            accepted = tested = 0
            for r in range(args.repeat):
                stats = ens.generate(prompt, seed=r + 1, **cfg).stats
                seconds += stats.host_seconds
                tokens += stats.tokens
                accepted += stats.accepted
                tested += stats.accepted + stats.rejected
            rate = f"{accepted / tested:.0%}" if tested else "-"
            print(f"{method:<10}{temperature:>4g}{seconds / tokens * 1e6:>10.0f}{rate:>8}")


if __name__ == "__main__":
    main()
