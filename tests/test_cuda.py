"""CUDA paths: every GPU result equals the CPU result (skips without a GPU).

Run on a machine with CUDA: ``python -m pytest tests/test_cuda.py``. CI machines have no
GPU, so these tests skip there with a message; docs/benchmarks.md records the last GPU run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: GPU paths not exercised")

CUDA = torch.device("cuda")


def _pair(b=64, d=32, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(b, d, generator=g, dtype=dtype)
    t = v + 0.8 * torch.randn(b, d, generator=g, dtype=dtype)
    return v, t


def _loss_inputs(name, v, t):
    kw = {}
    if name in ("crossclr", "calince"):
        kw = {"video_input": v * 2.0, "text_input": t * 2.0}
    if name == "mimaxmargin":
        kw = {"relevancy": torch.eye(v.shape[0], dtype=v.dtype)}
    return kw


@pytest.mark.parametrize("name", ["infonce", "ntxent", "maxmargin", "mimaxmargin", "milnce", "dcl", "crossclr",
                                  "ncl"])
def test_loss_and_gradients_match_cpu(name):
    from xmodal.losses import build_loss

    v, t = _pair()
    out = {}
    for dev in ("cpu", "cuda"):
        torch.manual_seed(0)
        loss_fn = build_loss(name).to(dev).double()
        vv = v.clone().to(dev).requires_grad_(True)
        tt = t.clone().to(dev).requires_grad_(True)
        kw = {k: x.to(dev) for k, x in _loss_inputs(name, v, t).items()}
        loss = loss_fn(vv, tt, **kw)
        loss.backward()
        out[dev] = (loss.detach().cpu(), vv.grad.cpu(), tt.grad.cpu())
    for a, b in zip(out["cpu"], out["cuda"]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_infonce_bf16_autocast_is_finite_and_close():
    from xmodal.losses import InfoNCE

    g = torch.Generator().manual_seed(3)
    v = torch.randn(256, 128, generator=g)
    t = v + 2.0 * torch.randn(256, 128, generator=g)  # a loss far from 0, so a relative error means something
    ref = InfoNCE(temperature=0.01)(v.double(), t.double())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        vv, tt = (v.cuda() @ torch.eye(128, device=CUDA)), (t.cuda() @ torch.eye(128, device=CUDA))
        assert vv.dtype == torch.bfloat16
        loss = InfoNCE(temperature=0.01)(vv.float(), tt.float())
    assert torch.isfinite(loss) and float(ref) > 0.1
    assert abs(float(loss) - float(ref)) / float(ref) < 0.05


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "average"])
def test_retrieval_and_streaming_match_cpu(ties):
    from xmodal.metrics import retrieval, streaming_retrieval

    g = torch.Generator().manual_seed(1)
    q = torch.nn.functional.normalize(torch.randn(3000, 64, generator=g), dim=1)
    gal = torch.nn.functional.normalize(q[:1000] + torch.randn(1000, 64, generator=g), dim=1)
    pos = torch.arange(3000) % 1000
    sim = (q @ gal.T).round(decimals=2)  # ties on purpose
    cpu = retrieval(sim, pos, ties=ties)
    gpu = retrieval(sim.to(CUDA), pos.to(CUDA), ties=ties)
    assert cpu == gpu
    s_cpu = streaming_retrieval(q, gal, pos, ties=ties, block_size=128)
    s_gpu = streaming_retrieval(q.to(CUDA), gal.to(CUDA), pos.to(CUDA), ties=ties, block_size=128)
    assert s_cpu.keys() == s_gpu.keys()
    for k in s_cpu:
        assert s_cpu[k] == pytest.approx(s_gpu[k], abs=0.05), k  # float32 matmul order may flip a near-tie


def test_sinkhorn_and_qbnorm_match_cpu():
    from xmodal.normalize import QBNorm, SinkhornBias

    g = torch.Generator().manual_seed(2)
    bank = torch.nn.functional.normalize(torch.randn(2000, 32, generator=g, dtype=torch.float64), dim=1)
    gal = torch.nn.functional.normalize(torch.randn(500, 32, generator=g, dtype=torch.float64), dim=1)
    sim = bank[:300] @ gal.T
    a = SinkhornBias(temperature=0.05, iters=8).fit(bank, gal)
    b = SinkhornBias(temperature=0.05, iters=8).fit(bank.to(CUDA), gal.to(CUDA))
    assert b.bias.device.type == "cuda"
    torch.testing.assert_close(a.bias, b.bias.cpu(), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(torch.as_tensor(a(sim)), torch.as_tensor(b(sim.to(CUDA))).cpu())
    qa = QBNorm(k=1, beta=20).fit(bank, gal)
    qb = QBNorm(k=1, beta=20).fit(bank.to(CUDA), gal.to(CUDA))
    torch.testing.assert_close(torch.as_tensor(qa(sim)), torch.as_tensor(qb(sim.to(CUDA))).cpu(),
                               rtol=1e-9, atol=1e-9)


def test_training_on_cuda_with_amp(tmp_path):
    from xmodal.config import load_config
    from xmodal.training.loop import train

    over = ["train.epochs=2", "train.device=cuda", "train.amp=true", "train.progress=false",
            "data.synthetic={num_train: 400, num_val: 100, num_test: 100}", "test_time.bank_size=200"]
    cfg = load_config("configs/synthetic.yaml", over)
    summary = train(cfg, tmp_path / "run")
    best = summary["val"][summary["normalizer"]]
    assert np.isfinite(best["t2v"]["R@1"]) and best["t2v"]["R@1"] > 0
    import xmodal

    model = xmodal.load_model(tmp_path / "run")
    assert model.temperature > 0
