"""NCL (Park et al. 2022): naive loops from eqs. 4 and 7-12, eq. 13, gradients, queues, bad input."""

import math

import numpy as np
import pytest
import torch

from xmodal.functional.ncl import ncl_biases, ncl_loss
from xmodal.functional.sinkhorn import log_sinkhorn
from xmodal.losses.ncl import NCL


def naive_sinkhorn(s, gamma, iters, r, c):
    m = [[math.exp(s[i][j] / gamma) for j in range(len(s[0]))] for i in range(len(s))]
    alpha, beta = [1.0] * len(s), [1.0] * len(s[0])
    for _ in range(iters):
        alpha = [r[i] / sum(m[i][j] * beta[j] for j in range(len(beta))) for i in range(len(alpha))]
        beta = [c[j] / sum(m[i][j] * alpha[i] for i in range(len(alpha))) for j in range(len(beta))]
    return alpha, beta


def naive_ncl(video, text, gamma, iters, ids=None):
    """Loops over the equations: biases from a plain Sinkhorn (constants), then the
    symmetric InfoNCE on a_i + b_j + <t_i, v_j>. Returns a torch scalar (float64)."""
    v = torch.nn.functional.normalize(video, dim=1)
    t = torch.nn.functional.normalize(text, dim=1)
    n = v.shape[0]
    s = [[float(t[i].detach() @ v[j].detach()) for j in range(n)] for i in range(n)]
    ids = list(range(n)) if ids is None else [int(x) for x in ids]
    uniq = sorted(set(ids))
    cols = [ids.index(u) for u in uniq]           # first occurrence of each video
    counts = [ids.count(u) for u in uniq]
    su = [[s[i][j] for j in cols] for i in range(n)]
    alpha, beta = naive_sinkhorn(su, gamma, iters, [1.0 / n] * n, [k / n for k in counts])
    a = [gamma * math.log(x / sum(alpha)) for x in alpha]
    bu = [gamma * math.log(x / sum(beta)) for x in beta]
    b = [bu[uniq.index(ids[j])] - gamma * math.log(counts[uniq.index(ids[j])]) for j in range(n)]
    total_t2v, total_v2t = 0.0, 0.0
    for i in range(n):
        den = sum(torch.exp((b[k] + t[i] @ v[k]) / gamma) for k in range(n) if k == i or ids[k] != ids[i])
        total_t2v = total_t2v - torch.log(torch.exp((b[i] + t[i] @ v[i]) / gamma) / den)
        den = sum(torch.exp((a[k] + t[k] @ v[i]) / gamma) for k in range(n) if k == i or ids[k] != ids[i])
        total_v2t = total_v2t - torch.log(torch.exp((a[i] + t[i] @ v[i]) / gamma) / den)
    return (total_t2v / n + total_v2t / n) / 2


def _batch(n=6, d=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=dtype), torch.randn(n, d, generator=g, dtype=dtype)


@pytest.mark.parametrize("ids", [None, [0, 1, 1, 2, 3, 3]])
@pytest.mark.parametrize("gamma, iters", [(0.5, 4), (0.1, 1), (0.2, 10)])
def test_matches_naive_loops_value_and_gradient(ids, gamma, iters):
    v, t = _batch()
    ids_t = None if ids is None else torch.tensor(ids)
    v1, t1 = v.clone().requires_grad_(), t.clone().requires_grad_()
    v2, t2 = v.clone().requires_grad_(), t.clone().requires_grad_()
    got = ncl_loss(v1, t1, temperature=gamma, sinkhorn_iters=iters, ids=ids_t)
    ref = naive_ncl(v2, t2, gamma, iters, ids)
    assert got.item() == pytest.approx(ref.item(), abs=1e-6)
    got.backward()
    ref.backward()  # the naive biases are Python floats: constants, as in the paper
    assert torch.allclose(v1.grad, v2.grad, atol=1e-6) and torch.allclose(t1.grad, t2.grad, atol=1e-6)


def test_sinkhorn_marginals_of_the_batch_plan():
    v, t = _batch(8, 4, seed=1)
    s = torch.nn.functional.normalize(t, dim=1) @ torch.nn.functional.normalize(v, dim=1).T
    la, lb, errs = log_sinkhorn(s, gamma=0.05, iters=500)
    p = torch.exp(la[:, None] + s / 0.05 + lb[None, :])
    assert torch.allclose(p.sum(1), torch.full((8,), 1 / 8, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(p.sum(0), torch.full((8,), 1 / 8, dtype=torch.float64), atol=1e-5)
    assert errs[-1] < 1e-5


@pytest.mark.parametrize("k, n", [(10, 10), (12, 5)])
def test_eq13_adjusted_retrieval_probabilities_sum_to_one(k, n):
    """Eq. 13: with converged biases every gallery item is retrieved with total probability
    K/N (1 for a square batch), every query with total probability N/K in the other direction."""
    g = torch.Generator().manual_seed(2)
    s = torch.randn(k, n, generator=g, dtype=torch.float64) * 0.3
    gamma = 0.05
    a, b = ncl_biases(s, gamma=gamma, iters=2000)
    p_t2v = torch.softmax((a[:, None] + b[None, :] + s) / gamma, dim=1)  # each text over videos
    p_v2t = torch.softmax((a[:, None] + b[None, :] + s) / gamma, dim=0)  # each video over texts
    assert torch.allclose(p_t2v.sum(0), torch.full((n,), k / n, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(p_v2t.sum(1), torch.full((k,), n / k, dtype=torch.float64), atol=1e-5)
    # without the biases the retrieval mass is far from uniform (the hubness NCL removes)
    raw = torch.softmax(s / gamma, dim=1).sum(0)
    assert (raw - k / n).abs().max() > 0.1


def test_ids_biases_equal_uniform_sinkhorn_with_identical_duplicates():
    v, t = _batch(4, 3, seed=3)
    ids = torch.tensor([0, 1, 1, 2])
    v[2] = v[1]  # the same video twice, two captions
    s = torch.nn.functional.normalize(t, dim=1) @ torch.nn.functional.normalize(v, dim=1).T
    # the iterates differ (different starting mass) but the fixed point is the same
    a1, b1 = ncl_biases(s, gamma=0.1, iters=1000, ids=ids)
    a2, b2 = ncl_biases(s, gamma=0.1, iters=1000)
    assert torch.allclose(a1, a2, atol=1e-9) and torch.allclose(b1, b2, atol=1e-9)


def test_gradcheck():
    v, t = _batch(4, 3, seed=4)
    v.requires_grad_(), t.requires_grad_()
    ids = torch.tensor([0, 0, 1, 2])
    for i in (None, ids):
        # the biases are constants of the gradient step (eq. 12 alternating fixed point)
        _, ab = ncl_loss(v, t, temperature=0.3, ids=i, return_biases=True)
        assert torch.autograd.gradcheck(
            lambda x, y: ncl_loss(x, y, temperature=0.3, ids=i, biases=ab), (v, t))
        g1 = torch.autograd.grad(ncl_loss(v, t, temperature=0.3, ids=i), (v, t))
        g2 = torch.autograd.grad(ncl_loss(v, t, temperature=0.3, ids=i, biases=ab), (v, t))
        assert all(torch.equal(x, y) for x, y in zip(g1, g2))


def test_aligned_embeddings_and_batch_of_one():
    x = torch.eye(4, dtype=torch.float64)
    # perfectly aligned orthogonal pairs: biases are 0 (symmetric plan), loss is InfoNCE's
    expected = math.log(1 + 3 * math.exp(-1 / 0.1))
    assert ncl_loss(x, x, temperature=0.1).item() == pytest.approx(expected, abs=1e-12)
    assert ncl_loss(x[:1], x[:1], temperature=0.1).item() == 0.0  # no negatives


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_finite_under_autocast(dtype):
    v, t = _batch(16, 8, seed=5, dtype=torch.float32)
    v, t = v.to(dtype).requires_grad_(), t.to(dtype).requires_grad_()
    with torch.autocast("cpu", dtype=dtype):
        loss = NCL(temperature=0.01, queue_size=32)(v, t)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(v.grad).all() and torch.isfinite(t.grad).all()


def test_queue_fifo_and_modes():
    loss = NCL(temperature=0.1, queue_size=5)
    tq, vq = loss.query_bank()
    assert tq.shape[0] == 0 and vq.shape[0] == 0  # nothing seen yet
    batches = [_batch(2, 3, seed=10 + s, dtype=torch.float32) for s in range(4)]
    unit = torch.nn.functional.normalize
    loss(*batches[0])
    tq, vq = loss.query_bank()
    assert torch.allclose(tq, unit(batches[0][1], dim=1)) and torch.allclose(vq, unit(batches[0][0], dim=1))
    for v, t in batches[1:]:
        loss(v.requires_grad_(), t)
    tq, vq = loss.query_bank()
    newest_first = torch.cat([unit(b[1], dim=1) for b in batches[::-1]])[:5]
    assert torch.allclose(tq, newest_first) and not tq.requires_grad and not vq.requires_grad
    loss.eval()
    loss(*_batch(2, 3, seed=99, dtype=torch.float32))
    assert torch.equal(loss.query_bank()[0], tq)  # eval mode leaves the queue alone
    tq[0] = 0.0
    assert not torch.equal(loss.query_bank()[0], tq)  # query_bank returns a copy
    none = NCL(queue_size=0)
    none(*batches[0])
    assert none.query_bank()[0].numel() == 0


def test_bad_input():
    v, t = _batch(4, 3)
    with pytest.raises(ValueError, match="differ"):
        NCL()(v, t[:3])
    bad = v.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="video"):
        NCL()(bad, t)
    for tau in (0.0, -1.0):
        with pytest.raises(ValueError, match="temperature"):
            NCL(temperature=tau)
        with pytest.raises(ValueError, match="temperature"):
            NCL()(v, t, temperature=tau)
    with pytest.raises(ValueError, match="temperature"):
        NCL()(v, t, temperature=torch.full((4,), 0.1))  # one gamma per batch
    with pytest.raises(ValueError, match="ids"):
        NCL()(v, t, ids=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="sinkhorn_iters"):
        NCL(sinkhorn_iters=0)


def test_symmetric_at_the_sinkhorn_fixed_point():
    """Swapping the modalities transposes S; the row-first iteration makes finite-iteration
    biases order-dependent, but at the fixed point NCL is symmetric."""
    v, t = _batch(7, 4, seed=6)
    a = ncl_loss(v, t, temperature=0.1, sinkhorn_iters=1000)
    b = ncl_loss(t, v, temperature=0.1, sinkhorn_iters=1000)
    assert a.item() == pytest.approx(b.item(), abs=1e-9)


def test_analytic_all_equal_embeddings():
    z = torch.ones(5, 3, dtype=torch.float64)
    assert ncl_loss(z, z, temperature=0.05).item() == pytest.approx(math.log(5), abs=1e-12)
