"""SinkhornBias.fit in gallery (column) blocks: the same iterates, biases and errors as
the bank-row-block iteration (the previous implementation) and the dense reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xmodal.functional.sinkhorn import log_sinkhorn
from xmodal.normalize import SinkhornBias, blockwise_log_sinkhorn
from xmodal.normalize import sinkhorn as mod
from xmodal.normalize._base import score_blocks


def _emb(n, d, seed, dtype=torch.float64):
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.nn.functional.normalize(x, dim=1).to(dtype)


def _row_path(q, g, gamma, iters, c=None, track_error=True, rows=7):
    """The previous implementation: bank row blocks, one extra pass for the last error."""
    k, n = q.shape[0], g.shape[0]
    log_r = torch.full((k,), -np.log(k), dtype=q.dtype)
    log_c = torch.full((n,), -np.log(n), dtype=q.dtype) if c is None else torch.log(c / c.sum())
    return blockwise_log_sinkhorn(lambda: score_blocks(q, g, rows), k, n, gamma=gamma, iters=iters,
                                  log_r=log_r, log_c=log_c, track_error=track_error)


@pytest.mark.parametrize("iters", [1, 2, 4, 9])
@pytest.mark.parametrize("block_size", [None, 1, 5, 40])
def test_same_bias_and_errors_as_row_blocks_and_dense(iters, block_size):
    q, g = _emb(23, 8, 0), _emb(40, 8, 1)
    c = torch.rand(40, generator=torch.Generator().manual_seed(2), dtype=torch.float64) + 0.1
    sb = SinkhornBias(0.1, iters=iters, block_size=block_size).fit(q, g, gallery_marginal=c)
    la, lb, errors = _row_path(q, g, 0.1, iters, c)
    torch.testing.assert_close(sb._log_beta, lb, atol=1e-12, rtol=0)
    torch.testing.assert_close(sb._log_alpha, la, atol=1e-12, rtol=0)
    assert len(sb.history) == iters and np.allclose(sb.history, errors, atol=1e-14, rtol=1e-9)
    dla, dlb, derr = log_sinkhorn(q @ g.T, gamma=0.1, iters=iters, col_marginal=c)
    bias = 0.1 * (dlb - torch.logsumexp(dlb, 0))
    torch.testing.assert_close(sb.bias, bias, atol=1e-12, rtol=0)
    assert np.allclose(sb.history, derr, atol=1e-14, rtol=1e-9)


def test_without_last_error_keeps_iters_minus_one_errors():
    q, g = _emb(10, 6, 3), _emb(30, 6, 4)
    sb = SinkhornBias(0.2, iters=5, track_error=False).fit(q, g)
    la, lb, errors = _row_path(q, g, 0.2, 5, track_error=False)
    assert len(sb.history) == 4 and np.allclose(sb.history, errors, atol=1e-14, rtol=1e-9)
    torch.testing.assert_close(sb._log_beta, lb, atol=1e-12, rtol=0)


def test_zero_mass_rows_and_columns():
    q, g = _emb(12, 5, 5), _emb(20, 5, 6)
    c = torch.rand(20, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    c[[3, 11]] = 0.0
    r = torch.ones(12, dtype=torch.float64)
    r[4] = 0.0
    sb = SinkhornBias(0.05, iters=6, block_size=6).fit(q, g, query_marginal=r, gallery_marginal=c)
    dla, dlb, derr = log_sinkhorn(q @ g.T, gamma=0.05, iters=6, row_marginal=r, col_marginal=c)
    assert torch.isinf(sb.bias[[3, 11]]).all() and torch.isinf(sb._log_alpha[4])
    keep = c > 0
    torch.testing.assert_close(sb._log_beta[keep], dlb[keep], atol=1e-10, rtol=0)
    assert np.allclose(sb.history, derr, atol=1e-12)


def test_underflowing_rows_are_recomputed_exactly(monkeypatch):
    """float32, a query of marginal mass 1e-70: its plan entries (~e^-161) underflow in
    the column-max-shifted buffer, so the exact row logsumexp must take over."""
    calls = []
    real = mod._exact_row_lse
    monkeypatch.setattr(mod, "_exact_row_lse", lambda *a: calls.append(1) or real(*a))
    q, g = _emb(6, 4, 9), _emb(10, 4, 10)
    r = torch.ones(6, dtype=torch.float64)
    r[0] = 1e-70
    sb = SinkhornBias(0.05, iters=3, block_size=3).fit(q.float(), g.float(), query_marginal=r)
    assert calls, "the exact row path was not exercised"
    ref = SinkhornBias(0.05, iters=3).fit(q, g, query_marginal=r)      # float64: no underflow
    assert torch.isfinite(sb.bias).all() and torch.isfinite(sb._log_alpha).all()
    torch.testing.assert_close(sb.bias.double(), ref.bias, atol=1e-5, rtol=0)
    torch.testing.assert_close(sb._log_alpha.double(), ref._log_alpha, atol=1e-4, rtol=1e-6)


def test_bank_larger_than_gallery_keeps_row_blocks(monkeypatch):
    called = []
    monkeypatch.setattr(mod, "gallery_block_log_sinkhorn", lambda *a, **k: called.append(1))
    SinkhornBias(0.1, iters=2).fit(_emb(30, 4, 11), _emb(10, 4, 12))
    assert not called
