"""`localcos chat`: a Textual terminal chat with an ensemble that shows speculation at work."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from collections.abc import Callable, Iterable

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, ProgressBar
from textual.worker import Worker, WorkerState, get_current_worker

from localcos.chat import ChatFormatter, Conversation, OwnTemplates
from localcos.ensemble import Ensemble
from localcos.runtime import Completion, Stream
from localcos.runtime.bytelevel import ByteModels, ByteStream, decoding_level
from localcos.errors import LocalcosError, StorageError
from localcos.files import write_text
from localcos.config import Settings
from localcos.config.resolve import request_level
from localcos.config.specs import GenerationConfig
from localcos.core.level import Level

from .screens import HelpScreen, SettingsScreen
from .transcript import Transcript
from .widgets import Legend, LiveReply, MessageView, StatsPanel

Loader = Callable[[Callable[[int, int, str], None]], "tuple[Ensemble | ByteModels, ChatFormatter | OwnTemplates]"]


def load_for(settings: Settings) -> Loader:
    """The loader of `settings`: the ensemble, and its chat formatter; at the byte level (models
    of different tokenizers) the byte-level models, each rendering the chat in its own template."""

    def loader(progress: Callable[[int, int, str], None]) -> tuple[Ensemble | ByteModels, ChatFormatter | OwnTemplates]:
        if decoding_level(settings).in_bytes:
            models = ByteModels.load(settings.load, settings.combiner(), progress=progress)
            try:
                return models, OwnTemplates(models)
            except LocalcosError:
                models.close()
                raise
        ens = Ensemble.from_spec(settings.load, settings.combiner(), progress=progress)
        try:
            return ens, ChatFormatter(ens, settings.chat_template_model)
        except LocalcosError:
            ens.close()
            raise

    return loader


class ModelLoading(Message):
    """Model i of n is being loaded."""

    def __init__(self, i: int, n: int, name: str) -> None:
        super().__init__()
        self.i, self.n, self.name = i, n, name


class TokensArrived(Message):
    """Tokens of the running reply, about ten times a second."""

    def __init__(self, pieces: list, seconds: float) -> None:
        super().__init__()
        self.pieces, self.seconds = pieces, seconds


class ChatApp(App):
    """The chat. It loads the ensemble of `settings` in a worker (or with `loader`, which
    returns the ensemble and its chat formatter) and generates each reply in another."""

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

    colouring: reactive[bool] = reactive(True)

    def __init__(self, settings: Settings, *, loader: Loader | None = None, save_dir: Path | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.loader = loader or load_for(settings)
        self.save_dir = save_dir or Path.cwd()
        self.sub_title = settings.name
        self.ensemble: Ensemble | ByteModels | None = None
        self.formatter: ChatFormatter | OwnTemplates | None = None
        # one model loaded for the mixed level on its own tokens, and its template: where a reply
        # the mixed level does not serve decodes (`config.resolve.request_level`, per reply)
        self.token_view: tuple[Ensemble, ChatFormatter] | None = None
        self.reply_level = Level.TOKEN  # the level the last (or running) reply decodes at
        self.conversation: Conversation | None = None
        self.stream: Stream | ByteStream | None = None  # the reply being generated
        self.reply_view: MessageView | None = None
        self.prompt_tokens = 0
        self.replies: list[dict] = []  # transcript records with stats

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
                yield Legend()
        yield Footer()

    def on_mount(self) -> None:
        self.load_models()

    def watch_colouring(self, on: bool) -> None:
        for view in self.query(MessageView):
            view.set_colouring(on)
        self.query_one(Legend).colouring = on

    # --- loading ----------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def load_models(self) -> tuple[Ensemble | ByteModels, ChatFormatter | OwnTemplates]:
        def loading(i: int, n: int, name: str) -> None:
            self.post_message(ModelLoading(i, n, name))

        return self.loader(loading)

    def on_model_loading(self, event: ModelLoading) -> None:
        self.query_one("#loading", ProgressBar).update(total=event.n, progress=event.i)
        self.query_one("#prompt", Input).placeholder = f"Loading {Path(event.name).name} ({event.i + 1}/{event.n})..."

    def _loaded(self, ensemble: Ensemble | ByteModels, formatter: ChatFormatter | OwnTemplates) -> None:
        self.ensemble, self.formatter = ensemble, formatter
        self.reply_level = ensemble.level if isinstance(ensemble, ByteModels) else Level.TOKEN
        token = Ensemble.token_view(ensemble)
        try:
            self.token_view = (token, ChatFormatter(token)) if token is not None else None
        except LocalcosError:  # no template of its own: every reply at the level loaded
            self.token_view = None
        self.conversation = Conversation(formatter, ensemble.n_ctx, self.settings.system)
        self.query_one("#loading", ProgressBar).display = False
        self.query_one(Legend).model_names = tuple(ensemble.names)
        prompt = self.query_one("#prompt", Input)
        prompt.disabled = False
        prompt.placeholder = "Message the ensemble (Enter sends, F1 help)"
        prompt.focus()
        if formatter.note:
            self.notify(formatter.note, title="Chat template")

    def _load_failed(self, error: BaseException) -> None:
        message = str(error) if isinstance(error, LocalcosError) else f"{type(error).__name__}: {error}"
        self.query_one("#loading", ProgressBar).display = False
        self.query_one("#prompt", Input).placeholder = "No models loaded. Ctrl-Q quits."
        self._add_message("notice", f"Could not load the models: {message}")
        self.notify(message, title="Loading failed", severity="error", timeout=30)

    @on(Worker.StateChanged)
    def _worker_done(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if event.state == WorkerState.SUCCESS:
            if worker.group == "load":
                assert worker.result is not None
                self._loaded(*worker.result)
            elif worker.group == "generate":
                self._reply_done(worker.result)
        elif event.state == WorkerState.ERROR:
            assert worker.error is not None
            if worker.group == "load":
                self._load_failed(worker.error)
            elif worker.group == "generate":
                self._reply_failed(worker.error)

    # --- messages ---------------------------------------------------------------------------------
    def _add_message(self, role: str, text: str = "") -> MessageView:
        speaker = self.ensemble.names[0] if self.ensemble is not None and len(self.ensemble.names) == 1 else "ensemble"
        view = MessageView(role, text, colouring=self.colouring, speaker=speaker)
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
        config = self.settings.generation
        ensemble, self.reply_level = self._decides(config)
        try:
            tokens, dropped = self.conversation.prompt(text, config.max_tokens)
            # a member of the lead model reads the second prompt (guidance, contrast), where there is one
            second = self.conversation.second_prompt(config.negative_prompt, self.settings.guide_system) if ensemble.second_member is not None else None
            stream = ensemble.stream(tokens, config=config, second_prompt=second)
        except LocalcosError as e:
            self.notify(str(e), title="Cannot send", severity="error")
            return
        event.input.value = ""
        if dropped:
            self._add_message(
                "notice",
                f"The conversation outgrew the context of {self.ensemble.n_ctx} tokens: the oldest {dropped} message(s) were dropped.",
            )
        self._add_message("user", text)
        self.reply_view = self._add_message("assistant")
        self.stream, self.prompt_tokens = stream, self.conversation.formatter.size(tokens)
        self.query_one(StatsPanel).live = LiveReply(config.method or "ensemble", 0, 0.0, self._unit, self._level)
        self.refresh_bindings()  # show Stop in the footer
        self.generate(stream)

    @work(thread=True, exclusive=True, group="generate", exit_on_error=False)
    def generate(self, stream: Stream | ByteStream) -> Completion | None:
        """Run the decoding loop in a thread; post the tokens to the UI about ten times a second
        (each update relayouts the screen on the UI thread, holding the GIL the decoding loop
        needs between llama.cpp calls: with the demo pair, 20 updates/s decoded a quarter slower)."""
        worker = get_current_worker()
        t0 = last = time.perf_counter()
        pending: list = []
        for chunk in stream.chunks():
            pending.extend((ev.text, ev.origin) for ev in chunk.tokens)
            now = time.perf_counter()
            if now - last > 0.1:
                self.post_message(TokensArrived(pending, now - t0))
                pending, last = [], now
            if worker.is_cancelled:
                stream.cancel()
        if pending:
            self.post_message(TokensArrived(pending, time.perf_counter() - t0))
        return stream.completion

    def on_tokens_arrived(self, event: TokensArrived) -> None:
        view = self.reply_view
        if view is None or view.complete:
            return
        view.add_tokens(event.pieces)
        self.query_one("#messages", VerticalScroll).scroll_end(animate=False)
        panel = self.query_one(StatsPanel)
        generated = len(view.tokens.plain) if self._unit == "chars" else view.n_tokens
        panel.live = LiveReply(self.settings.generation.method or "ensemble", generated, event.seconds, self._unit, self._level)
        panel.context = self._context_used(None if self._unit == "chars" else view.n_tokens)

    def _decides(self, config: GenerationConfig) -> tuple[Ensemble | ByteModels, Level]:
        """The models a reply with these settings decodes on, and its level, decided once per reply
        (`config.resolve.request_level`); the conversation renders in that level's templates."""
        assert self.ensemble is not None and self.formatter is not None and self.conversation is not None
        loaded = self.ensemble.level if isinstance(self.ensemble, ByteModels) else Level.TOKEN
        level = request_level(loaded, config, needs_tokens=False, token_view=self.token_view is not None)
        if level is not loaded and self.token_view is not None:
            ensemble, self.conversation.formatter = self.token_view
            return ensemble, level
        self.conversation.formatter = self.formatter
        return self.ensemble, level

    @property
    def _level(self) -> str:
        """The level the reply decodes at, as the stats name it."""
        return self.reply_level.value

    @property
    def _unit(self) -> str:
        """What a reply is counted in: tokens, or characters at the byte and mixed levels."""
        return "chars" if self.reply_level.in_bytes else "tokens"

    def _reply_done(self, completion: Completion | None) -> None:
        view, self.stream = self.reply_view, None
        self.refresh_bindings()
        if completion is None or view is None:
            return
        view.finish(completion.text, completion.finish_reason)
        assert self.conversation is not None
        self.conversation.reply(completion.text)
        panel = self.query_one(StatsPanel)
        panel.stats, panel.live = completion.stats, None
        panel.context = self._context_used(None if completion.stats.level.in_bytes else completion.stats.tokens)
        self.replies.append(
            {
                "prompt": self.conversation.messages[-2].content if len(self.conversation.messages) > 1 else "",
                "reply": completion.text,
                "finish_reason": completion.finish_reason,
                "stats": completion.stats.to_dict(),
                "settings": {"combine": asdict(self.settings.combine), "generation": asdict(self.settings.generation)},
            }
        )
        self.query_one("#messages", VerticalScroll).scroll_end(animate=False)
        if completion.finish_reason == "cancelled":
            self.notify("Stopped; the partial reply is kept.", timeout=3)

    def _reply_failed(self, error: BaseException) -> None:
        view, self.stream = self.reply_view, None
        self.refresh_bindings()
        self.query_one(StatsPanel).live = None
        if view is not None:
            view.finish(view.tokens.plain, "error")
            if self.conversation is not None and view.tokens.plain:
                self.conversation.reply(view.tokens.plain)  # what was generated stays in the chat
        message = str(error) if isinstance(error, LocalcosError) else f"{type(error).__name__}: {error}"
        self.notify(message, title="Generation failed", severity="error", timeout=15)

    def _context_used(self, generated: int | None) -> str:
        """Context used: the prompt and `generated` tokens (None at the byte level, where each
        model counts the reply in its own tokens: the prompt's, of the longest)."""
        n_ctx = self.ensemble.n_ctx if self.ensemble else 0
        if not n_ctx:
            return "-"
        used = self.prompt_tokens + (generated or 0)
        return f"{used}/{n_ctx} ({used / n_ctx:.0%})" + (" + reply" if generated is None else "")

    # --- actions ------------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple) -> bool | None:
        # Escape / Ctrl-C stop a reply; otherwise they keep their usual meaning (Ctrl-C copies)
        return not (action == "stop" and self.stream is None)

    def action_stop(self) -> None:
        if self.stream is not None:
            self.stream.cancel()

    def action_toggle_colours(self) -> None:
        self.colouring = not self.colouring

    def action_settings(self) -> None:
        def done(settings: Settings | None) -> None:
            if settings is None:
                return
            try:
                if self.ensemble is not None:
                    self.ensemble.combiner = settings.combiner()
            except LocalcosError as e:
                self.notify(str(e), title="Invalid settings", severity="error")
                return
            self.settings = settings
            self.notify("Settings apply to the next reply.", timeout=3)

        self.push_screen(SettingsScreen(self.settings), done)

    def action_new_chat(self) -> None:
        if self.stream is not None:
            self.notify("Stop the running reply first (Escape).", severity="warning")
            return
        if self.conversation is not None:
            self.conversation.clear()
        self.replies.clear()
        self.query_one("#messages", VerticalScroll).remove_children()
        self.notify("New chat.", timeout=2)

    def transcript(self) -> Transcript:
        return Transcript(
            models=self.ensemble.names if self.ensemble else [],
            combiner=self.ensemble.combiner.describe() if self.ensemble else "",
            system=self.settings.system,
            messages=list(self.conversation.messages) if self.conversation else [],
            replies=self.replies,
        )

    def action_save(self) -> None:
        if self.conversation is None or not self.conversation.messages:
            self.notify("Nothing to save yet.", severity="warning")
            return
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        base = self.save_dir / f"localcos-chat-{stamp}"
        md, js = base.with_suffix(".md"), base.with_suffix(".json")
        transcript = self.transcript()
        try:  # each file whole or not at all; the conversation stays on screen either way
            write_text(md, transcript.markdown())
            write_text(js, json.dumps(transcript.json(), indent=1))
        except (StorageError, OSError) as e:
            self.notify(f"{e}. The conversation is still here: free some space or set another folder, then save again.",
                        title="Not saved", severity="error")  # fmt: skip
            return
        self.notify(f"Saved {md.name} and {js.name} in {self.save_dir}", title="Transcript saved")

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Settings", "Method, combiner, sampling, gamma, max tokens", self.action_settings)
        yield SystemCommand("Toggle token colours", "Colour reply tokens by where they came from", self.action_toggle_colours)
        yield SystemCommand("New chat", "Forget the conversation", self.action_new_chat)
        yield SystemCommand("Save transcript", "Markdown and JSON with stats", self.action_save)


def run_chat(settings: Settings) -> int:
    """Entry point of `localcos chat`: run the app until the user quits."""
    app = ChatApp(settings)
    app.run()
    if app.ensemble is not None:
        app.ensemble.close()
    return 0
