"""Widgets of the chat: a message, the live stats panel, the colour legend."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Markdown, Static

from localcos.decoding import Origin

# Colours of token origins; drafts take the colour of the model that proposed them.
MODEL_STYLES = ["green", "cyan", "magenta", "blue"]
BONUS_STYLE = "bold yellow"
RESAMPLE_STYLE = "bold red"
SAMPLE_STYLE = ""


def origin_style(origin: Origin) -> str:
    if origin.kind == "draft" and origin.model is not None:
        return MODEL_STYLES[origin.model % len(MODEL_STYLES)]
    if origin.kind == "bonus":
        return BONUS_STYLE
    if origin.kind == "resample":
        return RESAMPLE_STYLE
    return SAMPLE_STYLE


class MessageView(Vertical):
    """One message. An assistant reply streams in as coloured tokens and becomes Markdown when
    it is complete (the colours stay available through the colouring toggle)."""

    def __init__(self, role: str, text: str = "", *, colouring: bool = True) -> None:
        super().__init__(classes=f"message {role}")
        self.role = role
        self.text = text
        self.tokens = Text()
        self.complete = role != "assistant"
        self.colouring = colouring
        self.finish_reason: str | None = None
        self.n_tokens = 0

    def compose(self) -> ComposeResult:
        yield Static(self._label(), classes="role")
        yield Static(self.text if self.role != "assistant" else "", classes="body tokens", markup=False)
        yield Markdown(self.text if self.complete else "", classes="body markdown")

    def _label(self) -> str:
        return {"user": "you", "assistant": "ensemble", "system": "system", "notice": "notice"}.get(self.role, self.role)

    def on_mount(self) -> None:
        self._show()

    def add_tokens(self, pieces: list[tuple[str, Origin]]) -> None:
        """Append streamed tokens (text and origin)."""
        for piece, origin in pieces:
            self.tokens.append(piece, style=origin_style(origin))
        self.n_tokens += len(pieces)
        self._render_tokens()

    def finish(self, text: str, finish_reason: str) -> None:
        """The reply is complete (or was stopped): show it as Markdown."""
        self.text = text
        self.complete = True
        self.finish_reason = finish_reason
        self.query_one(Markdown).update(text + ("\n\n*(stopped)*" if finish_reason == "cancelled" else ""))
        self._show()

    def set_colouring(self, on: bool) -> None:
        self.colouring = on
        if self.role == "assistant":
            self._render_tokens()
            self._show()

    def _render_tokens(self) -> None:
        # the spans keep their styles; without colouring only the plain text is shown
        self.query_one(".tokens", Static).update(self.tokens if self.colouring else self.tokens.plain)

    def _show(self) -> None:
        tokens, markdown = self.query_one(".tokens", Static), self.query_one(Markdown)
        if self.role != "assistant":
            tokens.display, markdown.display = True, False
            return
        show_markdown = self.complete and not self.colouring
        tokens.display, markdown.display = not show_markdown, show_markdown


class StatsPanel(Static):
    """Live numbers of the running (or last) reply and of the whole chat."""

    def show(self, stats: dict) -> None:
        lines = [
            ("method", stats.get("method", "-")),
            ("tokens/s", _fmt(stats.get("tokens_per_second"), ".1f")),
            ("tokens", str(stats.get("tokens", 0))),
            ("acceptance", _fmt(stats.get("acceptance_rate"), ".0%")),
            ("mean accepted", _fmt(stats.get("mean_accepted"), ".2f")),
            ("calls/token", _fmt(stats.get("calls_per_token"), ".2f")),
            ("speedup (est.)", _fmt(stats.get("speedup_estimate"), ".2f", "x")),
            ("context", stats.get("context", "-")),
        ]
        calls = stats.get("calls")
        text = Text()
        text.append("Stats\n", style="bold")
        for k, v in lines:
            text.append(f"{k:<15}", style="dim")
            text.append(f"{v}\n")
        if calls:
            text.append("calls per model\n", style="dim")
            for name, n in calls:
                text.append(f"  {name[:18]:<18} {n}\n")
        self.update(text)


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "-" if x is None else format(x, spec) + suffix


class Legend(Static):
    """What the token colours mean."""

    def __init__(self, model_names: list[str]) -> None:
        super().__init__(classes="legend")
        self.model_names = model_names

    def render_legend(self, colouring: bool) -> Text:
        text = Text()
        text.append("Colours", style="bold")
        text.append("  on\n" if colouring else "  off (ctrl+t)\n", style="dim")
        for i, name in enumerate(self.model_names):
            text.append("■ ", style=MODEL_STYLES[i % len(MODEL_STYLES)])
            text.append(f"draft of {name[:20]}\n")
        text.append("■ ", style=BONUS_STYLE)
        text.append("bonus token\n")
        text.append("■ ", style=RESAMPLE_STYLE)
        text.append("resampled after a rejection\n")
        text.append("■ ", style="white")
        text.append("sampled from r (no draft)\n")
        return text

    def set_colouring(self, on: bool) -> None:
        self.update(self.render_legend(on))
