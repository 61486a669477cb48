"""normalization_error, modality_gap, hubness against explicit-loop references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from xmodal.metrics import hubness, k_occurrence, modality_gap, normalization_error


def loop_normalization_error(sim, temperature, target=None):
    q, g = sim.shape
    mass = [0.0] * g
    for i in range(q):
        row = [float(v) / temperature for v in sim[i]]
        top = max(row)
        z = sum(math.exp(v - top) for v in row)
        for j in range(g):
            mass[j] += math.exp(row[j] - top) / z
    tgt = [q / g] * g if target is None else [float(t) for t in target]
    return sum(abs(tgt[j] - mass[j]) for j in range(g)) / g


def loop_gap(a, b):
    def centroid(x):
        acc = [0.0] * x.shape[1]
        for row in x:
            norm = math.sqrt(sum(float(v) ** 2 for v in row))
            for d, v in enumerate(row):
                acc[d] += float(v) / norm / x.shape[0]
        return acc
    ca, cb = centroid(a), centroid(b)
    return math.sqrt(sum((u - v) ** 2 for u, v in zip(ca, cb)))


def loop_hubness(sim, k):
    q, g = sim.shape
    counts = [0] * g
    for i in range(q):
        for j in sorted(range(g), key=lambda j: -sim[i, j])[:k]:
            counts[j] += 1
    mean = sum(counts) / g
    m2 = sum((c - mean) ** 2 for c in counts) / g
    m3 = sum((c - mean) ** 3 for c in counts) / g
    return counts, (m3 / m2 ** 1.5 if m2 > 0 else 0.0)


@pytest.mark.parametrize("temperature", [0.05, 1.0])
def test_normalization_error_matches_loops(temperature):
    rng = np.random.default_rng(0)
    sim = rng.uniform(-1, 1, (13, 6)).astype(np.float32)
    assert normalization_error(sim, temperature) == pytest.approx(
        loop_normalization_error(sim, temperature), abs=1e-9)
    target = rng.integers(0, 5, 6).astype(np.float64)
    assert normalization_error(torch.from_numpy(sim), temperature, target) == pytest.approx(
        loop_normalization_error(sim, temperature, target), abs=1e-9)


def test_normalization_error_analytic():
    # constant scores: every query spreads its unit mass evenly -> each item gets Q/G
    assert normalization_error(np.zeros((8, 4)), 0.1) == pytest.approx(0.0, abs=1e-12)
    # one-hot identity at a tiny temperature: every item gets mass ~1 = Q/G -> error ~0
    assert normalization_error(np.eye(5) * 10, 0.01) == pytest.approx(0.0, abs=1e-9)
    # all queries pick item 0: masses (Q, 0, ..., 0) vs target Q/G each
    q, g = 6, 3
    sim = np.zeros((q, g))
    sim[:, 0] = 100.0
    want = (abs(q / g - q) + (g - 1) * (q / g)) / g
    assert normalization_error(sim, 0.01) == pytest.approx(want, abs=1e-9)


def test_normalization_error_errors():
    with pytest.raises(ValueError, match="temperature"):
        normalization_error(np.zeros((2, 2)), 0.0)
    with pytest.raises(ValueError, match="target"):
        normalization_error(np.zeros((2, 2)), 1.0, target=np.ones(3))
    with pytest.raises(ValueError, match="target"):
        normalization_error(np.zeros((2, 2)), 1.0, target=-np.ones(2))


def test_modality_gap_matches_loops_and_analytic():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((9, 5)) + 1.0
    b = rng.standard_normal((7, 5)).astype(np.float16)
    assert modality_gap(a, b) == pytest.approx(loop_gap(a, b.astype(np.float64)), abs=1e-9)
    assert modality_gap(a, a * 3.0) == pytest.approx(0.0, abs=1e-12)     # scale-free
    e = np.eye(3)
    assert modality_gap(e[:1], e[1:2]) == pytest.approx(math.sqrt(2))     # orthogonal units
    with pytest.raises(ValueError, match="b"):
        modality_gap(a, np.ones((3, 4)))


@pytest.mark.parametrize("k", [1, 3, 6])
def test_hubness_matches_loops(k):
    rng = np.random.default_rng(k)
    sim = rng.standard_normal((40, 6))
    sim[:, 2] += 1.0                                   # item 2 is a hub
    counts, skew = loop_hubness(sim, k)
    assert k_occurrence(sim, k).tolist() == counts
    assert hubness(sim, k) == pytest.approx(skew, abs=1e-9)


def test_hubness_edge_cases():
    assert hubness(np.eye(4), k=1) == 0.0              # every item once: no skew, not NaN
    with pytest.raises(ValueError, match="k"):
        hubness(np.zeros((3, 4)), k=5)
    with pytest.raises(TypeError, match="k"):
        hubness(np.zeros((3, 4)), k=1.5)
