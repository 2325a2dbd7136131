"""`localcos make-test-models`: write the synthetic GGUF test models into a folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from .options import info


def register(sub: argparse._SubParsersAction) -> None:
    from ..models.weights import WEIGHT_TYPES

    p = sub.add_parser(
        "make-test-models",
        help="write synthetic GGUF test models into DIR",
        description="Write the synthetic test models (a base model, a sibling, a larger model, a different tokenizer, "
        "a padded vocabulary) into DIR: untrained weights that behave like language models, around a synthetic "
        "tokenizer or the real one of any GGUF file (--tokenizer).",
    )
    p.add_argument("dir")
    p.add_argument("--vocab", default="2048", help="vocabulary size of the synthetic tokenizer (default 2048; 400 to ~152k)")
    p.add_argument("--tokenizer", default=None, metavar="FILE.gguf", help="copy the tokenizer (and chat template) of this GGUF file instead")
    p.add_argument("--arch", choices=("llama", "qwen2"), default="llama", help="architecture (default llama; qwen2 adds attention biases)")
    p.add_argument("--dtype", choices=WEIGHT_TYPES, default="f32", help="weight type (default f32; q8_0, q4_0 and q4_k_m by llama.cpp's quantiser)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..backend import check_gguf_file
    from ..errors import ConfigError
    from ..config.parse import parse_int
    from ..models.writer import standard_test_models

    vocab = parse_int(args.vocab, "--vocab", minimum=400)
    if vocab > 300_000:
        raise ConfigError(f"--vocab must be at most 300000, got {vocab}", param="vocab")
    tokenizer = str(check_gguf_file(args.tokenizer)) if args.tokenizer else None
    made = standard_test_models(Path(args.dir), vocab_size=vocab, dtype=args.dtype, tokenizer=tokenizer, arch=args.arch, progress=info)
    for name, path in made.items():
        print(f"{name}\t{path}")
    return 0
