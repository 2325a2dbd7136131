"""Combination functions against hand-computed cases, and their validation."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from localcos.core.combiners import (
    Contrastive,
    CustomCombiner,
    LogitMix,
    WeightedEnsemble,
    load_custom,
    make_combiner,
    normalise_weights,
)
from localcos.errors import ConfigError


def close(actual, desired):
    """Probabilities are float32: equal within float32 rounding."""
    np.testing.assert_allclose(actual, desired, rtol=1e-5, atol=1e-7)


def softmax(x):
    e = np.exp(np.asarray(x, float) - np.max(x))
    return e / e.sum()


L1 = np.array([[math.log(1), math.log(2), math.log(7)]])  # p1 = (0.1, 0.2, 0.7)
L2 = np.array([[math.log(5), math.log(4), math.log(1)]])  # p2 = (0.5, 0.4, 0.1)


def test_weighted_ensemble_by_hand():
    we = WeightedEnsemble([1, 3]).bind(2, [1, 1])
    assert we.weights == (0.25, 0.75)
    r = we.combine([L1, L2], 1.0)
    close(r[0], [0.25 * 0.1 + 0.75 * 0.5, 0.25 * 0.2 + 0.75 * 0.4, 0.25 * 0.7 + 0.75 * 0.1])


def test_weighted_ensemble_temperature_applies_per_model():
    we = WeightedEnsemble().bind(2, [1, 1])
    r = we.combine([L1, L2], 0.5)
    expected = 0.5 * softmax(L1[0] / 0.5) + 0.5 * softmax(L2[0] / 0.5)
    close(r[0], expected)


def test_contrastive_by_hand():
    cd = Contrastive(mu=0.5).bind(2, [10, 100])  # model 1 is larger: the expert
    assert (cd.expert, cd.amateur) == (1, 0)
    r = cd.combine([L1, L2], 1.0)
    close(r[0], softmax(L2[0] - 0.5 * L1[0]))
    r_t = cd.combine([L1, L2], 2.0)
    close(r_t[0], softmax((L2[0] - 0.5 * L1[0]) / 2.0))


def test_contrastive_plausibility_masks_implausible_tokens():
    # expert p = (0.5, 0.4, 0.1); alpha = 0.3 keeps tokens with p >= 0.15: ids 0 and 1
    cd = Contrastive(mu=1.0, plausibility=0.3, expert=1).bind(2, [1, 1])
    r = cd.combine([L1, L2], 1.0)
    assert r[0, 2] == 0.0
    close(r[0, :2], softmax((L2[0] - L1[0])[:2]))


def test_contrastive_picks_the_larger_model_as_expert_by_default():
    assert Contrastive().bind(2, [500, 100]).expert == 0
    assert Contrastive().bind(2, [100, 500]).expert == 1
    assert Contrastive(expert=0).bind(2, [100, 500]).expert == 0


def test_logit_mix_by_hand():
    mix = LogitMix([0.25, 0.75]).bind(2, [1, 1])
    r = mix.combine([L1, L2], 1.0)
    close(r[0], softmax(0.25 * L1[0] + 0.75 * L2[0]))


def test_combiners_are_vectorised_over_positions():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(4, 50)), rng.normal(size=(4, 50))
    for comb in (WeightedEnsemble([0.3, 0.7]), Contrastive(0.2), LogitMix([1, 2])):
        bound = comb.bind(2, [1, 2])
        together = bound.combine([a, b], 0.8)
        one_by_one = np.concatenate([bound.combine([a[i : i + 1], b[i : i + 1]], 0.8) for i in range(4)])
        close(together, one_by_one)
        close(together.sum(axis=1), 1.0)


def test_custom_combiners_at_both_levels():
    logits_level = CustomCombiner(lambda ls: ls[1] - 0.5 * ls[0], level="logits")
    close(logits_level.combine([L1, L2], 1.0)[0], softmax(L2[0] - 0.5 * L1[0]))
    probs_level = CustomCombiner(lambda ps: np.sqrt(ps[0] * ps[1]), level="probs")
    geo = np.sqrt(softmax(L1[0]) * softmax(L2[0]))
    close(probs_level.combine([L1, L2], 1.0)[0], geo / geo.sum())


def test_custom_combiner_errors():
    with pytest.raises(ConfigError, match="shape"):
        CustomCombiner(lambda ls: ls[0][:, :2]).combine([L1, L2], 1.0)
    with pytest.raises(ConfigError, match="non-negative"):
        CustomCombiner(lambda ps: ps[0] - ps[1], level="probs").combine([L1, L2], 1.0)
    with pytest.raises(ConfigError, match="level"):
        CustomCombiner(lambda ls: ls[0], level="bogus")


def test_custom_combiner_from_a_file(tmp_path):
    f = tmp_path / "mine.py"
    f.write_text("def contrast(logits):\n    return logits[1] - 0.25 * logits[0]\n")
    comb = make_combiner(f"{f}:contrast")
    close(comb.combine([L1, L2], 1.0)[0], softmax(L2[0] - 0.25 * L1[0]))
    with pytest.raises(ConfigError, match="no function"):
        load_custom(f"{f}:missing")
    with pytest.raises(ConfigError, match="not found"):
        load_custom(f"{tmp_path}/nope.py:f")


@pytest.mark.parametrize(
    "weights, n, message",
    [
        ([0.5], 2, "got 1 weights for 2 models"),
        ([0.5, 0.5, 0.1], 2, "got 3 weights for 2 models"),
        ([1.0, -0.5], 2, "must be >= 0"),
        ([0.0, 0.0], 2, "positive sum"),
        ([float("nan"), 1.0], 2, "finite"),
    ],
)
def test_weight_validation(weights, n, message):
    with pytest.raises(ConfigError, match=message):
        normalise_weights(weights, n)
    with pytest.raises(ConfigError, match=message):
        WeightedEnsemble(weights).bind(n, [1] * n)


def test_contrastive_validation():
    with pytest.raises(ConfigError, match="mu must be >= 0"):
        Contrastive(mu=-0.1)
    with pytest.raises(ConfigError, match="exactly 2 models"):
        Contrastive().bind(3, [1, 2, 3])
    with pytest.raises(ConfigError, match="plausibility"):
        Contrastive(plausibility=1.5)
    with pytest.raises(ConfigError, match="does not apply to cd; it reads mu, plausibility, expert"):
        make_combiner("cd", weights=[1, 1])
    with pytest.raises(ConfigError, match="unknown combiner"):
        make_combiner("median")


# a combiner added through the registry only: every front end takes it by name
REGISTERS = (
    "import sys\n"
    "from localcos.core.combiners import CombinerKind, WeightedEnsemble, register\n"
    "register(CombinerKind('first', lambda: WeightedEnsemble([1.0, 0.0]), (), 'the first model alone'))\n"
    "from localcos.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.slow
def test_a_combiner_added_through_the_registry_works_in_generate_serve_and_presets(models, tmp_path):
    import json
    import subprocess
    import sys

    import httpx

    from localcos.testing.loopback import free_port

    pair = f"{models['base']},{models['sibling']}"
    common = ["--prompt", "The river runs", "--max-tokens", "8", "--temperature", "0", "--method", "ensemble", "--json"]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", REGISTERS, *args], capture_output=True, text=True, timeout=300)

    first = run("generate", "--models", pair, "--combine", "first", *common)
    assert first.returncode == 0, first.stderr
    alone = run("generate", "--models", pair, "--combine", "we", "--weights", "1,0", *common)
    text = json.loads(alone.stdout)["completions"][0]["text"]
    assert json.loads(first.stdout)["completions"][0]["text"] == text
    assert "first: the first model alone" in " ".join(run("generate", "--help").stdout.split())  # --help is made from the registry
    config = tmp_path / "models.toml"
    config.write_text(f'[ensembles.firsts]\nmodels = ["{models["base"]}", "{models["sibling"]}"]\ncombine = "first"\nmethod = "ensemble"\n')
    preset = run("generate", "--config", str(config), "--preset", "firsts", *common)
    assert preset.returncode == 0 and json.loads(preset.stdout)["completions"][0]["text"] == text, preset.stderr
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", REGISTERS, "serve", "--models", pair, "--port", str(port), "--alias", "p"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):  # bounded: until the server answers
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            import time

            time.sleep(0.2)
        body = {"model": "p", "prompt": "The river runs", "max_tokens": 8, "temperature": 0, "method": "ensemble", "combine": "first"}
        answer = httpx.post(url + "/v1/completions", json=body, timeout=120)
        assert answer.status_code == 200 and answer.json()["choices"][0]["text"] == text, answer.text
    finally:
        server.kill()
        server.wait()
    # without the registration it is unknown, in one line
    unknown = subprocess.run([sys.executable, "-m", "localcos", "generate", "--models", pair, "--combine", "first", *common],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert unknown.returncode == 2 and "--combine must be we, cd, logit-mix, cfg or FILE.py:FUNCTION" in unknown.stderr


def test_weights_given_to_a_combiner_that_reads_none_are_refused_in_the_words_the_user_gave_them(models):
    from localcos.config import resolve

    one = {"models": [str(models["base"])], "combine": "cfg", "weights": "1,1", "negative_prompt": "x"}
    for json, words in ((False, "--weights does not apply to cfg; use --cfg-scale"), (True, "weights does not apply to cfg; use cfg_scale")):
        with pytest.raises(ConfigError, match=re.escape(words)) as caught:
            resolve(one, json=json)
        assert caught.value.param == "weights"
