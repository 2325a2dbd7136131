"""llama.cpp's own test data and tools, from the source distribution of the llama-cpp-python that
localcos runs on.

The llama-cpp-python sdist vendors llama.cpp, and with it real tokenizers as test data: the
vocabulary-only GGUF files `models/ggml-vocab-*.gguf` (each with llama.cpp's tokenizer test cases,
`.inp` / `.out`) and real chat templates under `models/templates/`. The tests build models around
those tokenizers, and the benchmarks build llama.cpp's C++ tools from the same source, so the
figures compare like with like.

The sdist is fetched once with pip into the cache directory (`LOCALCOS_CACHE`), or taken from
`LOCALCOS_LLAMA_SDIST` (a downloaded `llama_cpp_python-VERSION.tar.gz`). Only the tests and the
benchmarks call this; localcos never downloads it for its users.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from ..errors import LocalcosError
from ..paths import cache_dir

PACKAGE = "llama-cpp-python"


class SdistUnavailable(LocalcosError):
    """The llama-cpp-python source distribution could not be fetched or read."""


def version() -> str:
    """The installed llama-cpp-python's version: the sdist must be the same one."""
    return importlib.metadata.version(PACKAGE)


def source_dir() -> Path:
    """The unpacked `vendor/llama.cpp` of the installed llama-cpp-python's sdist (fetched once)."""
    v = version()
    root = cache_dir() / f"llama-cpp-python-{v}"
    llama = root / "llama.cpp"
    if (root / ".complete").is_file():
        return llama
    archive = _archive(v)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=root.parent))
    try:
        prefix = f"llama_cpp_python-{v}/vendor/llama.cpp/"
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
            for m in members:
                m.name = m.name[len(prefix):] or "."
            if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12
                tar.extractall(tmp / "llama.cpp", members=members, filter="data")
            else:
                tar.extractall(tmp / "llama.cpp", members=members)
        if not (tmp / "llama.cpp" / "models").is_dir():
            raise SdistUnavailable(f"{archive} holds no vendor/llama.cpp/models: not a llama-cpp-python sdist")
        (tmp / ".complete").write_text(str(archive) + "\n")
        if root.exists():  # a half-finished earlier unpack
            shutil.rmtree(root)
        tmp.rename(root)
    except (OSError, tarfile.TarError) as e:
        raise SdistUnavailable(f"cannot unpack {archive}: {e}") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return llama


def _archive(v: str) -> Path:
    """The sdist archive: LOCALCOS_LLAMA_SDIST, an earlier download, or a new one from the index."""
    given = os.environ.get("LOCALCOS_LLAMA_SDIST")
    if given:
        path = Path(given).expanduser()
        if not path.is_file():
            raise SdistUnavailable(f"LOCALCOS_LLAMA_SDIST={given} is not a file")
        return path
    where = cache_dir() / "downloads"
    name = f"llama_cpp_python-{v}.tar.gz"
    if (where / name).is_file():
        return where / name
    where.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", f"{PACKAGE}=={v}", "-d", str(where), "-q"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        raise SdistUnavailable(f"downloading the {PACKAGE} {v} source from the package index timed out") from None
    if proc.returncode != 0 or not (where / name).is_file():
        lines = [line for line in (proc.stderr or proc.stdout).strip().splitlines() if line.strip()]
        reason = lines[-1].strip() if lines else f"pip exited with status {proc.returncode}"
        raise SdistUnavailable(
            f"cannot fetch the {PACKAGE} {v} source (its llama.cpp test vocabularies) from the package index: "
            f"{reason}; set LOCALCOS_LLAMA_SDIST to a downloaded {name}"
        )
    return where / name


def vocab_file(name: str) -> Path:
    """llama.cpp's vocabulary-only GGUF `ggml-vocab-NAME.gguf` (qwen2, llama-bpe, llama-spm, ...)."""
    path = source_dir() / "models" / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        known = sorted(p.name[len("ggml-vocab-") : -len(".gguf")] for p in path.parent.glob("ggml-vocab-*.gguf"))
        raise SdistUnavailable(f"llama.cpp ships no vocabulary {name!r}; it has {', '.join(known)}")
    return path


def vocab_cases(name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's tokenizer test cases for a vocabulary: (text, token ids without BOS) pairs."""
    base = vocab_file(name)
    inp, out = Path(f"{base}.inp"), Path(f"{base}.out")
    if not (inp.is_file() and out.is_file()):
        raise SdistUnavailable(f"llama.cpp ships no tokenizer test cases for {name!r}")
    marker = "\n__ggml_vocab_test__\n"  # ends every case, the last one included
    texts = inp.read_text(encoding="utf-8").removesuffix(marker).split(marker)
    ids = out.read_text(encoding="utf-8").removesuffix("\n").split("\n")
    if len(texts) != len(ids):
        raise SdistUnavailable(f"{inp.name} has {len(texts)} cases but {out.name} {len(ids)}")
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, ids)]


def template(name: str) -> str:
    """A chat template that llama.cpp ships (`models/templates/NAME.jinja`)."""
    path = source_dir() / "models" / "templates" / f"{name}.jinja"
    if not path.is_file():
        raise SdistUnavailable(f"llama.cpp ships no chat template {name!r}")
    return path.read_text(encoding="utf-8")


def build(targets: list[str], *, jobs: int | None = None, cmake_args: list[str] | None = None) -> Path:
    """Build llama.cpp's own C++ targets (llama-speculative, llama-perplexity, ...) from the same
    vendored source, once, in the cache; returns the folder holding the executables. Takes minutes
    on a laptop the first time; the cmake build is incremental afterwards."""
    if shutil.which("cmake") is None:
        raise SdistUnavailable("building llama.cpp's tools needs cmake (and a C++ compiler)")
    source = source_dir()
    build_dir = source.parent / "build"
    args = [
        "cmake", "-S", str(source), "-B", str(build_dir),
        "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DBUILD_SHARED_LIBS=OFF",
        *(cmake_args or []),
    ]  # fmt: skip
    for cmd in (args, ["cmake", "--build", str(build_dir), "--config", "Release", "-j", str(jobs or os.cpu_count() or 2), "--target", *targets]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"status {proc.returncode}"]
            raise SdistUnavailable(f"building llama.cpp ({' '.join(targets)}) failed: {tail[0]}")
    return build_dir / "bin"
