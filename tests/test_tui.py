"""The chat app, driven by Textual's pilot against synthetic models."""

from __future__ import annotations

import asyncio
import json

import pytest

from localcos import Ensemble
from localcos.chat import ChatFormatter
from localcos.errors import ModelFileError
from tui.app import ChatApp
from tui.screens import ChatSettings, SettingsScreen
from tui.widgets import Legend, MessageView, StatsPanel


def loader_for(paths, n_ctx=2048):
    def loader(progress):
        ens = Ensemble.load(paths, n_ctx=n_ctx, progress=progress)
        return ens, ChatFormatter(ens)

    return loader


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
        app = ChatApp(loader_for(chat_paths), ChatSettings(max_tokens=40, temperature=1.0), save_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            assert not app.query_one("#prompt").disabled
            await send(pilot, app, "Where does the river go?")
            await until(pilot, lambda: replies(app) and replies(app)[0].complete)
            view = replies(app)[0]
            assert view.finish_reason in ("length", "stop")
            assert view.text and view.text == app.conversation.messages[-1].content
            assert app.conversation.messages[-2].content == "Where does the river go?"
            stats = app.last_stats
            assert stats["method"] == "cos" and stats["tokens"] > 0 and stats["tokens_per_second"] > 0
            assert stats["acceptance_rate"] is not None and stats["calls"][0][1] > 0
            panel = str(app.query_one(StatsPanel).render())
            assert "acceptance" in panel and "tokens/s" in panel
            # the colour of each token follows its origin
            assert any(span.style for span in view.tokens.spans)
            # a second turn reuses the conversation
            await send(pilot, app, "And then?")
            await until(pilot, lambda: len(replies(app)) == 2 and replies(app)[1].complete)
            assert [m.role for m in app.conversation.messages] == ["user", "assistant", "user", "assistant"]

    asyncio.run(scenario())


def test_colouring_toggles(chat_paths):
    async def scenario():
        app = ChatApp(loader_for(chat_paths), ChatSettings(max_tokens=12))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            await send(pilot, app, "Hello")
            await until(pilot, lambda: replies(app) and replies(app)[0].complete)
            view = replies(app)[0]
            tokens, markdown = view.query_one(".tokens"), view.query_one("Markdown")
            assert tokens.display and not markdown.display  # coloured tokens
            await pilot.press("ctrl+t")
            assert app.colouring is False
            assert markdown.display and not tokens.display  # plain Markdown
            assert "off" in str(app.query_one(Legend).render())
            await pilot.press("ctrl+t")
            assert tokens.display and app.colouring

    asyncio.run(scenario())


def test_escape_stops_a_long_reply_and_keeps_it(chat_paths):
    # The reply must still be running when Escape arrives: the tiny models generate thousands of
    # tokens a second and may sample an end token at any moment, so this reply ignores them.
    load = loader_for(chat_paths, n_ctx=8192)

    def endless_loader(progress):
        ens, formatter = load(progress)
        stream = ens.stream
        ens.stream = lambda *args, **settings: stream(*args, **{**settings, "ignore_eos": True})
        return ens, formatter

    async def scenario():
        app = ChatApp(endless_loader, ChatSettings(max_tokens=6000, temperature=1.0))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            await send(pilot, app, "Tell me a long story")
            await until(pilot, lambda: replies(app) and replies(app)[0].n_tokens > 20)
            await pilot.press("escape")
            await until(pilot, lambda: replies(app)[0].complete)
            view = replies(app)[0]
            assert view.finish_reason == "cancelled"
            assert view.text and app.conversation.messages[-1].content == view.text
            assert app.last_stats["tokens"] < 6000
            assert app.stream is None and not app.query_one("#prompt").disabled

    asyncio.run(scenario())


def test_settings_apply_to_the_next_reply(chat_paths):
    async def scenario():
        app = ChatApp(loader_for(chat_paths), ChatSettings(max_tokens=30))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            await pilot.press("f2")
            await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
            screen = app.screen
            screen.query_one("#method").value = "ensemble"
            screen.query_one("#max_tokens").value = "5"
            screen.query_one("#combine").value = "cd"
            screen.query_one("#mu").value = "0.3"
            await pilot.click("#apply")
            await until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
            assert app.settings.method == "ensemble" and app.settings.max_tokens == 5
            await send(pilot, app, "Hi")
            await until(pilot, lambda: replies(app) and replies(app)[0].complete)
            assert app.last_stats["method"] == "ensemble" and app.last_stats["tokens"] <= 5
            assert app.replies[-1]["stats"]["combiner"].startswith("cd(mu=0.3")
            # invalid settings are refused with a notification and nothing changes
            await pilot.press("f2")
            await until(pilot, lambda: isinstance(app.screen, SettingsScreen))
            app.screen.query_one("#temperature").value = "-2"
            await pilot.click("#apply")
            await pilot.pause(0.2)
            assert isinstance(app.screen, SettingsScreen)
            assert any("temperature" in n.message for n in app._notifications)
            await pilot.press("escape")
            assert app.settings.temperature == ChatSettings().temperature

    asyncio.run(scenario())


def test_transcript_saves(chat_paths, tmp_path):
    async def scenario():
        app = ChatApp(loader_for(chat_paths), ChatSettings(max_tokens=10), save_dir=tmp_path, system="Be brief.")
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            await send(pilot, app, "Hello river")
            await until(pilot, lambda: replies(app) and replies(app)[0].complete)
            await pilot.press("ctrl+s")
            await pilot.pause(0.1)
        md = list(tmp_path.glob("localcos-chat-*.md"))
        js = list(tmp_path.glob("localcos-chat-*.json"))
        assert len(md) == 1 and len(js) == 1
        assert "Hello river" in md[0].read_text() and "Be brief." in md[0].read_text()
        data = json.loads(js[0].read_text())
        assert data["messages"][0] == {"role": "user", "content": "Hello river"}
        assert data["replies"][0]["stats"]["tokens"] > 0 and data["replies"][0]["settings"]["max_tokens"] == 10

    asyncio.run(scenario())


def test_new_chat_and_context_overflow(chat_paths):
    async def scenario():
        app = ChatApp(loader_for(chat_paths, n_ctx=96), ChatSettings(max_tokens=24))
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


def test_load_failure_is_a_notification_not_a_crash(tmp_path):
    def loader(progress):
        raise ModelFileError(f"model file not found: {tmp_path}/nope.gguf")

    async def scenario():
        app = ChatApp(loader, ChatSettings())
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: any(v.role == "notice" for v in app.query(MessageView)))
            assert any("model file not found" in n.message for n in app._notifications)
            assert app.query_one("#prompt").disabled
            await send(pilot, app, "hello?")  # ignored, the app stays up
            assert app.is_running

    asyncio.run(scenario())
