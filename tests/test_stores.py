"""The models people already have: an Ollama store, an LM Studio folder and the Hugging Face cache,
built in a temporary HOME around the test models (blobs as symlinks, as the stores allow), found by
`localcos models list` and named in `--models`, presets and the Python API."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localcos.errors import ModelNotAvailableError
from localcos.models import stores

LAYER = "application/vnd.ollama.image.model"


def ollama_manifest(root: Path, name: str, blob_source: Path | None, tag: str = "latest", namespace: str = "library",
                    registry: str = "registry.ollama.ai", template: bool = True) -> Path:  # fmt: skip
    """Ollama's layout: a manifest per model and tag, the GGUF a content-named blob beside the others."""
    digest = hashlib.sha256(f"{registry}/{namespace}/{name}:{tag}".encode()).hexdigest()
    blob = root / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    if blob_source is not None and not blob.exists():
        blob.symlink_to(blob_source)
    layers = [{"mediaType": LAYER, "digest": f"sha256:{digest}", "size": 1}]
    if template:
        layers.append({"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 1})
    manifest = root / "manifests" / registry / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                                    "config": {"digest": "sha256:" + "1" * 64}, "layers": layers}))  # fmt: skip
    return manifest


class Home:
    """A temporary HOME with an Ollama store, an LM Studio folder and a hub cache."""

    def __init__(self, root: Path, models, real_models) -> None:
        self.root = root
        self.ollama = root / ".ollama" / "models"
        self.lmstudio = root / ".lmstudio" / "models"
        self.hub = root / "hf" / "hub"
        self.files = {
            "base": models["base"], "sibling": models["sibling"], "qwen2": real_models["qwen2"], "llama3": real_models["llama3"],
        }  # fmt: skip
        ollama_manifest(self.ollama, "tiny", self.files["base"])
        ollama_manifest(self.ollama, "tiny", self.files["sibling"], tag="noisy")
        ollama_manifest(self.ollama, "qwen-test", self.files["qwen2"], tag="f16", namespace="someone")
        for publisher, repo, name in (("lmstudio-community", "Llama-Test-GGUF", "llama3"), ("bartowski", "Tiny-GGUF", "sibling")):
            folder = self.lmstudio / publisher / repo
            folder.mkdir(parents=True)
            (folder / f"{name}-F16.gguf").symlink_to(self.files[name])
        snapshot = self.hub / "models--owner--tiny-repo" / "snapshots" / ("a" * 40)
        snapshot.mkdir(parents=True)
        (snapshot / "tiny.gguf").symlink_to(self.files["base"])
        (self.hub / "models--owner--tiny-repo" / "refs").mkdir()
        (self.hub / "models--owner--tiny-repo" / "refs" / "main").write_text("a" * 40)
        older = self.hub / "models--owner--tiny-repo" / "snapshots" / ("b" * 40)  # not main's: hf: names never load it
        older.mkdir()
        (older / "old.gguf").symlink_to(self.files["sibling"])

    def env(self, **more: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("OLLAMA_MODELS", "XDG_CONFIG_HOME", "HF_HOME", "HF_HUB_CACHE")}
        return {**env, "HOME": str(self.root), "HF_HOME": str(self.root / "hf"), "HF_HUB_OFFLINE": "1", **more}

    def tree(self) -> dict[str, tuple]:
        return {str(p): (p.is_symlink(), p.stat().st_mtime_ns if p.is_file() and not p.is_symlink() else 0)
                for p in sorted(self.root.rglob("*"))}  # fmt: skip


@pytest.fixture
def home(tmp_path, models, real_models, monkeypatch) -> Home:
    h = Home(tmp_path / "home", models, real_models)
    for key, value in h.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(h.hub))
    return h


def localcos(home: Home, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localcos", *args], capture_output=True, text=True, timeout=300, env=home.env(**env))


def test_models_list_names_what_the_stores_hold_and_which_pair_at_the_token_level(home):
    proc = localcos(home, "models", "list")
    assert proc.returncode == 0, proc.stderr
    section = proc.stdout.split("on this machine", 1)[1]
    rows = {line.split()[0]: line for line in section.splitlines()[1:] if line.startswith(("ollama:", "lmstudio:", "hf:"))}
    assert set(rows) == {"ollama:tiny:latest", "ollama:tiny:noisy", "ollama:someone/qwen-test:f16",
                         "lmstudio:lmstudio-community/Llama-Test-GGUF/llama3-F16.gguf", "lmstudio:bartowski/Tiny-GGUF/sibling-F16.gguf",
                         "hf:owner/tiny-repo/tiny.gguf"}, section  # fmt: skip
    group = {name: line.split()[5] for name, line in rows.items()}  # the tokenizer's letter
    assert group["ollama:tiny:latest"] == group["ollama:tiny:noisy"] == group["lmstudio:bartowski/Tiny-GGUF/sibling-F16.gguf"]
    assert len({group["ollama:tiny:latest"], group["ollama:someone/qwen-test:f16"], group["lmstudio:lmstudio-community/Llama-Test-GGUF/llama3-F16.gguf"]}) == 3
    assert "qwen2" in rows["ollama:someone/qwen-test:f16"] and "F16" in rows["ollama:someone/qwen-test:f16"]
    assert "template layer is not used" in rows["ollama:tiny:latest"]


def _greedy(home: Home, models: str, *more: str) -> str:
    proc = localcos(home, "generate", "--models", models, "--prompt", "The river", "--temperature", "0", "--max-tokens", "12", "--json",
                    "--ctx", "256", *more)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["completions"][0]["text"]


def test_generate_by_store_names_is_generate_by_paths_at_both_levels(home):
    f = home.files
    token_level = _greedy(home, f"{f['base']},{f['sibling']}")
    assert _greedy(home, "ollama:tiny,ollama:tiny:noisy") == token_level
    assert _greedy(home, "hf:owner/tiny-repo/tiny.gguf,lmstudio:bartowski/Tiny-GGUF") == token_level  # FILE left out: one GGUF
    byte_level = _greedy(home, f"{f['qwen2']},{f['llama3']}")
    assert _greedy(home, "ollama:someone/qwen-test:f16,lmstudio:lmstudio-community/Llama-Test-GGUF/llama3-F16.gguf") == byte_level
    # a preset in the user's models.toml naming Ollama's models
    config = home.root / ".config" / "localcos"
    config.mkdir(parents=True)
    (config / "models.toml").write_text('[ensembles.mine]\nmodels = ["ollama:tiny", "ollama:tiny:noisy"]\ncombine = "we"\n')
    assert _preset(home) == token_level


def _preset(home: Home) -> str:
    proc = localcos(home, "generate", "--preset", "mine", "--prompt", "The river", "--temperature", "0", "--max-tokens", "12", "--json",
                    "--ctx", "256")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["completions"][0]["text"]


def test_the_python_api_takes_store_names(home):
    from localcos import Ensemble

    with Ensemble.load(["ollama:tiny", "lmstudio:bartowski/Tiny-GGUF/sibling-F16.gguf"], n_ctx=256) as ens:
        assert [m.path for m in ens.models] == [home.ollama / "blobs" / next(p.name for p in (home.ollama / "blobs").iterdir()
                                                                                if p.resolve() == home.files["base"].resolve()),
                                                home.lmstudio / "bartowski" / "Tiny-GGUF" / "sibling-F16.gguf"]  # fmt: skip
        assert ens.models[0].path.resolve() == home.files["base"].resolve()  # loaded from the blob where it lies


def test_bad_stores_are_one_line_and_exit_2_writing_nothing(home, tmp_path):
    notjson = ollama_manifest(home.ollama, "broken", home.files["base"])
    notjson.write_text("{not json")
    ollama_manifest(home.ollama, "gone", None)  # its blob was deleted
    text = tmp_path / "notes.txt"
    text.write_text("not a model at all " * 100)
    ollama_manifest(home.ollama, "text", text)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = [
        (["--models", "ollama:broken"], {}, "its manifest", "is not JSON"),
        (["--models", "ollama:gone"], {}, "is missing; pull it again with `ollama pull gone:latest`", ""),
        (["--models", "ollama:text"], {}, "is not a usable GGUF file", ""),
        (["--models", "ollama:tinny"], {}, "unknown Ollama model 'tinny'", "did you mean tiny:latest"),
        (["--models", "lmstudio:bartowski/Tiny"], {}, "unknown LM Studio model 'bartowski/Tiny'", "did you mean"),
        (["--models", "ollama:tiny"], {"OLLAMA_MODELS": str(a_file)}, f"OLLAMA_MODELS={a_file} is not a folder", ""),
    ]
    before = home.tree()
    for argv, env, *says in cases:
        proc = localcos(home, "generate", *argv, "--prompt", "x", "--max-tokens", "2", "--ctx", "64", **env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and all(s in lines[0] for s in says), (argv, proc.stderr)
    # the listing shows what is usable, and a line for each broken thing
    listing = localcos(home, "models", "list")
    assert listing.returncode == 2 and "ollama:tiny:latest" in listing.stdout
    errors = listing.stderr.strip().splitlines()
    assert len(errors) == 3 and all(line.startswith("localcos: error: ollama:") for line in errors), listing.stderr
    assert home.tree() == before  # nothing written


def test_a_store_of_fifty_manifests_reads_each_file_s_header_once(home, monkeypatch):
    from localcos.backend import gguf_file
    from localcos.cli import models as models_cli

    for i in range(50):
        ollama_manifest(home.ollama, f"many{i:02d}", home.files["base" if i % 2 else "qwen2"])
    read = []
    real = gguf_file.read_info
    monkeypatch.setattr(gguf_file, "read_info", lambda path, *a, **k: (read.append(Path(path).resolve()), real(path, *a, **k))[1])
    monkeypatch.setattr("localcos.backend.read_info", gguf_file.read_info)
    assert models_cli._list_found() == 0
    # 56 names over four files: each file's header read once, nothing beyond it
    assert sorted(read) == sorted({home.files[n].resolve() for n in ("base", "sibling", "qwen2", "llama3")})
    found, problems = stores.discover()
    assert len(found) == 56 and not problems


def test_names_are_parsed_as_ollama_and_lm_studio_write_them(home):
    assert stores.ollama_model("tiny").path == stores.ollama_model("tiny:latest").path
    assert stores.ollama_model("someone/qwen-test:f16").path.resolve() == home.files["qwen2"].resolve()
    ollama_manifest(home.ollama, "Tiny-GGUF", home.files["base"], tag="Q4_K_M", namespace="bartowski", registry="hf.co")
    assert stores.ollama_model("hf.co/bartowski/Tiny-GGUF:Q4_K_M").name == "ollama:hf.co/bartowski/Tiny-GGUF:Q4_K_M"
    for bad in ("", "a/b/c/d", "x:../y", "/x"):
        with pytest.raises(ModelNotAvailableError, match="is not an Ollama model name"):
            stores.ollama_model(bad)
    with pytest.raises(ModelNotAvailableError, match="is not an LM Studio model name"):
        stores.lmstudio_model("just-one")
    (home.lmstudio / "bartowski" / "Tiny-GGUF" / "second.gguf").symlink_to(home.files["base"])
    with pytest.raises(ModelNotAvailableError, match="holds 2 GGUF files; name one"):
        stores.lmstudio_model("bartowski/Tiny-GGUF")
