"""Reading the text files a user names, and writing files safely: every file localcos writes goes to a temporary name in its target folder
and is renamed over the target only when complete, so a full disk, a crash or Ctrl-C never leaves
half a file under the final name; a write that fails says in one line which path and why."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path
from typing import IO
from collections.abc import Iterator

from .errors import StorageError

# what each storage fault means to a user, by errno
_CAUSES = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "the file system is read-only",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "a part of the path is a file, not a folder",
    errno.EISDIR: "the path is a folder",
}

TEMP_PREFIX = ".localcos-tmp-"


def _fault(error: OSError) -> str | None:
    """What a storage fault means to a user; None for other OS errors. The gguf writer reports a
    full disk as a plain OSError without errno: counted too."""
    if error.errno is None and "space" in str(error).lower():
        return _CAUSES[errno.ENOSPC]
    return _CAUSES.get(error.errno or 0)


def storage_error(path: str | os.PathLike[str], error: OSError, hint: str = "") -> StorageError:
    """The one-line `StorageError` for an OS error met writing `path` (`hint`: what to do, e.g.
    which environment variable chose the folder)."""
    cause = _fault(error) or (error.strerror or str(error)).rstrip(".").lower()
    return StorageError(f"cannot write {os.fspath(path)}: {cause}{'; ' + hint if hint else ''}")


def is_storage_fault(error: OSError) -> bool:
    """Whether an OS error is one of the storage faults `storage_error` words for users."""
    return _fault(error) is not None


def make_folder(folder: str | os.PathLike[str], hint: str = "", for_file: str | os.PathLike[str] | None = None) -> Path:
    """`folder`, created with its parents if missing; a `StorageError` (naming `for_file`, the
    file to be written there, when given) when it cannot be."""
    folder = Path(folder)
    named = folder if for_file is None else for_file
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise storage_error(named, e, hint) from None
    if not folder.is_dir():
        raise storage_error(named, OSError(errno.ENOTDIR, "not a folder"), hint)
    return folder


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str], hint: str = "") -> Iterator[Path]:
    """A temporary path in `target`'s folder to write the whole file to (by any means, e.g. a
    library that takes a file name); renamed to `target` when the block ends without error,
    removed otherwise. Storage faults become a `StorageError` naming `target`."""
    target = Path(target)
    folder = make_folder(target.parent, hint, for_file=target)
    try:
        fd, name = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=target.suffix, dir=folder)
        os.close(fd)
    except OSError as e:
        raise storage_error(target, e, hint) from None
    temp = Path(name)
    try:
        yield temp
        os.replace(temp, target)
    except OSError as e:
        temp.unlink(missing_ok=True)
        if is_storage_fault(e):
            raise storage_error(target, e, hint) from None
        raise
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_write(
    target: str | os.PathLike[str], mode: str = "w", hint: str = "", encoding: str | None = "utf-8", newline: str | None = None
) -> Iterator[IO]:
    """An open file ("w" text or "wb" binary) whose content becomes `target` when the block ends
    without error (see `atomic_path`, which also turns a failed write into a `StorageError`)."""
    text = "b" not in mode
    with atomic_path(target, hint) as temp, open(temp, mode, encoding=encoding if text else None, newline=newline if text else None) as f:
        yield f
        f.flush()
        os.fsync(f.fileno())


def read_text(path: str | os.PathLike[str], what: str) -> str:
    """A text file the user named (`what`: the flag that named it), as UTF-8 (bad bytes
    replaced); a `ConfigError` in one line where it cannot be read."""
    from .errors import ConfigError

    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ConfigError(f"{what} {path}: {_CAUSES.get(e.errno or 0, e.strerror or 'cannot be read') if e.errno != errno.ENOENT else 'no such file'}",
                          param=what.lstrip("-").replace("-", "_")) from None  # fmt: skip


def write_text(target: str | os.PathLike[str], text: str, hint: str = "") -> None:
    """Write `text` to `target` atomically."""
    with atomic_write(target, "w", hint) as f:
        f.write(text)


CACHE_HINT = "set LOCALCOS_CACHE to a writable folder with room"
