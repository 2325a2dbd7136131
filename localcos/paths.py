"""Where localcos keeps its files, and its on/off environment switches."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def _user_dir(override: str, mac: str, windows: str, xdg: str, xdg_default: str) -> Path:
    """$`override`, else the platform's folder of its kind + localcos: ~/Library/`mac` on macOS,
    %LOCALAPPDATA%/localcos/`windows` on Windows, $`xdg` (else ~/`xdg_default`) elsewhere."""
    env = os.environ.get(override)
    if env:
        return Path(env).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / mac / "localcos"
    if os.name == "nt":
        return Path(os.environ.get("LOCALAPPDATA", Path.home())) / "localcos" / windows
    return Path(os.environ.get(xdg) or Path.home() / xdg_default) / "localcos"


def cache_dir() -> Path:
    """The user cache directory: $LOCALCOS_CACHE, else the platform's cache folder + localcos."""
    return _user_dir("LOCALCOS_CACHE", "Caches", "cache", "XDG_CACHE_HOME", ".cache")


def config_dir() -> Path:
    """The user configuration directory: $XDG_CONFIG_HOME/localcos (or the platform's)."""
    if sys.platform == "darwin" and not os.environ.get("XDG_CONFIG_HOME"):
        return Path.home() / "Library" / "Application Support" / "localcos"
    if os.name == "nt":
        return Path(os.environ.get("APPDATA", Path.home())) / "localcos"
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "localcos"


def data_dir() -> Path:
    """The user data directory (kept conversations, the chat's remembered settings): $LOCALCOS_DATA,
    else $XDG_DATA_HOME/localcos (or the platform's)."""
    return _user_dir("LOCALCOS_DATA", "Application Support", "data", "XDG_DATA_HOME", ".local/share")


def env_switch(name: str) -> bool | None:
    """The on/off environment variable `name`: None when unset; off for 0, false, no, off or empty."""
    value = os.environ.get(name)
    if value is None:
        return None
    return value.strip().lower() not in ("0", "false", "no", "off", "")
