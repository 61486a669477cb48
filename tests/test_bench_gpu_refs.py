"""bench/bench_gpu.py (losses): each inline reference equals its xmodal loss (issue 17).

The bench times every ``build_loss(name)`` against its own plain-torch reference; these checks
(float64, value and gradient, B = 8) are what make those references trustworthy.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from xmodal.losses import build_loss

pytestmark = pytest.mark.usefixtures("one_thread")

_spec = importlib.util.spec_from_file_location("bench_gpu", Path(__file__).resolve().parents[1] / "bench" / "bench_gpu.py")
bench_gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_gpu)

NAMES = ("infonce", "ntxent", "maxmargin", "milnce", "dcl", "crossclr", "ncl")


def _data(seed, n=8, d=16, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    v, t = (torch.randn(n, d, generator=g, dtype=dtype) for _ in range(2))  # not unit: the losses normalise
    # input features with a common direction (as real features have): 2-6 of the 8 samples are
    # influential (pruned) and the connectivity weights differ (max/min 160 to 1.4e6)
    vin, tin = (1 + 0.6 * torch.randn(n, k, generator=g, dtype=dtype) for k in (12, 5))
    return v, t, vin, tin


def _value_and_grad(fn, v, t):
    a, b = v.clone().requires_grad_(True), t.clone().requires_grad_(True)
    out = fn(a, b)
    out.backward()
    return out.detach(), a.grad, b.grad


def test_every_timed_loss_has_a_reference():
    assert tuple(bench_gpu.REFERENCES) == NAMES


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", NAMES)
def test_reference_equals_the_loss_in_float64(name, seed):
    v, t, vin, tin = _data(seed)
    extra = {"video_input": vin, "text_input": tin} if name == "crossclr" else {}
    loss = build_loss(name)
    ours = _value_and_grad(lambda a, b: loss(a, b, **extra), v, t)
    ref = _value_and_grad(lambda a, b: bench_gpu.REFERENCES[name](a, b, vin, tin), v, t)
    assert ours[0].dtype == ref[0].dtype == torch.float64
    assert math.isfinite(float(ref[0]))
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-10, atol=0)
    for g_ours, g_ref in zip(ours[1:], ref[1:]):
        assert float(g_ref.abs().max()) > 0
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-9, atol=1e-12)
    dv, dg = bench_gpu.reference_diffs(name, v, t, vin, tin)  # the bench's own pre-timing check
    assert dv <= 1e-10 and dg <= 1e-9


def test_crossclr_reference_exercises_pruning_and_weights():
    """The data prunes some (not all) negatives and weights the anchors unevenly, so the
    equality above covers Alg. 2's pruning and the connectivity weights, not plain InfoNCE."""
    for seed in (0, 1, 2):
        _, _, vin, tin = _data(seed)
        for x in (vin, tin):
            x = torch.nn.functional.normalize(x, dim=1)
            c = (x @ x.sum(0) - (x * x).sum(1)) / (x.shape[0] - 1)
            infl = c / c.abs().max() > 0.9
            assert 0 < int(infl.sum()) < x.shape[0]
            w = torch.softmax(c / c.abs().sum() / 0.0035, 0)
            assert float(w.max() / w.min()) > 10


@pytest.mark.parametrize("name,changed", [
    ("infonce", {"tau": 0.07}), ("ntxent", {"tau": 0.07}), ("maxmargin", {"margin": 0.1}),
    ("milnce", {"tau": 0.07}), ("dcl", {"tau_plus": 0.2}), ("crossclr", {"gamma": 2.0}),
    ("crossclr", {"lam": 0.5}), ("crossclr", {"kappa": 0.01}), ("ncl", {"iters": 3}),
])
def test_a_changed_hyper_parameter_is_detected(name, changed):
    """The comparison is not vacuous: a reference with another hyper-parameter differs."""
    v, t, vin, tin = _data(0)
    extra = {"video_input": vin, "text_input": tin} if name == "crossclr" else {}
    ours = build_loss(name)(v, t, **extra)
    other = bench_gpu.REFERENCES[name](v, t, vin, tin, **changed)
    assert abs(float(ours - other)) > 1e-6 * abs(float(ours))


def test_cpu_section_runs_and_checks(capsys):
    bench_gpu.bench_losses(16, 8, 1, torch.device("cpu"))
    out = capsys.readouterr().out
    for name in NAMES:
        assert f"\n  {name:10s}" in out
    assert "float64 checks passed" in out


def test_no_cuda_prints_one_line(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_gpu.main(["--only", "losses"]) == 0
    assert capsys.readouterr().out.count("\n") == 1
