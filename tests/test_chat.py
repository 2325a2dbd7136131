"""Chat prompts from the chat template stored in GGUF metadata."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from localcos import Ensemble
from localcos.chat import ChatFormatter, Message, render
from localcos.errors import ConfigError
from localcos.models.writer import CHAT_TEMPLATE

CONVERSATION = [Message("system", "Be brief."), Message("user", "Where does the river go?")]


def test_render_by_hand():
    text = render(CHAT_TEMPLATE, CONVERSATION, bos_token="<s>", eos_token="</s>")
    assert text == "<|system|>\nBe brief.\n<|user|>\nWhere does the river go?\n<|assistant|>\n"
    assert not render(CHAT_TEMPLATE, CONVERSATION, bos_token="", eos_token="", add_generation_prompt=False).endswith(
        "<|assistant|>\n"
    )


def test_template_errors_are_config_errors():
    with pytest.raises(ConfigError, match="refused"):
        render("{{ raise_exception('no system role') }}", CONVERSATION, bos_token="", eos_token="")
    with pytest.raises(ConfigError, match="cannot render"):
        render("{% for %}", CONVERSATION, bos_token="", eos_token="")


def test_formatter_uses_the_gguf_template_and_tokenises_once_for_all(models):
    with Ensemble.load([models["chat"], models["chat_sibling"]], n_ctx=256) as ens:
        fmt = ChatFormatter(ens, 0)
        assert fmt.template == CHAT_TEMPLATE
        assert fmt.note and "different chat templates" in fmt.note and "t-chat" in fmt.note
        tokens = fmt.tokens(CONVERSATION)
        assert tokens[0] == ens.models[0].bos
        assert tokens == ens.models[1].tokenize(fmt.text(CONVERSATION), special=True)
        assert ens.detokenize(tokens[1:]).lstrip(" ") == fmt.text(CONVERSATION)  # SentencePiece's space prefix
        other = ChatFormatter(ens, 1)
        assert other.text(CONVERSATION).startswith("[system]")
        out = ens.generate(tokens, method="cos", max_tokens=8, seed=0, ignore_eos=True)
        assert len(out.token_ids) == 8


def test_model_without_a_template(models):
    with Ensemble.load([models["base"]], n_ctx=64) as ens, pytest.raises(ConfigError, match="has no chat template"):
        ChatFormatter(ens)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localcos", *args], capture_output=True, text=True, timeout=300, env=os.environ.copy())


def test_generate_chat_cli(models):
    out = run(
        "generate", "--models", f"{models['chat']},{models['chat_sibling']}", "--chat", "--system", "Be brief.",
        "--prompt", "Where does the river go?", "--max-tokens", "6", "--seed", "1", "--json",
    )
    assert out.returncode == 0, out.stderr
    assert "different chat templates" in out.stderr
    with Ensemble.load([models["chat"], models["chat_sibling"]], n_ctx=256) as ens:
        expected = len(ChatFormatter(ens).tokens(CONVERSATION))
    assert json.loads(out.stdout)["stats"]["prompt_tokens"] == expected
    bad = run("generate", "--models", str(models["base"]), "--chat", "--prompt", "hi")
    assert bad.returncode == 2 and "has no chat template" in bad.stderr
    bad = run("generate", "--models", str(models["base"]), "--system", "x", "--prompt", "hi")
    assert bad.returncode == 2 and "--system needs --chat" in bad.stderr


def test_models_info_and_check_cli(models):
    info = run("models", "info", str(models["chat"]))
    assert info.returncode == 0 and "chat template   yes" in info.stdout
    ok = run("models", "check", f"{models['base']},{models['padded']}")
    assert ok.returncode == 0 and "compatible" in ok.stdout and "pad their vocabulary" in ok.stdout
    bad = run("models", "check", f"{models['base']},{models['other_tokenizer']}")
    assert bad.returncode == 1 and "not compatible" in bad.stdout and "token id" in bad.stdout
