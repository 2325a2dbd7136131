"""The chi-square helper used by every sampling test is itself right."""

import math
from collections import Counter

import numpy as np

from statcheck import chi2_sf, chi_square


def test_chi2_sf_known_values():
    # reference values of the chi-square survival function
    assert abs(chi2_sf(3.841458820694124, 1) - 0.05) < 1e-9
    assert abs(chi2_sf(18.307038053275146, 10) - 0.05) < 1e-9
    assert abs(chi2_sf(2.0, 2) - np.exp(-1.0)) < 1e-12
    # even dof: closed form exp(-x/2) * sum_{i < dof/2} (x/2)^i / i!
    exact = np.exp(-50.0) * sum(50.0**i / math.factorial(i) for i in range(25))
    assert abs(chi2_sf(100.0, 50) - exact) < 1e-12


def test_chi_square_accepts_a_fair_sample_and_rejects_a_biased_one():
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.3, 0.15, 0.05])
    fair = Counter(rng.choice(4, size=5000, p=p).tolist())
    assert chi_square(fair, p)[2] > 1e-3
    biased = Counter(rng.choice(4, size=5000, p=[0.45, 0.35, 0.15, 0.05]).tolist())
    assert chi_square(biased, p)[2] < 1e-6


def test_chi_square_flags_impossible_tokens():
    assert chi_square(Counter({0: 10, 1: 1}), np.array([1.0, 0.0]))[2] == 0.0
