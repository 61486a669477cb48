"""CrossCLR module: Algorithm 1 queue (connectivity and intra-modal negatives), no-queue mode,\npaper defaults, errors."""

import pytest
import torch
import torch.nn.functional as F

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
    """Q (size M) = current batch + the newest M - B earlier rows (Alg. 1); the earlier rows'
    inputs feed connectivity and their detached embeddings are intra-modal negatives."""
    m, b = 15, 6
    loss = CrossCLR(**KW, queue_size=m)
    batches = [_batch(s) for s in range(4)]
    seen = []  # newest first: (vi, ti, v, t, ids)
    for step, (v, t, vi, ti) in enumerate(batches):
        ids = torch.arange(b) + 3 * step  # overlapping ids across steps
        got = loss(v, t, video_input=vi, text_input=ti, ids=ids)
        if seen:
            cat = [torch.cat([s[k] for s in seen])[:m - b] for k in range(5)]
            ref = crossclr_loss(v, t, vi, ti, video_bank=cat[0], text_bank=cat[1], video_queue=cat[2],
                                text_queue=cat[3], queue_ids=cat[4], ids=ids, **KW)
        else:
            ref = crossclr_loss(v, t, vi, ti, ids=ids, **KW)
        assert got.item() == pytest.approx(ref.item(), abs=1e-10)
        seen.insert(0, (vi, ti, F.normalize(v, dim=1), F.normalize(t, dim=1), ids))
        assert loss.video_queue.shape[0] == min(m, b * len(seen))
        assert loss.text_embed_queue.shape == (min(m, b * len(seen)), 4)
    assert torch.allclose(loss.video_queue[:b], F.normalize(batches[3][2], dim=1))
    assert torch.allclose(loss.text_embed_queue[12:], F.normalize(batches[1][1][:3], dim=1))
    assert torch.equal(loss.id_queue[:b], torch.arange(b) + 9)


def test_queue_changes_the_loss_and_ids_block_queued_rows():
    loss = CrossCLR(**KW, queue_size=12)
    v, t, vi, ti = _batch(0)
    loss(v, t, video_input=vi, text_input=ti, ids=torch.arange(6))
    v2, t2, vi2, ti2 = _batch(1)
    loss.eval()
    fresh = loss(v2, t2, video_input=vi2, text_input=ti2, ids=torch.arange(6) + 100)
    same = loss(v2, t2, video_input=vi2, text_input=ti2, ids=torch.arange(6))
    alone = crossclr_loss(v2, t2, vi2, ti2, **KW)
    assert abs(fresh.item() - alone.item()) > 1e-3 and abs(fresh.item() - same.item()) > 1e-6
    no_ids = CrossCLR(**KW, queue_size=12)
    no_ids(v, t, video_input=vi, text_input=ti)
    assert torch.equal(no_ids.id_queue, torch.full((6,), -1))


def test_eval_mode_uses_but_does_not_update_the_queue():
    loss = CrossCLR(**KW, queue_size=20)
    v, t, vi, ti = _batch(0)
    loss(v, t, video_input=vi, text_input=ti)
    before = loss.video_queue.clone()
    loss.eval()
    v2, t2, vi2, ti2 = _batch(1)
    got = loss(v2, t2, video_input=vi2, text_input=ti2)
    ref = crossclr_loss(v2, t2, vi2, ti2, video_bank=vi, text_bank=ti, video_queue=v,
                        text_queue=t, **KW)
    assert got.item() == pytest.approx(ref.item(), abs=1e-10)
    assert torch.equal(loss.video_queue, before)


def test_paper_defaults():
    """Table 7 / sec. 4.3 (YouCook2): tau 0.03, lambda 0.8, gamma 0.9, kappa 35e-4; C.1 beta 0.15."""
    loss = CrossCLR()
    assert (loss.temperature, loss.intra_weight, loss.prune_threshold, loss.weight_scale) == (
        0.03, 0.8, 0.9, 0.0035)
    assert loss.options == dict(weight_norm="sum", prune_norm="max", intra_mode="delta",
                                num_positives=0, positive_weight=0.15)


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
    for kw, name in ((dict(weight_norm="x"), "weight_norm"), (dict(prune_norm="x"), "prune_norm"),
                     (dict(intra_mode="x"), "intra_mode"), (dict(num_positives=1.5), "num_positives"),
                     (dict(positive_weight=-1), "positive_weight")):
        with pytest.raises(ValueError, match=name):
            CrossCLR(**kw)
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


@pytest.mark.parametrize("on", ["none", "im", "pw", "np"])
def test_queue_acts_only_through_intra_negatives_weights_and_pruning(on):
    """Alg. 1's queue enters the loss only as intra-modal negatives (IM), through the
    connectivity that weights (PW) and prunes (NP) the samples: with all three off (Table 2's
    first row) a queue of 5,000-style earlier batches leaves the loss unchanged; with any one on,
    it changes it. This is why the Table 2 re-runs with the queue differ only in the IM/PW/NP rows."""
    off = dict(temperature=0.1, intra_weight=0.0, prune_threshold=None, weight_scale=None)
    kw = dict(off, **{"none": {}, "im": {"intra_weight": 0.8}, "pw": {"weight_scale": 0.05},
                      "np": {"prune_threshold": 0.97, "intra_weight": 0.8}}[on])
    queued, alone = CrossCLR(**kw, queue_size=18), CrossCLR(**kw, queue_size=0)
    for s in range(3):
        v, t, vi, ti = _batch(s)
        a = queued(v, t, video_input=vi, text_input=ti, ids=torch.arange(6) + 6 * s)
        b = alone(v, t, video_input=vi, text_input=ti, ids=torch.arange(6) + 6 * s)
    if on == "none":
        assert a.item() == pytest.approx(b.item(), abs=1e-12)
    else:
        assert abs(a.item() - b.item()) > 1e-6
    if on == "np":  # pruning on top of IM: the queue's effect differs from IM alone
        im = CrossCLR(**dict(off, intra_weight=0.8), queue_size=18)
        for s in range(3):
            v, t, vi, ti = _batch(s)
            c = im(v, t, video_input=vi, text_input=ti, ids=torch.arange(6) + 6 * s)
        assert abs(a.item() - c.item()) > 1e-6
