"""One validation helper per check; a loss forward with float temperatures syncs the host once."""

from __future__ import annotations

import pytest
import torch

from xmodal._validate import all_finite, check_all_finite
from xmodal.losses import MILNCE, InfoNCE, MaxMargin, NTXent


@pytest.fixture
def bool_calls(monkeypatch):
    calls = {"n": 0}
    real = torch.Tensor.__bool__

    def counting(self):
        calls["n"] += 1
        return real(self)

    monkeypatch.setattr(torch.Tensor, "__bool__", counting)
    return calls


@pytest.mark.parametrize("loss", [InfoNCE(), NTXent(), MILNCE(), MaxMargin()], ids=lambda x: type(x).__name__)
@pytest.mark.parametrize("seed", [0, 1])
def test_forward_syncs_once(loss, seed, bool_calls):
    g = torch.Generator().manual_seed(seed)
    v, t = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
    loss(v, t, ids=torch.tensor([0, 0, 1, 2, 3, 4, 5, 6]))
    assert bool_calls["n"] == 1


def test_crossclr_forward_syncs(bool_calls):
    """CrossCLR (no queue, no appendix C.1 positives): the embeddings' finiteness check, and each
    input feature matrix checked by the module and again by the functional form (2 x 2). The
    C.1 positives mask is not built, so no ``extra.any()`` sync (it was 2 more)."""
    from xmodal.losses import CrossCLR
    g = torch.Generator().manual_seed(0)
    v, t = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
    CrossCLR()(v, t, video_input=torch.rand(8, 5, generator=g), text_input=torch.rand(8, 3, generator=g))
    assert bool_calls["n"] == 5


@pytest.mark.parametrize("bad", ["video", "text"])
def test_nan_still_named(bad):
    v, t = torch.randn(4, 3), torch.randn(4, 3)
    (v if bad == "video" else t)[1, 2] = float("nan")
    with pytest.raises(ValueError, match=f"^{bad}: "):
        InfoNCE()(v, t)


def test_all_finite_exact_under_overflow_and_mixed_dtypes():
    big = torch.full((4,), 3e38)  # finite, but the float32 sum overflows: exact fallback
    assert all_finite(big, torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.float16))
    assert not all_finite(big, torch.tensor([0.0, float("inf")], dtype=torch.float64))
    assert all_finite(torch.arange(3))  # integers are finite
    with pytest.raises(ValueError, match="^b: contains 1 NaN"):
        check_all_finite({"a": torch.ones(3), "b": torch.tensor([1.0, float("nan")])})
