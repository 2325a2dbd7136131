"""`localcos chat`: a Textual terminal chat with an ensemble that shows speculation at work."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
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
from textual.widgets import Footer, Header, ProgressBar
from textual.worker import Worker, WorkerState, get_current_worker

from localcos.chat import ChatFormatter, Conversation, Message as ChatMessage, Templates, chat_templates
from localcos.config import OPTIONS, Settings
from localcos.config.specs import GenerationConfig
from localcos.conversations import ConversationStore, Turn
from localcos.core.level import Level
from localcos.ensemble import Ensemble, LevelEnsemble, load_at
from localcos.errors import LocalcosError, StorageError
from localcos.files import write_text
from localcos.runtime import Completion, Stream
from localcos.runtime.models import LevelViews
from localcos.config.levels import decoding_level
from localcos.stats import reply_progress

from .prefs import CHAT_DEFAULTS, Prefs
from .prompt import PromptArea
from .screens import FORM, ConversationsScreen, HelpScreen, ModelsScreen, SettingsScreen, TextScreen
from .transcript import Transcript
from .widgets import Legend, LiveReply, MessageView, StatsPanel, code_blocks

Loader = Callable[[Callable[[int, int, str], None]], "tuple[LevelEnsemble, Templates]"]


def load_for(settings: Settings) -> Loader:
    """The loader of `settings`: the ensemble, and its chat formatter; at the byte level (models
    of different tokenizers) the byte-level models, each rendering the chat in its own template."""

    def loader(progress: Callable[[int, int, str], None]) -> tuple[LevelEnsemble, Templates]:
        decoding_level(settings)  # what the level does not decode, refused before anything loads
        models = load_at(settings.load, settings.combiner(), progress=progress)
        try:
            return models, chat_templates(models, settings.chat_template_model)
        except LocalcosError:
            models.close()
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


def conversation_settings(settings: Settings) -> dict[str, str]:
    """What a kept conversation remembers of how it was held: its models as the user named them,
    and each combination and generation option not at its default, as text (what
    `localcos chat --continue` resolves again)."""
    values = {o.name: o.format(settings.value(o.name)) for o in OPTIONS.values() if o.target in ("combine", "generation")}
    source = {"synthetic": settings.name} if "synthetic" in settings.given else {"models": ",".join(settings.load.labels)}
    return {**source, **{k: v for k, v in values.items() if v != OPTIONS[k].format(OPTIONS[k].default)}}


class ChatApp(App):
    """The chat. It loads the ensemble of `settings` in a worker (or with `loader`, which
    returns the ensemble and its chat formatter) and generates each reply in another, every
    llama.cpp call of both on one thread of its own (llama.cpp's CPU threads belong to the
    thread that first computes: decoding on another thread than the one that loaded ran a fifth
    slower per token; and a reply never overlaps another's or a load).

    With a `store`, the conversation is kept as it happens (each message written when sent or
    when its reply ends; `open_id` reopens a kept one); with `prefs`, the settings form's values,
    the theme and the view are remembered between runs."""

    CSS_PATH = "app.tcss"
    TITLE = "localcos chat"
    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True),
        Binding("ctrl+c", "stop", "Stop", show=False, priority=True),
        Binding("ctrl+o", "conversations", "Chats"),
        Binding("ctrl+n", "new_chat", "New"),
        Binding("ctrl+r", "regenerate", "Retry"),
        Binding("ctrl+l", "edit_last", "Edit"),
        Binding("f5", "copy_reply", "Copy"),
        Binding("ctrl+t", "toggle_colours", "Colours"),
        Binding("f2", "settings", "Settings"),
        Binding("f3", "system", "System"),
        Binding("f4", "models", "Models"),
        Binding("ctrl+s", "export", "Export", show=False),
        Binding("f1", "help", "Help"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    colouring: reactive[bool] = reactive(False)

    def __init__(self, settings: Settings, *, loader: Loader | None = None, save_dir: Path | None = None, store: ConversationStore | None = None,
                 open_id: int | None = None, prefs: Prefs | None = None) -> None:  # fmt: skip
        super().__init__()
        self.prefs = prefs
        if prefs is not None:
            settings = remembered(settings, prefs)
        self.settings = settings
        self.loader = loader or load_for(settings)
        self.save_dir = save_dir or Path.cwd()
        self.sub_title = settings.name
        self.store = store
        self.kept_id: int | None = None  # the kept conversation on screen (None: not kept yet)
        self._open_on_load = open_id
        self.load_error: BaseException | None = None
        self._llama = ThreadPoolExecutor(max_workers=1, thread_name_prefix="localcos-llama")  # see the class's docstring
        self.ensemble: LevelEnsemble | None = None
        self.formatter: Templates | None = None
        # the models, with one model loaded for the mixed level on its own tokens beside them and
        # each one's templates: where a reply the mixed level does not serve decodes (`decides`)
        self.views: LevelViews[LevelEnsemble, Templates] | None = None
        self.reply_level = Level.TOKEN  # the level the last (or running) reply decodes at
        self.conversation: Conversation | None = None
        self.stream: Stream | None = None  # the reply being generated
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
                yield PromptArea(placeholder="Loading models...", id="prompt", disabled=True)
            with VerticalScroll(id="side"):
                yield StatsPanel(id="stats")
                yield Legend()
        yield Footer()

    def on_mount(self) -> None:
        if self.prefs is not None:
            if self.prefs.theme in self.available_themes:
                self.theme = self.prefs.theme
            self.colouring = self.prefs.colouring
        self.load_models(self.loader)

    def watch_theme(self, theme: str) -> None:
        if self.prefs is not None and self.prefs.theme != theme:
            self.prefs.theme = theme
            self._save_prefs()

    def watch_colouring(self, on: bool) -> None:
        for view in self.query(MessageView):
            view.set_colouring(on)
        self.query_one(Legend).colouring = on

    def _save_prefs(self) -> None:
        assert self.prefs is not None
        try:
            self.prefs.save()
        except (StorageError, OSError) as e:
            self.notify(f"{e}", title="Settings not remembered", severity="warning")

    # --- loading ----------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def load_models(self, loader: Loader) -> tuple[LevelEnsemble, Templates]:
        def loading(i: int, n: int, name: str) -> None:
            self.post_message(ModelLoading(i, n, name))

        return self._llama.submit(loader, loading).result()

    def on_model_loading(self, event: ModelLoading) -> None:
        bar = self.query_one("#loading", ProgressBar)
        bar.display = True
        bar.update(total=event.n, progress=event.i)
        self.query_one("#prompt", PromptArea).placeholder = f"Loading {Path(event.name).name} ({event.i + 1}/{event.n})..."

    def _loaded(self, ensemble: LevelEnsemble, formatter: Templates) -> None:
        old, self.ensemble, self.formatter = self.ensemble, ensemble, formatter
        if old is not None:  # another ensemble for the same conversation
            old.close()
        self.reply_level = ensemble.level
        token: Ensemble | None = Ensemble.token_view(ensemble)
        token_formatter = None
        try:
            token_formatter = ChatFormatter(token) if token is not None else None
        except LocalcosError:  # no template of its own: every reply at the level loaded
            token = None
        self.views = LevelViews(ensemble, token, formatter, token_formatter)
        kept = self.conversation.messages if self.conversation is not None else []
        system = self.conversation.system if self.conversation is not None else self.settings.system
        self.conversation = Conversation(formatter, ensemble.n_ctx, system)
        self.conversation.messages = list(kept)
        self.query_one("#loading", ProgressBar).display = False
        self.query_one(Legend).model_names = tuple(ensemble.names)
        prompt = self.query_one("#prompt", PromptArea)
        prompt.disabled = False
        names = ensemble.names
        prompt.placeholder = f"Message {names[0] if len(names) == 1 else 'the ensemble'} (Enter sends, Ctrl+J new line, F1 help)"
        prompt.focus()
        if formatter.note:
            self.notify(formatter.note, title="Chat template")
        if self._open_on_load is not None:
            chosen, self._open_on_load = self._open_on_load, None
            self._open(chosen)

    def _load_failed(self, error: BaseException) -> None:
        self.load_error = error
        message = str(error) if isinstance(error, LocalcosError) else f"{type(error).__name__}: {error}"
        self.query_one("#loading", ProgressBar).display = False
        if self.ensemble is None:
            self.query_one("#prompt", PromptArea).placeholder = "No models loaded. Ctrl-Q quits."
        else:  # another ensemble failed: the loaded one goes on
            self.query_one("#prompt", PromptArea).disabled = False
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

    def _keep(self, turn: Turn) -> None:
        """Write a message of the conversation as it happens (the conversation kept on its first)."""
        if self.store is None:
            return
        try:
            if self.kept_id is None:
                assert self.ensemble is not None
                self.kept_id = self.store.create(self.settings.load.labels, conversation_settings(self.settings), self.settings.system)
            self.store.add(self.kept_id, turn)
        except StorageError as e:
            self.notify(f"{e}. The conversation goes on, not kept.", title="Not kept", severity="error", timeout=15)

    @on(PromptArea.Submitted)
    def _submitted(self, event: PromptArea.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if self.ensemble is None or self.conversation is None:
            self.notify("The models are not loaded.", severity="warning")
            return
        if self.stream is not None:
            self.notify("A reply is still being generated: Escape stops it.", severity="warning")
            return
        if self._reply(text):
            event.area.remember(text)
            event.area.value = ""

    def _reply(self, text: str | None) -> bool:
        """Start the reply to `text`, a new message of the user's (None: to the conversation as it
        is, its last message the user's: a regenerated reply). False where it cannot start."""
        assert self.ensemble is not None and self.conversation is not None
        config = self.settings.generation
        ensemble, self.reply_level = self._decides(config)
        try:
            tokens, dropped = self.conversation.prompt(text, config.max_tokens) if text is not None else self.conversation.fit(config.max_tokens)
            # a member of the lead model reads the second prompt (guidance, contrast), where there is one
            second = self.conversation.second_prompt(config.negative_prompt, self.settings.guide_system) if ensemble.second_member is not None else None
            stream = ensemble.stream(tokens, config=config, second_prompt=second)
        except LocalcosError as e:
            self.notify(str(e), title="Cannot send", severity="error")
            return False
        if dropped:
            self._add_message(
                "notice",
                f"The conversation outgrew the context of {self.ensemble.n_ctx} tokens: the oldest {dropped} message(s) were dropped.",
            )
        if text is not None:
            self._add_message("user", text)
            self._keep(Turn("user", text))
        self.reply_view = self._add_message("assistant")
        self.stream, self.prompt_tokens = stream, self.conversation.formatter.size(tokens)
        self.query_one(StatsPanel).live = LiveReply(config.method or "ensemble", 0, 0.0, self.reply_level)
        self.refresh_bindings()  # show Stop in the footer
        self.generate(stream)
        return True

    @work(thread=True, exclusive=True, group="generate", exit_on_error=False)
    def generate(self, stream: Stream) -> Completion | None:
        """Run the decoding loop in a thread; post the tokens to the UI about ten times a second
        (each update relayouts the screen on the UI thread, holding the GIL the decoding loop
        needs between llama.cpp calls: with the demo pair, 20 updates/s decoded a quarter slower)."""
        worker = get_current_worker()

        def decode() -> Completion | None:
            t0 = last = time.perf_counter()
            pending: list = []
            for chunk in stream.chunks():
                pending.extend((ev.text, ev.origin) for ev in chunk.pieces)
                now = time.perf_counter()
                if now - last > 0.1:
                    self.post_message(TokensArrived(pending, now - t0))
                    pending, last = [], now
                if worker.is_cancelled:
                    stream.cancel()
            if pending:
                self.post_message(TokensArrived(pending, time.perf_counter() - t0))
            return stream.completion

        return self._llama.submit(decode).result()

    async def on_tokens_arrived(self, event: TokensArrived) -> None:
        view = self.reply_view
        if view is None or view.complete:
            return
        await view.add_tokens(event.pieces)
        self.query_one("#messages", VerticalScroll).scroll_end(animate=False)
        panel = self.query_one(StatsPanel)
        length, in_context = reply_progress(self.reply_level, view.n_tokens, view.tokens.plain)
        panel.live = LiveReply(self.settings.generation.method or "ensemble", length, event.seconds, self.reply_level)
        panel.context = self._context_used(in_context)

    def _decides(self, config: GenerationConfig) -> tuple[LevelEnsemble, Level]:
        """The models a reply with these settings decodes on, and its level, decided once per reply
        (`LevelViews.decides`); the conversation renders in their templates."""
        assert self.views is not None and self.conversation is not None
        ensemble = self.views.decides(config, needs_tokens=False)
        formatter = self.views.templates_for(ensemble)
        assert formatter is not None, "the chat loads models with templates"
        self.conversation.formatter = formatter
        return ensemble, ensemble.level

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
        panel.context = self._context_used(completion.stats.context_tokens)
        settings = {"combine": asdict(self.settings.combine), "generation": asdict(self.settings.generation)}
        stats = completion.stats.to_dict()
        self.replies.append({"prompt": self.conversation.messages[-2].content if len(self.conversation.messages) > 1 else "",
                             "reply": completion.text, "finish_reason": completion.finish_reason, "stats": stats, "settings": settings})  # fmt: skip
        self._keep(Turn("assistant", completion.text, completion.finish_reason, stats, conversation_settings(self.settings)))
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
                self._keep(Turn("assistant", view.tokens.plain, "error"))
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
    def _idle(self) -> bool:
        """No reply runs (else a warning says so)."""
        if self.stream is not None:
            self.notify("Stop the running reply first (Escape).", severity="warning")
            return False
        return True

    def _clear(self) -> None:
        """An empty screen and conversation (what is kept stays kept)."""
        if self.conversation is not None:
            self.conversation.clear()
        self.replies.clear()
        self.query_one("#messages", VerticalScroll).remove_children()
        panel = self.query_one(StatsPanel)
        panel.stats, panel.live, panel.context = None, None, "-"

    def action_new_chat(self) -> None:
        if not self._idle():
            return
        kept = self.kept_id is not None
        self._clear()
        self.kept_id = None
        if self.conversation is not None:
            self.conversation.system = self.settings.system
        self.sub_title = self.settings.name
        self.notify("New chat." + (" The last one is kept: Ctrl+O lists them." if kept else ""), timeout=3)

    def action_regenerate(self) -> None:
        """The last reply again (with the settings now in force)."""
        if not self._idle() or self.conversation is None or self.ensemble is None:
            return
        if not self.conversation.messages or self.conversation.messages[-1].role != "assistant":
            self.notify("There is no reply to generate again.", severity="warning")
            return
        self.conversation.messages.pop()
        self._forget(1)
        views = [v for v in self.query(MessageView) if v.role == "assistant"]
        if views:
            views[-1].remove()
        self._reply(None)

    def action_edit_last(self) -> None:
        """The last message of the user's back in the prompt, it and its reply gone, to send again."""
        if not self._idle() or self.conversation is None:
            return
        messages = self.conversation.messages
        last = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
        if last is None:
            self.notify("There is no message to edit.", severity="warning")
            return
        text, gone = messages[last].content, len(messages) - last
        del messages[last:]
        self._forget(gone)
        views = [v for v in self.query(MessageView) if v.role in ("user", "assistant")]
        for view in views[len(views) - gone :]:
            view.remove()
        prompt = self.query_one("#prompt", PromptArea)
        prompt.value = text
        prompt.focus()

    def _forget(self, n: int) -> None:
        """The last `n` kept messages dropped (a regenerated reply, an edited message)."""
        if self.store is not None and self.kept_id is not None:
            kept = self.store.get(self.kept_id)
            self.store.truncate(self.kept_id, len(kept.turns) - n)

    def action_copy_reply(self) -> None:
        views = [v for v in self.query(MessageView) if v.role == "assistant" and v.text]
        if not views:
            self.notify("No reply to copy yet.", severity="warning")
            return
        self.copy_to_clipboard(views[-1].text)
        blocks = len(code_blocks(views[-1].text))
        self.notify("Reply copied" + (f" ({blocks} code block{'s' if blocks > 1 else ''}: focus the message and press b for its last)" if blocks else "") + ".",
                    timeout=3)  # fmt: skip

    def action_conversations(self) -> None:
        if self.store is None:
            self.notify("Conversations are not kept in this chat.", severity="warning")
            return
        if not self._idle():
            return

        def done(chosen: int | None) -> None:
            if chosen == 0:
                self.action_new_chat()
            elif chosen is not None and chosen != self.kept_id:
                self._open(chosen)

        self.push_screen(ConversationsScreen(self.store, self.kept_id), done)

    def _open(self, conversation: int) -> None:
        """Show a kept conversation and go on with it (on the models loaded now, which its
        settings name where they differ: F4 loads its own)."""
        assert self.store is not None and self.conversation is not None
        try:
            kept = self.store.get(conversation)
        except LocalcosError as e:
            self.notify(str(e), severity="error")
            return
        self._clear()
        self.kept_id = conversation
        self.conversation.system = kept.system
        self.conversation.messages = [ChatMessage(t.role, t.content) for t in kept.turns if t.role in ("user", "assistant")]
        for t in kept.turns:
            view = self._add_message(t.role, t.content)
            if t.role == "assistant":
                view.finish_reason = t.finish_reason
        self.sub_title = kept.title
        loaded = ",".join(self.settings.load.labels)
        if kept.models and ",".join(kept.models) != loaded:
            self.notify(f"Held with {', '.join(kept.models)}; going on with {loaded} (F4 chooses models).", timeout=8)

    def action_system(self) -> None:
        if self.conversation is None:
            return

        def done(text: str | None) -> None:
            if text is None or self.conversation is None:
                return
            self.conversation.system = text.strip() or None
            if self.store is not None and self.kept_id is not None:
                self.store.set_system(self.kept_id, self.conversation.system)
            self.notify("The system message applies to the next reply.", timeout=3)

        self.push_screen(TextScreen("System message of this conversation", self.conversation.system or "", lines=True), done)

    def action_models(self) -> None:
        if not self._idle() or self.ensemble is None:
            return
        self.push_screen(ModelsScreen(model_choices(), " + ".join(self.settings.load.labels)), self._load_other)

    def _load_other(self, values: dict | None) -> None:
        """Load another ensemble for this conversation, in the background; the conversation is kept."""
        if not values:
            return
        from localcos.config import resolve

        # the sampling and length settings go along; how to combine and draft is the new models' own
        generation = {o.name: self.settings.value(o.name) for o in OPTIONS.values() if o.target == "generation" and o.name in FORM and not o.combines}
        try:
            settings = resolve({**values}, defaults={**CHAT_DEFAULTS, **{k: v for k, v in generation.items() if v is not None}})
        except LocalcosError as e:
            self.notify(str(e), title="Cannot load", severity="error")
            return
        self.settings = replace(settings, system=self.settings.system)
        self.sub_title = settings.name
        if self.store is not None and self.kept_id is not None:
            self.store.set_models(self.kept_id, settings.load.labels, conversation_settings(settings))
        self.query_one("#prompt", PromptArea).disabled = True
        self.load_models(load_for(settings))

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        # Escape / Ctrl-C stop a reply; otherwise they keep their usual meaning (Ctrl-C copies)
        return not (action == "stop" and self.stream is None)

    def action_stop(self) -> None:
        if self.stream is not None:
            self.stream.cancel()

    def action_toggle_colours(self) -> None:
        self.colouring = not self.colouring
        if self.prefs is not None:
            self.prefs.colouring = self.colouring
            self._save_prefs()

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
            if self.prefs is not None:
                self.prefs.settings = {name: OPTIONS[name].format(settings.value(name)) for name in FORM}
                self._save_prefs()
            self.notify("Settings apply to the next reply.", timeout=3)

        self.push_screen(SettingsScreen(self.settings), done)

    def transcript(self) -> Transcript:
        return Transcript(
            models=self.ensemble.names if self.ensemble else [],
            combiner=self.ensemble.combiner.describe() if self.ensemble else "",
            system=self.conversation.system if self.conversation else self.settings.system,
            messages=list(self.conversation.messages) if self.conversation else [],
            replies=self.replies,
        )

    def action_export(self) -> None:
        if self.conversation is None or not self.conversation.messages:
            self.notify("Nothing to export yet.", severity="warning")
            return

        def done(folder: str | None) -> None:
            if folder:
                self._export(Path(folder).expanduser())

        self.push_screen(TextScreen("Export to the folder (Markdown and JSON)", str(self.save_dir)), done)

    def _export(self, folder: Path) -> None:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        base = folder / f"localcos-chat-{stamp}"
        md, js = base.with_suffix(".md"), base.with_suffix(".json")
        if self.store is not None and self.kept_id is not None:
            kept = self.store.get(self.kept_id)
            text, data = kept.markdown(), kept.export()
        else:
            transcript = self.transcript()
            text, data = transcript.markdown(), transcript.json()
        try:  # each file whole or not at all; the conversation stays on screen either way
            write_text(md, text)
            write_text(js, json.dumps(data, indent=1))
        except (StorageError, OSError) as e:
            self.notify(f"{e}. The conversation is still here: free some space or choose another folder, then export again.",
                        title="Not exported", severity="error")  # fmt: skip
            return
        self.notify(f"Exported {md.name} and {js.name} to {folder}", title="Exported")

    def action_save(self) -> None:  # the former Ctrl+S, for scripts that call it
        self._export(self.save_dir)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Conversations", "Open, rename, delete or search the kept conversations", self.action_conversations)
        yield SystemCommand("New chat", "Start another conversation (this one is kept)", self.action_new_chat)
        yield SystemCommand("Regenerate", "The last reply again", self.action_regenerate)
        yield SystemCommand("Edit the last message", "Put it back in the prompt to change and send", self.action_edit_last)
        yield SystemCommand("Copy the last reply", "To the clipboard", self.action_copy_reply)
        yield SystemCommand("Settings", "Method, combiner, sampling, gamma, max tokens", self.action_settings)
        yield SystemCommand("System message", "This conversation's", self.action_system)
        yield SystemCommand("Models", "Another ensemble for this conversation", self.action_models)
        yield SystemCommand("Toggle token colours", "Colour reply tokens by where they came from", self.action_toggle_colours)
        yield SystemCommand("Export", "Markdown and JSON, to a folder you choose", self.action_export)


def remembered(settings: Settings, prefs: Prefs) -> Settings:
    """`settings` with the settings form's remembered values over the defaults (never over what
    the command line gave); a remembered value that no longer parses is left out."""
    values = {name: value for name, value in prefs.settings.items() if name in FORM and name not in settings.given}
    try:
        return settings.with_values(values)
    except LocalcosError:
        return settings


def model_choices() -> list[tuple[str, dict]]:
    """What F4 offers: the presets, then the models `localcos models list` finds (models.toml's
    that are fetched, and other tools' stores), each as the option values that load it."""
    from localcos.models.registry import Registry
    from localcos.models.stores import discover

    registry = Registry.load()
    out: list[tuple[str, dict]] = []
    for e in registry.ensembles.values():
        if all(registry.cached(m) for m in e.models if m in registry.models):
            out.append((f"preset {e.name}: {' + '.join(e.models)}", {"preset": e.name}))
    for m in registry.models.values():
        if registry.cached(m.name):
            out.append((f"{m.name}  ({m.description or m.where})", {"models": m.name}))
    found, _ = discover()
    out += [(f"{f.name}  ({f.store})", {"models": f.name}) for f in found]
    return out


def run_chat(settings: Settings, *, open_id: int | None = None, store: ConversationStore | None = None, prefs: Prefs | None = None) -> int:
    """Entry point of `localcos chat`: run the app until the user quits; 1 where the models never
    loaded."""
    app = ChatApp(settings, store=store, open_id=open_id, prefs=prefs)
    app.run()
    if app.ensemble is not None:
        app.ensemble.close()
    if store is not None:
        store.close()
    return 0 if app.ensemble is not None or app.load_error is None else 1
