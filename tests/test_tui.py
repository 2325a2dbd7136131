"""The chat app, driven by Textual's pilot against synthetic models; and `localcos chat` itself,
run headless through the CLI with each of its options."""

from __future__ import annotations

import asyncio
import json

from textual import events

import pytest

from conftest import RpcServer
from localcos import cli
from localcos.backend import RemoteModel
from localcos.backend import llamacpp as backend_model
from localcos.ensemble import Ensemble
from localcos.errors import ModelFileError
from localcos.config import resolve
from localcos.tui.app import ChatApp
from localcos.tui.screens import ConversationsScreen, ModelsScreen, SettingsScreen, TextScreen
from localcos.tui.widgets import Legend, MessageView, StatsPanel


def chat_settings(paths, **values):
    return resolve({"models": [str(p) for p in paths], "ctx": 2048, **values}, json=True)


async def until(pilot, condition, timeout=60.0):
    """Let the app run until `condition()` holds."""
    for _ in range(int(timeout / 0.05)):
        if condition():
            return
        await pilot.pause(0.05)
    raise AssertionError("timed out waiting for the app")


async def send(pilot, app, text):
    app.query_one("#prompt").value = text
    await pilot.press("enter")


def replies(app):
    return [v for v in app.query(MessageView) if v.role == "assistant"]


@pytest.fixture
def chat_paths(models):
    return [models["chat"], models["chat_sibling"]]


def test_message_streams_and_completes_with_stats(chat_paths, tmp_path):
    async def scenario():
        # a fixed gamma: under auto, a machine whose measured call costs say drafts do not pay
        # (a busy one) drafts nothing, and no token would be coloured
        app = ChatApp(chat_settings(chat_paths, max_tokens=40, temperature=1.0, gamma=3), save_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            assert not app.query_one("#prompt").disabled
            await send(pilot, app, "Where does the river go?")
            await until(pilot, lambda: replies(app) and replies(app)[0].complete)
            view = replies(app)[0]
            assert view.finish_reason in ("length", "stop")
            assert view.text and view.text == app.conversation.messages[-1].content
            assert app.conversation.messages[-2].content == "Where does the river go?"
            stats = app.query_one(StatsPanel).stats
            assert stats.method == "cos" and stats.tokens > 0 and stats.tokens_per_second > 0
            assert stats.acceptance_rate is not None and stats.models[0].calls > 0
            panel = str(app.query_one(StatsPanel).render())
            assert "acceptance" in panel and f"{stats.tokens_per_second:.1f}" in panel
            # the colour of each token follows its origin
            assert any(span.style for span in view.tokens.spans)
            # a second turn reuses the conversation
            await send(pilot, app, "And then?")
            await until(pilot, lambda: len(replies(app)) == 2 and replies(app)[1].complete)
            assert [m.role for m in app.conversation.messages] == ["user", "assistant", "user", "assistant"]

    asyncio.run(scenario())


def test_colouring_toggles(chat_paths):
    async def scenario():
        # drafts at a fixed gamma, so that every round leaves a coloured token (draft, bonus or
        # resample); under auto, call costs measured on a busy machine may plan no draft at all
        app = ChatApp(chat_settings(chat_paths, max_tokens=12, temperature=1.0, ignore_eos=True, gamma=3))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            await send(pilot, app, "Hello")
            await until(pilot, lambda: replies(app) and replies(app)[0].complete)
            view = replies(app)[0]
            tokens, markdown = view.query_one(".tokens"), view.query_one("Markdown")
            assert markdown.display and not tokens.display  # rendered Markdown
            assert "off" in str(app.query_one(Legend).render())
            await pilot.press("ctrl+t")
            assert app.colouring is True
            assert tokens.display and not markdown.display  # coloured tokens
            assert any(span.style for span in view.tokens.spans)
            await pilot.press("ctrl+t")
            assert markdown.display and not app.colouring

    asyncio.run(scenario())


def test_a_replys_first_tokens_keep_their_colours_whenever_its_view_mounts():
    """Tokens may reach a reply's view between its compose and its Mount event (the first batch
    of a fast reply): mounting must not turn the coloured tokens into plain text. A kept reply's
    text is shown uncoloured."""
    from textual.app import App

    from localcos.core.decoding import Origin

    class One(App):
        def compose(self):
            yield MessageView("assistant", colouring=True)
            yield MessageView("assistant", "kept text", colouring=True)

    async def scenario():
        async with One().run_test() as pilot:
            streaming, kept = pilot.app.query(MessageView)
            await streaming.add_tokens([("a", Origin("draft", 0)), ("b", Origin("resample"))])
            streaming.on_mount()  # as when the Mount event comes after the tokens
            assert streaming.tokens.plain == "ab" and [span.style for span in streaming.tokens.spans] == ["green", "bold red"]
            assert kept.tokens.plain == "kept text" and not kept.tokens.spans and kept.complete

    asyncio.run(scenario())


def test_escape_stops_a_long_reply_and_keeps_it(chat_paths):
    # The reply must still be running when Escape arrives: the tiny models generate thousands of
    # tokens a second and may sample an end token at any moment, so this reply ignores them.
    async def scenario():
        app = ChatApp(chat_settings(chat_paths, ctx=8192, max_tokens=6000, temperature=1.0, ignore_eos=True))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            await send(pilot, app, "Tell me a long story")
            await until(pilot, lambda: replies(app) and replies(app)[0].n_tokens > 20)
            await pilot.press("escape")
            await until(pilot, lambda: replies(app)[0].complete)
            view = replies(app)[0]
            assert view.finish_reason == "cancelled"
            assert view.text and app.conversation.messages[-1].content == view.text
            assert app.query_one(StatsPanel).stats.tokens < 6000
            assert app.stream is None and not app.query_one("#prompt").disabled

    asyncio.run(scenario())


def test_settings_apply_to_the_next_reply(chat_paths):
    async def scenario():
        app = ChatApp(chat_settings(chat_paths, max_tokens=30))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            await pilot.press("f2")
            await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
            screen = app.screen
            screen.query_one("#method").value = "ensemble"
            screen.query_one("#max_tokens").value = "5"
            screen.query_one("#combine").value = "cd"
            screen.query_one("#mu").value = "0.3"
            screen.query_one("#top_k").value = "7"
            await pilot.click("#apply")
            await until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
            config = app.settings.generation
            assert (config.method, config.max_tokens, config.top_k) == ("ensemble", 5, 7)
            await send(pilot, app, "Hi")
            await until(pilot, lambda: replies(app) and replies(app)[0].complete)
            stats = app.query_one(StatsPanel).stats
            assert stats.method == "ensemble" and stats.tokens <= 5
            assert app.replies[-1]["stats"]["combiner"].startswith("cd(mu=0.3")
            assert app.replies[-1]["settings"]["generation"]["top_k"] == 7
            # invalid settings are refused with a notification and nothing changes
            await pilot.press("f2")
            await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
            app.screen.query_one("#temperature").value = "-2"
            await pilot.click("#apply")
            await pilot.pause(0.2)
            assert isinstance(app.screen, SettingsScreen)
            assert any("temperature" in n.message for n in app._notifications)
            await pilot.press("escape")
            assert app.settings.generation == config

    asyncio.run(scenario())


def test_transcript_saves(chat_paths, tmp_path):
    async def scenario():
        # ignore_eos: a sampled reply could end at once, and the saved statistics are to count its tokens
        app = ChatApp(chat_settings(chat_paths, max_tokens=10, system="Be brief.", ignore_eos=True), save_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            await send(pilot, app, "Hello river")
            await until(pilot, lambda: replies(app) and replies(app)[0].complete)
            await pilot.press("ctrl+s")
            await until(pilot, lambda: isinstance(app.screen, TextScreen))
            assert app.screen.query_one("#text-value").value == str(tmp_path)  # the folder, to change or take
            await pilot.press("enter")
            await until(pilot, lambda: list(tmp_path.glob("localcos-chat-*.json")))
        md = list(tmp_path.glob("localcos-chat-*.md"))
        js = list(tmp_path.glob("localcos-chat-*.json"))
        assert len(md) == 1 and len(js) == 1
        assert "Hello river" in md[0].read_text() and "Be brief." in md[0].read_text()
        data = json.loads(js[0].read_text())
        assert data["messages"][0] == {"role": "user", "content": "Hello river"}
        assert data["replies"][0]["stats"]["tokens"] > 0 and data["replies"][0]["settings"]["generation"]["max_tokens"] == 10

    asyncio.run(scenario())


def test_new_chat_and_context_overflow(chat_paths):
    async def scenario():
        app = ChatApp(chat_settings(chat_paths, ctx=96, max_tokens=24))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            for i in range(4):
                await send(pilot, app, f"Message number {i} about the river and the mill")
                await until(pilot, lambda n=i + 1: len(replies(app)) == n and replies(app)[-1].complete)
            notices = [v for v in app.query(MessageView) if v.role == "notice"]
            assert notices and "oldest" in notices[0].text
            assert app.conversation.messages[0].content != "Message number 0 about the river and the mill"
            await pilot.press("ctrl+n")
            await pilot.pause(0.1)
            assert app.conversation.messages == [] and not list(app.query(MessageView))

    asyncio.run(scenario())


def test_load_failure_is_a_notification_not_a_crash(chat_paths, tmp_path):
    def loader(progress):
        raise ModelFileError(f"model file not found: {tmp_path}/nope.gguf")

    async def scenario():
        app = ChatApp(chat_settings(chat_paths), loader=loader)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: any(v.role == "notice" for v in app.query(MessageView)))
            assert any("model file not found" in n.message for n in app._notifications)
            assert app.query_one("#prompt").disabled
            await send(pilot, app, "hello?")  # the prompt is disabled: nothing is sent
            await pilot.pause(0.1)
            assert not [v for v in app.query(MessageView) if v.role == "user"]
            await pilot.press("f1")  # still answering keys
            await until(pilot, lambda: type(app.screen).__name__ == "HelpScreen")

    asyncio.run(scenario())


# --- `localcos chat` through the CLI: every option takes effect --------------------------------------

COMBINER_FILE = """
import numpy as np

def geometric(probs):
    return np.sqrt(probs[0] * probs[1])
"""


def _chat_cases(tmp_path, rpc_server):
    """(command-line options, check(app, generation configs seen)) pairs."""
    custom = tmp_path / "combiner.py"
    custom.write_text(COMBINER_FILE)

    def hardware(app, configs):
        models = app.ensemble.models
        assert [m.n_ctx for m in models] == [512, 512]
        assert [m.n_batch for m in models] == [64, 64]
        assert [m.n_threads for m in models] == [1, 1]
        assert [m.n_gpu_layers for m in models] == [1, 2]
        assert {(m.main_gpu, m.split_mode, m.flash_attn) for m in models} == {(1, "none", "off")}
        assert backend_model._VERBOSE

    def sampling(app, configs):
        c = configs[-1]
        assert (c.temperature, c.top_k, c.top_p, c.min_p, c.seed) == (0.5, 5, 0.9, 0.05, 7)
        assert (c.max_tokens, c.stop, c.ignore_eos) == (9, ("zzz",), True)
        stats = app.query_one(StatsPanel).stats
        assert stats.seed == 7 and stats.tokens == 9

    def method(app, configs):
        stats = app.query_one(StatsPanel).stats
        assert (stats.method, stats.proposer, stats.gamma) == ("sd", 1, [2])

    def contrastive(app, configs):
        assert app.ensemble.combiner.describe() == "cd(mu=0.3,expert=0,alpha=0.2)"

    def custom_combiner(app, configs):
        combiner = app.ensemble.combiner
        assert (combiner.name, combiner.level) == ("geometric", "probs")

    def chat(app, configs):
        assert app.conversation.system == "Be terse."
        assert app.conversation.formatter.model is app.ensemble.models[1]

    def rpc(app, configs):
        here, there = app.ensemble.models
        assert not isinstance(here, RemoteModel) and isinstance(there, RemoteModel)
        assert (there.servers, there.timeout, there.n_gpu_layers) == (str(rpc_server), 7.0, -1)
        assert there.stats.calls > 0 and there.connected

    return [
        (["--ctx", "512", "--batch-size", "64", "--threads", "1", "--n-gpu-layers", "1,2", "--main-gpu", "1",
          "--split-mode", "none", "--flash-attn", "off", "--verbose"], hardware),
        (["--temperature", "0.5", "--top-k", "5", "--top-p", "0.9", "--min-p", "0.05", "--seed", "7",
          "--max-tokens", "9", "--stop", "zzz", "--ignore-eos"], sampling),
        (["--method", "sd", "--gamma", "2", "--proposer", "1"], method),
        (["--combine", "cd", "--mu", "0.3", "--plausibility", "0.2", "--expert", "0"], contrastive),
        (["--combine", f"{custom}:geometric", "--combine-level", "probs"], custom_combiner),
        (["--system", "Be terse.", "--chat-template-model", "1"], chat),
        (["--rpc", f"-,{rpc_server}", "--rpc-timeout", "7"], rpc),
    ]


@pytest.mark.slow
def test_every_chat_option_reaches_the_ensemble_or_the_generation(chat_paths, tmp_path, monkeypatch, request):
    """`localcos chat` runs headless through the real command line (cli.main -> settings ->
    tui.run_chat -> ChatApp), one reply per case; each option must show in the loaded models or
    in the generation that ran."""
    configs = []
    stream = Ensemble.stream

    def recording_stream(self, prompt, *, config=None, **kw):
        configs.append(config)
        return stream(self, prompt, config=config, **kw)

    monkeypatch.setattr(Ensemble, "stream", recording_stream)
    monkeypatch.setattr(backend_model, "_VERBOSE", False)
    rpc_server = RpcServer()
    request.addfinalizer(rpc_server.kill)
    for argv, check in _chat_cases(tmp_path, rpc_server.endpoint):
        configs.clear()

        def run_headless(app, argv=argv, check=check):
            async def scenario():
                async with app.run_test(size=(120, 40)) as pilot:
                    await until(pilot, lambda: app.ensemble is not None or app._notifications)
                    assert app.ensemble is not None, [n.message for n in app._notifications]
                    await send(pilot, app, "Where does the river go?")
                    await until(pilot, lambda: replies(app) and replies(app)[0].complete)
                    check(app, configs)

            asyncio.run(scenario())

        monkeypatch.setattr(ChatApp, "run", run_headless)
        models = ",".join(str(p) for p in chat_paths)
        assert cli.main(["chat", "--models", models, *argv]) == 0, argv
        backend_model.set_verbose(False)


def test_chat_command_refuses_bad_options_in_one_line(chat_paths, capsys):
    models = ",".join(str(p) for p in chat_paths)
    for argv, fragment in (
        (["--demo", "--models", models], "--demo or --models"),
        (["--models", models, "--top-k", "-1"], "--top-k must be >= 0"),
        (["--models", models, "--gamma", "0"], "--gamma must be"),
        (["--models", models, "--weights", "1,2,3"], "got 3 weights for 2 models"),
        (["--models", models, "--proposer", "2"], "--proposer must be a model index"),
    ):
        assert cli.main(["chat", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("localcos: error:") and fragment in err[0], (argv, err)


# --- the chat as a daily tool: kept, pasted, rendered, retried ------------------------------------------


def test_a_pasted_block_is_sent_whole_and_earlier_messages_come_back_with_up(chat_paths):
    block = "Explain this code:\ndef add(a, b):\n    return a + b\nprint(add(1, 2))"

    async def scenario():
        app = ChatApp(chat_settings(chat_paths, max_tokens=4))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            prompt = app.query_one("#prompt")
            app.post_message(events.Paste(block))  # as a terminal delivers it: to the app, which hands it to the focused prompt
            await pilot.pause(0.1)
            assert prompt.value == block
            await pilot.press("enter")
            await until(pilot, lambda: replies(app) and replies(app)[0].complete)
            assert app.conversation.messages[0].content == block and prompt.value == ""
            await pilot.press("a", "ctrl+j", "b")  # Ctrl+J: a new line, not a send
            assert prompt.value == "a\nb" and len(app.conversation.messages) == 2
            prompt.value = ""
            await pilot.press("up")
            assert prompt.value == block

    asyncio.run(scenario())


def test_enter_in_a_settings_field_applies_the_form_and_sends_nothing(chat_paths):
    async def scenario():
        app = ChatApp(chat_settings(chat_paths, max_tokens=4))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            await pilot.press("f2")
            await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
            app.screen.query_one("#seed").focus()
            await pilot.press("4", "2", "4", "2", "enter")
            await until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
            await pilot.pause(0.2)
            assert app.settings.generation.seed == 4242
            assert not list(app.query(MessageView)) and app.conversation.messages == []

    asyncio.run(scenario())


def test_a_code_block_renders_while_the_reply_streams(chat_paths):
    from textual.widgets._markdown import MarkdownFence

    from localcos.core.decoding import Origin
    from localcos.tui.app import TokensArrived

    async def scenario():
        app = ChatApp(chat_settings(chat_paths, max_tokens=4))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            view = app.reply_view = app._add_message("assistant")
            await pilot.pause(0.05)
            pieces = ["Here:", "\n\n```", "python\n", "def add(a, b):\n", "    return a + b\n"]
            app.post_message(TokensArrived([(p, Origin("sample")) for p in pieces], 0.1))
            await until(pilot, lambda: list(view.query(MarkdownFence)))
            assert not view.complete and "return a + b" in view.query_one(MarkdownFence).code
            assert view.query_one("Markdown").display and not view.query_one(".tokens").display

    asyncio.run(scenario())


def test_the_side_panel_draws_every_row_and_a_new_chat_empties_it(chat_paths, models):
    async def scenario(paths, several):
        app = ChatApp(chat_settings(paths, max_tokens=8))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            prompt = app.query_one("#prompt")
            assert ("ensemble" in prompt.placeholder) == several and ("t-chat" in prompt.placeholder) != several
            await send(pilot, app, "Hello")
            await until(pilot, lambda: replies(app) and replies(app)[0].complete)
            await pilot.pause(0.2)
            for widget in (app.query_one(StatsPanel), app.query_one(Legend)):
                lines = widget.render().plain.rstrip("\n").split("\n")
                assert widget.size.height >= len(lines), (type(widget).__name__, widget.size.height, lines)
            legend = app.query_one(Legend).render().plain
            assert ("draft of" in legend) == several and "sampled" in legend
            assert "calls per model" in app.query_one(StatsPanel).render().plain
            await pilot.press("ctrl+n")
            await pilot.pause(0.1)
            panel = app.query_one(StatsPanel)
            assert panel.stats is None and panel.context == "-"

    asyncio.run(scenario(chat_paths, True))
    asyncio.run(scenario(chat_paths[:1], False))


def test_conversations_are_kept_reopened_renamed_deleted_and_switched(chat_paths, tmp_path):
    from localcos.conversations import ConversationStore

    store_path = tmp_path / "kept.sqlite"

    async def first():
        app = ChatApp(chat_settings(chat_paths, max_tokens=6), store=ConversationStore(store_path))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            for text in ("Where does the river go?", "And the mill?"):
                await send(pilot, app, text)
                await until(pilot, lambda t=text: replies(app) and replies(app)[-1].complete and app.conversation.messages[-2].content == t)
            await pilot.press("ctrl+n")  # a second conversation; the first stays kept
            await send(pilot, app, "Another topic")
            await until(pilot, lambda: len(replies(app)) == 1 and replies(app)[0].complete)
        return [(m.role, m.content) for m in app.conversation.messages]

    asyncio.run(first())  # ... and quit
    store = ConversationStore(store_path)
    kept = store.conversations()
    assert [k.title for k in kept] == ["Another topic", "Where does the river go?"] and [k.count for k in kept] == [2, 4]
    earlier = kept[1]
    assert store.get(earlier.id).turns[1].stats["tokens"] > 0 and earlier.models == [str(p) for p in chat_paths]

    async def reopened():
        app = ChatApp(chat_settings(chat_paths, max_tokens=6), store=ConversationStore(store_path), open_id=earlier.id)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: len(list(app.query(MessageView))) == 4)
            assert [m.content for m in app.conversation.messages][::2] == ["Where does the river go?", "And the mill?"]
            await send(pilot, app, "Go on")  # goes on with the kept conversation
            await until(pilot, lambda: len(replies(app)) == 3 and replies(app)[-1].complete)
            # Ctrl+O: the list; r renames, Enter on the other one switches to it
            await pilot.press("ctrl+o")
            await until(pilot, lambda: isinstance(app.screen, ConversationsScreen))
            await pilot.press("down")  # the other conversation (the latest first: this one, just updated)
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, TextScreen))
            app.screen.query_one("#text-value").value = "Topics"
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, ConversationsScreen))
            await pilot.press("enter")
            await until(pilot, lambda: not isinstance(app.screen, ConversationsScreen))
            await until(pilot, lambda: [m.content for m in app.conversation.messages][:1] == ["Another topic"])
            assert app.sub_title == "Topics"
            await pilot.press("ctrl+o")
            await until(pilot, lambda: isinstance(app.screen, ConversationsScreen))
            app.screen.query_one("#search").value = "mill"  # search: titles and messages
            await pilot.pause(0.1)
            assert app.screen.query_one("#conversation-list").option_count == 1
            app.screen.query_one("#conversation-list").focus()
            await pilot.press("d")  # delete the one found (not the one on screen)
            await pilot.press("escape")

    asyncio.run(reopened())
    assert [k.title for k in ConversationStore(store_path).conversations()] == ["Topics"]


def test_regenerate_and_edit_the_last_message(chat_paths, tmp_path):
    from localcos.conversations import ConversationStore

    async def scenario():
        store = ConversationStore(tmp_path / "kept.sqlite")
        app = ChatApp(chat_settings(chat_paths, max_tokens=8, temperature=1.0), store=store)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            await send(pilot, app, "Tell me about the river")
            await until(pilot, lambda: replies(app) and replies(app)[0].complete)
            first = replies(app)[0].text
            await pilot.press("ctrl+r")
            await until(pilot, lambda: len(replies(app)) == 1 and replies(app)[0].complete and replies(app)[0] is not None and app.stream is None
                        and len(app.replies) == 2)  # fmt: skip
            assert [m.role for m in app.conversation.messages] == ["user", "assistant"]
            assert app.conversation.messages[1].content == replies(app)[0].text and len(store.get(app.kept_id).turns) == 2
            assert first is not None  # (a sampled reply: it may or may not differ)
            await pilot.press("ctrl+l")
            await pilot.pause(0.1)
            assert app.query_one("#prompt").value == "Tell me about the river" and app.conversation.messages == []
            assert store.get(app.kept_id).turns == [] and not list(app.query(MessageView))
            app.query_one("#prompt").value = "Tell me about the mill"
            await pilot.press("enter")
            await until(pilot, lambda: replies(app) and replies(app)[0].complete)
            assert [t.content for t in store.get(app.kept_id).turns][:1] == ["Tell me about the mill"]

    asyncio.run(scenario())


def test_other_models_load_for_the_conversation_and_keep_it(chat_paths, models):
    async def scenario():
        app = ChatApp(chat_settings(chat_paths, max_tokens=6))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            await send(pilot, app, "Hello")
            await until(pilot, lambda: replies(app) and replies(app)[0].complete)
            old = app.ensemble
            await pilot.press("f4")
            await until(pilot, lambda: isinstance(app.screen, ModelsScreen))
            app.screen.query_one("#model-refs").value = str(chat_paths[1])
            app.screen.query_one("#model-refs").focus()
            await pilot.press("enter")
            await until(pilot, lambda: app.ensemble is not None and app.ensemble is not old and not app.query_one("#prompt").disabled)
            assert app.ensemble.names == ["t-chat2"] and [m.content for m in app.conversation.messages][0] == "Hello"
            await send(pilot, app, "And now?")
            await until(pilot, lambda: len(replies(app)) == 2 and replies(app)[1].complete)
            assert app.query_one(StatsPanel).stats.names == [chat_paths[1].name] and len(app.conversation.messages) == 4

    asyncio.run(scenario())


def test_settings_theme_and_view_are_remembered(chat_paths, tmp_path):
    from localcos.tui.prefs import Prefs

    path = tmp_path / "chat.json"

    async def first():
        app = ChatApp(chat_settings(chat_paths, max_tokens=6), prefs=Prefs.load(path))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            await pilot.press("f2")
            await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
            app.screen.query_one("#top_k").value = "7"
            await pilot.click("#apply")
            await until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
            app.theme = "nord"
            await pilot.press("ctrl+t")

    asyncio.run(first())

    async def again():
        app = ChatApp(chat_settings(chat_paths, max_tokens=6), prefs=Prefs.load(path))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            assert app.settings.generation.top_k == 7 and app.theme == "nord" and app.colouring
        given = ChatApp(chat_settings(chat_paths, top_k=3), prefs=Prefs.load(path))  # the command line wins
        assert given.settings.generation.top_k == 3

    asyncio.run(again())


def test_chat_continue_and_list_and_a_failed_load_exits_non_zero(chat_paths, models, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LOCALCOS_DATA", str(tmp_path))
    seen = []

    def headless(self, *args, **kwargs):
        async def scenario():
            async with self.run_test(size=(120, 40)) as pilot:
                await until(pilot, lambda: self.ensemble is not None or self.load_error is not None)
                if self.ensemble is not None and not self.conversation.messages:
                    await until(pilot, lambda: self.conversation.messages or self._open_on_load is None)
                    if not self.conversation.messages:
                        await send(pilot, self, "Keep this")
                        await until(pilot, lambda: replies(self) and replies(self)[0].complete)
                seen.append([m.content for m in self.conversation.messages] if self.conversation else None)

        asyncio.run(scenario())

    monkeypatch.setattr(ChatApp, "run", headless)
    paths = ",".join(str(p) for p in chat_paths)
    assert cli.main(["chat", "--models", paths, "--max-tokens", "4"]) == 0
    assert cli.main(["chat", "--continue"]) == 0  # with the conversation's own models
    assert seen[1][0] == "Keep this" and len(seen[1]) == 2
    capsys.readouterr()
    assert cli.main(["chat", "--list"]) == 0
    out = capsys.readouterr().out
    assert "Keep this" in out and chat_paths[0].name in out
    # a model without a chat template: the load fails in the app, and the command says so
    assert cli.main(["chat", "--models", str(models["base"])]) == 1


def test_a_demo_conversation_is_held_with_the_demo_pair_and_reopens_with_it():
    """--demo's conversation is kept with the synthetic set it ran (not the paths of its written
    files), so `chat --continue` resolves the demo pair again."""
    import argparse

    from localcos.cli.chat import settings_for
    from localcos.tui.app import conversation_settings

    demo = settings_for(argparse.Namespace(demo=True, models=None, preset=None))
    held = conversation_settings(demo)
    assert held.get("synthetic") == "demo" and "models" not in held
    again = settings_for(argparse.Namespace(demo=False, models=None, preset=None), held)
    assert again.name == demo.name and again.load.labels == demo.load.labels


def test_the_models_load_and_decode_on_one_thread_of_their_own(chat_paths, tmp_path, monkeypatch):
    """llama.cpp's CPU threads belong to the thread that first computes (decoding on another ran
    a fifth slower per token): the chat loads the models and decodes every reply on one thread,
    not the UI's, whichever worker asked."""
    import threading

    from localcos.backend.model import Model

    seen: list[tuple[str, threading.Thread]] = []
    init, decode = Model.__init__, Model.decode

    def loading(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(("load", threading.current_thread()))
        init(self, *args, **kwargs)

    def decoding(self, parts):  # type: ignore[no-untyped-def]
        seen.append(("decode", threading.current_thread()))
        return decode(self, parts)

    monkeypatch.setattr(Model, "__init__", loading)
    monkeypatch.setattr(Model, "decode", decoding)

    async def scenario():
        app = ChatApp(chat_settings(chat_paths, max_tokens=8), save_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            for n, text in enumerate(("Where does the river go?", "And then?"), 1):
                await send(pilot, app, text)
                await until(pilot, lambda n=n: len(replies(app)) == n and replies(app)[-1].complete)

    asyncio.run(scenario())
    assert {kind for kind, _ in seen} == {"load", "decode"}
    assert len({thread for _, thread in seen}) == 1 and seen[0][1] is not threading.main_thread()
