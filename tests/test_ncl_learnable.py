"""NCL with a learnable temperature (CLIP4Clip's logit_scale): value, gradients against a
float64 loop transcription of Fig. 4 / eqs. 4 and 7-12, clamp, learning, state."""

import math

import pytest
import torch

from xmodal.functional.ncl import ncl_loss
from xmodal.losses.ncl import NCL


def naive_sinkhorn(s, gamma, iters):
    """Plain Sinkhorn-Knopp (eqs. 7-9) on M = exp(s / gamma) with uniform marginals."""
    n, m = len(s), len(s[0])
    k = [[math.exp(s[i][j] / gamma) for j in range(m)] for i in range(n)]
    alpha, beta = [1.0] * n, [1.0] * m
    for _ in range(iters):
        alpha = [(1 / n) / sum(k[i][j] * beta[j] for j in range(m)) for i in range(n)]
        beta = [(1 / m) / sum(k[i][j] * alpha[i] for i in range(n)) for j in range(m)]
    return alpha, beta


def naive_learnable_ncl(video, text, logit_scale, iters):
    """gamma = exp(-logit_scale). Fig. 4 scales the kernel exp(S), S = s / gamma: its
    scalings log(alpha / sum alpha), log(beta / sum beta) (= a / gamma, b / gamma of eqs.
    10-11 at the current gamma) are constants of the step; eq. 4 on the logits
    S_ij + log alpha_i + log beta_j. Loops; float64."""
    v = torch.nn.functional.normalize(video, dim=1)
    t = torch.nn.functional.normalize(text, dim=1)
    n = v.shape[0]
    gamma = math.exp(-float(logit_scale.detach()))
    s = [[float(t[i].detach() @ v[j].detach()) for j in range(n)] for i in range(n)]
    alpha, beta = naive_sinkhorn(s, gamma, iters)
    la = [math.log(x / sum(alpha)) for x in alpha]
    lb = [math.log(x / sum(beta)) for x in beta]
    scale = logit_scale.exp()
    t2v = v2t = 0.0
    for i in range(n):
        row = [scale * (t[i] @ v[k]) + la[i] + lb[k] for k in range(n)]
        col = [scale * (t[k] @ v[i]) + la[k] + lb[i] for k in range(n)]
        t2v = t2v - (row[i] - torch.log(sum(torch.exp(x) for x in row)))
        v2t = v2t - (col[i] - torch.log(sum(torch.exp(x) for x in col)))
    return (t2v / n + v2t / n) / 2


def _batch(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(n, d, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("seed, n, d, tau, iters", [(0, 6, 5, 0.1, 4), (1, 4, 3, 0.5, 1), (2, 9, 8, 0.05, 10)])
def test_learnable_matches_naive_value_and_gradients(seed, n, d, tau, iters):
    v, t = _batch(n, d, seed)
    mod = NCL(temperature=tau, sinkhorn_iters=iters, queue_size=0, learnable=True).double()
    v1, t1 = v.clone().requires_grad_(), t.clone().requires_grad_()
    loss = mod(v1, t1)
    loss.backward()
    ls = mod.logit_scale.detach().clone().requires_grad_()  # float32-initialised value
    v2, t2 = v.clone().requires_grad_(), t.clone().requires_grad_()
    ref = naive_learnable_ncl(v2, t2, ls, iters)
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), abs=1e-9)
    assert mod.logit_scale.grad is not None and float(mod.logit_scale.grad) != 0.0
    assert float(mod.logit_scale.grad) == pytest.approx(float(ls.grad), abs=1e-8)
    assert torch.allclose(v1.grad, v2.grad, atol=1e-9) and torch.allclose(t1.grad, t2.grad, atol=1e-9)
    # same value as the fixed temperature (only the gradient w.r.t. gamma is new)
    fixed = NCL(temperature=math.exp(-float(ls.detach())), sinkhorn_iters=iters, queue_size=0)(v, t)
    assert loss.item() == pytest.approx(fixed.item(), abs=1e-12)


def test_functional_tensor_temperature_gradcheck():
    v, t = _batch(5, 4, 3)
    v.requires_grad_()
    tau = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    a = torch.randn(5, dtype=torch.float64) * 0.1
    b = torch.randn(5, dtype=torch.float64) * 0.1
    # with given biases the loss is a smooth function of the video: exact gradients
    assert torch.autograd.gradcheck(
        lambda x: ncl_loss(x, t, temperature=tau, biases=(a, b)), (v,))
    # the gradient w.r.t. gamma is the one of s / gamma alone (biases: logit constants)
    loss = ncl_loss(v, t, temperature=tau, biases=(a, b))
    (g_tau,) = torch.autograd.grad(loss, tau)
    eps = 1e-6
    sg = [ncl_loss(v, t, temperature=0.3 + e, biases=(a * (0.3 + e) / 0.3, b * (0.3 + e) / 0.3)).item()
          for e in (eps, -eps)]
    assert float(g_tau) == pytest.approx((sg[0] - sg[1]) / (2 * eps), abs=1e-6)


def test_temperature_property_clamp_and_state():
    mod = NCL(temperature=0.05, learnable=True, queue_size=0)
    assert isinstance(mod.temperature, torch.Tensor) and mod.temperature.requires_grad
    assert float(mod.temperature.detach()) == pytest.approx(0.05, rel=1e-6)
    assert "logit_scale" in mod.state_dict() and [n for n, _ in mod.named_parameters()] == ["logit_scale"]
    with torch.no_grad():
        mod.logit_scale.fill_(10.0)  # 1/gamma = e^10 > 100: clamped
    assert float(mod.temperature.detach()) == pytest.approx(0.01, rel=1e-6)
    assert NCL(0.07).temperature == 0.07 and list(NCL(0.07).parameters()) == []
    assert NCL.accepts == ("ids", "temperature")


def test_temperature_learns():
    """The exposing case: with learnable=True the temperature moves under SGD."""
    torch.manual_seed(0)
    v, t = _batch(16, 8, 4)
    v = (v + 2 * t).float()
    t = t.float()
    mod = NCL(temperature=0.5, learnable=True, queue_size=0)
    before = float(mod.temperature.detach())
    for _ in range(20):
        mod.zero_grad()
        mod(v, t).backward()
        with torch.no_grad():
            mod.logit_scale -= 0.5 * mod.logit_scale.grad
    assert float(mod.temperature.detach()) < 0.8 * before   # aligned pairs: a sharper softmax helps
