"""JSON-lines data files (multiple-choice sets, code tasks): one object per line, each bad line
refused in one line that names the file and the line."""

from __future__ import annotations

import json
from typing import Any
from collections.abc import Iterator

from .errors import ConfigError


def json_objects(text: str, where: str, param: str, expected: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each non-empty line of `text` as (its place, "WHERE:LINE", the object it holds);
    `ConfigError` (naming `param`) for a line that is not JSON or not an object (`expected` says
    what the object should hold)."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        at = f"{where}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{at}: not JSON ({e.msg})", param=param) from None
        if not isinstance(data, dict):
            raise ConfigError(f"{at}: expected an object with {expected}", param=param)
        yield at, data
