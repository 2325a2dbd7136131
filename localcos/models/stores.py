"""The models people already have: Ollama's store, LM Studio's models folder and the Hugging Face
hub cache, found on disk and named as `--models` takes them. Offline and read-only: nothing is
written to a store, and nothing of a model is read beyond its GGUF header.

Names:
- `ollama:MODEL[:TAG]` (tag `latest` by default; `NAMESPACE/MODEL` for others' models,
  `REGISTRY/NAMESPACE/MODEL` for other registries, e.g. `hf.co/OWNER/REPO:Q4_K_M`). Ollama keeps a
  manifest per model and tag, `manifests/REGISTRY/NAMESPACE/MODEL/TAG`, whose layer of media type
  `application/vnd.ollama.image.model` is the GGUF file, `blobs/sha256-HEX`; it loads from there
  (no copy). The store is `$OLLAMA_MODELS`, else `~/.ollama/models` and the Linux service's
  `/usr/share/ollama/.ollama/models`. Ollama's own template layer (Go's template syntax) is not
  used: the GGUF carries its chat template.
- `lmstudio:PUBLISHER/REPO[/FILE]`: LM Studio's models folder, `~/.lmstudio/models` (older
  versions `~/.cache/lm-studio/models`, and the `downloadsFolder` its settings name), laid out as
  `PUBLISHER/REPO/FILE.gguf`; FILE may be left out where the folder holds one model GGUF.
- GGUF files in the hub cache are listed under the `hf:OWNER/REPO/FILE` references that already
  exist, which resolve from the cache without the network (`registry.hub_file`).
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator

from ..errors import ModelFileError, ModelNotAvailableError

OLLAMA = "ollama:"
LMSTUDIO = "lmstudio:"
_MODEL_LAYER = "application/vnd.ollama.image.model"
_TEMPLATE_LAYER = "application/vnd.ollama.image.template"
_DEFAULT_REGISTRY, _DEFAULT_NAMESPACE = "registry.ollama.ai", "library"
_MAX_MANIFEST = 1 << 20  # a manifest is a few hundred bytes; anything this large is not one


class StoreError(ModelFileError):
    """A store, a manifest or a blob that cannot be used: one line saying which and why."""


@dataclass(frozen=True)
class Found:
    """A GGUF file found in a store: the name `--models` takes, the file, the store, and a note
    (what differs from how the store itself runs it)."""

    name: str
    path: Path
    store: str
    note: str = ""


# --- Ollama ---------------------------------------------------------------------------------------------


def ollama_roots() -> list[Path]:
    """Ollama's model folders: `$OLLAMA_MODELS` where set (Ollama then uses only it), else the
    user's and the Linux service's, those that exist."""
    given = os.environ.get("OLLAMA_MODELS")
    if given:
        root = Path(given).expanduser()
        if not root.is_dir():
            raise StoreError(f"OLLAMA_MODELS={given} is not a folder")
        return [root]
    return [p for p in (Path.home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")) if p.is_dir()]


def _ollama_parts(name: str) -> tuple[str, str, str, str]:
    """MODEL[:TAG] -> (registry, namespace, model, tag), as Ollama fills them in."""
    model, _, tag = name.partition(":")
    parts = model.split("/")
    if not model or not all(parts) or len(parts) > 3 or "/" in tag or tag.startswith("."):
        raise ModelNotAvailableError(f"{OLLAMA}{name} is not an Ollama model name (MODEL[:TAG], NAMESPACE/MODEL[:TAG])")
    registry, namespace = _DEFAULT_REGISTRY, _DEFAULT_NAMESPACE
    if len(parts) == 3:
        registry, namespace = parts[0], parts[1]
    elif len(parts) == 2:
        namespace = parts[0]
    return registry, namespace, parts[-1], tag or "latest"


def _ollama_name(registry: str, namespace: str, model: str, tag: str) -> str:
    """The name Ollama shows (and `ollama:` takes) for a manifest."""
    if registry != _DEFAULT_REGISTRY:
        return f"{registry}/{namespace}/{model}:{tag}"
    return f"{model}:{tag}" if namespace == _DEFAULT_NAMESPACE else f"{namespace}/{model}:{tag}"


def _ollama_manifests(root: Path) -> Iterator[tuple[str, Path]]:
    """(name, manifest path) of every model tag in a store."""
    top = root / "manifests"
    for registry in _folders(top):
        for namespace in _folders(registry):
            for model in _folders(namespace):
                for tag in sorted(_entries(model)):
                    if tag.is_file() and not tag.name.startswith("."):
                        yield _ollama_name(registry.name, namespace.name, model.name, tag.name), tag


def _ollama_model(name: str, root: Path, manifest: Path, check: bool = True) -> Found:
    """The GGUF blob a manifest names, checked to exist and (`check`) to be a whole GGUF file
    (a listing reads its header itself)."""
    where = f"{OLLAMA}{name}"
    try:
        size = manifest.stat().st_size
        if size > _MAX_MANIFEST:
            raise StoreError(f"{where}: its manifest {manifest} is not an Ollama manifest ({size} bytes)")
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except OSError as e:
        raise StoreError(f"{where}: cannot read its manifest {manifest}: {e.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StoreError(f"{where}: its manifest {manifest} is not JSON ({e})") from None
    layers = data.get("layers") if isinstance(data, dict) else None
    models = [x for x in layers if isinstance(x, dict) and x.get("mediaType") == _MODEL_LAYER] if isinstance(layers, list) else []
    digest = models[0].get("digest") if len(models) == 1 else None
    if not isinstance(digest, str) or not digest.startswith("sha256:") or not all(c in "0123456789abcdef" for c in digest[7:]):
        raise StoreError(f"{where}: its manifest {manifest} names no model layer ({_MODEL_LAYER} with a sha256 digest)")
    blob = root / "blobs" / digest.replace(":", "-")
    if not blob.exists():
        raise StoreError(f"{where}: the blob its manifest names, {blob}, is missing; pull it again with `ollama pull {name}`")
    note = ""
    if any(isinstance(x, dict) and x.get("mediaType") == _TEMPLATE_LAYER for x in layers):  # type: ignore[union-attr]
        note = "Ollama's template layer is not used: the GGUF's own chat template is"
    found = Found(where, blob, "Ollama", note)
    return _checked(found) if check else found


def ollama_model(name: str) -> Found:
    """The model `ollama:NAME` names, in the first store that has it."""
    registry, namespace, model, tag = _ollama_parts(name)
    roots = ollama_roots()
    for root in roots:
        manifest = root / "manifests" / registry / namespace / model / tag
        if manifest.is_file():
            return _ollama_model(_ollama_name(registry, namespace, model, tag), root, manifest)
    known = [n for root in roots for n, _ in _ollama_manifests(root)]
    if not roots:
        raise ModelNotAvailableError(f"{OLLAMA}{name}: no Ollama store here (~/.ollama/models, or set OLLAMA_MODELS)")
    raise ModelNotAvailableError(f"unknown Ollama model {name!r}{_near(_ollama_name(registry, namespace, model, tag), known)}")


# --- LM Studio -------------------------------------------------------------------------------------------


def lmstudio_roots() -> list[Path]:
    """LM Studio's models folders that exist: its default, the older one, and the downloads
    folder its settings name."""
    home = Path.home()
    candidates = [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    for settings in (home / ".lmstudio" / "settings.json", home / ".cache" / "lm-studio" / "settings.json"):
        try:
            folder = json.loads(settings.read_text(encoding="utf-8")).get("downloadsFolder")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            continue  # no settings, or not ours to judge: its folder is simply not added
        if isinstance(folder, str) and folder:
            candidates.append(Path(folder).expanduser())
    out: list[Path] = []
    for p in candidates:
        if p.is_dir() and p.resolve() not in {q.resolve() for q in out}:
            out.append(p)
    return out


def _is_model_file(path: Path) -> bool:
    # a vision model's projector (mmproj-*.gguf) sits beside its GGUF and is no language model
    return path.suffix == ".gguf" and not path.name.startswith("mmproj") and path.is_file()


def _lmstudio_files(root: Path) -> Iterator[tuple[str, Path]]:
    for publisher in _folders(root):
        for repo in _folders(publisher):
            for file in sorted(_entries(repo)):
                if _is_model_file(file):
                    yield f"{publisher.name}/{repo.name}/{file.name}", file


def lmstudio_model(name: str) -> Found:
    """The model `lmstudio:PUBLISHER/REPO[/FILE]` names."""
    parts = name.split("/")
    if len(parts) not in (2, 3) or not all(parts) or ".." in parts:
        raise ModelNotAvailableError(f"{LMSTUDIO}{name} is not an LM Studio model name (PUBLISHER/REPO[/FILE])")
    roots = lmstudio_roots()
    if not roots:
        raise ModelNotAvailableError(f"{LMSTUDIO}{name}: no LM Studio models folder here (~/.lmstudio/models)")
    for root in roots:
        folder = root / parts[0] / parts[1]
        if len(parts) == 3:
            path = folder / parts[2]
            if path.is_file():
                return _checked(Found(f"{LMSTUDIO}{name}", path, "LM Studio"))
            continue
        files = [f for f in sorted(_entries(folder)) if _is_model_file(f)] if folder.is_dir() else []
        if len(files) == 1:
            return _checked(Found(f"{LMSTUDIO}{name}", files[0], "LM Studio"))
        if files:
            raise ModelNotAvailableError(f"{LMSTUDIO}{name} holds {len(files)} GGUF files; name one: "
                                         + ", ".join(f"{LMSTUDIO}{name}/{f.name}" for f in files))  # fmt: skip
    known = [n for root in roots for n, _ in _lmstudio_files(root)]
    raise ModelNotAvailableError(f"unknown LM Studio model {name!r}{_near(name, known)}")


def _checked(found: Found) -> Found:
    """`found`, once its file is checked to be a whole GGUF file (the bounded header reader)."""
    from ..backend import check_model_file

    try:
        check_model_file(found.path)
    except ModelFileError as e:
        raise unusable(found.name, found.path, e) from None
    return found


def unusable(name: str, path: Path, why: object) -> StoreError:
    """A store's file that is not a whole GGUF file (`why`: the reader's error, or what is missing)."""
    return StoreError(f"{name}: {path} is not a usable GGUF file: {why}")


# --- the hub cache -------------------------------------------------------------------------------------------


def hub_cache_files() -> list[Found]:
    """GGUF files in the Hugging Face hub cache, as `hf:OWNER/REPO/FILE`: those of the snapshot
    the repository's main revision points to, the one an `hf:` name resolves to (files only in an
    older snapshot are not what the name would load)."""
    from huggingface_hub import constants

    root = Path(constants.HF_HUB_CACHE)
    out: list[Found] = []
    for repo in _folders(root):
        if not repo.name.startswith("models--"):
            continue
        owner_repo = repo.name[len("models--") :].replace("--", "/", 1)
        try:
            snapshot = repo / "snapshots" / (repo / "refs" / "main").read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            continue  # no main revision cached: no hf: name resolves here
        for file in sorted(snapshot.rglob("*.gguf")):
            if _is_model_file(file):
                name = f"hf:{owner_repo}/{file.relative_to(snapshot).as_posix()}"
                out.append(Found(name, file, "Hugging Face cache"))
    return sorted(out, key=lambda f: f.name)


# --- all of them --------------------------------------------------------------------------------------------


def discover() -> tuple[list[Found], list[str]]:
    """(every model found in the stores, one line for each thing found broken)."""
    found: list[Found] = []
    problems: list[str] = []
    seen: set[str] = set()

    def gather(roots: list[Path], listing, make) -> None:
        for root in roots:
            try:
                entries = list(listing(root))
            except StoreError as e:
                problems.append(str(e))
                continue
            for name, path in entries:
                if name in seen:
                    continue  # the first store that has a name is the one the name takes
                seen.add(name)
                try:
                    found.append(make(name, root, path))
                except StoreError as e:
                    problems.append(str(e))

    try:
        gather(ollama_roots(), _ollama_manifests, lambda name, root, manifest: _ollama_model(name, root, manifest, check=False))
    except StoreError as e:  # OLLAMA_MODELS is not a folder
        problems.append(str(e))
    gather(lmstudio_roots(), _lmstudio_files, lambda name, root, path: Found(f"{LMSTUDIO}{name}", path, "LM Studio"))
    try:
        found += hub_cache_files()
    except StoreError as e:
        problems.append(str(e))
    return found, problems


def resolve(ref: str) -> Path | None:
    """The file for an `ollama:` or `lmstudio:` reference, or None for another kind."""
    if ref.startswith(OLLAMA):
        return ollama_model(ref[len(OLLAMA) :]).path
    if ref.startswith(LMSTUDIO):
        return lmstudio_model(ref[len(LMSTUDIO) :]).path
    return None


def is_store_ref(ref: str) -> bool:
    return ref.startswith((OLLAMA, LMSTUDIO))


def _near(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    if close:
        return "; did you mean " + " or ".join(close) + "?"
    return f"; found {len(known)} (see `localcos models list`)" if known else "; the store holds none"


def _entries(folder: Path) -> list[Path]:
    """A folder's entries; an unreadable folder is one line naming it."""
    try:
        return list(folder.iterdir())
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        return []
    except OSError as e:
        raise StoreError(f"cannot read the folder {folder}: {e.strerror}") from None


def _folders(folder: Path) -> list[Path]:
    return sorted(p for p in _entries(folder) if p.is_dir() and not p.name.startswith("."))
