"""CrossCLR module: queue of frozen input features (Algorithm 1), no-queue mode, errors."""

import pytest
import torch

from xmodal.functional.crossclr import crossclr_loss
from xmodal.losses.crossclr import CrossCLR


def _batch(seed, n=6):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 4, generator=g, dtype=torch.float64),
            torch.randn(n, 4, generator=g, dtype=torch.float64),
            torch.rand(n, 5, generator=g, dtype=torch.float64),
            torch.rand(n, 3, generator=g, dtype=torch.float64))


KW = dict(temperature=0.1, intra_weight=0.8, prune_threshold=0.9, weight_scale=0.05)


def test_no_queue_equals_batch_connectivity():
    v, t, vi, ti = _batch(0)
    got = CrossCLR(**KW, queue_size=0)(v, t, video_input=vi, text_input=ti)
    assert got.item() == pytest.approx(crossclr_loss(v, t, vi, ti, **KW).item(), abs=1e-12)


def test_queue_fifo_including_current_batch():
    loss = CrossCLR(**KW, queue_size=15)
    batches = [_batch(s) for s in range(4)]
    seen_v, seen_t = [], []
    for v, t, vi, ti in batches:
        seen_v.insert(0, vi)
        seen_t.insert(0, ti)
        bank_v, bank_t = torch.cat(seen_v)[:15], torch.cat(seen_t)[:15]
        got = loss(v, t, video_input=vi, text_input=ti)
        ref = crossclr_loss(v, t, vi, ti, video_bank=bank_v, text_bank=bank_t, **KW)
        assert got.item() == pytest.approx(ref.item(), abs=1e-10)
        assert loss.video_queue.shape[0] == min(15, 6 * len(seen_v))  # only what was seen so far
    # newest rows first, oldest out
    assert torch.allclose(loss.video_queue[:6], torch.nn.functional.normalize(batches[3][2], dim=1))
    assert torch.allclose(loss.text_queue[12:], torch.nn.functional.normalize(batches[1][3][:3], dim=1))


def test_eval_mode_uses_but_does_not_update_the_queue():
    loss = CrossCLR(**KW, queue_size=20)
    v, t, vi, ti = _batch(0)
    loss(v, t, video_input=vi, text_input=ti)
    before = loss.video_queue.clone()
    loss.eval()
    v2, t2, vi2, ti2 = _batch(1)
    got = loss(v2, t2, video_input=vi2, text_input=ti2)
    ref = crossclr_loss(v2, t2, vi2, ti2, video_bank=torch.cat([vi2, vi]),
                        text_bank=torch.cat([ti2, ti]), **KW)
    assert got.item() == pytest.approx(ref.item(), abs=1e-10)
    assert torch.equal(loss.video_queue, before)


def test_multiple_positives_option_runs_and_differs():
    v, t, vi, ti = _batch(2)
    a = CrossCLR(**KW)(v, t, video_input=vi, text_input=ti)
    b = CrossCLR(**KW, num_positives=2, positive_weight=0.5)(v, t, video_input=vi, text_input=ti)
    assert torch.isfinite(b) and a.item() != b.item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_module_finite_under_autocast(dtype):
    v, t, vi, ti = _batch(3, n=16)
    v, t = v.to(dtype).requires_grad_(), t.to(dtype).requires_grad_()
    with torch.autocast("cpu", dtype=dtype):
        loss = CrossCLR(temperature=0.01, queue_size=64)(v, t, video_input=vi.to(dtype),
                                                         text_input=ti.to(dtype))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(v.grad).all() and torch.isfinite(t.grad).all()


def test_bad_input():
    v, t, vi, ti = _batch(0)
    with pytest.raises(ValueError, match="video_input"):
        CrossCLR()(v, t, text_input=ti)
    with pytest.raises(ValueError, match="text_input"):
        CrossCLR()(v, t, video_input=vi)
    with pytest.raises(ValueError, match="differ"):
        CrossCLR()(v, t[:4], video_input=vi, text_input=ti)
    with pytest.raises(ValueError, match="video_input"):
        CrossCLR()(v, t, video_input=vi[:4], text_input=ti)
    with pytest.raises(ValueError, match="queue_size"):
        CrossCLR(queue_size=4)(v, t, video_input=vi, text_input=ti)
    for tau in (0.0, -0.1):
        with pytest.raises(ValueError, match="temperature"):
            CrossCLR(temperature=tau)
        with pytest.raises(ValueError, match="temperature"):
            CrossCLR()(v, t, video_input=vi, text_input=ti, temperature=tau)
    nan = v.clone()
    nan[1, 1] = float("nan")
    with pytest.raises(ValueError, match="video"):
        CrossCLR()(nan, t, video_input=vi, text_input=ti)


def test_batch_of_one_and_numpy_inputs():
    v, t, vi, ti = _batch(4, n=1)
    assert CrossCLR()(v, t, video_input=vi, text_input=ti).item() == 0.0
    v, t, vi, ti = _batch(5)
    a = CrossCLR(**KW)(v.numpy(), t.numpy(), video_input=vi.numpy(), text_input=ti.numpy(),
                       ids=[0, 1, 2, 2, 3, 4])
    b = crossclr_loss(v, t, vi, ti, ids=torch.tensor([0, 1, 2, 2, 3, 4]), **KW)
    assert a.item() == pytest.approx(b.item(), abs=1e-12)
