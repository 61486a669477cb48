"""SinkhornBias (NCL sec. 3.4): marginals, eq. 13, plain vs log domain, blockwise ==
one-shot == functional.log_sinkhorn, streaming composition."""

import math

import numpy as np
import pytest
import torch

from xmodal.normalize import SinkhornBias


def _scores(k, n, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return np.tanh(rng.standard_normal((k, n))) * scale  # cosine-like, in (-scale, scale)


def plain_sinkhorn(s, gamma, iters, r=None, c=None):
    """Textbook Sinkhorn-Knopp in the exp domain with explicit loops (NCL eqs. 7-9):
    alpha_i = r_i / sum_j M_ij beta_j ; beta_j = c_j / sum_i alpha_i M_ij ; beta starts at 1."""
    k, n = s.shape
    r = [1 / k] * k if r is None else list(r / r.sum())
    c = [1 / n] * n if c is None else list(c / c.sum())
    m = [[math.exp(s[i, j] / gamma) for j in range(n)] for i in range(k)]
    beta = [1.0] * n
    for _ in range(iters):
        alpha = [r[i] / sum(m[i][j] * beta[j] for j in range(n)) for i in range(k)]
        beta = [c[j] / sum(alpha[i] * m[i][j] for i in range(k)) for j in range(n)]
    return np.array(alpha), np.array(beta)


def test_matches_plain_sinkhorn_where_it_does_not_overflow():
    s = _scores(30, 20, seed=1)
    counts = np.random.default_rng(2).integers(1, 6, 20).astype(float)
    alpha, beta = plain_sinkhorn(s, 0.1, 5, c=counts)
    sb = SinkhornBias(0.1, iters=5).fit_scores(torch.from_numpy(s), gallery_marginal=counts)
    np.testing.assert_allclose(sb.bias.numpy(), 0.1 * np.log(beta / beta.sum()), atol=1e-12)
    np.testing.assert_allclose(sb._log_alpha.numpy(), np.log(alpha), atol=1e-10)


def test_finite_at_gamma_0005_where_plain_sinkhorn_overflows():
    s = _scores(40, 25, seed=3, scale=4.0)  # exp(s / 0.005) up to exp(800): inf in float64
    with pytest.raises(OverflowError):
        plain_sinkhorn(s, 0.005, 2)
    for dtype in (torch.float32, torch.float64):
        sb = SinkhornBias(0.005, iters=50).fit_scores(torch.from_numpy(s).to(dtype))
        assert torch.isfinite(sb.bias).all() and sb.bias.dtype == dtype
        assert all(math.isfinite(e) for e in sb.history) and len(sb.history) == 50
        assert sb.history[-1] < sb.history[0]


def test_underflowing_columns_are_recomputed_exactly(monkeypatch):
    """At gamma = 0.005 the fused exp-buffer column sums underflow for items far from
    every row's best match; those columns must take the exact logsumexp path and the
    result must equal the dense log-domain reference."""
    log_sinkhorn = pytest.importorskip("xmodal.functional.sinkhorn").log_sinkhorn
    import xmodal.normalize.sinkhorn as mod
    calls = []
    real = mod._exact_column_lse
    monkeypatch.setattr(mod, "_exact_column_lse", lambda *a: calls.append(1) or real(*a))
    s = torch.from_numpy(_scores(40, 25, seed=3, scale=4.0))
    s[:, 1] = -4.0  # ~8 / 0.005 below every row's best: exp(-1600) underflows float64
    c = torch.arange(25, dtype=torch.float64) % 4  # includes zero-mass items
    sb = SinkhornBias(0.005, iters=8, block_size=6).fit_scores(s, gallery_marginal=c)
    la, lb, errors = log_sinkhorn(s, gamma=0.005, iters=8, col_marginal=c)
    assert calls, "the exact column path was not exercised"
    torch.testing.assert_close(sb._log_beta, lb, atol=1e-9, rtol=1e-12)
    torch.testing.assert_close(sb._log_alpha, la, atol=1e-9, rtol=1e-12)
    np.testing.assert_allclose(sb.history, errors, atol=1e-12)
    assert torch.isinf(sb.bias[c == 0]).all() and torch.isfinite(sb.bias[c > 0]).all()


@pytest.mark.parametrize("marginal", ["uniform", "counts"])
def test_marginals_within_1e5_after_convergence(marginal):
    k, n = 60, 24
    s = _scores(k, n, seed=4)
    c = None if marginal == "uniform" else np.random.default_rng(5).integers(1, 6, n).astype(float)
    sb = SinkhornBias(0.1, iters=200, block_size=16).fit_scores(s, gallery_marginal=c)
    target_c = np.full(n, 1 / n) if c is None else c / c.sum()
    la, lb = sb._log_alpha.double().numpy(), sb._log_beta.double().numpy()
    plan = np.array([[math.exp(la[i] + s[i, j] / 0.1 + lb[j]) for j in range(n)] for i in range(k)])
    assert np.abs(plan.sum(1) - 1 / k).max() < 1e-5
    assert np.abs(plan.sum(0) - target_c).max() < 1e-5
    assert sb.history[-1] < 1e-5
    assert sb.history[-1] == pytest.approx(max(np.abs(plan.sum(1) - 1 / k).max(),
                                               np.abs(plan.sum(0) - target_c).max()), abs=1e-7)


def test_eq13_retrieval_probabilities_sum_to_one_with_test_queries_as_bank():
    """NCL eq. 13: P(j | i) = softmax_j((S_ij + b_j) / gamma); with the bank equal to the
    test queries (K = N, uniform marginals) every item's total retrieval probability is 1."""
    n, gamma = 30, 0.1
    s = _scores(n, n, seed=6)
    sb = SinkhornBias(gamma, iters=300, oracle=True).fit_scores(s)
    assert sb.uses_test_queries
    adjusted = sb(s)
    probs = np.zeros((n, n))
    for i in range(n):
        z = sum(math.exp(adjusted[i, j] / gamma) for j in range(n))
        for j in range(n):
            probs[i, j] = math.exp(adjusted[i, j] / gamma) / z
    np.testing.assert_allclose(probs.sum(0), np.ones(n), atol=1e-5)
    # without the biases the totals are far from 1 (the test would otherwise be vacuous)
    assert np.abs(torch.softmax(torch.from_numpy(s) / gamma, 1).sum(0).numpy() - 1).max() > 0.1
    # K != N with a non-uniform gallery marginal: totals are K * c_j
    s2 = _scores(45, 15, seed=7)
    c = np.arange(1, 16, dtype=float)
    b = SinkhornBias(gamma, iters=400).fit_scores(s2, gallery_marginal=c).bias.numpy()
    totals = torch.softmax(torch.from_numpy((s2 + b) / gamma), 1).sum(0).numpy()
    np.testing.assert_allclose(totals, 45 * c / c.sum(), atol=1e-4)


def test_blockwise_equals_one_shot_and_functional_log_sinkhorn():
    log_sinkhorn = pytest.importorskip("xmodal.functional.sinkhorn").log_sinkhorn
    rng = np.random.default_rng(8)
    bank = torch.from_numpy(rng.standard_normal((70, 5)))
    gallery = torch.from_numpy(rng.standard_normal((33, 5)))
    s = bank @ gallery.T
    c = torch.from_numpy(rng.integers(1, 4, 33).astype(float))
    one = SinkhornBias(0.2, iters=6).fit(bank, gallery, gallery_marginal=c)
    blocks = SinkhornBias(0.2, iters=6, block_size=9).fit(bank, gallery, gallery_marginal=c)
    scores = SinkhornBias(0.2, iters=6, block_size=64).fit_scores(s.numpy(), gallery_marginal=c)
    la, lb, errors = log_sinkhorn(s, gamma=0.2, iters=6, col_marginal=c)
    for sb in (one, blocks, scores):
        torch.testing.assert_close(sb._log_beta, lb, atol=1e-10, rtol=0)
        torch.testing.assert_close(sb._log_alpha, la, atol=1e-10, rtol=0)
        np.testing.assert_allclose(sb.history, errors, atol=1e-12)
    assert len(SinkhornBias(0.2, iters=6, track_error=False).fit(bank, gallery).history) == 5


def test_fit_scores_reads_a_memmap_block_by_block(tmp_path):
    s = _scores(50, 12, seed=12).astype(np.float32)
    mm = np.lib.format.open_memmap(tmp_path / "s.npy", mode="w+", dtype=np.float32, shape=s.shape)
    mm[:] = s
    mm.flush()
    ro = np.load(tmp_path / "s.npy", mmap_mode="r")
    got = SinkhornBias(0.05, iters=4, block_size=8).fit_scores(ro).bias
    torch.testing.assert_close(got, SinkhornBias(0.05, iters=4).fit_scores(s).bias, atol=1e-6, rtol=0)


def test_call_adds_bias_without_mutation_and_round_trips():
    s = _scores(20, 10, seed=9).astype(np.float32)
    sim = _scores(4, 10, seed=10).astype(np.float32)
    before = sim.copy()
    sb = SinkhornBias(0.05, iters=4).fit_scores(s)
    out = sb(sim)
    np.testing.assert_allclose(out, sim + sb.bias.numpy()[None], rtol=1e-6)
    assert np.array_equal(sim, before) and out.dtype == np.float32
    again = SinkhornBias.from_state_dict(sb.state_dict())
    np.testing.assert_array_equal(again(sim), out)
    assert sb.streaming_kwargs()["bias"] is sb.bias


def test_bad_arguments():
    with pytest.raises(ValueError, match="iters"):
        SinkhornBias(0.05, iters=0)
    with pytest.raises(ValueError, match="temperature"):
        SinkhornBias(0)
    with pytest.raises(ValueError, match="gallery_marginal"):
        SinkhornBias(0.05).fit_scores(_scores(5, 4), gallery_marginal=np.ones(3))
    with pytest.raises(ValueError, match="gallery_marginal"):
        SinkhornBias(0.05).fit_scores(_scores(5, 4), gallery_marginal=-np.ones(4))
    with pytest.raises(ValueError, match="scores"):
        SinkhornBias(0.05).fit_scores(np.array([[np.inf, 0.0]]))
    with pytest.raises(ValueError, match="bias|fit"):
        SinkhornBias(0.05)(np.zeros((2, 2)))


def test_streaming_evaluator_with_bias_equals_dense():
    metrics = pytest.importorskip("xmodal.metrics")
    if not hasattr(metrics, "streaming_retrieval"):
        pytest.skip("xmodal.metrics.streaming_retrieval not available yet")
    rng = np.random.default_rng(11)
    queries, gallery = rng.standard_normal((50, 8)), rng.standard_normal((40, 8))
    positives = rng.integers(0, 40, 50)
    sb = SinkhornBias(0.1, iters=4).fit(rng.standard_normal((80, 8)), gallery)
    dense = metrics.retrieval(sb(queries @ gallery.T), positives)
    streamed = metrics.streaming_retrieval(queries, gallery, positives, block_size=7, **sb.streaming_kwargs())
    for key in dense:
        assert streamed[key] == pytest.approx(dense[key])
