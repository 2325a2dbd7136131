"""The chi-square helper every sampling test rests on: pooling, impossible tokens, power."""

from collections import Counter

import numpy as np
import pytest
from scipy import stats

from statcheck import chi_square


def test_chi_square_agrees_with_scipy_when_nothing_is_pooled():
    obs = Counter({0: 480, 1: 310, 2: 160, 3: 50})
    p = np.array([0.5, 0.3, 0.15, 0.05])
    stat, dof, pvalue = chi_square(obs, p)
    ref = stats.chisquare([480, 310, 160, 50], p * 1000)
    assert dof == 3 and np.isclose(stat, ref.statistic) and np.isclose(pvalue, ref.pvalue)


def test_chi_square_accepts_a_fair_sample_and_rejects_a_biased_one():
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.3, 0.15, 0.05])
    fair = Counter(rng.choice(4, size=5000, p=p).tolist())
    assert chi_square(fair, p)[2] > 1e-3
    biased = Counter(rng.choice(4, size=5000, p=[0.45, 0.35, 0.15, 0.05]).tolist())
    assert chi_square(biased, p)[2] < 1e-6


def test_rare_tokens_are_pooled():
    # 200 draws: the four rare tokens (expected 0.5 each) form one bucket with the other
    p = np.array([0.5, 0.49, 0.0025, 0.0025, 0.0025, 0.0025])
    stat, dof, _ = chi_square(Counter({0: 100, 1: 98, 2: 1, 4: 1}), p)
    assert dof == 1  # two categories left: token 0, token 1 with the pooled rest
    assert stat == pytest.approx(0.0, abs=1e-12)  # 100 of 100 expected, and 98 + 2 of 100 (the rare ones counted in)


def test_chi_square_flags_impossible_tokens():
    assert chi_square(Counter({0: 10, 1: 1}), np.array([1.0, 0.0]))[2] == 0.0
