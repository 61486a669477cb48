"""log_sinkhorn against a plain (non-log) Sinkhorn-Knopp written from NCL eqs. 7-9."""

import math

import numpy as np
import pytest
import torch

from xmodal.functional.sinkhorn import log_sinkhorn, sinkhorn_plan


def plain_sinkhorn(scores, gamma, iters, r=None, c=None):
    """Textbook Sinkhorn on M = exp(S / gamma) with explicit loops (float64 numpy)."""
    m = np.exp(np.asarray(scores, dtype=np.float64) / gamma)
    k, n = m.shape
    r = np.full(k, 1.0 / k) if r is None else np.asarray(r, float) / np.sum(r)
    c = np.full(n, 1.0 / n) if c is None else np.asarray(c, float) / np.sum(c)
    alpha, beta = np.ones(k), np.ones(n)
    for _ in range(iters):
        for i in range(k):
            alpha[i] = r[i] / sum(m[i, j] * beta[j] for j in range(n))
        for j in range(n):
            beta[j] = c[j] / sum(m[i, j] * alpha[i] for i in range(k))
    return alpha, beta


@pytest.mark.parametrize("marginals", [False, True])
def test_matches_plain_sinkhorn(marginals):
    rng = np.random.default_rng(0)
    s = rng.uniform(-1, 1, size=(7, 5))
    r = rng.uniform(0.5, 2, size=7) if marginals else None
    c = rng.uniform(0.5, 2, size=5) if marginals else None
    la, lb, errs = log_sinkhorn(torch.tensor(s), gamma=0.3, iters=6,
                                row_marginal=None if r is None else torch.tensor(r),
                                col_marginal=None if c is None else torch.tensor(c))
    a, b = plain_sinkhorn(s, 0.3, 6, r, c)
    np.testing.assert_allclose(la.numpy(), np.log(a), rtol=0, atol=1e-10)
    np.testing.assert_allclose(lb.numpy(), np.log(b), rtol=0, atol=1e-10)
    assert len(errs) == 6 and errs[-1] <= errs[0]


@pytest.mark.parametrize("shape", [(6, 6), (9, 4), (3, 11)])
def test_marginals_converge(shape):
    torch.manual_seed(1)
    s = torch.randn(*shape, dtype=torch.float64)
    r = torch.rand(shape[0], dtype=torch.float64) + 0.1
    c = torch.rand(shape[1], dtype=torch.float64) + 0.1
    for rm, cm in [(None, None), (r, c)]:
        p = sinkhorn_plan(s, gamma=0.5, iters=300, row_marginal=rm, col_marginal=cm)
        rr = torch.full((shape[0],), 1 / shape[0], dtype=torch.float64) if rm is None else rm / rm.sum()
        cc = torch.full((shape[1],), 1 / shape[1], dtype=torch.float64) if cm is None else cm / cm.sum()
        assert torch.allclose(p.sum(1), rr, atol=1e-5, rtol=0)
        assert torch.allclose(p.sum(0), cc, atol=1e-5, rtol=0)
        _, _, errs = log_sinkhorn(s, gamma=0.5, iters=300, row_marginal=rm, col_marginal=cm)
        assert errs[-1] < 1e-5
        # errors are measured independently of the returned scalings
        assert errs[-1] == pytest.approx(max((p.sum(1) - rr).abs().max().item(),
                                             (p.sum(0) - cc).abs().max().item()), abs=1e-12)
        assert log_sinkhorn(s, gamma=0.5, iters=3, track_errors=False)[2] == []


def test_no_overflow_where_plain_overflows():
    torch.manual_seed(2)
    s = torch.randn(8, 8, dtype=torch.float64)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        a, _ = plain_sinkhorn(s.numpy(), 1e-3, 2)
    assert not np.all(np.isfinite(a))  # the plain iteration overflows exp(1000)
    la, lb, errs = log_sinkhorn(s, gamma=1e-3, iters=50)
    assert torch.isfinite(la).all() and torch.isfinite(lb).all()
    assert all(math.isfinite(e) for e in errs)


def test_half_precision_scores_run_in_float32():
    torch.manual_seed(3)
    s = torch.randn(16, 10).half()
    la, lb, _ = log_sinkhorn(s, gamma=0.01, iters=4)
    assert la.dtype == torch.float32 and torch.isfinite(la).all() and torch.isfinite(lb).all()


def test_gradients_flow():
    s = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: log_sinkhorn(x, gamma=0.7, iters=3)[0], (s,))


def test_input_untouched():
    s = torch.randn(5, 4)
    s0 = s.clone()
    log_sinkhorn(s, gamma=0.1, iters=3)
    assert torch.equal(s, s0)


@pytest.mark.parametrize("kw, match", [
    (dict(gamma=0.0, iters=3), "gamma"),
    (dict(gamma=-1.0, iters=3), "gamma"),
    (dict(gamma=0.1, iters=0), "iters"),
    (dict(gamma=0.1, iters=2, row_marginal=torch.ones(3)), "row_marginal"),
    (dict(gamma=0.1, iters=2, col_marginal=-torch.ones(4)), "col_marginal"),
])
def test_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        log_sinkhorn(torch.randn(5, 4), **kw)


def test_nan_scores():
    s = torch.randn(3, 3)
    s[0, 1] = float("nan")
    with pytest.raises(ValueError, match="scores"):
        log_sinkhorn(s, gamma=0.1, iters=2)
