"""QB-Norm's bank column logsumexp with the running shift: equal to a dense float64
logsumexp and an argmax activation set, whatever the block order and magnitudes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xmodal.normalize import QBNorm
from xmodal.normalize.qbnorm import bank_column_logsumexp
from xmodal.normalize._base import matrix_blocks


def _dense(s, beta, k=1):
    s64 = torch.as_tensor(s, dtype=torch.float64)
    lse = torch.logsumexp(beta * s64, dim=0)
    active = torch.zeros(s64.shape[1], dtype=torch.bool)
    for row in s64.numpy():   # top-k by a stable sort: ties take the lowest index
        active[np.argsort(-row, kind="stable")[:k]] = True
    return lse, active


@pytest.mark.parametrize("case", ["cosine", "later block far above", "later block far below", "ties"])
@pytest.mark.parametrize("rows", [1, 3, 50])
@pytest.mark.parametrize("k", [1, 2])
def test_matches_dense_logsumexp_and_argmax(case, rows, k):
    rng = np.random.default_rng(rows + 7 * k)
    s = rng.uniform(-1, 1, (40, 30)).astype(np.float32)
    if case == "later block far above":
        s[20:] += 10.0          # beta * 10 = 200 above the running value: exp overflows
    elif case == "later block far below":
        s[:5] += 10.0           # later blocks underflow against the running value
    elif case == "ties":
        s = rng.integers(0, 3, (40, 30)).astype(np.float32)
    lse, active = bank_column_logsumexp(matrix_blocks(s, rows), 20.0, topk=k)
    ref_lse, ref_active = _dense(s, 20.0, k)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-5, rtol=1e-6)
    if k == 1 or case != "ties":    # top-k ties beyond k = 1 are torch.topk's choice
        assert torch.equal(active, ref_active)


def test_overflowing_block_takes_the_column_max_path(monkeypatch):
    calls = []
    real = torch.Tensor.amax
    monkeypatch.setattr(torch.Tensor, "amax", lambda self, *a, **kw: calls.append(1) or real(self, *a, **kw))
    s = np.zeros((6, 4), np.float32)
    s[3:] = 10.0
    lse, _ = bank_column_logsumexp(matrix_blocks(s, 3), 20.0)
    assert len(calls) == 2            # the first block and the overflowing one
    torch.testing.assert_close(lse.double(), _dense(s, 20.0)[0], atol=1e-5, rtol=0)


def test_qbnorm_fit_equals_fit_scores_and_dense():
    rng = np.random.default_rng(3)
    bank = rng.standard_normal((300, 16)).astype(np.float32)
    gallery = rng.standard_normal((70, 16)).astype(np.float32)
    bank /= np.linalg.norm(bank, axis=1, keepdims=True)
    gallery /= np.linalg.norm(gallery, axis=1, keepdims=True)
    a = QBNorm(k=1, beta=20.0, output="log", block_size=7).fit(bank, gallery)
    b = QBNorm(k=1, beta=20.0, output="log").fit_scores(bank @ gallery.T)
    ref_lse, ref_active = _dense(bank.astype(np.float64) @ gallery.T.astype(np.float64), 20.0)
    torch.testing.assert_close(a._lse.double(), ref_lse, atol=2e-5, rtol=0)
    torch.testing.assert_close(b._lse.double(), ref_lse, atol=2e-5, rtol=0)
    assert torch.equal(a.activation_set, ref_active) and torch.equal(b.activation_set, ref_active)
