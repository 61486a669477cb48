"""InfoNCE, NTXent, MaxMargin, MIMaxMargin, MILNCE, DebiasedContrastive against the
naive loop implementations in ``test_losses_base_naive.py``, analytic values, symmetry,
gradcheck, low-precision stability and bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import test_losses_base_naive as naive
from xmodal.functional.dcl import debiased_contrastive
from xmodal.functional.infonce import info_nce
from xmodal.functional.maxmargin import max_margin
from xmodal.functional.milnce import mil_nce
from xmodal.functional.mimaxmargin import mi_max_margin
from xmodal.functional.ntxent import nt_xent
from xmodal.losses import (LOSSES, MILNCE, DebiasedContrastive, InfoNCE, MaxMargin, MIMaxMargin,
                           NTXent, build_loss)

B, D = 6, 5
IDS = torch.tensor([3, 3, 1, 7, 7, 7])


def pair(seed=0, b=B, d=D, dtype=torch.float64, grad=False):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(b, d, generator=g, dtype=dtype)
    t = torch.randn(b, d, generator=g, dtype=dtype)
    if grad:
        v.requires_grad_(True)
        t.requires_grad_(True)
    return v, t


def relevancy(seed=0, b=B):
    g = torch.Generator().manual_seed(seed)
    r = torch.rand(b, b, generator=g, dtype=torch.float64)
    r.fill_diagonal_(1.0)
    return r


def assert_same_value_and_grad(fast, slow, seed=0):
    v1, t1 = pair(seed, grad=True)
    v2, t2 = pair(seed, grad=True)
    a, b = fast(v1, t1), slow(v2, t2)
    assert abs(float(a.detach()) - float(b.detach())) < 1e-6 * max(1.0, abs(float(b.detach())))
    a.backward()
    b.backward()
    torch.testing.assert_close(v1.grad, v2.grad, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(t1.grad, t2.grad, atol=1e-6, rtol=1e-6)


TAU_VEC = torch.tensor([0.05, 0.1, 0.2, 0.07, 0.5, 0.3], dtype=torch.float64)
TAU_VEC2 = torch.tensor([0.3, 0.06, 0.1, 0.2, 0.08, 0.4], dtype=torch.float64)
M_VEC = torch.tensor([0.1, 0.2, 0.0, 0.5, 0.3, 0.25], dtype=torch.float64)

# (name, fast, slow): the equality cases
CASES = [
    ("infonce", lambda v, t: info_nce(v, t, temperature=0.1), lambda v, t: naive.infonce(v, t, 0.1)),
    ("infonce-ids", lambda v, t: info_nce(v, t, temperature=0.2, ids=IDS),
     lambda v, t: naive.infonce(v, t, 0.2, ids=IDS)),
    ("infonce-per-sample", lambda v, t: info_nce(v, t, temperature=TAU_VEC),
     lambda v, t: naive.infonce(v, t, TAU_VEC)),
    ("infonce-directions", lambda v, t: info_nce(v, t, t2v_temperature=TAU_VEC, v2t_temperature=0.3),
     lambda v, t: naive.infonce(v, t, TAU_VEC, 0.3)),
    ("infonce-unnormalised", lambda v, t: info_nce(v, t, temperature=2.0, normalize=False),
     lambda v, t: naive.infonce(v, t, 2.0, normalize=False)),
    ("ntxent", lambda v, t: nt_xent(v, t, temperature=0.1), lambda v, t: naive.ntxent(v, t, 0.1)),
    ("ntxent-ids-directions",
     lambda v, t: nt_xent(v, t, t2v_temperature=TAU_VEC, v2t_temperature=TAU_VEC2, ids=IDS),
     lambda v, t: naive.ntxent(v, t, TAU_VEC, TAU_VEC2, ids=IDS)),
    ("maxmargin", lambda v, t: max_margin(v, t, margin=0.3), lambda v, t: naive.maxmargin(v, t, 0.3)),
    ("maxmargin-ids-per-sample", lambda v, t: max_margin(v, t, margin=M_VEC, ids=IDS),
     lambda v, t: naive.maxmargin(v, t, M_VEC, ids=IDS)),
    ("maxmargin-sum-eq-3.3", lambda v, t: max_margin(v, t, margin=M_VEC, ids=IDS, negative_reduction="sum"),
     lambda v, t: naive.maxmargin(v, t, M_VEC, ids=IDS, summed=True)),
    ("maxmargin-hardest", lambda v, t: max_margin(v, t, margin=M_VEC, hardest=True),
     lambda v, t: naive.maxmargin(v, t, M_VEC, hardest=True)),
    ("maxmargin-hardest-ids", lambda v, t: max_margin(v, t, margin=0.4, ids=IDS, hardest=True),
     lambda v, t: naive.maxmargin(v, t, 0.4, ids=IDS, hardest=True)),
    ("mimaxmargin", lambda v, t: mi_max_margin(v, t, relevancy(), margin=M_VEC, threshold=0.4),
     lambda v, t: naive.mimaxmargin(v, t, relevancy(), M_VEC, 0.4)),
    ("milnce-ids", lambda v, t: mil_nce(v, t, temperature=TAU_VEC, ids=IDS),
     lambda v, t: naive.milnce(v, t, TAU_VEC, IDS)),
    ("dcl", lambda v, t: debiased_contrastive(v, t, temperature=0.5, tau_plus=0.1),
     lambda v, t: naive.dcl(v, t, 0.5, 0.1)),
    ("dcl-ids-per-sample", lambda v, t: debiased_contrastive(v, t, temperature=TAU_VEC, tau_plus=0.2, ids=IDS),
     lambda v, t: naive.dcl(v, t, TAU_VEC, 0.2, ids=IDS)),
]


@pytest.mark.parametrize("name,fast,slow", CASES, ids=[c[0] for c in CASES])
def test_equals_naive_loops(name, fast, slow):
    for seed in (0, 1):
        assert_same_value_and_grad(fast, slow, seed)


def test_dcl_clamp_branch_equals_naive():
    # tau_plus large: the estimator goes below N e^{-1/t} for some rows and the clamp acts
    v, t = pair(2)
    t = v + 0.05 * t
    fast = debiased_contrastive(v, t, temperature=0.5, tau_plus=0.9)
    assert abs(float(fast) - float(naive.dcl(v, t, 0.5, 0.9))) < 1e-9


def test_infonce_matches_clip_cross_entropy():
    v, t = pair(3)
    vn, tn = F.normalize(v, dim=1), F.normalize(t, dim=1)
    logits = vn @ tn.T / 0.07
    labels = torch.arange(B)
    ref = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
    assert abs(float(InfoNCE(0.07)(v, t)) - float(ref)) < 1e-10


def test_reductions_between_losses():
    v, t = pair(4)
    ref = info_nce(v, t, temperature=0.1)
    assert abs(float(mil_nce(v, t, temperature=0.1)) - float(ref)) < 1e-12  # no ids: one positive
    unique = torch.arange(B)
    assert abs(float(mil_nce(v, t, temperature=0.1, ids=unique)) - float(ref)) < 1e-12
    # tau_plus = 0 and unit vectors: the clamp never acts, DCL is InfoNCE
    assert abs(float(debiased_contrastive(v, t, temperature=0.1, tau_plus=0.0)) - float(ref)) < 1e-12
    eye = torch.eye(B, dtype=torch.float64)
    assert abs(float(mi_max_margin(v, t, eye, margin=0.2)) - float(max_margin(v, t, margin=0.2))) < 1e-12


def test_official_mimm_normalisation():
    # the EPIC-100 MI-MM baseline: relu(margin - (diag - x)) averaged over off-diagonal
    # entries, summed over the two directions == 2 * our MaxMargin
    v, t = pair(5)
    vn, tn = F.normalize(v, dim=1), F.normalize(t, dim=1)
    total = 0.0
    for x in (tn @ vn.T, (tn @ vn.T).T):
        diag = x.diag()[:, None].expand(B, B)
        off = ~torch.eye(B, dtype=torch.bool)
        total += F.relu(0.2 - (diag - x))[off].mean()
    assert abs(float(total) - 2 * float(MaxMargin(0.2)(v, t))) < 1e-12


def test_rows_partition_equals_full_batch():
    """Per-rank rows (local_loss) average back to the full-batch loss."""
    v, t = pair(6)
    rel = relevancy(6)
    fns = [lambda **k: info_nce(v, t, temperature=TAU_VEC, ids=IDS, **k),
           lambda **k: nt_xent(v, t, temperature=TAU_VEC, ids=IDS, **k),
           lambda **k: max_margin(v, t, margin=M_VEC, ids=IDS, **k),
           lambda **k: max_margin(v, t, margin=0.3, hardest=True, **k),
           lambda **k: mi_max_margin(v, t, rel, **k),
           lambda **k: mil_nce(v, t, ids=IDS, **k),
           lambda **k: debiased_contrastive(v, t, ids=IDS, **k)]
    for fn in fns:
        halves = (fn(rows=slice(0, 3)) + fn(rows=torch.tensor([3, 4, 5]))) / 2
        assert abs(float(halves) - float(fn())) < 1e-12


def test_analytic_aligned_orthogonal_is_zero():
    v = torch.eye(B, 8, dtype=torch.float64)
    for loss in (InfoNCE(0.01), NTXent(0.01), MILNCE(0.01), DebiasedContrastive(0.01, 0.1)):
        assert float(loss(v, v.clone())) < 1e-30
    assert float(MaxMargin(0.2)(v, v.clone())) == 0.0
    assert float(MaxMargin(0.2, hardest=True)(v, v.clone())) == 0.0
    assert float(MIMaxMargin(0.2)(v, v.clone(), relevancy=torch.eye(B))) == 0.0


def test_analytic_all_equal_embeddings():
    x = torch.ones(B, D, dtype=torch.float64)
    assert abs(float(InfoNCE(0.05)(x, x)) - math.log(B)) < 1e-12
    assert abs(float(MILNCE(0.05)(x, x)) - math.log(B)) < 1e-12
    assert abs(float(NTXent(0.05)(x, x)) - math.log(2 * B - 1)) < 1e-12
    assert abs(float(DebiasedContrastive(0.05, 0.3)(x, x)) - math.log(B)) < 1e-12
    assert abs(float(MaxMargin(0.2)(x, x)) - 0.2) < 1e-12
    assert abs(float(MaxMargin(0.2, hardest=True)(x, x)) - 0.2) < 1e-12
    # ids: three instances of two rows each -> log(B - 1) per row (one masked entry)
    ids = torch.tensor([0, 0, 1, 1, 2, 2])
    assert abs(float(InfoNCE(0.05)(x, x, ids=ids)) - math.log(B - 1)) < 1e-12
    assert abs(float(MILNCE(0.05)(x, x, ids=ids)) - math.log(B / 2)) < 1e-12


@pytest.mark.parametrize("name", ["infonce", "ntxent", "maxmargin", "milnce", "dcl"])
def test_symmetric_in_the_two_modalities(name):
    v, t = pair(7)
    loss = build_loss(name)
    kw = {"ids": IDS}
    assert abs(float(loss(v, t, **kw)) - float(loss(t, v, **kw))) < 1e-12


def test_mimaxmargin_symmetric_with_transposed_relevancy():
    v, t = pair(8)
    rel = relevancy(8)
    loss = MIMaxMargin(0.3, threshold=0.4)
    assert abs(float(loss(v, t, relevancy=rel)) - float(loss(t, v, relevancy=rel.T))) < 1e-12


def test_per_direction_temperatures_are_used():
    v, t = pair(9)
    both = info_nce(v, t, temperature=0.1)
    mixed = info_nce(v, t, t2v_temperature=0.1, v2t_temperature=0.5)
    assert abs(float(both) - float(mixed)) > 1e-3
    module = InfoNCE(0.1, t2v_temperature=0.1, v2t_temperature=0.5)
    assert abs(float(module(v, t)) - float(mixed)) < 1e-12


GRADCHECK = [
    lambda v, t, s: info_nce(v, t, temperature=s, ids=IDS),
    lambda v, t, s: nt_xent(v, t, temperature=s, ids=IDS),
    lambda v, t, s: max_margin(v, t, margin=s, ids=IDS),
    lambda v, t, s: mi_max_margin(v, t, relevancy(), margin=s),
    lambda v, t, s: mil_nce(v, t, temperature=s, ids=IDS),
    lambda v, t, s: debiased_contrastive(v, t, temperature=s, tau_plus=0.1),
]


@pytest.mark.parametrize("i", range(len(GRADCHECK)))
def test_gradcheck_float64(i):
    v, t = pair(10, grad=True)
    s = (TAU_VEC.clone() + 0.2).requires_grad_(True)
    assert torch.autograd.gradcheck(GRADCHECK[i], (v, t, s), eps=1e-6, atol=1e-5)


def test_gradcheck_hardest():
    v, t = pair(11, grad=True)
    assert torch.autograd.gradcheck(lambda a, b: max_margin(a, b, margin=0.5, hardest=True), (v, t))


def make(name):
    return LOSSES[name](0.01) if name not in ("maxmargin", "mimaxmargin") else LOSSES[name]()


def extra(name, b):
    return {"relevancy": torch.eye(b)} if name == "mimaxmargin" else {"ids": torch.arange(b) // 2}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["infonce", "ntxent", "maxmargin", "mimaxmargin", "milnce", "dcl"])
def test_low_precision_finite(name, dtype):
    """Autocast at temperature 0.01: exp(1/0.01) = e^100 overflows if exponentiated
    directly (float16 already at logits > 11); the losses compute float32 logits with
    logsumexp and agree with a float32 run on the same (rounded) inputs."""
    torch.manual_seed(0)
    b = 32
    v = torch.randn(b, 16, requires_grad=True)
    t = torch.randn(b, 16, requires_grad=True)
    loss_fn = make(name)
    with torch.autocast("cpu", dtype=dtype):
        v16, t16 = v @ torch.eye(16), (v + 0.01 * t) @ torch.eye(16)  # 16-bit, near-aligned
        assert v16.dtype == dtype
        loss = loss_fn(v16, t16, **extra(name, b))
    loss.backward()
    assert loss.dtype == torch.float32
    assert torch.isfinite(loss) and torch.isfinite(v.grad).all() and torch.isfinite(t.grad).all()
    ref = loss_fn(v16.detach().float(), t16.detach().float(), **extra(name, b))
    assert abs(float(loss.detach()) - float(ref.detach())) <= 1e-5 * max(1.0, abs(float(ref.detach())))
    vh = v.detach().to(dtype).requires_grad_(True)  # plain 16-bit inputs, no autocast
    th = (v.detach() + 0.01 * t.detach()).to(dtype).requires_grad_(True)
    loss = loss_fn(vh, th, **extra(name, b))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(vh.grad.float()).all()
    assert vh.grad.dtype == dtype


def test_float16_matches_float32():
    v, t = pair(12, dtype=torch.float32)
    a = InfoNCE(0.01)(v.half(), t.half())
    b = InfoNCE(0.01)(v.half().float(), t.half().float())
    assert abs(float(a) - float(b)) < 1e-4 * float(b)


def test_learnable_temperature():
    loss = InfoNCE(0.07, learnable=True)
    assert abs(float(loss.temperature.detach()) - 0.07) < 1e-6
    v, t = pair(13, dtype=torch.float32)
    out = loss(v, t)
    assert abs(float(out.detach()) - float(InfoNCE(0.07)(v, t).detach())) < 1e-5
    out.backward()
    assert loss.logit_scale.grad is not None and loss.logit_scale.grad != 0
    with torch.no_grad():
        loss.logit_scale.fill_(10.0)  # 1/tau = e^10 > 100: clamped at the CLIP maximum
    assert abs(float(loss.temperature.detach()) - 0.01) < 1e-7
    loss.zero_grad()
    loss(v, t).backward()
    assert float(loss.logit_scale.grad) == 0.0  # clamped: no gradient, as CLIP
    assert float(InfoNCE(0.07, learnable=True)(v, t, temperature=0.5).detach()) == pytest.approx(
        float(InfoNCE(0.5)(v, t)), abs=1e-6)


def test_batch_of_one():
    v, t = pair(14, b=1)
    for name in ("infonce", "ntxent", "milnce"):
        assert float(LOSSES[name]()(v, t)) == 0.0  # only the positive logit is left
    assert float(MaxMargin()(v, t)) == 0.0  # no negatives
    assert float(MIMaxMargin()(v, t, relevancy=torch.ones(1, 1))) == 0.0
    with pytest.raises(ValueError, match="negative"):
        DebiasedContrastive()(v, t)
    with pytest.raises(ValueError, match="negative"):
        DebiasedContrastive()(*pair(14, b=3), ids=torch.tensor([1, 1, 1]))


@pytest.mark.parametrize("name", sorted(["infonce", "ntxent", "maxmargin", "mimaxmargin", "milnce", "dcl"]))
def test_bad_input(name):
    cls = LOSSES[name]
    loss = cls()
    v, t = pair(15)
    kw = {"relevancy": torch.eye(B)} if name == "mimaxmargin" else {}
    with pytest.raises(ValueError, match="video and text"):
        loss(v, t[:4], **kw)
    bad = v.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="video"):
        loss(bad, t, **kw)
    with pytest.raises(ValueError, match="text"):
        loss(v, t.masked_fill(t > 1, float("inf")), **kw)
    with pytest.raises(ValueError):
        loss(v[0], t[0], **kw)
    with pytest.raises(TypeError):
        loss("video", t, **kw)
    key = "margin" if name in ("maxmargin", "mimaxmargin") else "temperature"
    bad_value = -0.1 if key == "margin" else 0.0
    with pytest.raises(ValueError, match=key):
        cls(bad_value)
    per_sample = torch.full((B,), 0.1, dtype=torch.float64)
    per_sample[3] = bad_value
    with pytest.raises(ValueError, match=key):
        loss(v, t, **{key: per_sample}, **kw)
    with pytest.raises(ValueError, match=key):
        loss(v, t, **{key: torch.full((B + 1,), 0.1)}, **kw)
    if "ids" in cls.accepts:
        with pytest.raises(ValueError, match="ids"):
            loss(v, t, ids=torch.arange(B + 1))
        with pytest.raises(TypeError, match="ids"):
            loss(v, t, ids=torch.arange(B).double())


def test_registry_and_accepts():
    assert set(LOSSES) >= {"infonce", "ntxent", "maxmargin", "mimaxmargin", "milnce", "dcl"}
    vocabulary = {"ids", "temperature", "margin", "video_input", "text_input", "relevancy",
                  "t2v_temperature", "v2t_temperature"}
    for cls in LOSSES.values():
        assert set(cls.accepts) <= vocabulary
    assert isinstance(build_loss("InfoNCE", temperature=0.1), InfoNCE)
    with pytest.raises(ValueError, match="unknown loss"):
        build_loss("nope")
    with pytest.raises(ValueError, match="relevancy"):
        MIMaxMargin()(*pair(16))
    with pytest.raises(ValueError, match="tau_plus"):
        DebiasedContrastive(0.1, tau_plus=1.0)


def test_inputs_not_mutated_and_numpy_accepted():
    v, t = pair(17)
    v0, t0 = v.clone(), t.clone()
    InfoNCE()(v, t)
    assert torch.equal(v, v0) and torch.equal(t, t0)
    out = InfoNCE()(v.numpy(), t.numpy())
    assert abs(float(out) - float(InfoNCE()(v, t))) < 1e-12


def test_mimaxmargin_sorted_form_equals_triplet_enumeration():
    """The O(B^2 log B) prefix-sum form against all |P| x |N| triplets, larger batch."""
    g = torch.Generator().manual_seed(18)
    b = 24
    v = torch.randn(b, 7, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(b, 7, generator=g, dtype=torch.float64, requires_grad=True)
    rel = torch.rand(b, b, generator=g, dtype=torch.float64)
    rel[3] = 0.0  # an anchor with no positive
    rel[:, 5] = 1.0  # a text with no negative video
    m = torch.rand(b, generator=g, dtype=torch.float64)
    fast = mi_max_margin(v, t, rel, margin=m, threshold=0.7)
    vn, tn = F.normalize(v, dim=1), F.normalize(t, dim=1)
    brute = []
    for s, pos in ((vn @ tn.T, rel >= 0.7), (tn @ vn.T, (rel >= 0.7).T)):
        hinge = (m[:, None, None] + s[:, None, :] - s[:, :, None]).clamp_min(0)  # [anchor, p, n]
        valid = pos[:, :, None] & ~pos[:, None, :]
        per = (hinge * valid).sum((1, 2)) / valid.sum((1, 2)).clamp_min(1)
        brute.append(per.mean())
    brute = (brute[0] + brute[1]) / 2
    assert abs(float(fast.detach()) - float(brute.detach())) < 1e-12
    gf = torch.autograd.grad(fast, (v, t))
    gb = torch.autograd.grad(brute, (v, t))
    for a, b_ in zip(gf, gb):
        torch.testing.assert_close(a, b_, atol=1e-12, rtol=1e-10)


def test_milnce_joint_equals_official_howto100m_form():
    g = torch.Generator().manual_seed(19)
    nv, k = 4, 3
    video = torch.randn(nv, D, generator=g, dtype=torch.float64, requires_grad=True)
    text = torch.randn(nv * k, D, generator=g, dtype=torch.float64, requires_grad=True)
    groups = [[text[i * k + j] for j in range(k)] for i in range(nv)]
    ref = naive.milnce_official(video, groups, 0.5)
    ids = torch.arange(nv).repeat_interleave(k)
    ours = mil_nce(video.repeat_interleave(k, dim=0), text, temperature=0.5, ids=ids,
                   normalize=False, joint=True)
    assert abs(float(ours.detach()) - float(ref.detach())) < 1e-10
    for a, b in zip(torch.autograd.grad(ours, (video, text)), torch.autograd.grad(ref, (video, text))):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)
    # the official code vectorised (x: [videos, videos, K]; no temperature there)
    x = (video @ text.T).view(nv, nv, k)
    num = torch.logsumexp(x[torch.arange(nv), torch.arange(nv)], dim=1)
    den = torch.logsumexp(torch.cat((x, x.permute(1, 0, 2)), dim=1).view(nv, -1), dim=1)
    official = (den - num).mean()
    module = MILNCE(1.0, normalize=False, joint=True)
    assert abs(float(module(video.repeat_interleave(k, dim=0), text, ids=ids).detach()) - float(official.detach())) < 1e-10
    with pytest.raises(ValueError, match="joint"):
        mil_nce(video, video, temperature=torch.ones(nv), joint=True)
    with pytest.raises(ValueError, match="joint"):
        MILNCE(joint=True, local_loss=True)


def _one_line(exc_info, name):
    msg = str(exc_info.value)
    assert "\n" not in msg and msg.startswith(name), msg


@pytest.mark.parametrize("cls, kwargs, name", [
    # a tensor as a flag: bool() of it raised "RuntimeError: Boolean value of Tensor ..."
    (InfoNCE, dict(learnable=torch.tensor([-0.7, 0.6, 0.7])), "learnable"),
    (InfoNCE, dict(gather=torch.zeros(2, 3)), "gather"),
    (NTXent, dict(normalize=torch.zeros(0, 2, dtype=torch.long)), "normalize"),
    (MaxMargin, dict(local_loss=torch.ones(2, 4, 2)), "local_loss"),
    (MILNCE, dict(local_loss=torch.ones(4, 4, dtype=torch.long)), "local_loss"),
    # a string is not read as True
    (MaxMargin, dict(hardest="false"), "hardest"),
])
def test_junk_flags_refused_in_one_line(cls, kwargs, name):
    with pytest.raises(TypeError) as exc:
        cls(**kwargs)
    _one_line(exc, name)


@pytest.mark.parametrize("make, name, error", [
    # an array where a number is expected: once a multi-line message with the array's repr
    (lambda: MIMaxMargin(margin=torch.rand(2, 5) < 0.5), "margin", TypeError),
    (lambda: MIMaxMargin(threshold=torch.ones(3)), "threshold", TypeError),
    (lambda: DebiasedContrastive(tau_plus=torch.ones(3)), "tau_plus", TypeError),  # was a RuntimeError
    (lambda: MaxMargin(margin=float("nan")), "margin", ValueError),
])
def test_junk_numbers_refused_in_one_line(make, name, error):
    with pytest.raises(error) as exc:
        make()
    _one_line(exc, name)


def test_valid_flags_and_numbers_still_accepted():
    # numpy bools and 0/1 are flags; numpy scalars and numeric strings are numbers, as before
    import numpy as np

    assert InfoNCE(learnable=np.True_).learnable is True
    assert MaxMargin(hardest=1, margin=np.float32(0.25)).hardest is True
    assert MIMaxMargin(margin="0.5").margin == 0.5
    assert DebiasedContrastive(tau_plus=np.float64(0.2)).tau_plus == 0.2
