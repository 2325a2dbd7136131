"""The verification kernel alone: emitted tokens follow r for any (r, q), edge cases included."""

from __future__ import annotations

import zlib
from collections import Counter

import numpy as np
import pytest

from localcos.core.verify import sample_residual, verify
from statcheck import assert_matches

V = 16


def emitted(r: np.ndarray, q: np.ndarray, n: int, rng: np.random.Generator) -> Counter:
    """Draw x ~ q, verify it against r, record the emitted token; n times."""
    counts: Counter = Counter()
    xs = rng.choice(len(q), size=n, p=q)
    r2, q2 = r[None, :], q[None, :]
    for x in xs:
        v = verify([int(x)], q2, r2, rng)
        counts[int(x) if v.accepted else v.resample] += 1
    return counts


def random_pair(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    r = rng.dirichlet(np.full(V, 0.5))
    q = rng.dirichlet(np.full(V, 0.5))
    return r, q


@pytest.mark.parametrize("pairs, draws, seed", [(60, 2000, 2024), (4, 30000, 4096)], ids=["many-pairs", "many-draws"])
def test_random_pairs_emit_r(pairs, draws, seed):
    """Random (r, q) pairs, 120k verifications either way: many pairs (shapes) with few draws
    each see a broken step; few pairs with many draws each see an acceptance or a residual off by
    a tenth (min(1, 1.1 r/q), max(0, r - 0.9 q)), which the end-to-end joint-law tests
    (tests/test_fake_decoding.py) move too little mass to see (the power of each:
    docs/development.md)."""
    rng = np.random.default_rng(seed)
    for k in range(pairs):
        r, q = random_pair(rng)
        assert_matches(emitted(r, q, draws, rng), r, f"pair {k}")


def edge_cases():
    rng = np.random.default_rng(7)
    r, q = random_pair(rng)
    one_hot = np.eye(V)
    q_zeros = q.copy()
    q_zeros[:5] = 0  # the proposer never proposes tokens r gives mass to
    q_zeros /= q_zeros.sum()
    r_zeros = r.copy()
    r_zeros[-5:] = 0  # r gives no mass to tokens the proposer likes
    r_zeros /= r_zeros.sum()
    nearly = r * (1 + 1e-12 * rng.standard_normal(V))
    nearly /= nearly.sum()
    half = np.zeros(V)
    half[:8] = 1 / 8
    other_half = np.zeros(V)
    other_half[8:] = 1 / 8
    return {
        "q zero where r > 0": (r, q_zeros),
        "r zero where q > 0": (r_zeros, q),
        "one-hot r": (one_hot[3], q),
        "one-hot q": (r, one_hot[5]),
        "one-hot both, equal": (one_hot[4], one_hot[4]),
        "one-hot both, different": (one_hot[4], one_hot[9]),
        "r equals q (Z = 0)": (r, r.copy()),
        "r nearly q (Z tiny)": (nearly, r),
        "disjoint supports": (half, other_half),
    }


@pytest.mark.parametrize("name", list(edge_cases()))
def test_edge_cases_emit_r(name):
    r, q = edge_cases()[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    counts = emitted(r, q, 4000, rng)
    assert_matches(counts, r, name)


def test_acceptance_rate_is_one_minus_tv():
    rng = np.random.default_rng(3)
    r, q = random_pair(rng)
    n = 20000
    xs = rng.choice(V, size=n, p=q)
    accepted = sum(verify([int(x)], q[None], r[None], rng).accepted for x in xs)
    alpha = np.minimum(r, q).sum()
    # binomial standard error; 5 sigma
    assert abs(accepted / n - alpha) < 5 * np.sqrt(alpha * (1 - alpha) / n)


def test_first_rejection_discards_the_rest():
    q = np.eye(V)[[1, 2, 3]]  # one-hot drafts: tokens 1, 2, 3
    r = np.eye(V)[[1, 7, 3]]  # r agrees at 0 and 2 but not at 1
    v = verify([1, 2, 3], q, r, np.random.default_rng(0))
    assert (v.accepted, v.resample) == (1, 7)
    v = verify([1, 2, 3], q, np.eye(V)[[1, 2, 3]], np.random.default_rng(0))
    assert (v.accepted, v.resample) == (3, None)
    assert verify([], q[:0], r[:0], np.random.default_rng(0)).accepted == 0


def test_multi_token_draft_is_exact_at_every_position():
    """Two-token drafts with independent position distributions: each emitted position follows
    its r (the second only when the first was accepted)."""
    rng = np.random.default_rng(11)
    (r1, q1), (r2, q2) = random_pair(rng), random_pair(rng)
    first, second = Counter(), Counter()
    q, r = np.stack([q1, q2]), np.stack([r1, r2])
    for _ in range(20000):
        x = [int(rng.choice(V, p=q1)), int(rng.choice(V, p=q2))]
        v = verify(x, q, r, rng)
        first[x[0] if v.accepted >= 1 else v.resample] += 1
        if v.accepted >= 1:
            second[x[1] if v.accepted == 2 else v.resample] += 1
    assert_matches(first, r1, "position 1")
    assert_matches(second, r2, "position 2")


def test_residual_never_divides_by_zero():
    r = np.full(V, 1 / V)
    assert 0 <= sample_residual(r, r.copy(), np.random.default_rng(0)) < V
