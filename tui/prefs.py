"""What the chat remembers between runs: the settings form's values, the theme and the view
(Markdown or token colours), in a JSON file in localcos's data folder."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localcos.files import write_text
from localcos.paths import data_dir


# where the chat starts before the command line and the remembered form: a reply of moderate
# length, sampled
CHAT_DEFAULTS: dict[str, Any] = {"temperature": 0.7, "max_tokens": 512}


def prefs_path() -> Path:
    return data_dir() / "chat.json"


@dataclass
class Prefs:
    """The remembered choices (`settings`: option name -> the value as the form shows it)."""

    path: Path = field(default_factory=prefs_path)
    settings: dict[str, Any] = field(default_factory=dict)
    theme: str | None = None
    colouring: bool = False

    @classmethod
    def load(cls, path: Path | None = None) -> Prefs:
        """The remembered choices; none where the file is missing or unreadable (it is rewritten
        on the next change)."""
        prefs = cls(path or prefs_path())
        try:
            data = json.loads(prefs.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return prefs
        if isinstance(data, dict):
            settings, theme, colouring = data.get("settings"), data.get("theme"), data.get("colouring")
            prefs.settings = settings if isinstance(settings, dict) else {}
            prefs.theme = theme if isinstance(theme, str) else None
            prefs.colouring = colouring if isinstance(colouring, bool) else False
        return prefs

    def save(self) -> None:
        write_text(self.path, json.dumps({"settings": self.settings, "theme": self.theme, "colouring": self.colouring}, indent=1))
