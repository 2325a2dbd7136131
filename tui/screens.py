"""Modal screens: the settings form, the help, the kept conversations, the models, a text."""

from __future__ import annotations

import contextlib
import time

from textual import on
from textual.app import ComposeResult
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Markdown, OptionList, Select, TextArea
from textual.widgets.option_list import Option, OptionDoesNotExist

from localcos.config import OPTIONS, Settings
from localcos.conversations import ConversationStore
from localcos.errors import ConfigError

# The options a running chat can change, in the order the form shows them: everything about
# combining and generating (loading options need the models reloaded, so they stay on the
# command line). Labels, help and parsing come from the option declarations.
FORM = (
    "method",
    "combine",
    "weights",
    "mu",
    "plausibility",
    "expert",
    "combine_level",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "gamma",
    "proposer",
    "lookup",
    "max_tokens",
    "ignore_eos",
    "json_object",
    "json_schema",
    "grammar",
)


def _label(name: str) -> str:
    return OPTIONS[name].flag.lstrip("-").replace("-", " ")


class SettingsScreen(ModalScreen["Settings | None"]):
    """Change how the next reply is generated. Returns the new settings, or None."""

    BINDINGS = [("escape", "cancel", "Cancel")]

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        with Vertical(id="settings"):
            yield Label("Settings (apply to the next reply)", id="settings-title")
            with VerticalScroll(id="settings-scroll"), Grid(id="settings-grid"):
                for name in FORM:
                    opt = OPTIONS[name]
                    value = self.settings.value(name)
                    yield Label(_label(name), id=f"label-{name}")
                    if opt.switch:
                        yield Checkbox(value=bool(value), compact=True, id=name, tooltip=opt.help)
                    elif opt.choices:
                        yield Select([(c, c) for c in opt.choices], value=value, allow_blank=False, compact=True, id=name, tooltip=opt.help)
                    else:
                        default = opt.format(opt.default) or "default"
                        yield Input(opt.format(value), placeholder=default, compact=True, id=name, tooltip=opt.help)
            with Horizontal(id="settings-buttons"):
                yield Button("Apply", variant="primary", id="apply")
                yield Button("Cancel", id="cancel")

    def values(self) -> dict[str, object]:
        """The form as option values (empty fields: the option's default)."""
        out: dict[str, object] = {}
        for name in FORM:
            widget = self.query_one(f"#{name}")
            out[name] = widget.value  # type: ignore[attr-defined]
        return out

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "cancel":
            self.dismiss(None)
            return
        self._apply()

    @on(Input.Submitted)
    def _enter(self, event: Input.Submitted) -> None:
        """Enter in a field applies the form, as a form's Enter does (and goes nowhere else)."""
        event.stop()
        self._apply()

    def _apply(self) -> None:
        try:
            self.dismiss(self.settings.with_values(self.values()))
        except ConfigError as e:
            self.app.notify(str(e), title="Invalid settings", severity="error")

    def action_cancel(self) -> None:
        self.dismiss(None)


class TextScreen(ModalScreen["str | None"]):
    """One text to write or change (a system message, a title, a folder): the text, or None."""

    BINDINGS = [("escape", "cancel", "Cancel")]

    def __init__(self, title: str, text: str = "", *, lines: bool = False, placeholder: str = "") -> None:
        super().__init__()
        self.title_text, self.text, self.lines, self.placeholder = title, text, lines, placeholder

    def compose(self) -> ComposeResult:
        with Vertical(id="text-dialog"):
            yield Label(self.title_text, id="text-title")
            if self.lines:
                yield TextArea(self.text, id="text-value", soft_wrap=True, placeholder=self.placeholder)
            else:
                yield Input(self.text, id="text-value", placeholder=self.placeholder)
            with Horizontal(classes="dialog-buttons"):
                yield Button("OK", variant="primary", id="ok")
                yield Button("Cancel", id="cancel")

    def _value(self) -> str:
        widget = self.query_one("#text-value")
        return widget.text if isinstance(widget, TextArea) else widget.value  # type: ignore[attr-defined]

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(self._value() if event.button.id == "ok" else None)

    @on(Input.Submitted)
    def _enter(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(self._value())

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConversationsScreen(ModalScreen["int | None"]):
    """The kept conversations: search, open (Enter), rename (r), delete (d), a new one (n).
    Returns the conversation to open (0: a new one), or None."""

    BINDINGS = [("escape", "cancel", "Close"), ("r", "rename", "Rename"), ("d", "delete", "Delete"), ("n", "new", "New chat")]

    def __init__(self, store: ConversationStore, current: int | None) -> None:
        super().__init__()
        self.store, self.current = store, current

    def compose(self) -> ComposeResult:
        with Vertical(id="conversations"):
            yield Label("Conversations (Enter opens, r renames, d deletes, n new, Escape closes)", id="conversations-title")
            yield Input(placeholder="search titles and messages", id="search")
            yield OptionList(id="conversation-list")

    def on_mount(self) -> None:
        self._fill("")
        options = self.query_one(OptionList)
        if options.option_count:
            options.highlighted = 0
        options.focus()

    def _fill(self, search: str) -> None:
        """The list (for `search`), the one highlighted before highlighted again where it still is."""
        options = self.query_one(OptionList)
        before = self._highlighted()
        options.clear_options()
        for kept in self.store.conversations(search or None):
            mark = "* " if kept.id == self.current else "  "
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(kept.updated))
            options.add_option(Option(f"{mark}{kept.title}  [dim]{when}, {kept.count} messages, {', '.join(kept.models)[:40]}[/dim]",
                                      id=str(kept.id)))  # fmt: skip
        if before is not None:
            with contextlib.suppress(OptionDoesNotExist):  # (gone: deleted, or not found by the search)
                options.highlighted = options.get_option_index(str(before))

    @on(Input.Changed, "#search")
    def _search(self, event: Input.Changed) -> None:
        self._fill(event.value)

    @on(Input.Submitted, "#search")
    def _to_list(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_one(OptionList).focus()

    @on(OptionList.OptionSelected)
    def _open(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id or 0))

    def _highlighted(self) -> int | None:
        options = self.query_one(OptionList)
        if options.highlighted is None:
            return None
        return int(options.get_option_at_index(options.highlighted).id or 0)

    def action_rename(self) -> None:
        chosen = self._highlighted()
        if chosen is None:
            return

        def done(title: str | None) -> None:
            if title:
                self.store.rename(chosen, title)
                self._fill(self.query_one("#search", Input).value)

        self.app.push_screen(TextScreen("New title", self.store.get(chosen).title), done)

    def action_delete(self) -> None:
        chosen = self._highlighted()
        if chosen is None:
            return
        self.store.delete(chosen)
        self.app.notify("Conversation deleted.", timeout=2)
        if chosen == self.current:
            self.dismiss(0)
            return
        self._fill(self.query_one("#search", Input).value)

    def action_new(self) -> None:
        self.dismiss(0)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ModelsScreen(ModalScreen["dict | None"]):
    """Another ensemble for the conversation: a preset, or one or more models (comma-separated),
    of what `localcos models list` finds. Returns the option values to load, or None."""

    BINDINGS = [("escape", "cancel", "Cancel")]

    def __init__(self, choices: list[tuple[str, dict]], current: str) -> None:
        super().__init__()
        self.choices, self.current = choices, current

    def compose(self) -> ComposeResult:
        with Vertical(id="models-dialog"):
            yield Label(f"Models for this conversation (now: {self.current}); it is kept as it is", id="models-title")
            yield OptionList(*[Option(label, id=str(i)) for i, (label, _) in enumerate(self.choices)], id="model-list")
            yield Input(placeholder="or type models as --models takes them: A,B (paths, names, ollama:..., hf:...)", id="model-refs")

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()

    @on(OptionList.OptionSelected)
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.choices[int(event.option.id or 0)][1])

    @on(Input.Submitted, "#model-refs")
    def _typed(self, event: Input.Submitted) -> None:
        event.stop()
        if event.value.strip():
            self.dismiss({"models": event.value.strip()})

    def action_cancel(self) -> None:
        self.dismiss(None)


HELP = """\
# localcos chat

Every reply is generated by the **ensemble**: at each token the models' next-token
distributions are combined (weighted ensemble, contrastive decoding or a logit mix) and the
token is sampled from the combination. With **CoS** one model drafts tokens, the others check
them in one batched pass against the combined distribution, and the models take turns, so the
reply follows exactly the ensemble's distribution with fewer model calls.

Every conversation is kept as it happens (in localcos's data folder): quit any time, and
`localcos chat --continue` reopens the last one, `--list` lists them.

## Keys

| key | action |
|---|---|
| Enter | send the message |
| Ctrl+J, Shift+Enter | a new line in the message (a pasted block keeps all its lines) |
| Up, Down | earlier messages (at the prompt's first or last line) |
| Escape, Ctrl+C | stop the running reply (what was generated stays) |
| Ctrl+R | the last reply again |
| Ctrl+L | edit the last message (it and its reply go back into the prompt) |
| F5 | copy the last reply; on a focused message (Tab, or a click) c copies it, b its last code block |
| Ctrl+O | the kept conversations: open, rename, delete, search |
| Ctrl+N | a new chat (this one stays kept) |
| F2 | settings (method, combiner, sampling, gamma, ...), remembered for the next runs |
| F3 | this conversation's system message |
| F4 | other models or a preset for this conversation |
| Ctrl+T | Markdown, or the tokens coloured by where they came from |
| Ctrl+S | export (Markdown and JSON, to a folder you choose) |
| Ctrl+P | command palette (also: the theme, remembered) |
| Ctrl+Q | quit |
| F1 | this help |

## Colours

With Ctrl+T each token of a reply is coloured by where it came from: the draft of one model
that the other models accepted, a **bonus** token (sampled by a model right after it verified
the others' drafts, then accepted), a token looked up in the context, or a token
**resampled** after a rejection. With the standard ensemble every token is sampled from the
combination directly.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [("escape", "close", "Close"), ("f1", "close", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Markdown(HELP)
            yield Button("Close", id="close-help")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)
