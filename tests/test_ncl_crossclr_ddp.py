"""2-process gloo DDP equals one process on the concatenated batch for NCL, CrossCLR
(no queue and with queue, over two steps) and CaliNCE: loss, parameter gradients and the
queues. One spawn runs all cases."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp
from torch import nn

from xmodal import dist
from xmodal.losses import NCL, CaliNCE, CrossCLR
from conftest import mark_done, spawn_gloo

WORLD, LOCAL_B, DV, DT, DOUT = 2, 4, 6, 7, 5
GLOBAL_B = WORLD * LOCAL_B


class Towers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.video = nn.Linear(DV, DOUT)
        self.text = nn.Linear(DT, DOUT)

    def forward(self, xv, xt):
        return self.video(xv), self.text(xt)


def global_batches():
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(2):  # two steps, so that the CrossCLR queue holds an older batch
        xv = torch.rand(GLOBAL_B, DV, generator=g, dtype=torch.float64)
        xt = torch.rand(GLOBAL_B, DT, generator=g, dtype=torch.float64)
        out.append((xv, xt))
    ids = torch.tensor([0, 0, 1, 2, 3, 3, 3, 4])  # instance 3 spans both ranks
    return out, ids


TAU = torch.linspace(0.05, 0.3, GLOBAL_B, dtype=torch.float64)  # per-sample temperatures


def cases():
    """(name, loss factory, needs inputs, uses ids and per-sample temperatures)."""
    return [
        ("ncl", lambda: NCL(0.1, queue_size=12), False, True),
        ("crossclr-noqueue", lambda: CrossCLR(0.1, prune_threshold=0.97, weight_scale=0.05), True, True),
        ("crossclr-queue", lambda: CrossCLR(0.1, prune_threshold=0.9, weight_scale=0.05,
                                            queue_size=12, num_positives=1), True, False),
        ("calince", lambda: CaliNCE(0.1, embed_dim=DOUT, predictive_weight=0.5, seed=3), False, True),
    ]


def run_steps(model, loss_fn, batches, ids, inputs, use_ids, tau=None):
    """Two training steps (no optimizer: gradients of the last step are compared)."""
    losses = []
    for xv, xt in batches:
        model.zero_grad()
        loss_fn.zero_grad()
        extra = {"ids": ids} if use_ids else {}
        if use_ids and not isinstance(loss_fn, NCL):  # NCL takes one temperature per batch
            extra["temperature"] = tau
        if inputs:
            extra.update(video_input=xv, text_input=xt)
        loss = loss_fn(*model(xv, xt), **extra)
        loss.backward()
        losses.append(float(loss.detach()))
    return losses


def reference(factory, inputs, use_ids):
    torch.manual_seed(0)
    model, loss_fn = Towers().double(), factory().double()
    batches, ids = global_batches()
    losses = run_steps(model, loss_fn, batches, ids, inputs, use_ids, TAU)
    grads = [p.grad.clone() for p in model.parameters()]
    grads += [p.grad.clone() for p in loss_fn.parameters() if p.grad is not None]
    return losses, grads, {k: b.clone() for k, b in loss_fn.named_buffers()}


def worker(rank: int, init_file: str) -> None:
    refs = {name: reference(f, i, u) for name, f, i, u in cases()}
    tdist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        sl = slice(rank * LOCAL_B, (rank + 1) * LOCAL_B)
        batches, ids = global_batches()
        local = [(xv[sl], xt[sl]) for xv, xt in batches]
        for name, factory, inputs, use_ids in cases():
            ref_losses, ref_grads, ref_buffers = refs[name]
            torch.manual_seed(0)
            model = nn.parallel.DistributedDataParallel(Towers().double())
            loss_fn = factory().double()
            losses = run_steps(model, loss_fn, local, ids[sl], inputs, use_ids, TAU[sl])
            for got, want in zip(losses, ref_losses):
                assert abs(got - want) < 1e-10, (name, got, want)
            grads = [p.grad for p in model.module.parameters()]
            # the loss' own parameters (CaliNCE heads) are outside DDP: average them here
            grads += [dist.all_reduce_mean(p.grad) for p in loss_fn.parameters() if p.grad is not None]
            assert len(grads) == len(ref_grads), name
            for got, want in zip(grads, ref_grads):
                torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-9, msg=name)
            for key, buf in loss_fn.named_buffers():  # queues hold the gathered global batches
                torch.testing.assert_close(buf, ref_buffers[key], atol=1e-12, rtol=0, msg=name)
        # Tear down only when both ranks are done: destroying a gloo group while the peer
        # still communicates aborts the process ("terminate called without an active exception").
        mark_done(init_file, rank)
        tdist.barrier()
    finally:
        tdist.destroy_process_group()


def test_two_process_gloo_equals_single_process(tmp_path):
    if not tdist.is_available():
        pytest.skip("torch.distributed is not available")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    spawn_gloo(worker, WORLD, str(tmp_path / "init"))


def test_cases_exercise_pruning():
    """The thresholds above really prune some (not all) samples, so the test is not vacuous."""
    from xmodal.functional.crossclr import connectivity, influence_scores
    batches, _ = global_batches()
    xv, xt = batches[0]
    c = influence_scores(connectivity(xv))
    assert 0 < int((c > 0.97).sum()) < GLOBAL_B
    c = influence_scores(connectivity(batches[1][0], xv[:12 - GLOBAL_B]))  # step 2: Q = batch + 4
    assert 0 < int((c > 0.9).sum()) < 12
