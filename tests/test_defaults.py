"""One set of defaults for every front end, from one place (`config.levels.default_method`, the
options' defaults): the method is cos for two or more models, and --gamma auto plans its drafts,
on the command line, in `Ensemble`, `ByteEnsemble`, the server and presets that name no gamma;
a fixed gamma only where one is asked for. Read from the plans, not from timings."""

from __future__ import annotations

from dataclasses import replace

import pytest

from localcos import ByteEnsemble, Ensemble
from localcos.config import GenerationConfig, default_method, resolve
from localcos.config.specs import LoadSpec
from localcos.errors import ConfigError
from localcos.core.level import Level
from localcos.config.levels import decoding_level
from localcos.runtime.plan import plan
from test_server import serving


def test_the_defaults_come_from_one_place():
    assert default_method(2) == default_method(3) == "cos" and default_method(1) == "ensemble"
    config = GenerationConfig()
    assert config.method is None and config.gamma == "auto" and config.byte_gamma == "auto"
    assert config.for_models(2).method == "cos" and config.for_models(1).method == "ensemble"


def test_the_command_line_and_presets_resolve_cos_with_auto(models):
    pair = [str(models["base"]), str(models["sibling"])]
    settings = resolve({"models": pair})
    assert (settings.generation.method, settings.generation.gamma) == ("cos", "auto")
    assert resolve({"models": pair[:1]}).generation.method == "ensemble"
    fixed = resolve({"models": pair, "gamma": "3"})
    assert fixed.generation.gamma == 3
    preset = resolve({"preset": "coder-cd"}, json=True)  # names method cos and gamma auto
    assert (preset.generation.method, preset.generation.gamma) == ("cos", "auto")


def test_ensemble_plans_cos_with_auto_and_a_fixed_gamma_only_when_asked(models):
    with Ensemble.load([models["base"], models["sibling"]], n_ctx=256) as ens:
        default = plan(ens, "The river", GenerationConfig())
        assert default.config.method == "cos" and default.strategy.method == "cos" and default.strategy.auto
        fixed = plan(ens, "The river", GenerationConfig(gamma=3))
        assert not fixed.strategy.auto and fixed.strategy.gammas[fixed.strategy.proposer] == 3
        out = ens.generate("The river", max_tokens=8, seed=1)
        assert out.stats.method == "cos" and out.stats.gamma is None  # planned as it went


def test_byte_ensemble_plans_cos_with_byte_gamma_auto(real_models):
    with ByteEnsemble.load([real_models["qwen2"], real_models["llama3"]], n_ctx=256) as ens:
        assert ens.level is Level.BYTE
        planned = ens.plan("Hello", GenerationConfig())  # what generate plans with no settings
        assert planned.method == "cos" and planned.config.byte_gamma == "auto"
        assert ens.generate("Hello", max_tokens=8, seed=1).stats.method == "cos"
    # one model: the mixed level unless named; "auto" is decide_level's word (token for one model),
    # not this class's, so it is refused rather than read another way
    with ByteEnsemble.load([real_models["qwen2"]], n_ctx=256) as one:
        assert one.level is Level.MIXED
    with pytest.raises(ConfigError, match="byte or mixed"):
        ByteEnsemble.load([real_models["qwen2"]], level="auto")
    # the level is decided once, where the models are named, and travels as a Level
    spec = LoadSpec.make([real_models["qwen2"], real_models["llama3"]])
    assert spec.level is Level.BYTE and replace(spec, n_ctx=128).level is Level.BYTE
    assert LoadSpec.make([real_models["qwen2"], real_models["qwen2"]]).level is Level.TOKEN
    assert LoadSpec.make([real_models["qwen2"]], level="mixed").level is Level.MIXED


@pytest.mark.parametrize("level", ["token", "byte"])
def test_the_server_answers_with_cos_and_auto_by_default(models, real_models, level):
    pair = [models["base"], models["sibling"]] if level == "token" else [real_models["qwen2"], real_models["llama3"]]
    with serving(["--models", ",".join(map(str, pair)), "--ctx", "256", "--alias", "pair"]) as s:
        out = s.client().completions.create(model="pair", prompt="The river", max_tokens=8, seed=2)
        stats = out.model_extra["localcos"]
        assert stats["method"] == "cos" and stats.get("gamma") is None


def test_one_models_default_is_its_own_tokens_and_the_mixed_level_is_asked_for(models):
    """--level auto for one model: its own tokens (the token level), greedy or sampled: the
    mixed level added nothing over the model read as its makers run it (docs/evaluation.md);
    --level mixed of one model with gate 0.5 unless given, and not with a second prompt (its gate
    is the user's choice); several models as before."""
    one, two = [str(models["base"])], [str(models["base"]), str(models["sibling"])]

    def level(values):
        settings = resolve({"models": one, **values})
        return settings.load.level, settings.combine.gate

    for decoding in ({"temperature": 0}, {"temperature": 0, "top_k": 5}, {}, {"temperature": 0.7, "top_k": 40}, {"min_p": 0.1}):
        assert level(decoding) == (Level.TOKEN, None), decoding  # decided once, where the models are named
        assert decoding_level(resolve({"models": one, **decoding})) is Level.TOKEN, decoding
    assert level({"temperature": 0, "level": "mixed"}) == ("mixed", 0.5)
    assert level({"temperature": 0, "level": "mixed", "gate": 0.3}) == ("mixed", 0.3)
    with pytest.raises(ConfigError, match="--level mixed needs --gate G"):
        resolve({"models": one, "temperature": 0, "level": "mixed", "negative_prompt": "x"})
    with pytest.raises(ConfigError, match="--level mixed needs --gate G"):
        resolve({"models": two, "temperature": 0, "level": "mixed"})
    assert resolve({"models": two, "temperature": 0}).load.level is Level.TOKEN  # several models: by their tokenizers (one here)
    settings = resolve({"models": one, "temperature": 0, "level": "mixed"})
    assert settings.generation.method == "ensemble"  # the mixed level's step


def test_one_model_served_at_the_mixed_level_says_so_and_serves_the_rest_on_its_own_tokens(real_models):
    """`localcos serve` of one model with --level mixed --temperature 0: the mixed level (gate 0.5), named by
    /v1/models and by each answer's statistics; a request the mixed level does not serve (one
    that samples, or asks for log-probabilities) decodes at the token level on the same loaded
    model, the text `Ensemble` writes with the same seed, and says so; --level token serves its
    own tokens."""
    qwen = str(real_models["qwen2"])
    with Ensemble.load([qwen], n_ctx=256) as ens:
        sampled_here = ens.generate("The river", temperature=0.8, max_tokens=8, seed=5, ignore_eos=True).text
        greedy_here = ens.generate("The river", temperature=0, max_tokens=8, ignore_eos=True).text
    with serving(["--models", qwen, "--ctx", "256", "--alias", "m", "--temperature", "0", "--level", "mixed"]) as s:
        client = s.client()
        assert client.models.list().data[0].model_extra["localcos"]["level"] == "mixed"
        first = client.completions.create(model="m", prompt="The river", max_tokens=8)
        stats = first.model_extra["localcos"]
        assert stats["level"] == "mixed" and "gate(0.5" in stats["combiner"]
        sampled = client.completions.create(model="m", prompt="The river", max_tokens=8, temperature=0.8, seed=5, extra_body={"ignore_eos": True})
        assert sampled.model_extra["localcos"]["level"] == "token" and sampled.choices[0].text == sampled_here
        scored = client.completions.create(model="m", prompt="The river", max_tokens=8, logprobs=2, extra_body={"ignore_eos": True})
        assert scored.model_extra["localcos"]["level"] == "token" and scored.choices[0].text == greedy_here
        assert len(scored.choices[0].logprobs.tokens) == 8  # its own tokens, each with its log-probability
        chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, logprobs=True)
        assert chat.model_extra["localcos"]["level"] == "token" and len(chat.choices[0].logprobs.content) >= 1
        again = client.completions.create(model="m", prompt="The river", max_tokens=8)
        assert again.choices[0].text == first.choices[0].text and again.model_extra["localcos"]["level"] == "mixed"
    with serving(["--models", qwen, "--ctx", "256", "--alias", "m", "--temperature", "0"]) as s:  # the default: its own tokens
        client = s.client()
        assert client.models.list().data[0].model_extra["localcos"]["level"] == "token"
        assert client.completions.create(model="m", prompt="The river", max_tokens=8).model_extra["localcos"]["level"] == "token"


def test_the_chat_decides_each_replys_level_from_the_settings_it_is_sent_with(real_models):
    """`localcos chat` of one model with --level mixed: a greedy reply decodes at the mixed level; a
    reply sent after the settings turn to sampling decodes on the model's own tokens (the text
    `Ensemble` writes from the same conversation and seed), and says so in the stats panel; the
    next greedy reply is at the mixed level again."""
    import asyncio
    from dataclasses import replace

    from localcos.chat import ChatFormatter, Message
    from localcos.tui.app import ChatApp
    from localcos.tui.widgets import StatsPanel
    from test_tui import replies, send, until

    qwen = str(real_models["qwen2"])
    settings = resolve({"models": [qwen], "ctx": 256, "temperature": 0, "max_tokens": 6, "level": "mixed"}, json=True)
    app = ChatApp(settings)
    seen: list[tuple[str, str, str]] = []  # level, panel, text of each reply

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.ensemble is not None)
            for n, (question, temperature) in enumerate([("Hi", 0.0), ("And?", 0.8), ("So?", 0.0)], 1):
                app.settings = replace(app.settings, generation=replace(app.settings.generation, temperature=temperature, seed=5))
                await send(pilot, app, question)
                await until(pilot, lambda n=n: len(replies(app)) == n and replies(app)[-1].complete, timeout=120)
                stats = app.query_one(StatsPanel).stats
                seen.append((stats.level.value, app.query_one(StatsPanel).render().plain, replies(app)[-1].text))

    asyncio.run(scenario())
    assert [level for level, _, _ in seen] == ["mixed", "token", "mixed"]
    assert "chars/s" in seen[0][1] and "tokens/s" in seen[1][1] and "token" in seen[1][1]
    conversation = [Message("user", "Hi"), Message("assistant", seen[0][2]), Message("user", "And?")]
    with Ensemble.load([qwen], n_ctx=256) as ens:
        want = ens.generate(ChatFormatter(ens).tokens(conversation), temperature=0.8, seed=5, max_tokens=6).text
    assert seen[1][2] == want


def test_a_request_decodes_at_the_mixed_level_only_where_that_level_serves_it(models):
    """`request_level` on a one-model server loaded for the mixed level: greedy plain requests stay
    there; one that samples, needs tokens, or asks what the mixed level's rules refuse (a
    constraint, another method, lookahead) or the token level's drafts goes to the model's own
    tokens; without a token view nothing moves."""
    from localcos.config.levels import request_level

    def level(values, needs_tokens=False, token_view=True):
        generation = resolve({"models": [str(models["base"])], "level": "token", **values}, decoded=False).generation
        return request_level(Level.MIXED, generation, needs_tokens=needs_tokens, token_view=token_view)

    assert level({"temperature": 0}) is Level.MIXED and level({"temperature": 0, "top_k": 5}) is Level.MIXED
    assert level({"temperature": 0}, needs_tokens=True) is Level.TOKEN
    for token_only in ({"temperature": 0.8}, {"temperature": 0, "json_object": True}, {"temperature": 0, "method": "cos"},
                       {"temperature": 0, "lookahead": "3,4"}, {"temperature": 0, "gamma": "4"}, {"temperature": 0, "lookup": "on"}):  # fmt: skip
        assert level(token_only) is Level.TOKEN, token_only
    assert level({"temperature": 0.8}, token_view=False) is Level.MIXED
