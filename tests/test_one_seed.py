"""One seed, one text: a seeded generation depends on nothing that ran before in the process.

llama.cpp is not batch-invariant: a token's cells and rows round differently with the shape of the
call that computed them and with where the cache puts them (even on the F32 synthetic models a
prompt's last token evaluated alone differs from the same token in the prompt's batch). So a
generation that reused what an earlier one left in the cache could take another turn, and the
same seeded request gave another text after other requests. Each test here does other work
first (other prompts, other lengths, other methods) and compares with a fresh process: rows
bitwise in the backend, texts in every front end, on quantised synthetic models (Q4_0 / Q8_0, and
real tokenizers at the byte level).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from localcos import ByteEnsemble, Ensemble, WeightedEnsemble
from localcos.backend import Model
from localcos.backend.slot import prompt_calls
from test_server import serving

PROMPT = "The river runs past the old mill and"
OTHERS = [("Once upon a time", 31, 0.5, "ensemble"), ("A", 7, 1.0, "cos"), ("In the morning the market opens and the", 18, 0.0, "sd")]


def cli(paths, prompt: str, *args: str) -> dict:
    """`localcos generate --json` in a fresh process: its first completion."""
    proc = subprocess.run([sys.executable, "-m", "localcos", "generate", "--models", ",".join(map(str, paths)), "--prompt", prompt, "--json", *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["completions"][0]


def rows_from(slot, prompt: list[int], then: list[int]) -> np.ndarray:
    """The row after `prompt` begun fresh in `slot` (`Slot.start_prompt`), then one per token of
    `then` evaluated one at a time."""
    rows = [slot.start_prompt(prompt).copy()]
    for token in then:
        rows.append(slot.evaluate([token], 1)[0].copy())
    return np.stack(rows)


# --- the backend: a prompt begun after other work is computed bitwise as in a fresh process -------


def test_a_prompt_begun_after_other_work_gives_a_fresh_processs_rows_bitwise(models):
    tokens = [int(t) for t in np.random.default_rng(3).integers(3, 1000, 700)]
    prompt, then = tokens[:300], tokens[300:310]
    longer = prompt + tokens[400:460]  # shares the prompt's first call of 256 tokens, and more
    with Model(models["q4"], n_ctx=1024, n_seq=2) as m:
        want = rows_from(m.slots[0], prompt, then)
    with Model(models["q4"], n_ctx=1024, n_seq=2) as m:
        want_longer = rows_from(m.slots[1], longer, then)

    with Model(models["q4"], n_ctx=1024, n_seq=2) as m:
        # other work: another sequence, a prefix of the prompt, a few rows batched
        m.slots[1].evaluate(tokens[500:650], 1)
        m.slots[0].evaluate(prompt[:120], 1)
        m.slots[0].evaluate(tokens[200:205], 5)
        assert np.array_equal(rows_from(m.slots[0], prompt, then), want)  # evaluated afresh
        before = m.stats.snapshot()
        assert np.array_equal(rows_from(m.slots[0], prompt, then), want)  # the same prompt, put back
        assert m.stats.minus(before).tokens == len(then)  # no prompt token evaluated again
        before = m.stats.snapshot()
        assert np.array_equal(rows_from(m.slots[1], longer, then), want_longer)  # its first call put back
        assert m.stats.minus(before).tokens == len(longer) - m.prompt_chunk + len(then)
        # and the old way, sharing what the cache holds, is not the same: what this guards against
        m.slots[0].evaluate(then, 1)
        assert not np.array_equal(m.slots[0].prefill(longer), want_longer[0])


def test_only_a_prompt_evaluated_alone_is_kept(models):
    """A prompt whose calls another sequence shared (a scheduler interleaving them) is not what a
    fresh process computes: nothing is kept, and the next start evaluates it all."""
    prompt = list(range(5, 45))
    with Model(models["q4"], n_ctx=256, n_seq=2) as m:
        home, other = m.slots
        assert m.restore_prompt(home, prompt) is None and home.tokens == []
        for part, rows in prompt_calls(prompt, 0, m.prompt_chunk):
            row, _ = m.decode([(home, part, len(part) - rows, len(part)), (other, [7, 8], 2, 2)])
        m.keep_prompt(home, prompt, row[0])
        assert m.restore_prompt(home, prompt) is None and home.tokens == []  # not kept
        row = home.start_prompt(prompt)  # alone: kept
        assert np.array_equal(m.restore_prompt(other, prompt), row) and other.tokens == prompt and home.tokens == []


# --- the front ends: the same seeded request after other requests, as a fresh process ------------


@pytest.fixture(scope="module")
def quantised(models):
    return [models["q4"], models["q8"]]


def test_token_level_generate_stream_and_generate_many_after_other_requests_are_a_fresh_processs(quantised):
    sampled = dict(method="cos", gamma="auto", temperature=0.8, seed=5, max_tokens=24)
    greedy = dict(method="cos", gamma=3, temperature=0.0, max_tokens=24)
    common = ["--ctx", "512", "--max-tokens", "24", "--method", "cos"]
    want = cli(quantised, PROMPT, *common, "--gamma", "auto", "--temperature", "0.8", "--seed", "5")["text"]
    want_greedy = cli(quantised, PROMPT, *common, "--gamma", "3", "--temperature", "0")["text"]
    texts = []
    with Ensemble.load(quantised, WeightedEnsemble([0.5, 0.5]), n_ctx=512) as ens:
        for prompt, n, t, method in OTHERS:  # three rounds, each after another request
            ens.generate(prompt, max_tokens=n, temperature=t, method=method, seed=n)
            texts.append(ens.generate(PROMPT, **sampled).text)
            texts.append("".join(ens.stream(PROMPT, **sampled)))
            texts.append(ens.generate_many(PROMPT, 2, **sampled)[0].text)
            assert ens.generate(PROMPT, **greedy).text == want_greedy
    assert texts == [want] * len(texts)


@pytest.fixture(scope="module")
def tokenizers(real_models):
    """Two tokenizers (Qwen2's, Llama 3's): the byte level; the Qwen2 model in Q4_K_M."""
    return [real_models["qwen2_q4km"], real_models["llama3"]]


def test_byte_level_generate_stream_and_generate_many_after_other_requests_are_a_fresh_processs(tokenizers):
    pair = tokenizers
    want = cli(pair, PROMPT, "--ctx", "256", "--max-tokens", "32", "--temperature", "0.8", "--seed", "5")["text"]
    want_greedy = cli(pair, PROMPT, "--ctx", "256", "--max-tokens", "32", "--temperature", "0", "--method", "ensemble")["text"]
    texts, dropped = [], []  # the mass pruning dropped: a sum of the rows' probabilities, bit for bit
    with ByteEnsemble.load(pair, WeightedEnsemble([0.5, 0.5]), n_ctx=256) as ens:
        for prompt, n, t, _ in OTHERS:
            ens.generate(prompt, max_tokens=n, temperature=t, seed=n)
            out = ens.generate(PROMPT, max_tokens=32, temperature=0.8, seed=5)
            texts.append(out.text)
            dropped.append(out.stats.dropped_mass)
            stream = ens.stream(PROMPT, max_tokens=32, temperature=0.8, seed=5)
            texts.append("".join(stream))
            dropped.append(stream.completion.stats.dropped_mass)  # type: ignore[union-attr]
            texts.append(ens.generate_many(PROMPT, 2, max_tokens=32, temperature=0.8, seed=5)[0].text)
            assert ens.generate(PROMPT, max_tokens=32, temperature=0.0, method="ensemble").text == want_greedy
        # what a viewer shows as it arrives (the chat's `Chunk.pieces`) is the text, every piece
        # sampled: the byte level commits no tokens of one vocabulary
        shown = [piece for chunk in ens.stream(PROMPT, max_tokens=32, temperature=0.8, seed=5).chunks() for piece in chunk.pieces]
        assert "".join(piece.text for piece in shown) == want and {piece.origin.kind for piece in shown} == {"sample"}
    assert texts == [want] * len(texts)
    assert sum(dropped[0]) > 0 and dropped == [dropped[0]] * len(dropped)


@pytest.mark.parametrize("level", ["token", "byte"])
def test_the_server_answers_a_seeded_request_alike_with_other_requests_between(quantised, tokenizers, level):
    """`localcos serve`: the same seeded request, with requests of other lengths between, gives
    the text a fresh `localcos generate` gives every time."""
    pair = quantised if level == "token" else tokenizers
    want = cli(pair, PROMPT, "--ctx", "256", "--max-tokens", "32", "--temperature", "0.8", "--seed", "9")["text"]
    with serving(["--models", ",".join(map(str, pair)), "--ctx", "256", "--alias", "pair"]) as s:
        client = s.client()

        def ask(prompt: str, n: int, seed: int) -> str:
            return client.completions.create(model="pair", prompt=prompt, max_tokens=n, temperature=0.8, seed=seed).choices[0].text

        texts = []
        for prompt, n, _, _ in OTHERS:
            texts.append(ask(PROMPT, 32, 9))
            ask(prompt, n, n)
        assert texts == [want] * len(texts)
