"""CaliNCE (Zhao et al.): naive loops from eqs. 1-6, detached calibration weight,
predictive coding stop-gradient, seeded shuffling, numerics, bad input."""

import math

import pytest
import torch
import torch.nn.functional as F

from xmodal.functional.calince import (calibrated_nce, correspondence_loss, derangement,
                                       predictive_coding_loss)
from xmodal.functional.infonce import info_nce
from xmodal.losses.calince import CaliNCE


def _batch(n=6, d=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=dtype), torch.randn(n, d, generator=g, dtype=dtype)


def naive_head(head, fv, ft):
    """p(match) of the two-layer MLP, computed by hand from its weights."""
    w1, b1, w2, b2 = head[0].weight, head[0].bias, head[2].weight, head[2].bias
    out = []
    for a, b in zip(fv, ft):
        h = torch.clamp(w1 @ torch.cat([a, b]) + b1, min=0)
        z = w2 @ h + b2
        out.append(torch.exp(z[1]) / (torch.exp(z[0]) + torch.exp(z[1])))
    return out


def naive_calince(mod, video, text, sigma, tau, ids=None):
    n = video.shape[0]
    v, t = F.normalize(video, dim=1), F.normalize(text, dim=1)
    ids = list(range(n)) if ids is None else [int(i) for i in ids]
    c = naive_head(mod.head, v, t)
    c_shuf = naive_head(mod.head, v, t[sigma])
    terms = [-torch.log(ci) for ci in c]
    terms += [-torch.log(1 - c_shuf[i]) for i in range(n) if ids[int(sigma[i])] != ids[i]]
    l_corr = sum(terms) / len(terms)
    l_cont = 0.0
    for i in range(n):
        ok = [k for k in range(n) if k == i or ids[k] != ids[i]]
        nce_v = -torch.log(torch.exp(v[i] @ t[i] / tau) / sum(torch.exp(v[i] @ t[k] / tau) for k in ok))
        nce_t = -torch.log(torch.exp(t[i] @ v[i] / tau) / sum(torch.exp(t[i] @ v[k] / tau) for k in ok))
        l_cont = l_cont + float(c[i].detach()) * (nce_v + nce_t) / n
    l_pred = 0.0
    if mod.predict_v is not None:
        for i in range(n):
            pv, pt = mod.predict_v(v[i]), mod.predict_t(t[i])
            l_pred = l_pred + (((pv / pv.norm()) - t[i]) ** 2).sum() / n
            l_pred = l_pred + (((pt / pt.norm()) - v[i]) ** 2).sum() / n
    return l_corr, l_cont, l_pred


@pytest.mark.parametrize("ids", [None, [0, 1, 1, 2, 3, 3]])
@pytest.mark.parametrize("pred_w", [0.0, 0.7])
def test_matches_naive_loops(ids, pred_w):
    torch.manual_seed(0)
    v, t = _batch()
    ids_t = None if ids is None else torch.tensor(ids)
    mod = CaliNCE(temperature=0.1, contrastive_weight=0.6, correspondence_weight=0.3,
                  predictive_weight=pred_w, hidden_dim=5, embed_dim=4, seed=3).double()
    loss = mod(v, t, ids=ids_t)
    sigma = derangement(6, generator=torch.Generator().manual_seed(3))
    l_corr, l_cont, l_pred = naive_calince(mod, v, t, sigma, 0.1, ids)
    expected = 0.3 * l_corr + 0.6 * l_cont + pred_w * l_pred
    assert loss.item() == pytest.approx(float(expected.detach()), abs=1e-6)
    assert mod.last_terms["corr"] == pytest.approx(float(l_corr.detach()), abs=1e-6)
    assert mod.last_terms["cont"] == pytest.approx(float(l_cont.detach()), abs=1e-6)
    assert mod.last_terms["loss"] == pytest.approx(loss.item(), abs=1e-12)


def test_unit_weights_give_twice_infonce():
    v, t = _batch(seed=1)
    ids = torch.tensor([0, 0, 1, 2, 3, 4])
    got = calibrated_nce(v, t, torch.ones(6, dtype=torch.float64), temperature=0.2, ids=ids)
    assert got.item() == pytest.approx(2 * info_nce(v, t, temperature=0.2, ids=ids).item(), abs=1e-12)


def _head_grads(detach):
    torch.manual_seed(1)
    mod = CaliNCE(temperature=0.1, correspondence_weight=0.0, hidden_dim=8, embed_dim=4,
                  detach_weight=detach, seed=0)
    v, t = _batch(seed=2, dtype=torch.float32)
    mod(v, t).backward()
    return mod, [p.grad for p in mod.head.parameters()]


def test_detached_weight_keeps_the_head_out_of_the_contrastive_term():
    _, grads = _head_grads(detach=True)
    assert all(g is None or torch.count_nonzero(g) == 0 for g in grads)
    _, grads = _head_grads(detach=False)
    assert any(g is not None and torch.count_nonzero(g) > 0 for g in grads)


def test_undetached_weight_collapses_c_towards_zero():
    """The trivial solution: descending the contrastive term alone drives c_ii -> 0 when the
    weight is not detached; with the default (detached) the head does not move."""
    v, t = _batch(seed=3, dtype=torch.float32)
    for detach, shrinks in ((False, True), (True, False)):
        torch.manual_seed(2)
        mod = CaliNCE(temperature=0.1, correspondence_weight=0.0, hidden_dim=8, embed_dim=4,
                      detach_weight=detach, seed=0)
        mod(v, t)
        c0 = mod.last_terms["c_mean"]
        for _ in range(8):  # plain gradient descent (torch.optim's first import is slow)
            mod.zero_grad()
            mod(v, t).backward()
            with torch.no_grad():
                for p in mod.parameters():
                    if p.grad is not None:
                        p -= 2.0 * p.grad
        mod(v, t)
        assert (mod.last_terms["c_mean"] < 0.5 * c0) == shrinks
        if not shrinks:
            assert mod.last_terms["c_mean"] == pytest.approx(c0, abs=1e-7)


def test_derangement_and_seeding():
    for n in (2, 3, 10):
        s = derangement(n, generator=torch.Generator().manual_seed(n))
        assert sorted(s.tolist()) == list(range(n)) and bool((s != torch.arange(n)).all())
    a = derangement(9, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, derangement(9, generator=torch.Generator().manual_seed(4)))
    torch.manual_seed(5)
    b = derangement(9)
    torch.manual_seed(5)
    assert torch.equal(b, derangement(9))  # global RNG when no generator
    with pytest.raises(ValueError, match="n"):
        derangement(1)


def test_correspondence_loss_drops_same_id_shuffles():
    m = torch.tensor([[0.0, 2.0], [1.0, 0.0]])
    s = torch.tensor([[3.0, 0.0], [0.0, 5.0]])
    ce1 = -F.log_softmax(m, 1)[:, 1]
    ce0 = -F.log_softmax(s, 1)[:, 0]
    full = correspondence_loss(m, s)
    assert full.item() == pytest.approx(float((ce1.sum() + ce0.sum()) / 4), abs=1e-7)
    part = correspondence_loss(m, s, torch.tensor([True, False]))
    assert part.item() == pytest.approx(float((ce1.sum() + ce0[0]) / 3), abs=1e-7)


def test_predictive_coding_stop_gradient_and_gradcheck():
    v, t = _batch(seed=4)
    pv, pt = _batch(seed=5)
    for x in (v, t, pv, pt):
        x.requires_grad_()
    predictive_coding_loss(pv, pt, v, t).backward()
    assert v.grad is None and t.grad is None  # targets are stop-gradient
    assert torch.autograd.gradcheck(lambda a, b: predictive_coding_loss(a, b, v, t), (pv, pt))
    w = torch.rand(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: calibrated_nce(a, b, c, temperature=0.3), (v, t, w))
    # aligned predictions cost nothing
    assert predictive_coding_loss(t, v, v, t).item() == pytest.approx(0.0, abs=1e-12)


def test_head_on_inputs():
    v, t = _batch(seed=6)
    g = torch.Generator().manual_seed(7)
    vi, ti = torch.randn(6, 3, generator=g), torch.randn(6, 5, generator=g)
    mod = CaliNCE(head_input="inputs", input_dims=(3, 5), seed=0)
    assert torch.isfinite(mod(v, t, vi, ti))
    with pytest.raises(ValueError, match="video_input"):
        mod(v, t)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_finite_under_autocast(dtype):
    v, t = _batch(16, 8, seed=8, dtype=torch.float32)
    v, t = v.to(dtype).requires_grad_(), t.to(dtype).requires_grad_()
    mod = CaliNCE(temperature=0.01, predictive_weight=0.5, embed_dim=8, seed=0)
    with torch.autocast("cpu", dtype=dtype):
        loss = mod(v, t)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(v.grad).all() and torch.isfinite(t.grad).all()


def test_batch_of_one_and_lazy_head():
    v, t = _batch(1, 4, dtype=torch.float32)
    mod = CaliNCE(seed=0)  # lazy head: parameters appear at the first forward
    loss = mod(v, t)
    assert torch.isfinite(loss) and mod.last_terms["cont"] == 0.0  # no negatives
    assert mod.head[0].weight.shape == (256, 8)


def test_bad_input():
    v, t = _batch()
    with pytest.raises(ValueError, match="differ"):
        CaliNCE()(v, t[:4])
    nan = v.clone()
    nan[0, 0] = math.nan
    with pytest.raises(ValueError, match="video"):
        CaliNCE()(nan, t)
    for tau in (0.0, -1.0):
        with pytest.raises(ValueError, match="temperature"):
            CaliNCE(temperature=tau)
        with pytest.raises(ValueError, match="temperature"):
            CaliNCE(seed=0)(v, t, temperature=tau)
    with pytest.raises(ValueError, match="embed_dim"):
        CaliNCE(predictive_weight=1.0)
    with pytest.raises(ValueError, match="head_input"):
        CaliNCE(head_input="both")
    with pytest.raises(ValueError, match="contrastive_weight"):
        CaliNCE(contrastive_weight=-1.0)
