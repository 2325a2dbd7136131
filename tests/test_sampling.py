"""The sampler: greedy, truncations by hand, and draws that follow their distribution."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localcos.errors import ConfigError
from localcos.core.sampling import Sampler, draw, softmax
from statcheck import assert_matches


def close(actual, desired):
    """Probabilities are float32: equal within float32 rounding."""
    np.testing.assert_allclose(actual, desired, rtol=1e-5, atol=1e-7)

P = np.array([0.05, 0.4, 0.1, 0.3, 0.15])


def test_greedy_is_one_hot_at_the_argmax_with_ties_to_the_lowest_id():
    s = Sampler(temperature=0)
    np.testing.assert_array_equal(s.finalize(P), [0, 1, 0, 0, 0])
    tie = np.array([0.1, 0.4, 0.1, 0.4])
    np.testing.assert_array_equal(s.finalize(tie), [0, 1, 0, 0])
    assert s.draw(s.finalize(tie), np.random.default_rng(0)) == 1


def test_top_k_by_hand():
    out = Sampler(top_k=2).finalize(P)
    close(out, np.array([0, 0.4, 0, 0.3, 0]) / 0.7)


def test_top_p_by_hand():
    # sorted: 0.4, 0.3, 0.15, 0.1, 0.05; mass 0.7 < 0.8 <= 0.85: keep three
    out = Sampler(top_p=0.8).finalize(P)
    close(out, np.array([0, 0.4, 0, 0.3, 0.15]) / 0.85)
    close(Sampler(top_p=0.4).finalize(P), [0, 1, 0, 0, 0])


def test_top_p_on_a_large_flat_vocabulary_grows_its_candidate_set():
    rng = np.random.default_rng(1)
    p = rng.random(20000)
    p /= p.sum()
    out = Sampler(top_p=0.5).finalize(p)
    order = np.argsort(-p)
    csum = np.cumsum(p[order])
    n_keep = int(np.searchsorted(csum, 0.5)) + 1
    assert np.count_nonzero(out) == n_keep
    assert set(np.flatnonzero(out)) == set(order[:n_keep].tolist())


def test_min_p_by_hand():
    # keep p >= 0.5 * 0.4 = 0.2
    close(Sampler(min_p=0.5).finalize(P), np.array([0, 0.4, 0, 0.3, 0]) / 0.7)


def test_finalize_is_vectorised_over_rows():
    rows = np.stack([P, P[::-1], np.full(5, 0.2)])
    s = Sampler(top_k=3, top_p=0.9, min_p=0.1)
    close(s.finalize(rows), np.stack([s.finalize(r) for r in rows]))


def test_softmax_temperature():
    logits = np.log(P)
    close(softmax(logits), P)
    close(softmax(logits, 0.5), P**2 / (P**2).sum())


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_k=-1), dict(top_p=0), dict(top_p=1.5), dict(min_p=2)])
def test_invalid_settings(bad):
    with pytest.raises(ConfigError):
        Sampler(**bad)


def test_draws_follow_the_distribution():
    # 20000 draws: the chi-square test detects a deviation of ~1.5% absolute in any bucket
    rng = np.random.default_rng(1234)
    s = Sampler()
    samples = [s.draw(P, rng) for _ in range(20000)]
    assert_matches(samples, P, "draws")


def test_truncated_draws_follow_the_truncated_distribution():
    rng = np.random.default_rng(99)
    logits = np.random.default_rng(5).normal(size=300) * 2
    s = Sampler(temperature=0.7, top_k=40, top_p=0.9, min_p=0.02)
    target = s.finalize(softmax(logits, 0.7))
    samples = [s.draw(target, rng) for _ in range(20000)]
    assert_matches(samples, target, "truncated draws")


def test_same_seed_same_draws():
    s = Sampler()
    a = [s.draw(P, np.random.default_rng(7)) for _ in range(5)]
    b = [s.draw(P, np.random.default_rng(7)) for _ in range(5)]
    assert a == b


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1), min_size=1, max_size=30), st.floats(0, 1, exclude_max=True))
def test_draw_never_returns_a_zero_probability_token(weights, u):
    p = np.array(weights)
    if p.sum() <= 0:
        return
    t = draw(p, u)
    assert 0 <= t < len(p) and p[t] > 0
