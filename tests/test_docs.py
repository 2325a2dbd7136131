"""The README and the guides in docs/ cannot drift from the code silently: every `localcos`
command they show parses with the real command line (its subcommand, flags and choices), and
every `--option` they name is an option of localcos, of one of the benchmark scripts, or of the
few other tools they quote (pip, pytest, llama-bench, ssh). Renaming an option fails here."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import pytest

from localcos.cli import build_parser
import contextlib

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# options the pages quote from other tools
OTHER_TOOLS = {"--force-reinstall", "--no-cache-dir", "--no-deps", "--help", "--version"}


def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    """localcos's subcommands (and `models`' own), each with its parser."""
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    out[f"{prefix} {name}".strip()] = sub
                    walk(sub, f"{prefix} {name}")

    walk(build_parser(), "")
    return out


def localcos_flags() -> set[str]:
    from localcos.eval.configs import VARIANT_OPTIONS

    flags: set[str] = {opt.flag for opt in VARIANT_OPTIONS}  # what `eval --variant` reads
    for parser in [build_parser(), *subcommand_parsers().values()]:
        for action in parser._actions:
            flags.update(s for s in action.option_strings if s.startswith("--"))
    return flags


def benchmark_flags() -> set[str]:
    flags: set[str] = set()
    for script in (ROOT / "benchmarks").glob("*.py"):
        flags.update(re.findall(r"""add_argument\(\s*["'](--[a-z][a-z0-9-]*)""", script.read_text()))
    return flags


def commands(text: str) -> list[str]:
    """Every `localcos ...` command a page shows: lines of its shell blocks (continued lines
    joined, comments dropped) and inline code that starts with `localcos `."""
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S) + re.findall(r"\n((?:    localcos [^\n]*\n)+)", text):
        lines += [line.split(" #", 1)[0] for line in block.replace("\\\n", " ").splitlines()]
    lines += [c for c in re.findall(r"`(localcos [^`]+)`", text) if "..." not in c]
    found = []
    for line in lines:
        for part in re.split(r" && | \| ", line):  # commands chained or piped
            part = re.sub(r"^(\.venv/bin/)?", "", part.strip())
            if part.startswith("localcos "):
                found.append(part)
    return found


def test_every_option_a_page_names_exists():
    known = localcos_flags() | benchmark_flags() | OTHER_TOOLS
    unknown = {}
    for page in PAGES:
        for flag in set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", page.read_text())):
            if flag not in known:
                unknown.setdefault(flag, page.name)
    assert not unknown, f"options named in the docs that nothing takes: {unknown}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_command_a_page_shows_parses(page, monkeypatch):
    parsers = subcommand_parsers()
    shown = commands(page.read_text())
    if page.name == "README.md":
        assert len(shown) >= 12  # the tour shows every command
    for command in shown:
        words = shlex.split(command)[1:]
        if words and words[0] in ("--help", "--version"):
            continue
        # placeholders: NAME|FILE takes its first spelling; A,B[,C] its required part
        words = [re.sub(r"\[.*\]$", "", w.split("|")[0]) if re.fullmatch(r"[\w.@:/,\[\]=|-]+", w) else w for w in words]
        sub = " ".join(words[:2]) if " ".join(words[:2]) in parsers else words[0] if words else ""
        assert sub in parsers, f"{page.name}: `{command}`: no subcommand {words[:1]}"
        errors = []
        monkeypatch.setattr(type(parsers[sub]), "error", lambda self, message: errors.append(message) or (_ for _ in ()).throw(SystemExit(2)))
        with contextlib.suppress(SystemExit):
            build_parser().parse_args(words)
        assert not errors, f"{page.name}: `{command}`: {errors[0]}"


def test_the_readme_is_a_front_door_and_the_help_names_its_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 260
    top = {name for name in subcommand_parsers() if " " not in name}
    listed = re.search(r"`localcos --help` lists\s+the\s+commands: (.*?)\.\n", readme, flags=re.S)
    assert listed, "the README lists the commands"
    assert set(re.findall(r"`([a-z-]+)`", listed.group(1))) == top
    for link in re.findall(r"\]\((docs/[^)#]+)\)", readme):
        assert (ROOT / link).is_file(), link


def tour_blocks(readme: str) -> tuple[list[str], list[str]]:
    """The shell lines of the README's quick start and of its tour (continued lines joined)."""
    def section(title: str) -> str:
        return re.search(rf"\n## {title}\n(.*?)\n## ", readme, flags=re.S).group(1)  # type: ignore[union-attr]

    def lines(text: str) -> list[str]:
        return [line for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S) for line in block.replace("\\\n", " ").splitlines() if line.strip()]

    return lines(section("Quick start")), lines(section("A short tour"))


def test_the_quick_start_is_what_ci_runs():
    """The README's install and test commands are the ones `.ci/run` runs on a clean clone."""
    quick, _ = tour_blocks((ROOT / "README.md").read_text())
    ci = (ROOT / ".ci" / "run").read_text()
    install, test = quick
    for command in re.split(r" && ", install):
        command = command.replace('CMAKE_ARGS="-DGGML_RPC=ON" ', "")  # .ci/run exports it
        assert command in ci, f"the quick start's `{command}` is not what .ci/run runs"
    assert test in ci


def test_every_command_of_the_tour_runs(real_models, tmp_path):
    """Each command the README's tour shows, run as a process on synthetic models with real
    tokenizers in place of the trained ones it names (the Qwen2 pair for the Qwen2.5-Coder pair,
    a Llama 3 tokenizer for SmolLM2), a few tokens each: it exits 0. `chat` needs a terminal (the
    chat app is driven in tests/test_tui.py); `serve` is started and answers /v1/models."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    _, tour = tour_blocks((ROOT / "README.md").read_text())
    qwen, sibling, llama = (str(real_models[n]) for n in ("qwen2", "qwen2_sibling", "llama3"))
    names = {"coder-0.5b": qwen, "coder-1.5b": sibling, "smollm2-135m": llama}
    notes = tmp_path / "notes.py"
    notes.write_text("def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n" * 8)
    # MBPP's sanitized file as released (one problem of its shape), where the tour names it
    mbpp = [{"source_file": "x", "task_id": 11, "prompt": "Write a function to add two numbers.", "code": "def add(a, b):\n    return a + b",
             "test_imports": [], "test_list": ["assert add(1, 2) == 3"]}]  # fmt: skip
    (tmp_path / "sanitized-mbpp.json").write_text(json.dumps(mbpp))
    ran = set()
    for line in tour:
        words = shlex.split(line.split(" #", 1)[0])
        assert words[0] == "localcos", line
        sub = words[1]
        words = [",".join(names.get(m, m) for m in w.split(",")) for w in words]
        if "--preset" in words:  # the preset's pair, as synthetic models
            i = words.index("--preset")
            words[i : i + 2] = ["--models", f"{qwen},{sibling}"]
        words = [str(notes) if w == "notes.py" else w for w in words]
        if sub == "chat":
            ran.add(sub)
            continue
        argv = [sys.executable, "-m", "localcos", *words[1:]]
        if sub == "serve":
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            argv[argv.index("--port") + 1] = str(port)
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path)
            try:
                deadline = time.monotonic() + 120
                while True:
                    assert proc.poll() is None, f"`{line}` exited: {proc.stderr.read().decode()[-2000:]}"  # type: ignore[union-attr]
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
                            assert r.status == 200
                            break
                    except OSError:
                        assert time.monotonic() < deadline, f"`{line}` did not answer in 120 s"
                        time.sleep(0.5)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            ran.add(sub)
            continue
        short = {"generate": ["--max-tokens", "4"], "eval": ["--problems", "1", "--max-tokens", "16"],
                 "bench": ["--limit-prompts", "1", "--max-tokens", "4"], "score": ["--ctx", "64"]}.get(sub, [])  # fmt: skip
        if sub == "bench" and "--synthetic" not in words:
            short += ["--methods", "ensemble,cos", "--temperature", "0"]
        proc = subprocess.run([*argv, *short], capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, f"`{line}` failed: {proc.stderr[-2000:]}"
        ran.add(sub)
    assert ran >= {"generate", "chat", "serve", "eval", "score", "bench"}, ran
