"""Widgets of the chat: a message, the live statistics panel, the colour legend."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Markdown, Static

from localcos.core.decoding import Origin
from localcos.core.level import Level
from localcos.stats import GenerationStats, dash, level_details

# Colours of token origins; drafts take the colour of the model that proposed them.
MODEL_STYLES = ["green", "cyan", "magenta", "blue"]
BONUS_STYLE = "bold yellow"
LOOKUP_STYLE = "underline bright_white"
RESAMPLE_STYLE = "bold red"
SAMPLE_STYLE = ""


def origin_style(origin: Origin) -> str:
    if origin.kind == "draft" and origin.model is not None:
        return MODEL_STYLES[origin.model % len(MODEL_STYLES)]
    if origin.kind == "bonus":
        return BONUS_STYLE
    if origin.kind == "lookup":
        return LOOKUP_STYLE
    if origin.kind == "resample":
        return RESAMPLE_STYLE
    return SAMPLE_STYLE


# how a reply that did not end by itself says so
NOTES = {"cancelled": "stopped", "error": "failed", "length": "cut at the length limit: --max-tokens"}


FENCE = re.compile(r"```[^\n]*\n(.*?)(?:```|\Z)", re.S)


def code_blocks(text: str) -> list[str]:
    """The fenced code blocks of a Markdown text, in order (the last one may still be open)."""
    return [block.rstrip("\n") + "\n" for block in FENCE.findall(text)]


class MessageView(Vertical, can_focus=True):
    """One message. A reply is rendered as Markdown while it streams (code blocks highlighted as
    they come); the token colours (which model drafted what) are a second view of it, which
    `set_colouring` switches to. Focused, `c` copies the message and `b` its last code block."""

    BINDINGS = [Binding("c", "copy", "Copy"), Binding("b", "copy_code", "Copy code")]

    def __init__(self, role: str, text: str = "", *, colouring: bool = False, speaker: str = "ensemble") -> None:
        super().__init__(classes=f"message {role}")
        self.role = role
        self.speaker = speaker  # who an assistant's reply is from: the ensemble, or its one model
        self.text = text
        # a kept reply's text, uncoloured (its origins are not kept); set here, not on mount: a
        # reply's first tokens may arrive before the view is mounted
        self.tokens = Text(text if role == "assistant" else "")
        self.complete = role != "assistant" or bool(text)
        self.colouring = colouring
        self.finish_reason: str | None = None
        self.n_tokens = 0

    def compose(self) -> ComposeResult:
        yield Static(self._label(), classes="role")
        yield Static(self.text if self.role != "assistant" else "", classes="body tokens", markup=False)
        yield Markdown(self.text if self.role == "assistant" else "", classes="body markdown")

    def _label(self) -> str:
        return {"user": "you", "assistant": self.speaker, "system": "system", "notice": "notice"}.get(self.role, self.role)

    def on_mount(self) -> None:
        if self.role == "assistant":
            self._render_tokens()
        self._show()

    async def add_tokens(self, pieces: list[tuple[str, Origin]]) -> None:
        """Append streamed tokens (text and origin): to the Markdown and to the coloured view."""
        added = "".join(piece for piece, _ in pieces)
        for piece, origin in pieces:
            self.tokens.append(piece, style=origin_style(origin))
        self.n_tokens += len(pieces)
        self.text += added
        self._render_tokens()
        if added:
            await self.query_one(Markdown).append(added)

    def finish(self, text: str, finish_reason: str) -> None:
        """The reply is complete (or was stopped)."""
        self.text = text
        self.complete = True
        self.finish_reason = finish_reason
        note = NOTES.get(finish_reason)
        self.query_one(Markdown).update(text + (f"\n\n*({note})*" if note else ""))
        if note:  # said in the coloured view too
            self.tokens.append(f"\n({note})", style="dim italic")
            self._render_tokens()
        self._show()

    def set_colouring(self, on: bool) -> None:
        self.colouring = on
        if self.role == "assistant":
            self._render_tokens()
            self._show()

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.text)
        self.app.notify("Message copied.", timeout=2)

    def action_copy_code(self) -> None:
        blocks = code_blocks(self.text)
        if not blocks:
            self.app.notify("This message has no code block.", severity="warning", timeout=3)
            return
        self.app.copy_to_clipboard(blocks[-1])
        self.app.notify("Code block copied.", timeout=2)

    def _render_tokens(self) -> None:
        # the spans keep their styles; without colouring only the plain text is shown
        self.query_one(".tokens", Static).update(self.tokens if self.colouring else self.tokens.plain)

    def _show(self) -> None:
        tokens, markdown = self.query_one(".tokens", Static), self.query_one(Markdown)
        if self.role != "assistant":
            tokens.display, markdown.display = True, False
            return
        tokens.display, markdown.display = self.colouring, not self.colouring


@dataclass(frozen=True)
class LiveReply:
    """What is known of a reply while it streams."""

    method: str
    length: int  # generated so far, in its level's unit (`Level.unit`)
    seconds: float
    level: Level = Level.TOKEN  # the level it decodes at


class StatsPanel(Static):
    """The last reply's `GenerationStats`, or the running reply's progress, and context use: one
    panel at every level (tokens at the token level, characters at the byte and mixed levels).
    Its height follows its lines (a change lays the panel out again)."""

    stats: reactive[GenerationStats | None] = reactive(None, layout=True)
    live: reactive[LiveReply | None] = reactive(None, layout=True)
    context: reactive[str] = reactive("-", layout=True)

    def render(self) -> Text:
        s, live = self.stats, self.live
        level: Level | None = None
        if live is not None:  # a reply is streaming: its own numbers, the rest from the last one
            method, length, level = live.method, live.length, live.level
            speed = length / live.seconds if live.seconds > 0 else None
        elif s is not None:
            method, length, speed, level = s.method, s.length, s.per_second, s.level
        else:
            method, length, speed = "-", 0, None
        shown = level or Level.TOKEN  # before any reply: the token level's lines, every value "-"
        unit = shown.unit
        lines = [("level", level.value if level else "-"), ("method", method), (f"{unit}/s", dash(speed, ".1f")), (unit, str(length)),
                 ("acceptance", s.acceptance if s else "-"), *level_details(shown, s)]  # fmt: skip
        text = _table([*lines, ("context", self.context)])
        if s is None or not s.models:
            return text
        heading, per_model = s.per_model()
        text.append(f"{heading}\n", style="dim")
        for line in per_model:
            text.append(f"  {line}\n")
        return text


def _table(lines: list[tuple[str, str]]) -> Text:
    """The panel's heading and its name/value lines."""
    text = Text()
    text.append("Stats\n", style="bold")
    for k, v in lines:
        text.append(f"{k:<15}", style="dim")
        text.append(f"{v}\n")
    return text


class Legend(Static):
    """What the token colours mean (with one model, nothing drafts but the context)."""

    model_names: reactive[tuple[str, ...]] = reactive((), layout=True)
    colouring: reactive[bool] = reactive(False, layout=True)

    def __init__(self) -> None:
        super().__init__(classes="legend")

    def render(self) -> Text:
        text = Text()
        text.append("Colours", style="bold")
        text.append("  on (ctrl+t)\n" if self.colouring else "  off (ctrl+t)\n", style="dim")
        several = len(self.model_names) > 1
        if several:
            for i, name in enumerate(self.model_names):
                text.append("■ ", style=MODEL_STYLES[i % len(MODEL_STYLES)])
                text.append(f"draft of {name[:20]}\n")
            text.append("■ ", style=BONUS_STYLE)
            text.append("bonus token\n")
        text.append("■ ", style=LOOKUP_STYLE)
        text.append("looked up in the context\n")
        text.append("■ ", style=RESAMPLE_STYLE)
        text.append("resampled after a rejection\n")
        text.append("■ ", style="white")
        text.append("sampled from r (no draft)\n" if several else "sampled from the model\n")
        return text
