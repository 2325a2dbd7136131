"""Bits per byte at the byte level (`scoring.bytescore`): exact on tiny tokenised fakes, and the
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
from localcos.scoring.bytescore import bits_per_byte, windows_of

PROMPT = (0, 1)


def fake_models(*models, lanes=1, **member_options):
    members = [[FakeMember(m, **member_options) for m in models] for _ in range(lanes)]
    return SimpleNamespace(
        members=members[0],
        lanes=lambda: members,
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
        "def add(a, b):\n    return a + b\n\nThe quick brown fox. Caf\u00e9 cr\u00e8me.\n"
    )  # code, prose and accented letters: what needs no length (every byte of it costs the exact scoring rows)
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
    members = [FakeMember(m) for m in models]
    return SimpleNamespace(
        members=members,
        lanes=lambda: [members],
        models=[SimpleNamespace(n_params=1, n_ctx=64, name=f"m{i}") for i, _ in enumerate(models)],
        prompts=lambda context: [PROMPT + (len(context),)] * len(models),
    )


def test_a_choice_scores_the_probability_of_its_bytes_after_the_context():
    """log p(choice | context) of each model is the brute-force prefix probability of its bytes
    after the context's tokens, and r's is the sum over its bytes of log r."""
    from localcos.scoring.bytescore import byte_choices
    from localcos.scoring.choices import ChoiceItem

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
    import localcos.scoring.bytescore as bytescore
    from localcos.runtime.bytelevel import RULED_OUT

    monkeypatch.setattr(bytescore, "combine_symbols", lambda combiner, dists, t: np.zeros(257))
    result = bits_per_byte(fake_models(VOCAB_A, VOCAB_B), "abaab", [WeightedEnsemble()], window=5)
    assert result.combined[0].total == pytest.approx(-math.log2(RULED_OUT) * result.combined[0].count)


def test_a_byte_the_held_paths_rule_out_is_scored_from_the_models_own_tokenisation():
    """One path per model and heavy pruning: the text goes where a model's held path cannot
    follow. Its paths are rebuilt from its own tokenisation of the text so far and the byte is
    scored there (as a generation goes on), not at the floor of a byte it rules out."""
    from localcos.runtime.bytelevel.scoring import walk_together

    models = fake_models(VOCAB_A, VOCAB_B, max_paths=1, prune=0.5)
    data = "abbabaabab\u00e9ba".encode()
    seen: list[list[float]] = []
    for member in models.members:
        member.start(PROMPT)
    walk_together([models.members], [data], lambda lane, j, dists: seen.append([float(d[data[j]]) for d in dists]), lambda lane, j: True)
    assert len(seen) == len(data) and sum(m.view.restarts for m in models.members) > 0
    assert all(p > 0 for probs in seen for p in probs)
    result = bits_per_byte(fake_models(VOCAB_A, VOCAB_B, max_paths=1, prune=0.5), data.decode(), [WeightedEnsemble()], window=len(data))
    assert sum(result.unreachable) > 0 and all(b.total < b.count * 29 for b in result.members)


def test_windows_scored_side_by_side_give_each_window_its_brute_force_figure():
    """Lanes advance a byte at a time together (`walk_together`): three windows in two lanes
    (a group of two, then one) each score what brute force gives for that window alone."""
    data = "abaabba\u00e9abbaababab\u00e9aabab".encode()
    window = 8
    spans = windows_of(data, window)
    assert len(spans) == 3
    result = bits_per_byte(fake_models(VOCAB_A, VOCAB_B, lanes=2), data.decode(), [WeightedEnsemble()], window=window)
    brutes = [BruteForce(VOCAB_A, PROMPT), BruteForce(VOCAB_B, PROMPT)]
    for brute, bits in zip(brutes, result.members):
        expected = 0.0
        for lo, hi in spans:
            piece, first = data[lo:hi], (hi - lo) // 2
            expected -= math.log2(brute.prefix(piece) / brute.prefix(piece[:first]))
        assert bits.total == pytest.approx(expected, abs=1e-9)
        assert bits.count == sum((hi - lo) - (hi - lo) // 2 for lo, hi in spans)


def test_lanes_score_a_text_as_one_window_at_a_time_does(model_dir, llama_vocab):
    """Two tokenizers (Qwen2 and Llama 3 vocabularies on synthetic F32 weights), a text of several
    windows: loaded with four lanes (windows side by side, their rows in shared calls) the figures
    are those of one window at a time. Not bit for bit: llama.cpp rounds rows of calls of other
    shapes differently (its cache is F16 whatever the weights), and where that reorders the
    heaviest tokenisations the cap keeps, a figure moves by what the one let go held; measured
    here a few millionths of the figure, so the bound is 1e-5 of it (a row given to the wrong lane or
    path moves it by whole bits)."""
    from dataclasses import replace

    from conftest import REAL_SPECS, cached_model
    from localcos.config.specs import LoadSpec
    from localcos.runtime.bytelevel import ByteModels

    text = ("def add(a, b):\n    return a + b\n\nclass Caf\u00e9:\n    pass\n" * 14)[:600]
    paths = []
    for name in ("qwen2", "llama3"):
        vocab, spec = REAL_SPECS[name]
        paths.append(cached_model(replace(spec, dtype="f32", name=f"{spec.name}-f32", tokenizer=str(llama_vocab(vocab))), model_dir))
    spec = LoadSpec.make(paths, n_ctx=160, byte_paths=6, byte_prune=0.0)
    results = []
    for lanes in (1, 4):
        with ByteModels.load(spec, WeightedEnsemble(), lanes=lanes) as models:
            assert len(models.lanes()) == lanes
            results.append(bits_per_byte(models, text, [WeightedEnsemble()], window=158))
    one, side_by_side = results
    assert one.windows == side_by_side.windows >= 3
    for a, b in zip(one.members + one.combined, side_by_side.members + side_by_side.combined):
        assert a.count == b.count
        assert b.per_byte == pytest.approx(a.per_byte, rel=1e-5)
