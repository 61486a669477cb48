"""CrossCLR (Zolfaghari et al. 2021) against references written here: eqs. 3-8 as explicit
loops (sets of sec. 3.2 / Alg. 1, B.1 max-normalisation, Alg. 2 weights), Algorithm 2's
pseudo-code transcribed (with the documented deviations patched in, and literally), in float64."""

import math

import pytest
import torch
import torch.nn.functional as F

from xmodal.functional.crossclr import (connectivity, connectivity_weights, crossclr_loss,
                                        influence_scores)
from xmodal.losses.infonce import InfoNCE


def cos(a, b):
    return float(a @ b / (a.norm() * b.norm()))


def naive_connectivity(rows):
    """Eq. 4 over the set ``rows``; the sample itself is not its own neighbour (Alg. 2 mask)."""
    m = len(rows)
    return [sum(cos(rows[k], rows[j]) for j in range(m) if j != k) / (m - 1) for k in range(m)]


def naive_crossclr(zx, zy, x_in, y_in, *, tau, lam, gamma, kappa, banks=(None, None),
                   qembs=(None, None), qids=None, ids=None, k_pos=0, beta=0.15,
                   weight_norm="sum", prune_norm="max", intra_mode="delta"):
    n = zx.shape[0]
    zx, zy = F.normalize(zx, dim=1), F.normalize(zy, dim=1)
    taus = [tau] * n if isinstance(tau, float) else [float(x) for x in tau]
    bid = list(range(n)) if ids is None else [int(i) for i in ids]

    def influential(a_in, bank):
        c = naive_connectivity(list(a_in) + ([] if bank is None else list(bank)))
        top = max(abs(v) for v in c)
        scores = c if prune_norm == "none" else [v / top for v in c]  # appendix B.1
        return c[:n], [gamma is not None and s > gamma for s in scores]

    def direction(za, zb, a_in, bank, qemb):
        c, infl = influential(a_in, bank)  # I_x of the ANCHOR's modality prunes every negative
        if kappa is None:
            w = [1.0] * n
        elif weight_norm == "sum":  # Alg. 2: norm_w(prox) = prox / sum(prox)
            w = [math.exp(v / sum(c) / kappa) for v in c]
        else:  # eq. 5
            w = [math.exp(v / kappa) for v in c]
        qe = None if qemb is None else F.normalize(qemb, dim=1)
        losses = []
        for i in range(n):
            def d(p, q):
                return math.exp(float(p @ q) / taus[i])

            def d_intra(p, q):
                return lam * d(p, q) if intra_mode == "delta" else math.exp(lam * float(p @ q) / taus[i])
            others = [k for k in range(n) if k != i and bid[k] != bid[i]]
            cands = [k for k in others if gamma is None or infl[k]]  # topK(I_x)
            extra = sorted(cands, key=lambda k: -cos(a_in[i], a_in[k]))[:k_pos]
            num = d(za[i], zb[i]) + beta * sum(d(za[i], zb[k]) for k in extra)
            den = d(za[i], zb[i]) + sum(d(za[i], zb[k]) for k in others
                                        if not infl[k] and k not in extra)
            if lam > 0:
                den += sum(d_intra(za[i], za[k]) for k in others if not infl[k] and k not in extra)
                for m in range(0 if qe is None else len(qe)):
                    same = ids is not None and qids is not None and int(qids[m]) == bid[i]
                    if not infl[n + m] and not same:
                        den += d_intra(za[i], qe[m])
            losses.append(-math.log(num / den))
        if weight_norm == "none":
            return sum(a * b for a, b in zip(w, losses)) / n
        return sum(a * b for a, b in zip(w, losses)) / sum(w)

    return (direction(zx, zy, x_in, banks[0], qembs[0])
            + direction(zy, zx, y_in, banks[1], qembs[1])) / 2


def alg2_patched(emb_v, emb_t, in_v, in_t, t, threshold, lam, t_w, intra="logit"):
    """Algorithm 2 line by line, with deviations 1-3 patched: diagonal -inf instead of ``*mask``,
    the positive column kept, ``lambda`` in the concatenation and ``t_w = kappa`` in the weights."""
    b = emb_v.shape[0]
    eye = torch.eye(b, dtype=torch.bool)
    emb_v, emb_t = F.normalize(emb_v, dim=1), F.normalize(emb_t, dim=1)
    in_v, in_t = F.normalize(in_v, dim=1), F.normalize(in_t, dim=1)  # eq. 4: cosine

    def half(e_a, e_b, in_a):
        l_ab = e_a @ e_b.T / t
        l_aa = (e_a @ e_a.T / t).masked_fill(eye, -math.inf)
        prox = ((in_a @ in_a.T) * (1 - eye.double())).mean(1)
        scores = prox / prox.max()
        keep = scores <= threshold
        l_aa_p = l_aa.masked_fill(~keep[None, :], -math.inf)
        l_ab_p = l_ab.masked_fill(~(keep[None, :] | eye), -math.inf)
        intra_logits = lam * l_aa_p if intra == "logit" else l_aa_p + math.log(lam)
        loss = F.cross_entropy(torch.cat([l_ab_p, intra_logits], 1), torch.arange(b), reduction="none")
        w = prox / prox.sum()
        loss = loss * torch.exp(w / t_w)
        return loss.sum() / torch.exp(w / t_w).sum()

    return (half(emb_v, emb_t, in_v) + half(emb_t, emb_v, in_t)) / 2


def _data(n=8, d=6, dv=5, dt=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = [torch.randn(n, d, generator=g, dtype=torch.float64) for _ in range(2)]
    # positive, skewed input features (as after ReLU): B.1 scores spread over ~0.6-1, so
    # gamma = 0.9 marks some but not all samples (test_configs_really_prune)
    return (z[0], z[1], torch.rand(n, dv, generator=g, dtype=torch.float64) ** 3,
            torch.rand(n, dt, generator=g, dtype=torch.float64) ** 3)


CONFIGS = [
    dict(tau=0.1, lam=0.8, gamma=None, kappa=None),
    dict(tau=0.1, lam=0.8, gamma=0.9, kappa=None),
    dict(tau=0.1, lam=0.5, gamma=0.95, kappa=0.05),
    dict(tau=0.03, lam=0.8, gamma=0.9, kappa=0.0035),
    dict(tau=0.1, lam=0.0, gamma=0.93, kappa=0.01),
    dict(tau=0.2, lam=1.0, gamma=0.9, kappa=0.0035, k_pos=2, beta=0.15),
    dict(tau=0.2, lam=0.8, gamma=None, kappa=None, k_pos=1, beta=2.0),
    dict(tau=0.1, lam=0.8, gamma=0.9, kappa=0.1, weight_norm="mean"),
    dict(tau=0.1, lam=0.8, gamma=0.9, kappa=0.5, weight_norm="none", intra_mode="logit"),
    dict(tau=0.1, lam=0.8, gamma=0.78, kappa=0.05, prune_norm="none"),
]


def _call(zx, zy, xi, yi, cfg, **kw):
    opts = {k: cfg[k] for k in ("weight_norm", "prune_norm", "intra_mode") if k in cfg}
    return crossclr_loss(zx, zy, xi, yi, temperature=cfg["tau"], intra_weight=cfg["lam"],
                         prune_threshold=cfg["gamma"], weight_scale=cfg["kappa"],
                         num_positives=cfg.get("k_pos", 0), positive_weight=cfg.get("beta", 0.15),
                         **opts, **kw)


def _ref(zx, zy, xi, yi, cfg, **kw):
    opts = {k: cfg[k] for k in ("weight_norm", "prune_norm", "intra_mode") if k in cfg}
    return naive_crossclr(zx, zy, xi, yi, tau=cfg["tau"], lam=cfg["lam"], gamma=cfg["gamma"],
                          kappa=cfg["kappa"], k_pos=cfg.get("k_pos", 0), beta=cfg.get("beta", 0.15),
                          **opts, **kw)


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("shape,seed,with_ids", [((8, 6, 5, 7), 0, False), ((8, 6, 5, 7), 1, True),
                                                 ((11, 4, 9, 3), 2, False)])
def test_matches_naive_loops(cfg, shape, seed, with_ids):
    n, d, dv, dt = shape
    zx, zy, xi, yi = _data(n, d, dv, dt, seed)
    ids = torch.tensor([0, 1, 1, 2, 3, 4, 4, 5]) if with_ids else None
    got = _call(zx, zy, xi, yi, cfg, ids=ids)
    assert got.item() == pytest.approx(_ref(zx, zy, xi, yi, cfg, ids=ids), abs=1e-9, rel=1e-9)


@pytest.mark.parametrize("seed", [0, 3, 5])
def test_configs_really_prune(seed):
    """gamma = 0.9 on B.1 scores marks some, not all, samples, and differently per modality."""
    _, _, xi, yi = _data(seed=seed)
    sv, st = influence_scores(connectivity(xi)) > 0.9, influence_scores(connectivity(yi)) > 0.9
    assert 0 < int(sv.sum()) < 8 and 0 < int(st.sum()) < 8 and not torch.equal(sv, st)


def test_connectivity_excludes_self_and_spans_the_bank():
    _, _, xi, _ = _data(n=6, seed=4)
    bank = torch.rand(5, xi.shape[1], generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = connectivity(xi, bank)
    assert got.shape == (11,)
    assert torch.allclose(got, torch.tensor(naive_connectivity(list(xi) + list(bank)), dtype=got.dtype))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_pruning_uses_the_anchor_modality(seed):
    """A text negative y_j leaves a video anchor's set when its paired VIDEO x_j is influential
    (sec. 3.2, Alg. 1, Alg. 2 ``l_vt[:, scores_v < threshold]``), not when y_j itself is."""
    zx, zy, xi, yi = _data(seed=seed)
    cfg = dict(tau=0.1, lam=0.8, gamma=0.9, kappa=None)
    got = _call(zx, zy, xi, yi, cfg).item()
    assert got == pytest.approx(_ref(zx, zy, xi, yi, cfg), abs=1e-10)
    # the reading "prune y_j when y_j is influential" gives another value on these batches
    swapped = naive_swapped_pruning(zx, zy, xi, yi, 0.1, 0.8, 0.9)
    assert abs(got - swapped) > 1e-4


def naive_swapped_pruning(zx, zy, xi, yi, tau, lam, gamma):
    """The old (wrong) reading: cross negatives pruned by THEIR own modality's influence."""
    n = zx.shape[0]
    zx, zy = F.normalize(zx, dim=1), F.normalize(zy, dim=1)
    ix = [v > gamma for v in influence_scores(connectivity(xi)).tolist()]
    iy = [v > gamma for v in influence_scores(connectivity(yi)).tolist()]

    def direction(za, zb, ia, ib):
        out = 0.0
        for i in range(n):
            d = [math.exp(float(za[i] @ zb[k]) / tau) for k in range(n)]
            r = [math.exp(float(za[i] @ za[k]) / tau) for k in range(n)]
            den = d[i] + sum(d[k] for k in range(n) if k != i and not ib[k])
            den += lam * sum(r[k] for k in range(n) if k != i and not ia[k])
            out -= math.log(d[i] / den)
        return out / n
    return (direction(zx, zy, ix, iy) + direction(zy, zx, iy, ix)) / 2


@pytest.mark.parametrize("seed,n,threshold", [(0, 8, 0.9), (1, 12, 0.9), (2, 16, 0.95), (3, 8, 2.0)])
@pytest.mark.parametrize("lam,kappa", [(0.8, 0.0035), (0.5, 0.01)])
def test_matches_algorithm2_transcription(seed, n, threshold, lam, kappa):
    zv, zt, vi, ti = _data(n=n, seed=seed)
    ref = alg2_patched(zv, zt, vi, ti, 0.03, threshold, lam, kappa)
    got = crossclr_loss(zv, zt, vi, ti, temperature=0.03, intra_weight=lam, prune_threshold=threshold,
                        weight_scale=kappa, intra_mode="logit")
    assert got.item() == pytest.approx(ref.item(), abs=1e-10)
    ref = alg2_patched(zv, zt, vi, ti, 0.03, threshold, lam, kappa, intra="delta")
    got = crossclr_loss(zv, zt, vi, ti, temperature=0.03, intra_weight=lam, prune_threshold=threshold,
                        weight_scale=kappa)
    assert got.item() == pytest.approx(ref.item(), abs=1e-10)


def ess(w):
    return float(w.sum() ** 2 / (w * w).sum())


@pytest.mark.parametrize("seed,n", [(0, 64), (1, 64), (2, 128)])
def test_alg2_weights_and_their_effective_sample_size(seed, n):
    """Alg. 2: w = exp(norm_w(prox) / t_w) with norm_w(x) = x / sum(x), prox = row mean of the
    masked input Gram matrix; at kappa = 0.0035 the weights are far from degenerate, while
    eq. 5 read literally (exp(C / kappa)) puts almost all weight on a few samples."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 32, generator=g, dtype=torch.float64) ** 3  # spread connectivities
    xn = F.normalize(x, dim=1)
    prox = ((xn @ xn.T) * (1 - torch.eye(n, dtype=x.dtype))).mean(1)
    w_alg2 = torch.exp((prox / prox.sum()) / 0.0035)
    got = connectivity_weights(connectivity(x), 0.0035)
    assert torch.allclose(got, n * w_alg2 / w_alg2.sum(), rtol=1e-10)
    assert ess(got) == pytest.approx(ess(w_alg2), rel=1e-10)
    assert ess(got) > 0.5 * n
    eq5 = connectivity_weights(connectivity(x), 0.0035, "mean")
    assert ess(eq5) < 0.1 * n


def test_queue_supplies_pruned_intra_negatives():
    """Alg. 1: the queued samples are intra-modal negatives (N^IR over Q), pruned by their
    connectivity over Q divided by the maximum (B.1); queued rows with the anchor's id are not."""
    g = torch.Generator().manual_seed(11)
    zx, zy, xi, yi = _data(n=6, seed=6)
    bx, by = torch.rand(9, xi.shape[1], generator=g, dtype=torch.float64), torch.rand(
        9, yi.shape[1], generator=g, dtype=torch.float64)
    qx, qy = torch.randn(9, 6, generator=g, dtype=torch.float64), torch.randn(
        9, 6, generator=g, dtype=torch.float64)
    ids, qids = torch.arange(6), torch.tensor([0, 7, 8, 3, 9, 10, 11, 12, 13])
    tau = torch.linspace(0.05, 0.2, 6, dtype=torch.float64)
    for gamma, kappa in ((0.9, 0.0035), (None, None), (0.95, 0.01)):
        cfg = dict(tau=tau, lam=0.8, gamma=gamma, kappa=kappa)
        kw = dict(ids=ids)
        got = _call(zx, zy, xi, yi, cfg, video_bank=bx, text_bank=by, video_queue=qx,
                    text_queue=qy, queue_ids=qids, **kw)
        ref = _ref(zx, zy, xi, yi, cfg, banks=(bx, by), qembs=(qx, qy), qids=qids, **kw)
        assert got.item() == pytest.approx(ref, abs=1e-10)
        no_q = _call(zx, zy, xi, yi, cfg, video_bank=bx, text_bank=by, **kw)
        assert abs(no_q.item() - got.item()) > 1e-3  # the queued negatives count
    # with a queue, some queued rows are pruned at gamma = 0.9 (B.1) and none on raw C
    c = connectivity(xi, bx)
    assert 0 < int((influence_scores(c)[6:] > 0.9).sum()) < 9
    assert int((c > 0.9).sum()) == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_multiple_positives_eq8(seed):
    """Eq. 8: extra positives P_y = {y_k : k in topK(I_x)}, scaled by beta, numerator only."""
    zx, zy, xi, yi = _data(n=10, seed=seed)
    for k_pos, beta in ((2, 0.15), (5, 0.2)):
        cfg = dict(tau=0.1, lam=0.8, gamma=0.9, kappa=0.0035, k_pos=k_pos, beta=beta)
        got = _call(zx, zy, xi, yi, cfg)
        assert got.item() == pytest.approx(_ref(zx, zy, xi, yi, cfg), abs=1e-10)
        assert abs(got.item() - _call(zx, zy, xi, yi, dict(cfg, k_pos=0)).item()) > 1e-6


def test_multiple_positives_default_beta():
    zx, zy, xi, yi = _data(seed=3)
    a = crossclr_loss(zx, zy, xi, yi, num_positives=2)
    b = crossclr_loss(zx, zy, xi, yi, num_positives=2, positive_weight=0.15)
    assert a.item() == b.item()


@pytest.mark.parametrize("ids", [None, torch.tensor([0, 0, 1, 2, 3, 3, 4, 5])])
def test_reduces_to_infonce(ids):
    zx, zy, xi, yi = _data(seed=2)
    ref = InfoNCE(temperature=0.07)(zx, zy, ids=ids)
    for inputs in ((xi, yi), (None, None)):
        got = crossclr_loss(zx, zy, *inputs, temperature=0.07, intra_weight=0.0,
                            prune_threshold=None, weight_scale=None, ids=ids)
        assert got.item() == pytest.approx(ref.item(), abs=1e-12)


def test_literal_pseudo_code_quirks():
    """Alg. 2 taken literally (``* mask``, dropped columns, labels arange): exp(0) = 1 stays in
    every denominator, and an influential anchor's positive column disappears."""
    zv, zt, vi, ti = _data(seed=4)
    n, tau = 8, 0.1
    zvn, ztn = F.normalize(zv, dim=1), F.normalize(zt, dim=1)
    s_vt, s_vv = zvn @ ztn.T / tau, zvn @ zvn.T / tau
    keep_v = influence_scores(connectivity(vi)) < 0.9
    l_vv = (s_vv * (1 - torch.eye(n, dtype=zv.dtype)))[:, keep_v]
    l_vt = s_vt[:, keep_v]
    i = int(torch.nonzero(keep_v)[0])  # a kept anchor left of a pruned column j
    j = int(torch.nonzero(~keep_v & (torch.arange(n) > i))[0])
    assert not torch.isclose(l_vt[j], s_vt[j, j]).any()  # anchor j lost its positive
    rows = F.cross_entropy(torch.cat([l_vt, 1.0 * l_vv], 1), torch.arange(n), reduction="none")
    eye = torch.eye(n, dtype=torch.bool)
    ours_den = torch.logsumexp(torch.cat([s_vt.masked_fill(~keep_v[None, :] & ~eye, -math.inf),
                                          s_vv.masked_fill(~keep_v[None, :] | eye, -math.inf)], 1), 1)
    # anchor i keeps its columns; the literal denominator has one exp(0) = 1 more (diagonal)
    lit_den = rows[i] + l_vt[i, i]
    assert l_vt[i, i] == s_vt[i, i]
    assert float(torch.exp(lit_den)) == pytest.approx(float(torch.exp(ours_den[i])) + 1.0, rel=1e-10)


def test_gradcheck():
    zx, zy, xi, yi = _data(n=5, d=3, seed=7)
    zx.requires_grad_(), zy.requires_grad_()
    for kw in (dict(prune_threshold=0.95, weight_scale=0.1),
               dict(prune_threshold=None, weight_scale=None, num_positives=1, positive_weight=0.5),
               dict(intra_mode="logit", video_bank=xi[:2] + 0.1, text_bank=yi[:2] * 0.5,
                    video_queue=zx.detach()[:2], text_queue=zy.detach()[:2])):
        assert torch.autograd.gradcheck(
            lambda a, b: crossclr_loss(a, b, xi, yi, temperature=0.3, **kw), (zx, zy))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_finite_under_autocast(dtype):
    zx, zy, xi, yi = _data(n=16, d=8, seed=8)
    zx, zy = zx.to(dtype).requires_grad_(), zy.to(dtype).requires_grad_()
    with torch.autocast("cpu", dtype=dtype):
        loss = crossclr_loss(zx, zy, xi.to(dtype), yi.to(dtype), temperature=0.01, num_positives=2)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(zx.grad).all() and torch.isfinite(zy.grad).all()


def test_weights_stable_and_limits():
    zx, zy, xi, yi = _data(seed=6)
    uni = crossclr_loss(zx, zy, xi, yi, prune_threshold=None, weight_scale=None)
    for norm in ("sum", "mean"):
        flat = crossclr_loss(zx, zy, xi, yi, prune_threshold=None, weight_scale=1e12, weight_norm=norm)
        assert flat.item() == pytest.approx(uni.item(), abs=1e-9)  # kappa -> inf: uniform
    assert torch.isfinite(crossclr_loss(zx.float(), zy.float(), xi.float(), yi.float(), weight_scale=1e-6))
    with pytest.raises(ValueError, match="weight_scale"):
        crossclr_loss(zx, zy, xi, yi, weight_scale=1e-4, weight_norm="none")


def test_bad_input():
    zx, zy, xi, yi = _data()
    cases = [(dict(video_input=None), "video_input"), (dict(text_input=yi[:5]), "text_input"),
             (dict(temperature=0.0), "temperature"), (dict(intra_weight=-1.0), "intra_weight"),
             (dict(weight_norm="max"), "weight_norm"), (dict(prune_norm="sum"), "prune_norm"),
             (dict(intra_mode="x"), "intra_mode"), (dict(num_positives=-1), "num_positives"),
             (dict(positive_weight=0.0), "positive_weight"),
             (dict(video_bank=torch.rand(10, xi.shape[1] + 1, dtype=torch.float64)), "video_bank"),
             (dict(video_bank=xi, video_queue=torch.rand(3, 6, dtype=torch.float64)), "video_queue"),
             (dict(video_queue=torch.rand(8, 6, dtype=torch.float64)), "video_queue")]
    for kw, name in cases:
        args = dict(video_input=xi, text_input=yi)
        args.update(kw)
        with pytest.raises(ValueError, match=name):
            crossclr_loss(zx, zy, **args)
    with pytest.raises(ValueError, match="differ"):
        crossclr_loss(zx, zy[:5], xi, yi)
    bad = xi.clone()
    bad[0, 0] = math.nan
    with pytest.raises(ValueError, match="video_input"):
        crossclr_loss(zx, zy, bad, yi)
    nan_bank = torch.rand(10, xi.shape[1], dtype=torch.float64)
    nan_bank[3, 1] = math.nan
    with pytest.raises(ValueError, match="video_bank"):
        crossclr_loss(zx, zy, xi, yi, video_bank=nan_bank)


def test_symmetry_and_permutation_invariance():
    zx, zy, xi, yi = _data(seed=9)
    kw = dict(temperature=0.1, prune_threshold=0.93, weight_scale=0.0035, num_positives=1)
    a = crossclr_loss(zx, zy, xi, yi, **kw)
    assert crossclr_loss(zy, zx, yi, xi, **kw).item() == pytest.approx(a.item(), abs=1e-12)
    p = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    assert crossclr_loss(zx[p], zy[p], xi[p], yi[p], **kw).item() == pytest.approx(a.item(), abs=1e-12)


@pytest.mark.parametrize("lam", [0.0, 0.8])
def test_analytic_all_equal_embeddings(lam):
    """All deltas equal: L_i = log(B + lambda (B - 1)) for every anchor (no pruning)."""
    z = torch.ones(6, 4, dtype=torch.float64)
    _, _, xi, yi = _data(n=6)
    got = crossclr_loss(z, z, xi, yi, temperature=0.05, intra_weight=lam, prune_threshold=None)
    assert got.item() == pytest.approx(math.log(6 + lam * 5), abs=1e-12)


def test_lambda_is_the_released_codes_weight_on_intra_modal_logits():
    """The official release (github.com/amazon-science/crossmodal-contrastive-learning,
    ``trainer/loss.py``, ``CrossCLR_onlyIntraModality``, default ``negative_weight=0.8``)
    concatenates ``[l_vt, w * l_vv]`` of logits already divided by tau: lambda = 0.8 weights
    the intra-modal *logits* (``delta ** lambda``, our ``intra_mode="logit"``). Re-derived
    here as a per-anchor softmax; the release also multiplies the diagonal by 0, leaving
    ``exp(0) = 1`` in every denominator (Alg. 2's quirk 2 in the module doc), which we drop:
    with that term set to -inf instead, the release's formula equals ours."""
    g = torch.Generator().manual_seed(7)
    b, d, tau, lam = 6, 5, 0.1, 0.8
    v = torch.nn.functional.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=1)
    t = torch.nn.functional.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=1)

    def released(x, y, self_term):
        inter, intra = x @ y.T / tau, x @ x.T / tau
        intra = intra * (1 - torch.eye(b, dtype=torch.float64)) if self_term else \
            intra.masked_fill(torch.eye(b, dtype=torch.bool), float("-inf"))
        logits = torch.cat([inter, lam * intra], dim=1)
        return -torch.log_softmax(logits, dim=1).diagonal().mean()

    ours = crossclr_loss(v, t, temperature=tau, intra_weight=lam, prune_threshold=None,
                         weight_scale=None, intra_mode="logit")
    ref = (released(v, t, False) + released(t, v, False)) / 2
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    with_self = (released(v, t, True) + released(t, v, True)) / 2
    assert float(with_self - ours) > 1e-3      # the release's extra exp(0) terms raise the loss
