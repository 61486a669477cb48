"""FAISS index with folded per-gallery biases == brute-force biased top-k."""

import sys

import numpy as np
import pytest
import torch

pytest.importorskip("faiss")

from xmodal.retrieval.index import BiasedIndex, fold_bias, import_faiss  # noqa: E402
from xmodal.normalize import DistributionNormalization, SinkhornBias  # noqa: E402


def brute_force(queries, gallery, bias, k):
    """Explicit loop: score every item, sort descending (float64)."""
    scores, indices = [], []
    for x in queries.astype(np.float64):
        s = [(float(x @ y) + float(b), j) for j, (y, b) in enumerate(zip(gallery.astype(np.float64), bias))]
        s.sort(key=lambda t: -t[0])
        scores.append([t[0] for t in s[:k]])
        indices.append([t[1] for t in s[:k]])
    return np.array(scores), np.array(indices)


def check_same_topk(got_s, got_i, ref_s, ref_i, all_scores, atol):
    np.testing.assert_allclose(got_s, ref_s, atol=atol)
    for row in range(ref_i.shape[0]):
        for col in range(ref_i.shape[1]):
            gap = np.abs(all_scores[row] - ref_s[row, col])
            if (gap < 10 * atol).sum() == 1:  # a distinct score: the item must match
                assert got_i[row, col] == ref_i[row, col]


def test_exact_index_with_integer_data_and_ties_equals_brute_force():
    rng = np.random.default_rng(0)
    gallery = rng.integers(-3, 4, (60, 5)).astype(np.float32)
    gallery[30:40] = gallery[:10]  # duplicated items: exact ties
    bias = rng.integers(-4, 5, 60).astype(np.float32) / 4
    queries = rng.integers(-3, 4, (25, 5)).astype(np.float32)
    scores, idx = BiasedIndex(gallery, bias).search(queries, k=7)
    ref_s, ref_i = brute_force(queries, gallery, bias, 7)
    check_same_topk(scores, idx, ref_s, ref_i, queries @ gallery.T + bias, atol=1e-6)
    np.testing.assert_array_equal(scores, ref_s)  # small integers: float32 is exact


@pytest.mark.parametrize("kind", ["flat", "ivf"])
def test_biased_topk_equals_brute_force_random(kind):
    rng = np.random.default_rng(1)
    gallery = rng.standard_normal((300, 16)).astype(np.float32)
    queries = torch.from_numpy(rng.standard_normal((40, 16)).astype(np.float32))
    bias = rng.standard_normal(300) * 0.5
    # IVF visiting every cell is exhaustive, hence exact as well
    index = BiasedIndex(gallery, bias, kind=kind, nlist=10, nprobe=10)
    scores, idx = index.search(queries, k=10)
    ref_s, ref_i = brute_force(queries.numpy(), gallery, bias, 10)
    check_same_topk(scores, idx, ref_s, ref_i, queries.numpy() @ gallery.T + bias, atol=1e-4)
    ts, ti = index.search_torch(queries, k=10)
    assert torch.is_tensor(ts) and ti.dtype == torch.int64


def test_folded_normaliser_biases_match_their_call():
    rng = np.random.default_rng(2)
    bank, gallery = rng.standard_normal((90, 12)), rng.standard_normal((50, 12))
    queries = rng.standard_normal((30, 12))
    sim = queries @ gallery.T
    for norm in (SinkhornBias(0.1, iters=4).fit(bank, gallery),
                 DistributionNormalization(num_samples=None).fit(bank, gallery)):
        adjusted = norm(sim)
        scores, idx = BiasedIndex(gallery, norm.bias).search(queries, k=5)
        ref_i = np.argsort(-adjusted, axis=1, kind="stable")[:, :5]
        np.testing.assert_allclose(scores, np.take_along_axis(adjusted, ref_i, 1), atol=1e-4)
        np.testing.assert_array_equal(idx[:, 0], ref_i[:, 0])


def test_fold_bias_and_errors(monkeypatch):
    q, g = fold_bias(np.ones((2, 3)), np.zeros((4, 3)), np.arange(4.0))
    assert q.shape == (2, 4) and (q[:, -1] == 1).all() and (g[:, -1] == np.arange(4)).all()
    with pytest.raises(ValueError, match="bias"):
        BiasedIndex(np.zeros((4, 3)), np.zeros(5))
    with pytest.raises(ValueError, match="kind"):
        BiasedIndex(np.zeros((4, 3)), kind="lsh")
    with pytest.raises(ValueError, match="queries"):
        BiasedIndex(np.zeros((4, 3))).search(np.zeros((1, 2)))
    monkeypatch.setitem(sys.modules, "faiss", None)
    with pytest.raises(ImportError, match=r"\[faiss\]"):
        import_faiss()
