"""`localcos chat`: a Textual terminal chat with an ensemble that shows speculation at work."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, ProgressBar
from textual.worker import get_current_worker

from localcos.chat import ChatFormatter, Conversation
from localcos.errors import LocalcosError

from .screens import ChatSettings, HelpScreen, SettingsScreen
from .widgets import Legend, MessageView, StatsPanel

Loader = Callable[[Callable[[int, int, str], None]], "tuple[object, ChatFormatter]"]


class ChatApp(App):
    """The chat. `loader(progress)` loads the ensemble (in a worker thread) and returns it with
    its chat formatter; `progress(i, n, name)` reports each model as it loads."""

    CSS_PATH = "app.tcss"
    TITLE = "localcos chat"
    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True),
        Binding("ctrl+c", "stop", "Stop", show=False, priority=True),
        Binding("ctrl+t", "toggle_colours", "Colours"),
        Binding("f2", "settings", "Settings"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+s", "save", "Save"),
        Binding("f1", "help", "Help"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(
        self,
        loader: Loader,
        settings: ChatSettings,
        *,
        system: str | None = None,
        save_dir: Path | None = None,
        subtitle: str = "",
    ) -> None:
        super().__init__()
        self.loader = loader
        self.settings = settings
        self.system = system
        self.save_dir = save_dir or Path.cwd()
        self.sub_title = subtitle
        self.ensemble = None
        self.conversation: Conversation | None = None
        self.colouring = True
        self.stream = None  # the reply being generated
        self.replies: list[dict] = []  # transcript entries with stats
        self.last_stats: dict = {}

    # --- layout ---------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield VerticalScroll(id="messages")
                yield ProgressBar(total=1, show_eta=False, id="loading")
                yield Input(placeholder="Loading models...", id="prompt", disabled=True)
            with Vertical(id="side"):
                yield StatsPanel(id="stats")
                yield Legend([])
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(StatsPanel).show({})
        self.query_one(Legend).set_colouring(self.colouring)
        self.load_models()

    # --- loading ----------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="load")
    def load_models(self) -> None:
        def progress(i: int, n: int, name: str) -> None:
            self.call_from_thread(self._loading, i, n, name)

        try:
            ensemble, formatter = self.loader(progress)
        except LocalcosError as e:
            self.call_from_thread(self._load_failed, str(e))
            return
        except Exception as e:  # keep the app alive whatever broke
            self.call_from_thread(self._load_failed, f"{type(e).__name__}: {e}")
            return
        self.call_from_thread(self._loaded, ensemble, formatter)

    def _loading(self, i: int, n: int, name: str) -> None:
        bar = self.query_one("#loading", ProgressBar)
        bar.update(total=n, progress=i)
        self.query_one("#prompt", Input).placeholder = f"Loading {Path(name).name} ({i + 1}/{n})..."

    def _load_failed(self, message: str) -> None:
        self.query_one("#loading", ProgressBar).display = False
        self.query_one("#prompt", Input).placeholder = "No models loaded. Ctrl-Q quits."
        self._add_message("notice", f"Could not load the models: {message}")
        self.notify(message, title="Loading failed", severity="error", timeout=30)

    def _loaded(self, ensemble, formatter: ChatFormatter) -> None:
        self.ensemble = ensemble
        self.conversation = Conversation(formatter, ensemble.n_ctx, self.system)
        self.query_one("#loading", ProgressBar).display = False
        legend = self.query_one(Legend)
        legend.model_names = ensemble.names
        legend.set_colouring(self.colouring)
        prompt = self.query_one("#prompt", Input)
        prompt.disabled = False
        prompt.placeholder = "Message the ensemble (Enter sends, F1 help)"
        prompt.focus()
        if formatter.note:
            self.notify(formatter.note, title="Chat template")
        try:
            self._apply_settings(self.settings)
        except LocalcosError as e:
            self.notify(str(e), title="Invalid settings", severity="error", timeout=15)

    # --- messages ---------------------------------------------------------------------------------
    def _add_message(self, role: str, text: str = "") -> MessageView:
        view = MessageView(role, text, colouring=self.colouring)
        messages = self.query_one("#messages", VerticalScroll)
        messages.mount(view)
        messages.scroll_end(animate=False)
        return view

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if self.ensemble is None or self.conversation is None:
            self.notify("The models are not loaded.", severity="warning")
            return
        if self.stream is not None:
            self.notify("A reply is still being generated: Escape stops it.", severity="warning")
            return
        event.input.value = ""
        try:
            tokens, dropped = self.conversation.prompt(text, self.settings.max_tokens)
        except LocalcosError as e:
            self.notify(str(e), title="Cannot send", severity="error")
            return
        if dropped:
            self._add_message("notice", f"The conversation outgrew the context of {self.ensemble.n_ctx} tokens: the oldest {dropped} message(s) were dropped.")
        self._add_message("user", text)
        view = self._add_message("assistant")
        try:
            self.stream = self.ensemble.stream(tokens, **self.settings.generation())
        except LocalcosError as e:
            self.notify(str(e), title="Cannot generate", severity="error")
            return
        self.refresh_bindings()  # show Stop in the footer
        self.generate(self.stream, view, len(tokens))

    @work(thread=True, exclusive=True, group="generate")
    def generate(self, stream, view: MessageView, prompt_tokens: int) -> None:
        """Run the decoding loop in a thread; hand each round's tokens to the UI."""
        worker = get_current_worker()
        t0 = time.perf_counter()
        last_update = 0.0
        pending: list = []
        try:
            for chunk in stream.chunks():
                pending.extend((ev.text, ev.origin) for ev in chunk.tokens)
                now = time.perf_counter()
                # about 10 screen updates a second: each one relayouts the screen on the UI
                # thread, holding the GIL that the decoding loop needs between llama.cpp calls
                # (measured with the demo pair: 20 updates/s decoded a quarter slower)
                if now - last_update > 0.1:
                    batch, pending = pending, []
                    self.call_from_thread(self._reply_progress, view, batch, prompt_tokens, now - t0)
                    last_update = now
                if worker.is_cancelled:
                    stream.cancel()
        except LocalcosError as e:
            self.call_from_thread(self._reply_failed, view, str(e))
            return
        except Exception as e:
            self.call_from_thread(self._reply_failed, view, f"{type(e).__name__}: {e}")
            return
        self.call_from_thread(self._reply_done, view, pending, stream.completion, prompt_tokens)

    def _reply_progress(self, view: MessageView, pieces: list, prompt_tokens: int, seconds: float) -> None:
        view.add_tokens(pieces)
        self.query_one("#messages", VerticalScroll).scroll_end(animate=False)
        live = {
            "method": self.settings.method,
            "tokens": view.n_tokens,
            "tokens_per_second": view.n_tokens / seconds if seconds > 0 else None,
            "context": self._context_used(prompt_tokens, view.n_tokens),
        }
        self.query_one(StatsPanel).show({**self.last_stats, **live})

    def _reply_failed(self, view: MessageView, message: str) -> None:
        self.stream = None
        self.refresh_bindings()
        view.finish(view.tokens.plain, "error")
        self.notify(message, title="Generation failed", severity="error", timeout=15)

    def _reply_done(self, view: MessageView, pieces: list, completion, prompt_tokens: int) -> None:
        self.stream = None
        self.refresh_bindings()
        if pieces:
            view.add_tokens(pieces)
        if completion is None:
            return
        view.finish(completion.text, completion.finish_reason)
        assert self.conversation is not None
        self.conversation.reply(completion.text)
        stats = self._stats(completion, prompt_tokens)
        self.last_stats = stats
        self.replies.append(
            {
                "prompt": self.conversation.messages[-2].content if len(self.conversation.messages) > 1 else "",
                "reply": completion.text,
                "finish_reason": completion.finish_reason,
                "stats": completion.stats.to_dict(),
                "settings": asdict(self.settings),
            }
        )
        self.query_one(StatsPanel).show(stats)
        self.query_one("#messages", VerticalScroll).scroll_end(animate=False)
        if completion.finish_reason == "cancelled":
            self.notify("Stopped; the partial reply is kept.", timeout=3)

    def _context_used(self, prompt_tokens: int, generated: int | None) -> str:
        n_ctx = self.ensemble.n_ctx if self.ensemble else 0
        used = prompt_tokens + (generated or 0)
        return f"{used}/{n_ctx} ({used / n_ctx:.0%})" if n_ctx else "-"

    def _stats(self, completion, prompt_tokens: int) -> dict:
        s = completion.stats
        n = len(s.models)
        return {
            "method": s.method,
            "tokens_per_second": s.tokens_per_second,
            "tokens": s.tokens,
            "acceptance_rate": s.acceptance_rate,
            "mean_accepted": s.mean_accepted,
            "calls_per_token": s.calls_per_token,
            "speedup_estimate": s.speedup_estimate if s.method != "ensemble" else (1.0 if s.tokens else None),
            "context": self._context_used(prompt_tokens, s.tokens),
            "calls": [(name, m.calls) for name, m in zip(self.ensemble.names, s.models)],
            "models": n,
        }

    # --- actions ------------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple) -> bool | None:
        # Escape / Ctrl-C stop a reply; otherwise they keep their usual meaning (Ctrl-C copies)
        if action == "stop" and self.stream is None:
            return False
        return True

    def action_stop(self) -> None:
        if self.stream is not None:
            self.stream.cancel()

    def action_toggle_colours(self) -> None:
        self.colouring = not self.colouring
        for view in self.query(MessageView):
            view.set_colouring(self.colouring)
        self.query_one(Legend).set_colouring(self.colouring)

    def action_settings(self) -> None:
        n = len(self.ensemble.models) if self.ensemble else 2

        def done(settings: ChatSettings | None) -> None:
            if settings is not None:
                try:
                    self._apply_settings(settings)
                except LocalcosError as e:
                    self.notify(str(e), title="Invalid settings", severity="error")
                    return
                self.notify("Settings apply to the next reply.", timeout=3)

        self.push_screen(SettingsScreen(self.settings, n), done)

    def _apply_settings(self, settings: ChatSettings) -> None:
        if self.ensemble is not None:
            self.ensemble.combiner = self.ensemble._bind(settings.combiner())
            if len(self.ensemble.models) == 1 and settings.method != "ensemble":
                settings = replace(settings, method="ensemble")
        self.settings = settings

    def action_new_chat(self) -> None:
        if self.stream is not None:
            self.notify("Stop the running reply first (Escape).", severity="warning")
            return
        if self.conversation is not None:
            self.conversation.clear()
        self.replies.clear()
        self.query_one("#messages", VerticalScroll).remove_children()
        self.notify("New chat.", timeout=2)

    def action_save(self) -> None:
        if self.conversation is None or not self.conversation.messages:
            self.notify("Nothing to save yet.", severity="warning")
            return
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        base = self.save_dir / f"localcos-chat-{stamp}"
        md, js = base.with_suffix(".md"), base.with_suffix(".json")
        try:
            self.save_dir.mkdir(parents=True, exist_ok=True)
            md.write_text(self.transcript_markdown(), encoding="utf-8")
            js.write_text(json.dumps(self.transcript_json(), indent=1), encoding="utf-8")
        except OSError as e:
            self.notify(f"Cannot save: {e}", severity="error")
            return
        self.notify(f"Saved {md.name} and {js.name} in {self.save_dir}", title="Transcript saved")

    def transcript_markdown(self) -> str:
        assert self.conversation is not None
        out = ["# localcos chat", ""]
        if self.ensemble is not None:
            out += [f"Models: {', '.join(self.ensemble.names)}  ", f"Combiner: {self.ensemble.combiner.describe()}", ""]
        if self.system:
            out += [f"**system**: {self.system}", ""]
        for m in self.conversation.messages:
            out += [f"## {'You' if m.role == 'user' else 'Ensemble'}", "", m.content, ""]
        return "\n".join(out)

    def transcript_json(self) -> dict:
        assert self.conversation is not None
        return {
            "models": self.ensemble.names if self.ensemble else [],
            "system": self.system,
            "messages": [{"role": m.role, "content": m.content} for m in self.conversation.messages],
            "replies": self.replies,
        }

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Settings", "Method, combiner, temperature, gamma, max tokens", self.action_settings)
        yield SystemCommand("Toggle token colours", "Colour reply tokens by where they came from", self.action_toggle_colours)
        yield SystemCommand("New chat", "Forget the conversation", self.action_new_chat)
        yield SystemCommand("Save transcript", "Markdown and JSON with stats", self.action_save)


def run_chat(args) -> int:
    """Entry point of `localcos chat`."""
    from localcos import cli
    from localcos.synthetic import ensure_set

    if args.demo and (args.models or args.preset):
        from localcos.errors import ConfigError

        raise ConfigError("give --demo or --models/--preset, not both")
    if args.demo:
        paths = ensure_set("demo", progress=lambda m: print(m, flush=True))
        setup = cli.Setup(paths, [str(p) for p in paths], [0] * len(paths))
        subtitle = "demo: two synthetic models"
    else:
        setup = cli.resolve_setup(args)
        subtitle = " + ".join(Path(r).name for r in setup.refs)
    gamma = cli.generation_settings(args, len(setup.paths))["gamma"]
    weights = tuple(cli._floats(args.weights, "--weights")) if args.weights else None
    settings = ChatSettings(
        method=args.method or ("cos" if len(setup.paths) > 1 else "ensemble"),
        combine=args.combine or "we",
        weights=weights,
        mu=0.1 if args.mu is None else args.mu,
        temperature=args.temperature,
        top_p=args.top_p,
        gamma=gamma,
        max_tokens=args.max_tokens,
    )
    template_model = args.chat_template_model if args.chat_template_model is not None else (setup.chat_template_model or 0)

    def loader(progress):
        from localcos.ensemble import Ensemble

        ens = Ensemble.load(
            setup.paths,
            cli.build_combiner(args),
            n_ctx=args.ctx,
            n_gpu_layers=setup.n_gpu_layers,
            n_threads=args.threads,
            progress=progress,
        )
        try:
            return ens, ChatFormatter(ens, template_model)
        except LocalcosError:
            ens.close()
            raise

    app = ChatApp(loader, settings, system=args.system, subtitle=subtitle)
    app.run()
    if app.ensemble is not None:
        app.ensemble.close()
    return 0
