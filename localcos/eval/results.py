"""The results file of `localcos eval` (`ResultsFile`): a JSON-lines record of one run, appended as
each result comes and resumed from, never mixing two runs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.options import OPTIONS
from ..errors import ConfigError
from ..files import storage_error

if TYPE_CHECKING:
    from .configs import EvalConfig

# 3: the header holds the run's level, byte-level options and limits; 2 did not (read, not resumed);
# 1 counted any exit status 0 as passed (refused)
RESULTS_FORMAT = 3


class ResultsFile:
    """The JSON-lines record of a run: a header line, then one line per (configuration, problem)
    as each finishes. The header holds what the whole run shares and changes what its
    configurations write or how their programs are judged (the task, the models, the level and
    its options, the sandbox and its limits); each record holds its configuration's own settings
    (`EvalConfig.identity`). Opening an existing file resumes it: the problems it holds are not
    run again, and a file whose header or a configuration's settings differ from this run's is
    refused, never mixed. A last line cut short by an interruption is dropped from the file
    before anything is appended; any other line that is not a record is refused."""

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any]) -> None:
        self.path = Path(path)
        self.header = {"localcos_eval": RESULTS_FORMAT, **header}
        self.records: dict[tuple[str, str], dict[str, Any]] = {}
        self.identities: dict[str, dict[str, str]] = {}
        self.legacy = False  # format 2: read for its summary; it does not say enough to be resumed
        if self.path.exists():
            self._read()
        else:
            self._append(self.header)

    def _read(self) -> None:
        try:
            data = self.path.read_bytes()
        except OSError as e:
            raise storage_error(self.path, e) from None
        lines = data.split(b"\n")  # the last is b"" where the file ends with a newline
        kept = len(data) - len(lines.pop())  # what ends with its newline is kept; the rest an interruption cut short
        if len(lines) > 1 and _json_or_none(lines[-1]) is None:  # a last line that is not even JSON: cut short too
            kept -= len(lines.pop()) + 1
        header = _json_or_none(lines[0]) if lines else None
        if isinstance(header, dict) and header.get("localcos_eval") == 1:
            raise ConfigError(f"{self.path} was written by an older localcos eval, which counted a program that exited early "
                              "as passed; give another --results to run again", param="results")  # fmt: skip
        if not isinstance(header, dict) or header.get("localcos_eval") not in (2, RESULTS_FORMAT):
            raise ConfigError(f"{self.path} is not a localcos eval results file; give another --results", param="results")
        self.legacy = header["localcos_eval"] == 2
        for key in ("task", "models", "sandbox") if self.legacy else self.header:
            if key != "localcos_eval" and header.get(key) != self.header.get(key):
                raise ConfigError(f"{self.path} holds results for {key} {header.get(key)!r}, not {self.header.get(key)!r}; "
                                  "give another --results", param="results")  # fmt: skip
        for number, line in enumerate(lines[1:], start=2):
            record = _json_or_none(line)
            if not _is_record(record):
                raise ConfigError(f"{self.path}:{number}: not a localcos eval record; give another --results", param="results")
            self.records[(record["config"], record["task_id"])] = record
            self.identities.setdefault(record["config"], record["settings"])
        if kept < len(data):  # repaired before anything is appended; that problem runs again
            try:
                with open(self.path, "r+b") as f:
                    f.truncate(kept)
            except OSError as e:
                raise storage_error(self.path, e) from None

    def check(self, config: EvalConfig) -> None:
        """A configuration whose name the file holds with other settings is refused. An option
        the file's records predate ran at its default, and compares as its default."""
        known = self.identities.get(config.name)
        if known is None:
            return
        wanted = config.identity
        changed = sorted(k for k in set(known) | set(wanted) if _recorded(known, k) != wanted.get(k))
        if changed:
            raise ConfigError(f"{self.path} holds results for {config.name!r} with other settings ({', '.join(changed)}); "
                              "give it another name or another --results", param="variant")  # fmt: skip

    def check_resumable(self) -> None:
        """Refuse to add records to a file that cannot say whether they would mix with its own."""
        if self.legacy:
            raise ConfigError(f"{self.path} was written by a localcos eval that did not record the level, the limits and the "
                              "byte-level options of its run, so new results could silently mix with its own; it is read only "
                              "for a finished run's summary: give another --results to run", param="results")  # fmt: skip

    def get(self, config: str, task_id: str) -> dict[str, Any] | None:
        return self.records.get((config, task_id))

    def add(self, config: EvalConfig, record: dict[str, Any]) -> None:
        self.check_resumable()
        record = {"config": config.name, "settings": config.identity, **record}
        self._append(record)
        self.records[(config.name, record["task_id"])] = record
        self.identities.setdefault(config.name, config.identity)

    def _append(self, record: dict[str, Any]) -> None:
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise storage_error(self.path, e) from None


_RECORD_FIELDS: dict[str, type | tuple[type, ...]] = {"config": str, "task_id": str, "passed": bool, "settings": dict, "length": int, "seconds": (int, float),
                  "llama_seconds": (int, float)}  # fmt: skip


def _json_or_none(line: bytes) -> Any:
    try:
        return json.loads(line.decode("utf-8", errors="replace"))
    except json.JSONDecodeError:
        return None


def _is_record(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(value.get(k), t) for k, t in _RECORD_FIELDS.items())


def _recorded(identity: dict[str, str], key: str) -> str | None:
    """A setting as a record holds it; an option added since the record was written is its
    default (the only value the run that wrote it could have used)."""
    if key in identity:
        return identity[key]
    option = OPTIONS.get(key)
    return option.format(option.default) if option is not None else None
