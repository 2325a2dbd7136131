"""Kept conversations: the terminal chat's history, in SQLite (the standard library's) in
localcos's data folder.

Every message is written as it happens (a user's when it is sent, a reply when it ends, also
one that was stopped), so quitting, a crash or Ctrl-C loses nothing. A conversation keeps the
models and settings it was held with (to reopen it with them), its system message, its title
(the first message's start until renamed) and, for each reply, the settings and statistics it
was made with. Exported as Markdown (to read) and JSON (to import again, on this or another
machine). No I/O outside the one database file and the files named for export and import.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Iterator, Sequence

from .errors import ConfigError, StorageError
from .paths import data_dir

FORMAT = "localcos-conversation/1"  # an export's "format": what import takes
_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    models TEXT NOT NULL,        -- JSON: the models as the user named them (paths, names, presets' models)
    settings TEXT NOT NULL,      -- JSON: the option values it was held with (strings, as typed)
    system TEXT
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    finish_reason TEXT,          -- a reply's: stop, length, cancelled, error
    stats TEXT,                  -- JSON: a reply's statistics (GenerationStats.to_dict)
    settings TEXT,               -- JSON: the option values a reply was made with
    created REAL NOT NULL,
    UNIQUE (conversation, position)
);
"""
TITLE_LENGTH = 60


def database_path() -> Path:
    """Where conversations are kept: `conversations.sqlite` in the data folder."""
    return data_dir() / "conversations.sqlite"


@dataclass
class Turn:
    """One message of a kept conversation."""

    role: str
    content: str
    finish_reason: str | None = None
    stats: dict[str, Any] | None = None
    settings: dict[str, Any] | None = None


@dataclass
class Kept:
    """A kept conversation: what the list shows, and its messages once opened."""

    id: int
    title: str
    created: float
    updated: float
    models: list[str]
    settings: dict[str, Any]
    system: str | None
    turns: list[Turn] = field(default_factory=list)
    count: int = 0  # messages (without opening it)

    def markdown(self) -> str:
        """The conversation for people to read."""
        out = [f"# {self.title}", "", f"Models: {', '.join(self.models)}  ", f"Started {_when(self.created)}, last {_when(self.updated)}", ""]
        if self.system:
            out += [f"**system**: {self.system}", ""]
        for t in self.turns:
            out += [f"## {'You' if t.role == 'user' else 'Reply'}", "", t.content, ""]
            if t.role == "assistant" and t.finish_reason not in (None, "stop"):
                out += [f"*({t.finish_reason})*", ""]
        return "\n".join(out)

    def export(self) -> dict[str, Any]:
        """The conversation as JSON (what `ConversationStore.import_json` takes)."""
        return {"format": FORMAT, "title": self.title, "created": self.created, "updated": self.updated, "models": self.models,
                "settings": self.settings, "system": self.system,
                "messages": [{k: v for k, v in vars(t).items() if v is not None} for t in self.turns]}  # fmt: skip


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


class ConversationStore:
    """The database of kept conversations (created on first use). One connection, used by the
    thread that made it (the chat's UI thread)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else database_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path)
            self._db.execute("PRAGMA foreign_keys = ON")
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as e:
            raise StorageError(f"cannot keep conversations in {self.path}: {e}; set LOCALCOS_DATA to a writable folder") from None

    def close(self) -> None:
        self._db.close()

    def _write(self, sql: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
        with self._transaction():
            return self._db.execute(sql, args)

    # --- conversations ----------------------------------------------------------------------------
    def create(self, models: Sequence[str], settings: dict[str, Any], system: str | None = None, title: str = "New chat") -> int:
        now = time.time()
        cursor = self._write("INSERT INTO conversations (title, created, updated, models, settings, system) VALUES (?, ?, ?, ?, ?, ?)",
                             (title, now, now, json.dumps(list(models)), json.dumps(settings), system))  # fmt: skip
        assert cursor.lastrowid is not None
        return int(cursor.lastrowid)

    def conversations(self, search: str | None = None) -> list[Kept]:
        """The kept conversations, the latest first; with `search`, those whose title or a
        message holds it (case-insensitive)."""
        sql = "SELECT c.*, (SELECT COUNT(*) FROM messages m WHERE m.conversation = c.id) FROM conversations c"
        args: list[Any] = []
        if search:
            sql += " WHERE c.title LIKE ? OR EXISTS (SELECT 1 FROM messages m WHERE m.conversation = c.id AND m.content LIKE ?)"
            args = [f"%{search}%"] * 2
        return [self._kept(row) for row in self._db.execute(sql + " ORDER BY c.updated DESC, c.id DESC", args)]

    def get(self, conversation: int) -> Kept:
        """A conversation with its messages (`ConfigError` for an id it does not hold)."""
        row = self._db.execute("SELECT c.*, (SELECT COUNT(*) FROM messages m WHERE m.conversation = c.id) FROM conversations c WHERE id = ?",
                               (conversation,)).fetchone()  # fmt: skip
        if row is None:
            raise ConfigError(f"no kept conversation {conversation} (`localcos chat --list` lists them)", param="open")
        kept = self._kept(row)
        rows = self._db.execute("SELECT role, content, finish_reason, stats, settings FROM messages WHERE conversation = ? ORDER BY position",
                                (conversation,))  # fmt: skip
        kept.turns = [Turn(role, content, finish, json.loads(stats) if stats else None, json.loads(s) if s else None)
                      for role, content, finish, stats, s in rows]  # fmt: skip
        return kept

    def latest(self) -> int | None:
        row = self._db.execute("SELECT id FROM conversations ORDER BY updated DESC, id DESC LIMIT 1").fetchone()
        return None if row is None else int(row[0])

    def rename(self, conversation: int, title: str) -> None:
        self._write("UPDATE conversations SET title = ? WHERE id = ?", (title.strip() or "Untitled", conversation))

    def delete(self, conversation: int) -> None:
        self._write("DELETE FROM conversations WHERE id = ?", (conversation,))

    def set_system(self, conversation: int, system: str | None) -> None:
        self._write("UPDATE conversations SET system = ?, updated = ? WHERE id = ?", (system or None, time.time(), conversation))

    def set_models(self, conversation: int, models: Sequence[str], settings: dict[str, Any]) -> None:
        self._write("UPDATE conversations SET models = ?, settings = ?, updated = ? WHERE id = ?",
                    (json.dumps(list(models)), json.dumps(settings), time.time(), conversation))  # fmt: skip

    # --- messages ---------------------------------------------------------------------------------
    def add(self, conversation: int, turn: Turn) -> None:
        """Append a message (the first user message titles an untitled conversation)."""
        now = time.time()
        with self._transaction():
            position = self._db.execute("SELECT COALESCE(MAX(position), -1) + 1 FROM messages WHERE conversation = ?", (conversation,)).fetchone()[0]
            self._db.execute(
                "INSERT INTO messages (conversation, position, role, content, finish_reason, stats, settings, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation, position, turn.role, turn.content, turn.finish_reason, _json(turn.stats), _json(turn.settings), now),
            )
            self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation))
            if turn.role == "user" and position == 0:
                title = " ".join(turn.content.split())
                self._db.execute("UPDATE conversations SET title = ? WHERE id = ? AND title = 'New chat'",
                                 (title[:TITLE_LENGTH] + ("..." if len(title) > TITLE_LENGTH else ""), conversation))  # fmt: skip

    def truncate(self, conversation: int, keep: int) -> None:
        """Keep only the first `keep` messages (a reply regenerated, a message edited)."""
        self._write("DELETE FROM messages WHERE conversation = ? AND position >= ?", (conversation, keep))

    # --- export and import -------------------------------------------------------------------------
    def import_json(self, data: Any, where: str = "the file") -> int:
        """A conversation from an export (`Kept.export`), kept as a new one; a `ConfigError` naming
        what is wrong with it."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigError(f"{where} is not a localcos conversation (its format is not {FORMAT!r})", param="import")
        messages = data.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                                                      for m in messages):  # fmt: skip
            raise ConfigError(f"{where}: messages must be a list of {{role, content}}", param="import")
        models, settings, system, title = data.get("models"), data.get("settings"), data.get("system"), data.get("title")
        conversation = self.create([str(m) for m in models] if isinstance(models, list) else [], settings if isinstance(settings, dict) else {},
                                   system if isinstance(system, str) else None, title if isinstance(title, str) else "Imported chat")  # fmt: skip
        for m in messages:
            self.add(conversation, Turn(m["role"], m["content"], m.get("finish_reason"), m.get("stats"), m.get("settings")))
        return conversation

    # --- inside ---------------------------------------------------------------------------------------
    def _kept(self, row: Sequence[Any]) -> Kept:
        cid, title, created, updated, models, settings, system, count = row
        return Kept(int(cid), title, created, updated, json.loads(models), json.loads(settings), system, count=int(count))

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """Statements written all or none (sqlite's own transaction), a fault as `StorageError`."""
        try:
            with self._db:
                yield
        except sqlite3.Error as e:
            raise StorageError(f"cannot write to {self.path}: {e}") from None


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)
