"""Modal screens: settings and help."""

from __future__ import annotations

from dataclasses import dataclass, replace

from textual.app import ComposeResult
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Markdown, Select

from localcos.errors import ConfigError


@dataclass(frozen=True)
class ChatSettings:
    """What the next reply is generated with."""

    method: str = "cos"
    combine: str = "we"
    weights: tuple[float, ...] | None = None
    mu: float = 0.1
    temperature: float = 0.7
    top_p: float = 1.0
    gamma: int | tuple[int, ...] | str | None = None
    max_tokens: int = 512

    def combiner(self):
        from localcos.combiners import make_combiner

        return make_combiner(self.combine, weights=None if self.combine == "cd" else self.weights, mu=self.mu)

    def generation(self) -> dict:
        return dict(
            method=self.method,
            temperature=self.temperature,
            top_p=self.top_p,
            gamma=self.gamma,
            max_tokens=self.max_tokens,
        )


def _parse_gamma(text: str) -> int | tuple[int, ...] | str | None:
    text = text.strip()
    if not text or text == "default":
        return None
    if text == "auto":
        return "auto"
    values = tuple(int(x) for x in text.split(","))
    return values[0] if len(values) == 1 else values


class SettingsScreen(ModalScreen["ChatSettings | None"]):
    """Change how the next reply is generated. Returns the new settings, or None."""

    BINDINGS = [("escape", "cancel", "Cancel")]

    def __init__(self, settings: ChatSettings, n_models: int) -> None:
        super().__init__()
        self.settings = settings
        self.n_models = n_models

    def compose(self) -> ComposeResult:
        s = self.settings
        methods = [(m, m) for m in ("cos", "naive-cos", "sd", "ensemble")]
        combiners = [("weighted ensemble (we)", "we"), ("contrastive (cd)", "cd"), ("logit mix", "logit-mix")]
        with Vertical(id="settings"):
            yield Label("Settings (apply to the next reply)", id="settings-title")
            with Grid(id="settings-grid"):
                yield Label("method")
                yield Select(methods, value=s.method, allow_blank=False, compact=True, id="method")
                yield Label("combiner")
                yield Select(
                    combiners,
                    value=s.combine if s.combine in ("we", "cd", "logit-mix") else "we",
                    allow_blank=False,
                    compact=True,
                    id="combine",
                )
                yield Label("weights")
                yield Input(",".join(f"{w:g}" for w in s.weights) if s.weights else "", placeholder="equal", compact=True, id="weights")
                yield Label("mu (cd)")
                yield Input(f"{s.mu:g}", compact=True, id="mu")
                yield Label("temperature")
                yield Input(f"{s.temperature:g}", compact=True, id="temperature")
                yield Label("top-p")
                yield Input(f"{s.top_p:g}", compact=True, id="top_p")
                yield Label("gamma")
                g = s.gamma
                yield Input("" if g is None else g if isinstance(g, str) else ",".join(str(x) for x in (g if isinstance(g, tuple) else (g,))), placeholder="default, auto, 3 or 5,1", compact=True, id="gamma")
                yield Label("max tokens")
                yield Input(str(s.max_tokens), compact=True, id="max_tokens")
            with Horizontal(id="settings-buttons"):
                yield Button("Apply", variant="primary", id="apply")
                yield Button("Cancel", id="cancel")

    def _read(self) -> ChatSettings:
        def value(name: str) -> str:
            return self.query_one(f"#{name}", Input).value.strip()

        try:
            weights_text = value("weights")
            weights = tuple(float(x) for x in weights_text.split(",")) if weights_text else None
            new = replace(
                self.settings,
                method=str(self.query_one("#method", Select).value),
                combine=str(self.query_one("#combine", Select).value),
                weights=weights,
                mu=float(value("mu")),
                temperature=float(value("temperature")),
                top_p=float(value("top_p")),
                gamma=_parse_gamma(value("gamma")),
                max_tokens=int(value("max_tokens")),
            )
        except ValueError as e:
            raise ConfigError(f"not a number: {e}") from None
        # validate exactly as generation will
        from localcos.ensemble import GenerationConfig
        from localcos.sampling import Sampler

        new.combiner().bind(self.n_models, [1] * self.n_models)
        GenerationConfig(**new.generation())
        Sampler(new.temperature, 0, new.top_p, 0.0)
        return new

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "cancel":
            self.dismiss(None)
            return
        try:
            self.dismiss(self._read())
        except ConfigError as e:
            self.app.notify(str(e), title="Invalid settings", severity="error")

    def action_cancel(self) -> None:
        self.dismiss(None)


HELP = """\
# localcos chat

Every reply is generated by the **ensemble**: at each token the models' next-token
distributions are combined (weighted ensemble, contrastive decoding or a logit mix) and the
token is sampled from the combination. With **CoS** one model drafts tokens, the others check
them in one batched pass against the combined distribution, and the models take turns, so the
reply follows exactly the ensemble's distribution with fewer model calls.

## Keys

| key | action |
|---|---|
| Enter | send the message |
| Escape, Ctrl-C | stop the running reply (what was generated stays) |
| Ctrl-T | token colours on/off |
| F2 | settings (method, combiner, temperature, gamma, ...) |
| Ctrl-N | new chat |
| Ctrl-S | save the transcript (Markdown and JSON with stats) |
| Ctrl-P | command palette |
| Ctrl-Q | quit |
| F1 | this help |

## Colours

Each token of a reply is coloured by where it came from: the draft of one model that the
other models accepted, a **bonus** token (sampled by a model right after it verified the
others' drafts, then accepted), or a token **resampled** after a rejection. With the
standard ensemble every token is sampled from the combination directly.
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
