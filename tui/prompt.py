"""The chat's prompt: several lines (a pasted block keeps every line), Enter sends, Shift+Enter or
Ctrl+J starts a new line, Up and Down at its first or last line recall earlier prompts."""

from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import TextArea


class PromptArea(TextArea):
    """A multi-line prompt; `Submitted` carries its text when Enter is pressed."""

    class Submitted(Message):
        def __init__(self, area: PromptArea, value: str) -> None:
            super().__init__()
            self.area, self.value = area, value

    def __init__(self, *, placeholder: str = "", id: str | None = None, disabled: bool = False) -> None:
        super().__init__(id=id, disabled=disabled, soft_wrap=True, show_line_numbers=False, tab_behavior="focus", compact=True,
                         placeholder=placeholder)  # fmt: skip
        self.sent: list[str] = []  # sent prompts, oldest first
        self._recalled: int | None = None  # the history entry shown (None: the user's own text)
        self._draft = ""  # what the user had typed before recalling

    @property
    def value(self) -> str:
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)

    def remember(self, text: str) -> None:
        if text and (not self.sent or self.sent[-1] != text):
            self.sent.append(text)
        self._recalled = None

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self, self.text))
            return
        if event.key in ("shift+enter", "ctrl+j"):
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        if event.key == "up" and self.cursor_location[0] == 0 and self.sent:
            event.stop()
            event.prevent_default()
            self._recall(-1)
            return
        if event.key == "down" and self._recalled is not None and self.cursor_location[0] == self.document.line_count - 1:
            event.stop()
            event.prevent_default()
            self._recall(+1)
            return
        await super()._on_key(event)

    def _recall(self, step: int) -> None:
        """Show the earlier (-1) or later (+1) prompt of the history; past the latest, the draft."""
        if self._recalled is None:
            self._draft, self._recalled = self.text, len(self.sent)
        self._recalled = max(0, min(len(self.sent), self._recalled + step))
        text = self._draft if self._recalled == len(self.sent) else self.sent[self._recalled]
        if self._recalled == len(self.sent):
            self._recalled = None
        self.value = text
