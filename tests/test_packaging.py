"""The installed distribution: a wheel (not an editable install) carries the one models.toml and
the chat as localcos.tui, and no top-level `tui` package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_wheel_installs_the_models_toml_and_the_chat_under_localcos(tmp_path):
    src = tmp_path / "src"  # a copy, so the build leaves nothing in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "models.toml"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "models.toml")
    for folder in ("localcos", "tui"):
        shutil.copytree(ROOT / folder, src / folder, ignore=ignore)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(src)],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("localcos-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "localcos/models.toml" in names and "localcos/tui/app.tcss" in names
    assert not any(n.startswith("tui/") for n in names), "no top-level tui package"
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "localcos").rglob("*.py")}
    sources |= {"localcos/tui/" + p.name for p in (ROOT / "tui").glob("*.py")}
    assert sources <= names, f"modules missing from the wheel: {sorted(sources - names)}"

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)], check=True, timeout=300)
    check = f"""
import importlib.util, pathlib
import localcos
from localcos.models import registry
site = pathlib.Path({str(site)!r})
assert pathlib.Path(localcos.__file__).is_relative_to(site), localcos.__file__
assert registry.BUILTIN == site / "localcos" / "models.toml", registry.BUILTIN
assert registry.BUILTIN.read_text() == pathlib.Path({str(ROOT / 'models.toml')!r}).read_text()
assert "qwen-1.5b-we" in registry.Registry.load(user=False).ensembles
import localcos.tui.app
assert pathlib.Path(localcos.tui.app.__file__).is_relative_to(site)
assert importlib.util.find_spec("tui") is None
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
