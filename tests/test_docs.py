"""The README and the guides in docs/ cannot drift from the code silently: every `localcos`
command they show parses with the real command line (its subcommand, flags and choices), and
every `--option` they name is an option of localcos, of one of the benchmark scripts, or of the
few other tools they quote (pip, pytest, llama-bench, ssh). Renaming an option fails here."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from localcos.cli import build_parser

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
    flags: set[str] = set()
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
        try:
            build_parser().parse_args(words)
        except SystemExit:
            pass
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
