"""CrossCLR (Zolfaghari et al. 2021): naive loops from eqs. 3-7, reduction to InfoNCE,
the documented deviations from Algorithm 2's pseudo-code, gradients, numerics."""

import math

import pytest
import torch
import torch.nn.functional as F

from xmodal.functional.crossclr import connectivity, crossclr_loss
from xmodal.losses.infonce import InfoNCE


def naive_connectivity(inp, bank=None):
    x = [r / r.norm() for r in inp]
    q = x if bank is None else [r / r.norm() for r in bank]
    c = [sum(float(a @ b) for b in q) / len(q) for a in x]
    if bank is None:
        m = max(abs(v) for v in c)
        c = [v / m for v in c]
    return c


def naive_crossclr(zx, zy, x_in, y_in, tau, lam, gamma, kappa, banks=(None, None), ids=None,
                   k_pos=0, beta=1.0):
    """Eqs. 3-7 with explicit loops; w_i = exp(C_i / kappa), weighted mean per direction."""
    n = zx.shape[0]
    zx, zy = F.normalize(zx, dim=1), F.normalize(zy, dim=1)
    taus = [tau] * n if isinstance(tau, float) else [float(x) for x in tau]
    ids = list(range(n)) if ids is None else [int(i) for i in ids]
    cx, cy = naive_connectivity(x_in, banks[0]), naive_connectivity(y_in, banks[1])

    def one_direction(za, zb, a_in, ca, cb):
        infl_a = [gamma is not None and c > gamma for c in ca]
        infl_b = [gamma is not None and c > gamma for c in cb]
        w = [1.0 if kappa is None else math.exp(c / kappa) for c in ca]
        losses = []
        for i in range(n):
            delta = lambda a, b: torch.exp(a @ b / taus[i])  # noqa: E731
            others = [k for k in range(n) if k != i and ids[k] != ids[i]]
            cands = [k for k in others if infl_b[k] or gamma is None]
            sim_in = {k: float(F.normalize(a_in[i], dim=0) @ F.normalize(a_in[k], dim=0)) for k in cands}
            extra = sorted(cands, key=lambda k: -sim_in[k])[:k_pos]
            num = delta(za[i], zb[i]) + sum(beta * delta(za[i], zb[k]) for k in extra)
            den = num
            den = den + sum(delta(za[i], zb[k]) for k in others if k not in extra and not infl_b[k])
            den = den + sum(lam * delta(za[i], za[k]) for k in others if k not in extra and not infl_a[k])
            losses.append(-torch.log(num / den))
        return sum(wi * li for wi, li in zip(w, losses)) / sum(w)

    return (one_direction(zx, zy, x_in, cx, cy) + one_direction(zy, zx, y_in, cy, cx)) / 2


def _data(n=8, d=6, dv=5, dt=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = [torch.randn(n, d, generator=g, dtype=torch.float64) for _ in range(2)]
    # positive input features (as after ReLU) so connectivities are spread around 0.7-1
    ins = [torch.rand(n, dv, generator=g, dtype=torch.float64),
           torch.rand(n, dt, generator=g, dtype=torch.float64)]
    return z[0], z[1], ins[0], ins[1]


CONFIGS = [
    dict(tau=0.1, lam=0.8, gamma=None, kappa=None),
    dict(tau=0.1, lam=0.8, gamma=0.9, kappa=None),
    dict(tau=0.1, lam=0.5, gamma=0.95, kappa=0.05),
    dict(tau=0.03, lam=0.8, gamma=0.9, kappa=0.0035),
    dict(tau=0.1, lam=0.0, gamma=0.93, kappa=0.1),
    dict(tau=0.2, lam=1.0, gamma=0.9, kappa=0.1, k_pos=2, beta=0.5),
    dict(tau=0.2, lam=1.0, gamma=None, kappa=None, k_pos=1, beta=2.0),
]


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("with_ids", [False, True])
def test_matches_naive_loops(cfg, with_ids):
    zx, zy, xi, yi = _data()
    ids = torch.tensor([0, 1, 1, 2, 3, 4, 4, 5]) if with_ids else None
    got = crossclr_loss(zx, zy, xi, yi, temperature=cfg["tau"], intra_weight=cfg["lam"],
                        prune_threshold=cfg["gamma"], weight_scale=cfg["kappa"], ids=ids,
                        num_positives=cfg.get("k_pos", 0), positive_weight=cfg.get("beta", 1.0))
    ref = naive_crossclr(zx, zy, xi, yi, cfg["tau"], cfg["lam"], cfg["gamma"], cfg["kappa"], ids=ids,
                         k_pos=cfg.get("k_pos", 0), beta=cfg.get("beta", 1.0))
    assert got.item() == pytest.approx(ref.item(), abs=1e-6, rel=1e-9)


def test_configs_really_prune():
    _, _, xi, yi = _data()
    for gamma in (0.9, 0.93, 0.95):
        for c in (connectivity(xi), connectivity(yi)):
            assert 0 < int((c > gamma).sum()) < len(c)  # some, not all, samples influential


def test_with_bank_and_per_sample_temperature():
    zx, zy, xi, yi = _data(seed=1)
    g = torch.Generator().manual_seed(5)
    bx = torch.cat([xi, torch.rand(12, xi.shape[1], generator=g, dtype=torch.float64)])
    by = torch.cat([yi, torch.rand(12, yi.shape[1], generator=g, dtype=torch.float64)])
    tau = torch.linspace(0.05, 0.2, 8, dtype=torch.float64)
    c = connectivity(xi, bx)
    gamma = float(c.median())
    got = crossclr_loss(zx, zy, xi, yi, video_bank=bx, text_bank=by, temperature=tau,
                        prune_threshold=gamma, weight_scale=0.02)
    ref = naive_crossclr(zx, zy, xi, yi, tau, 0.8, gamma, 0.02, banks=(bx, by))
    assert got.item() == pytest.approx(ref.item(), abs=1e-6)


@pytest.mark.parametrize("ids", [None, torch.tensor([0, 0, 1, 2, 3, 3, 4, 5])])
def test_reduces_to_infonce(ids):
    zx, zy, xi, yi = _data(seed=2)
    got = crossclr_loss(zx, zy, xi, yi, temperature=0.07, intra_weight=0.0,
                        prune_threshold=None, weight_scale=None, ids=ids)
    ref = InfoNCE(temperature=0.07)(zx, zy, ids=ids)
    assert got.item() == pytest.approx(ref.item(), abs=1e-12)
    # inputs are not needed in this configuration
    assert crossclr_loss(zx, zy, temperature=0.07, intra_weight=0.0, prune_threshold=None,
                         weight_scale=None, ids=ids).item() == pytest.approx(ref.item(), abs=1e-12)


def pseudo_code_rows(zv, zt, v_in, t_in, tau, lam, gamma):
    """Algorithm 2 / official CrossCLR_onlyIntraModality taken literally (video anchors):
    multiplicative diagonal mask, lambda on the logits, pruned columns dropped, labels arange."""
    n = zv.shape[0]
    zv, zt = F.normalize(zv, dim=1), F.normalize(zt, dim=1)
    keep_v = connectivity(v_in) <= gamma
    keep_t = connectivity(t_in) <= gamma
    logits_vt = (zv @ zt.T / tau)[:, keep_t]
    logits_vv = ((zv @ zv.T / tau) * (1 - torch.eye(n, dtype=zv.dtype)))[:, keep_v]
    logits = torch.cat([logits_vt, lam * logits_vv], dim=1)
    return F.cross_entropy(logits, torch.arange(n), reduction="none"), logits


def test_deviation_diagonal_exp0_and_lambda_on_logits():
    zv, zt, vi, ti = _data(seed=3)
    tau, n = 0.1, 8
    s_vt = F.normalize(zv, dim=1) @ F.normalize(zt, dim=1).T / tau
    s_vv = F.normalize(zv, dim=1) @ F.normalize(zv, dim=1).T / tau
    off = ~torch.eye(n, dtype=torch.bool)
    # (2) lambda = 1, no pruning: the pseudo-code keeps exp(0) = 1 in every denominator
    rows, _ = pseudo_code_rows(zv, zt, vi, ti, tau, 1.0, gamma=10.0)
    ours = torch.logsumexp(torch.cat([s_vt, s_vv.masked_fill(~off, -math.inf)], 1), 1) - s_vt.diag()
    assert torch.allclose(torch.exp(rows + s_vt.diag()), torch.exp(ours + s_vt.diag()) + 1.0)
    assert not torch.allclose(rows, ours)
    # (3) lambda = 0.5: the pseudo-code uses delta**lambda (lambda * logit), eq. 3 lambda * delta
    rows, _ = pseudo_code_rows(zv, zt, vi, ti, tau, 0.5, gamma=10.0)
    pseudo_terms = torch.exp(s_vt).sum(1) + torch.exp(0.5 * s_vv * off).sum(1)
    assert torch.allclose(rows, torch.log(pseudo_terms) - s_vt.diag())
    eq3_terms = torch.exp(s_vt).sum(1) + 0.5 * (torch.exp(s_vv) * off).sum(1)
    ours_v = torch.log(eq3_terms) - s_vt.diag()
    assert not torch.allclose(rows, ours_v)
    # ours (video direction, uniform weights, no pruning) is eq. 3 exactly
    ours_t = torch.log(torch.exp(s_vt.T).sum(1) + 0.5 * (torch.exp(
        F.normalize(zt, dim=1) @ F.normalize(zt, dim=1).T / tau) * off).sum(1)) - s_vt.diag()
    full = crossclr_loss(zv, zt, vi, ti, temperature=tau, intra_weight=0.5, prune_threshold=None,
                         weight_scale=None)
    assert full.item() == pytest.approx(((ours_v.mean() + ours_t.mean()) / 2).item(), abs=1e-12)
    # lambda = 0: the pseudo-code still has n - 1 + 1 terms exp(0) (not InfoNCE); ours is InfoNCE
    rows0, _ = pseudo_code_rows(zv, zt, vi, ti, tau, 0.0, gamma=10.0)
    info = torch.logsumexp(s_vt, 1) - s_vt.diag()
    assert torch.allclose(torch.exp(rows0 + s_vt.diag()), torch.exp(info + s_vt.diag()) + n)


def test_deviation_pruning_drops_the_positive_in_the_pseudo_code():
    zv, zt, vi, ti = _data(seed=4)
    tau = 0.1
    ct = connectivity(ti)
    top2 = ct.sort().values[-2:]
    gamma = float(top2.mean())  # exactly one influential text: the most connected one
    j = int(ct.argmax())
    assert j < 7
    rows, logits = pseudo_code_rows(zv, zt, vi, ti, tau, 0.8, gamma)
    s_vt = F.normalize(zv, dim=1) @ F.normalize(zt, dim=1).T / tau
    # pseudo-code: column j is gone, so anchor j's positive s_jj is in none of its logits ...
    assert not torch.isclose(logits[j], s_vt[j, j]).any()
    # ... and anchor j's label j now points at text j + 1 (shifted columns)
    assert torch.isclose(logits[j, j], s_vt[j, j + 1])
    # ours: the positive of every anchor is kept; the pruned text only leaves the negatives
    ours = crossclr_loss(zv, zt, vi, ti, temperature=tau, intra_weight=0.8,
                         prune_threshold=gamma, weight_scale=None)
    ref = naive_crossclr(zv, zt, vi, ti, tau, 0.8, gamma, None)
    assert ours.item() == pytest.approx(ref.item(), abs=1e-10)


def test_weights_are_a_weighted_mean_and_stable_for_small_kappa():
    zx, zy, xi, yi = _data(seed=6)
    uni = crossclr_loss(zx, zy, xi, yi, prune_threshold=None, weight_scale=None)
    flat = crossclr_loss(zx, zy, xi, yi, prune_threshold=None, weight_scale=1e12)
    assert flat.item() == pytest.approx(uni.item(), abs=1e-9)  # kappa -> inf: uniform
    tiny = crossclr_loss(zx.float(), zy.float(), xi.float(), yi.float(), weight_scale=1e-4)
    assert torch.isfinite(tiny)
    with pytest.raises(ValueError, match="weight_scale"):
        crossclr_loss(zx, zy, xi, yi, weight_scale=1e-4, weight_norm="none")


def test_gradcheck():
    zx, zy, xi, yi = _data(n=5, d=3, seed=7)
    zx.requires_grad_(), zy.requires_grad_()
    for kw in (dict(prune_threshold=0.95, weight_scale=0.1),
               dict(prune_threshold=None, weight_scale=None, num_positives=1, positive_weight=0.5)):
        assert torch.autograd.gradcheck(
            lambda a, b: crossclr_loss(a, b, xi, yi, temperature=0.3, **kw), (zx, zy))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_finite_under_autocast(dtype):
    zx, zy, xi, yi = _data(n=16, d=8, seed=8)
    zx, zy = zx.to(dtype).requires_grad_(), zy.to(dtype).requires_grad_()
    with torch.autocast("cpu", dtype=dtype):
        loss = crossclr_loss(zx, zy, xi.to(dtype), yi.to(dtype), temperature=0.01)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(zx.grad).all() and torch.isfinite(zy.grad).all()


def test_bad_input():
    zx, zy, xi, yi = _data()
    with pytest.raises(ValueError, match="video_input"):
        crossclr_loss(zx, zy, None, yi)
    with pytest.raises(ValueError, match="text_input"):
        crossclr_loss(zx, zy, xi, yi[:5])
    with pytest.raises(ValueError, match="differ"):
        crossclr_loss(zx, zy[:5], xi, yi)
    with pytest.raises(ValueError, match="temperature"):
        crossclr_loss(zx, zy, xi, yi, temperature=0.0)
    with pytest.raises(ValueError, match="intra_weight"):
        crossclr_loss(zx, zy, xi, yi, intra_weight=-1.0)
    bad = xi.clone()
    bad[0, 0] = math.nan
    with pytest.raises(ValueError, match="video_input"):
        crossclr_loss(zx, zy, bad, yi)
    with pytest.raises(ValueError, match="video_bank"):
        crossclr_loss(zx, zy, xi, yi, video_bank=torch.rand(10, xi.shape[1] + 1, dtype=torch.float64))
    nan_bank = torch.rand(10, xi.shape[1], dtype=torch.float64)
    nan_bank[3, 1] = math.nan
    with pytest.raises(ValueError, match="video_bank"):
        crossclr_loss(zx, zy, xi, yi, video_bank=nan_bank)


def test_symmetry_and_permutation_invariance():
    zx, zy, xi, yi = _data(seed=9)
    kw = dict(temperature=0.1, prune_threshold=0.93, weight_scale=0.05, num_positives=1)
    a = crossclr_loss(zx, zy, xi, yi, **kw)
    assert crossclr_loss(zy, zx, yi, xi, **kw).item() == pytest.approx(a.item(), abs=1e-12)
    p = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    assert crossclr_loss(zx[p], zy[p], xi[p], yi[p], **kw).item() == pytest.approx(a.item(), abs=1e-12)


@pytest.mark.parametrize("lam", [0.0, 0.8])
def test_analytic_all_equal_embeddings(lam):
    """All deltas equal: L_i = log(B + lambda (B - 1)) for every anchor (no pruning)."""
    z = torch.ones(6, 4, dtype=torch.float64)
    _, _, xi, yi = _data(n=6)
    got = crossclr_loss(z, z, xi, yi, temperature=0.05, intra_weight=lam, prune_threshold=None,
                        weight_scale=0.1)
    assert got.item() == pytest.approx(math.log(6 + lam * 5), abs=1e-12)
