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


def naive_calince(mod, video, text, sigma, tau, ids=None, calibration=True):
    """Literal transcription of sec. 3 / eq. 6 in float64, one sample at a time.

    C and G act on the features f as given (sec. 3.1: C([f_v, f_t]); eqs. 4-5:
    G(f) / ||G(f)|| against sg[f / ||f||]); the NCE dot products use unit vectors.
    """
    n = video.shape[0]
    v, t = F.normalize(video, dim=1), F.normalize(text, dim=1)
    ids = list(range(n)) if ids is None else [int(i) for i in ids]
    l_corr, c = torch.zeros((), dtype=torch.float64), [1.0] * n
    if mod.head is not None:
        c = naive_head(mod.head, video, text)
        c_shuf = naive_head(mod.head, video, text[sigma])
        valid = [i for i in range(n) if ids[int(sigma[i])] != ids[i]]
        # eq. 1 per sample: -c_ii log(c^_ii) - (1 - c_ij) log(1 - c^_ij), c_ii = 1, c_ij = 0
        l_corr = sum(-torch.log(c[i]) for i in range(n)) / n
        if valid:
            l_corr = l_corr + sum(-torch.log(1 - c_shuf[i]) for i in valid) / len(valid)
    l_cont = 0.0
    for i in range(n):
        ok = [k for k in range(n) if k == i or ids[k] != ids[i]]
        nce_v = -torch.log(torch.exp(v[i] @ t[i] / tau) / sum(torch.exp(v[i] @ t[k] / tau) for k in ok))
        nce_t = -torch.log(torch.exp(t[i] @ v[i] / tau) / sum(torch.exp(t[i] @ v[k] / tau) for k in ok))
        w = float(c[i].detach()) if calibration else 1.0
        l_cont = l_cont + w * (nce_v + nce_t) / n
    l_pred = 0.0
    if mod.predict_v is not None:
        for i in range(n):
            pv, pt = mod.predict_v(video[i]), mod.predict_t(text[i])
            l_pred = l_pred + (((pv / pv.norm()) - t[i].detach()) ** 2).sum() / n
            l_pred = l_pred + (((pt / pt.norm()) - v[i].detach()) ** 2).sum() / n
    return l_corr, l_cont, l_pred


@pytest.mark.parametrize("seed, n, d", [(0, 6, 4), (1, 5, 3), (2, 9, 7)])
@pytest.mark.parametrize("ids", [False, True])
@pytest.mark.parametrize("pred_w", [0.0, 0.7])
def test_matches_naive_loops(seed, n, d, ids, pred_w):
    torch.manual_seed(seed)
    v, t = _batch(n, d, seed=seed)
    v = v * 3.0  # un-normalised features: the heads see them as they are
    ids_t = torch.tensor([0, 1, 1] + list(range(2, n - 1))) if ids else None
    mod = CaliNCE(temperature=0.1, contrastive_weight=0.6, correspondence_weight=0.3,
                  predictive_weight=pred_w, hidden_dim=5, embed_dim=d, seed=3).double()
    loss = mod(v, t, ids=ids_t)
    sigma = derangement(n, generator=torch.Generator().manual_seed(3))
    l_corr, l_cont, l_pred = naive_calince(mod, v, t, sigma, 0.1, ids_t)
    expected = 0.3 * l_corr + 0.6 * l_cont + pred_w * l_pred
    assert loss.item() == pytest.approx(float(expected.detach()), abs=1e-10)
    assert mod.last_terms["correspondence"] == pytest.approx(float(l_corr.detach()), abs=1e-10)
    assert mod.last_terms["contrastive"] == pytest.approx(float(l_cont.detach()), abs=1e-10)
    assert mod.last_terms["predictive"] == pytest.approx(float(torch.as_tensor(l_pred).detach()), abs=1e-10)
    assert mod.last_terms["loss"] == pytest.approx(loss.item(), abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_correspondence_is_the_per_sample_sum_of_eq1(seed):
    """The exposing case: eq. 1 sums the two terms per sample; a mean over 2B terms is half."""
    g = torch.Generator().manual_seed(seed)
    n = 7
    match = torch.randn(n, 2, generator=g, dtype=torch.float64)
    mismatch = torch.randn(n, 2, generator=g, dtype=torch.float64)
    c_ii = torch.softmax(match, 1)[:, 1]
    c_ij = torch.softmax(mismatch, 1)[:, 1]
    paper = sum(-math.log(c_ii[i]) - math.log(1 - c_ij[i]) for i in range(n)) / n
    got = correspondence_loss(match, mismatch).item()
    assert got == pytest.approx(paper, abs=1e-12)
    over_2b = torch.cat([-torch.log(c_ii), -torch.log(1 - c_ij)]).mean().item()
    assert got == pytest.approx(2 * over_2b, abs=1e-12)


TABLE1 = {  # Table 1 rows (sec. 3.4): theta1 corr, theta2 contra, theta3 coding = 200
    "coding": dict(calibration=False, contrastive_weight=0.0, correspondence_weight=0.0, predictive_weight=200.0),
    "corr": dict(calibration=False, contrastive_weight=0.0),
    "contra": dict(calibration=False, correspondence_weight=0.0),
    "contra+corr": dict(calibration=False),
    "contra+coding": dict(calibration=False, correspondence_weight=0.0, predictive_weight=200.0),
    "contra+corr+coding": dict(calibration=False, predictive_weight=200.0),
    "calince": dict(calibration=True),
}


@pytest.mark.parametrize("row", sorted(TABLE1))
@pytest.mark.parametrize("seed", [0, 1])
def test_table1_rows(row, seed):
    kw = TABLE1[row]
    torch.manual_seed(seed)
    v, t = _batch(8, 5, seed=10 + seed)
    mod = CaliNCE(temperature=0.2, hidden_dim=6, embed_dim=5, seed=seed, **kw).double()
    loss = mod(v, t)
    sigma = derangement(8, generator=torch.Generator().manual_seed(seed))
    l_corr, l_cont, l_pred = naive_calince(mod, v, t, sigma, 0.2, calibration=kw["calibration"])
    w = {k: kw.get(k, 1.0) for k in ("contrastive_weight", "correspondence_weight")}
    expected = (w["correspondence_weight"] * l_corr + w["contrastive_weight"] * l_cont
                + kw.get("predictive_weight", 0.0) * l_pred)
    assert loss.item() == pytest.approx(float(torch.as_tensor(expected).detach()), abs=1e-9)
    assert (mod.head is None) == (not kw["calibration"] and w["correspondence_weight"] == 0)
    if row == "contra":   # plain co-training weight 1: eq. 2 = twice the symmetric InfoNCE
        assert loss.item() == pytest.approx(2 * info_nce(v, t, temperature=0.2).item(), abs=1e-12)


def test_calibration_needs_the_correspondence_loss():
    with pytest.raises(ValueError, match="correspondence_weight"):
        CaliNCE(correspondence_weight=0.0)
    with pytest.raises(ValueError, match="all are 0"):
        CaliNCE(calibration=False, contrastive_weight=0.0, correspondence_weight=0.0)


def test_unit_weights_give_twice_infonce():
    v, t = _batch(seed=1)
    ids = torch.tensor([0, 0, 1, 2, 3, 4])
    got = calibrated_nce(v, t, torch.ones(6, dtype=torch.float64), temperature=0.2, ids=ids)
    assert got.item() == pytest.approx(2 * info_nce(v, t, temperature=0.2, ids=ids).item(), abs=1e-12)


def _head_grads(calibration, detach):
    torch.manual_seed(1)
    mod = CaliNCE(temperature=0.1, calibration=calibration, hidden_dim=8, embed_dim=4,
                  detach_weight=detach, seed=0)
    v, t = _batch(seed=2, dtype=torch.float32)
    mod(v, t).backward()
    return [p.grad.clone() for p in mod.head.parameters()]


def test_detached_weight_keeps_the_head_out_of_the_contrastive_term():
    # uncalibrated: the head learns from L_corr only; detached calibration must match it
    ref = _head_grads(calibration=False, detach=True)
    got = _head_grads(calibration=True, detach=True)
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(ref, got))
    got = _head_grads(calibration=True, detach=False)
    assert not all(torch.allclose(a, b, atol=1e-7) for a, b in zip(ref, got))


def test_undetached_weight_collapses_c_towards_zero():
    """The trivial solution: descending (almost only) the contrastive term drives c_ii -> 0
    when the weight is not detached; with the default (detached) the head barely moves."""
    v, t = _batch(seed=3, dtype=torch.float32)
    for detach, shrinks in ((False, True), (True, False)):
        torch.manual_seed(2)
        mod = CaliNCE(temperature=0.1, correspondence_weight=1e-6, hidden_dim=8, embed_dim=4,
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
            assert mod.last_terms["c_mean"] == pytest.approx(c0, abs=1e-4)


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
    assert full.item() == pytest.approx(float(ce1.mean() + ce0.mean()), abs=1e-7)
    part = correspondence_loss(m, s, torch.tensor([True, False]))
    assert part.item() == pytest.approx(float(ce1.mean() + ce0[0]), abs=1e-7)
    none = correspondence_loss(m, s, torch.tensor([False, False]))
    assert none.item() == pytest.approx(float(ce1.mean()), abs=1e-7)


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
    assert torch.isfinite(loss) and mod.last_terms["contrastive"] == 0.0  # no negatives
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
    with pytest.raises(ValueError, match="predictive_weight"):
        CaliNCE(predictive_weight=float("nan"), embed_dim=4)


def test_docstring_examples_run():
    import doctest

    import xmodal.functional.calince as fmod
    import xmodal.losses.calince as lmod
    for mod in (fmod, lmod):
        result = doctest.testmod(mod, verbose=False)
        assert result.attempted >= 2 and result.failed == 0
