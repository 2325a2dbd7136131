"""Bits per byte at the byte level (`eval.bytescore`): exact on tiny tokenised fakes, and the
`score` command on a real pair of different tokenizers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from bytefakes import VOCAB_A, VOCAB_B, BruteForce, FakeMember
from localcos.core.combiners import WeightedEnsemble
from localcos.eval.bytescore import bits_per_byte, windows_of

PROMPT = (0, 1)


def fake_models(*models, **member_options):
    return SimpleNamespace(
        members=[FakeMember(m, **member_options) for m in models],
        models=[SimpleNamespace(n_params=1) for _ in models],
        document_starts=lambda: [PROMPT] * len(models),
    )


@pytest.mark.parametrize("text", ["abaab", "ba\u00e9ab"])
def test_bits_per_byte_equal_brute_force_prefix_probabilities(text):
    data = text.encode()
    result = bits_per_byte(fake_models(VOCAB_A, VOCAB_B), text, [WeightedEnsemble()], window=len(data))
    first = len(data) // 2  # the second half of the window is scored
    brutes = [BruteForce(VOCAB_A, PROMPT), BruteForce(VOCAB_B, PROMPT)]
    for brute, bits in zip(brutes, result.members):
        expected = -math.log2(brute.prefix(data) / brute.prefix(data[:first]))
        assert bits.count == len(data) - first
        assert bits.total == pytest.approx(expected, abs=1e-9)
    we = sum(-math.log2(0.5 * brutes[0].next_symbol(data[:j])[data[j]] + 0.5 * brutes[1].next_symbol(data[:j])[data[j]])
             for j in range(first, len(data)))  # fmt: skip
    assert result.combined[0].total == pytest.approx(we, rel=1e-6)  # the combiners compute in float32


def test_windows_cut_on_character_boundaries():
    data = ("ab\u00e9" * 10).encode()
    spans = windows_of(data, 7)
    assert spans[0][0] == 0 and all(b == c for (_, b), (c, _) in zip(spans, spans[1:]))
    for lo, hi in spans:
        data[lo:hi].decode("utf-8")  # whole characters
        assert hi - lo <= 7


def test_score_a_text_with_two_tokenizers_in_bits_per_byte(trained, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(
        "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
        "The quick brown fox jumps over the lazy dog. Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e.\n" * 3
    )
    out = tmp_path / "score.json"
    models = ",".join(str(trained(n)) for n in ("smollm2-135m", "coder-0.5b"))
    proc = subprocess.run([sys.executable, "-m", "localcos", "score", "--models", models, "--file", str(text), "--ctx", "256",
                           "--json", str(out)], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "bits per byte" in proc.stdout
    report = json.loads(out.read_text())
    assert report["level"] == "byte" and report["kind"] == "bits_per_byte"
    values = {row["kind"] + ":" + row["label"]: row["value"] for row in report["rows"]}
    alone = [v for k, v in values.items() if k.startswith("model:")]
    (we,) = [v for k, v in values.items() if k.startswith("r:")]
    assert len(alone) == 2 and all(0.05 < v < 4 for v in alone)  # trained models: well under 8 bits a byte
    # -log2 of an equal mixture is at most the mean of the two -log2s, byte by byte
    assert we <= np.mean(alone) + 1e-9
    # multiple choice at the byte level: each model reads the context in its own tokens
    items = tmp_path / "items.jsonl"
    easy = [("The capital of France is", [" Paris", " Madrid"], 0), ("2 + 2 =", [" 5", " 4"], 1),
            ("The opposite of hot is", [" banana", " cold"], 1), ("def add(a, b):\n    return", [" a + b", " a pineapple"], 0)]  # fmt: skip
    items.write_text("".join(json.dumps({"context": c, "choices": ch, "answer": a}) + "\n" for c, ch, a in easy))
    out = tmp_path / "choices.json"
    choices = subprocess.run([sys.executable, "-m", "localcos", "score", "--models", models, "--choices", str(items), "--json", str(out)],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert choices.returncode == 0, choices.stderr
    assert "at the byte level" in choices.stdout
    report = json.loads(out.read_text())
    assert report["kind"] == "choices" and report["level"] == "byte"
    accuracy = {row["kind"] + ":" + row["label"]: row["value"] for row in report["rows"]}
    assert all(v >= 0.75 for v in accuracy.values()) and [v for k, v in accuracy.items() if k.startswith("r:")] == [1.0], accuracy
    assert report["loglikelihoods"]["bytes"][0] == [len(" Paris"), len(" Madrid")]


def fake_choice_models(*models):
    return SimpleNamespace(
        members=[FakeMember(m) for m in models],
        models=[SimpleNamespace(n_params=1, n_ctx=64, name=f"m{i}") for i, _ in enumerate(models)],
        prompts=lambda context: [PROMPT + (len(context),)] * len(models),
    )


def test_a_choice_scores_the_probability_of_its_bytes_after_the_context():
    """log p(choice | context) of each model is the brute-force prefix probability of its bytes
    after the context's tokens, and r's is the sum over its bytes of log r."""
    from localcos.eval.bytescore import byte_choices
    from localcos.eval.choices import ChoiceItem

    items = [ChoiceItem("ctx", ("ab", "ba\u00e9", "aab"), 2)]
    scores = byte_choices(fake_choice_models(VOCAB_A, VOCAB_B), items, [WeightedEnsemble()])
    prompt = PROMPT + (3,)
    brutes = [BruteForce(VOCAB_A, prompt), BruteForce(VOCAB_B, prompt)]
    for k, choice in enumerate(items[0].choices):
        data = choice.encode()
        for brute, member in zip(brutes, scores.members):
            assert member[0][k] == pytest.approx(math.log(brute.prefix(data)), abs=1e-9)
        we = sum(math.log(0.5 * brutes[0].next_symbol(data[:j])[data[j]] + 0.5 * brutes[1].next_symbol(data[:j])[data[j]]) for j in range(len(data)))
        assert scores.combined[0][0][k] == pytest.approx(we, rel=1e-6)
        assert scores.tokens[0][k] == len(data)


def test_a_byte_r_gives_nothing_is_scored_at_the_floor_not_as_infinite(monkeypatch):
    """Pruned paths can rule a byte of the text out in every model (the combination then gives
    it 0): it is scored at RULED_OUT, as each model's own is, and the bits stay finite."""
    import localcos.eval.bytescore as bytescore
    from localcos.runtime.bytelevel import RULED_OUT

    monkeypatch.setattr(bytescore, "combine_symbols", lambda combiner, dists, t: np.zeros(257))
    result = bits_per_byte(fake_models(VOCAB_A, VOCAB_B), "abaab", [WeightedEnsemble()], window=5)
    assert result.combined[0].total == pytest.approx(-math.log2(RULED_OUT) * result.combined[0].count)


def test_a_byte_the_held_paths_rule_out_is_scored_from_the_models_own_tokenisation():
    """One path per model and heavy pruning: the text goes where a model's held path cannot
    follow. Its paths are rebuilt from its own tokenisation of the text so far and the byte is
    scored there (as a generation goes on), not at the floor of a byte it rules out."""
    from localcos.eval.bytescore import walk

    models = fake_models(VOCAB_A, VOCAB_B, max_paths=1, prune=0.5)
    data = "abbabaabab\u00e9ba".encode()
    seen: list[list[float]] = []
    for member in models.members:
        member.start(PROMPT)
    rebuilds = walk(models.members, data, lambda j, dists: seen.append([float(d[data[j]]) for d in dists]))
    assert len(seen) == len(data) and sum(rebuilds) > 0
    assert all(p > 0 for probs in seen for p in probs)
    result = bits_per_byte(fake_models(VOCAB_A, VOCAB_B, max_paths=1, prune=0.5), data.decode(), [WeightedEnsemble()], window=len(data))
    assert sum(result.unreachable) > 0 and all(b.total < b.count * 29 for b in result.members)
