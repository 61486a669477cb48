"""2-process gloo DDP equals one process on the concatenated batch (loss and gradients)
for every in-batch loss, with ``local_loss`` off and on; plus ``xmodal.dist`` when not
initialised. One spawn runs all cases (keeps the test fast)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp
from torch import nn

from xmodal import dist
from xmodal.functional.infonce import info_nce
from xmodal.losses import MILNCE, DebiasedContrastive, InfoNCE, MaxMargin, MIMaxMargin, NTXent
from conftest import mark_done, spawn_gloo

WORLD, LOCAL_B, DIN, DOUT = 2, 4, 6, 5
GLOBAL_B = WORLD * LOCAL_B


def test_not_initialised():
    assert not dist.is_distributed()
    assert dist.world_size() == 1 and dist.rank() == 0
    x = torch.randn(3, 2, requires_grad=True)
    assert dist.all_gather_with_grad(x) is x
    y = dist.all_gather_no_grad(x)
    assert not y.requires_grad and torch.equal(y, x.detach())
    assert torch.equal(dist.all_reduce_mean(x), x.detach())


class Towers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.video = nn.Linear(DIN, DOUT)
        self.text = nn.Linear(DIN, DOUT)

    def forward(self, xv, xt):
        return self.video(xv), self.text(xt)


def global_batch():
    g = torch.Generator().manual_seed(123)
    xv = torch.randn(GLOBAL_B, DIN, generator=g, dtype=torch.float64)
    xt = torch.randn(GLOBAL_B, DIN, generator=g, dtype=torch.float64)
    ids = torch.tensor([0, 0, 1, 2, 3, 3, 3, 4])          # instance 3 spans both ranks
    tau = torch.linspace(0.05, 0.4, GLOBAL_B, dtype=torch.float64)
    margin = torch.linspace(0.0, 0.5, GLOBAL_B, dtype=torch.float64)
    rel = torch.rand(GLOBAL_B, GLOBAL_B, generator=g, dtype=torch.float64)
    rel.fill_diagonal_(1.0)
    return xv, xt, ids, tau, margin, rel


def cases():
    """(name, module factory, keyword builder from (ids, tau, margin, rel))."""
    return [
        ("infonce", lambda ll: InfoNCE(0.1, local_loss=ll), lambda i, t, m, r: {"ids": i, "temperature": t}),
        ("infonce-dirs", lambda ll: InfoNCE(0.1, t2v_temperature=0.2, v2t_temperature=0.05, local_loss=ll),
         lambda i, t, m, r: {}),
        ("infonce-learnable", lambda ll: InfoNCE(0.1, learnable=True, local_loss=ll), lambda i, t, m, r: {}),
        ("ntxent", lambda ll: NTXent(0.2, local_loss=ll), lambda i, t, m, r: {"ids": i, "temperature": t}),
        ("maxmargin", lambda ll: MaxMargin(local_loss=ll), lambda i, t, m, r: {"ids": i, "margin": m}),
        ("maxmargin-hardest", lambda ll: MaxMargin(0.3, hardest=True, local_loss=ll), lambda i, t, m, r: {}),
        ("mimaxmargin", lambda ll: MIMaxMargin(threshold=0.6, local_loss=ll),
         lambda i, t, m, r: {"relevancy": r, "margin": m}),
        ("milnce", lambda ll: MILNCE(0.1, local_loss=ll), lambda i, t, m, r: {"ids": i, "temperature": t}),
        ("milnce-joint", lambda ll: MILNCE(0.1, joint=True), lambda i, t, m, r: {"ids": i}),  # no local_loss
        ("maxmargin-sum", lambda ll: MaxMargin(negative_reduction="sum", local_loss=ll),
         lambda i, t, m, r: {"ids": i, "margin": m}),
        ("dcl", lambda ll: DebiasedContrastive(0.3, 0.1, local_loss=ll),
         lambda i, t, m, r: {"ids": i, "temperature": t}),
    ]


def reference(name, factory, kwargs):
    """Single process, full batch, no DDP: loss and gradients of every parameter."""
    torch.manual_seed(0)
    model = Towers().double()
    loss_fn = factory(False).double()
    xv, xt, ids, tau, margin, rel = global_batch()
    loss = loss_fn(*model(xv, xt), **kwargs(ids, tau, margin, rel))
    loss.backward()
    grads = [p.grad.clone() for p in list(model.parameters()) + list(loss_fn.parameters())]
    return float(loss.detach()), grads


def worker(rank: int, init_file: str) -> None:
    # references first, while torch.distributed is not initialised (a loss would gather)
    refs = {name: reference(name, factory, kwargs) for name, factory, kwargs in cases()}
    tdist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        assert dist.is_distributed() and dist.world_size() == WORLD and dist.rank() == rank
        sl = slice(rank * LOCAL_B, (rank + 1) * LOCAL_B)
        xv, xt, ids, tau, margin, rel = global_batch()
        # gather utilities: shapes, order, gradient = sum over ranks of the slice's grads
        x = torch.full((2, 3), float(rank), requires_grad=True)
        g = dist.all_gather_with_grad(x)
        assert g.shape == (4, 3) and torch.equal(g[:2], torch.zeros(2, 3)) and torch.equal(g[2:], torch.ones(2, 3))
        (g * torch.arange(1.0, 5.0)[:, None]).sum().backward()
        expected = torch.arange(1.0, 5.0)[2 * rank:2 * rank + 2, None].expand(2, 3) * WORLD
        assert torch.equal(x.grad, expected)
        with pytest.raises(ValueError, match="same shape"):
            dist.all_gather_with_grad(torch.zeros(rank + 1, 2))
        for name, factory, kwargs in cases():
            ref_loss, ref_grads = refs[name]
            for local_loss in (False, True):
                torch.manual_seed(0)
                model = nn.parallel.DistributedDataParallel(Towers().double())
                loss_fn = factory(local_loss).double()
                kw = kwargs(ids[sl], tau[sl], margin[sl], rel[sl])
                loss = loss_fn(*model(xv[sl], xt[sl]), **kw)
                loss.backward()
                value = float(dist.all_reduce_mean(loss)) if local_loss else float(loss)
                assert abs(value - ref_loss) < 1e-10, (name, local_loss, value, ref_loss)
                grads = [p.grad for p in model.module.parameters()]
                # the loss' own parameters (learnable temperature) are outside DDP: average here
                grads += [dist.all_reduce_mean(p.grad) for p in loss_fn.parameters()]
                for got, want in zip(grads, ref_grads):
                    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-9,
                                               msg=f"{name} local_loss={local_loss}")
        # without DDP: the local embeddings' gradient is world_size x the single-process one
        v = xv[sl].clone().requires_grad_(True)
        t = xt[sl].clone().requires_grad_(True)
        InfoNCE(0.1)(v, t).backward()
        vf = xv.clone().requires_grad_(True)
        InfoNCE(0.1)(vf, xt).backward()
        torch.testing.assert_close(v.grad, WORLD * vf.grad[sl], atol=1e-12, rtol=1e-10)
        # gather=False: each rank's own batch only (the functional form never gathers)
        local = InfoNCE(0.1, gather=False)(xv[sl], xt[sl])
        assert abs(float(local) - float(info_nce(xv[sl], xt[sl], temperature=0.1))) < 1e-12
        mark_done(init_file, rank)
        tdist.barrier()  # tear down only when both ranks are done (gloo aborts otherwise)
    finally:
        tdist.destroy_process_group()


def test_two_process_gloo_equals_single_process(tmp_path):
    if not tdist.is_available():
        pytest.skip("torch.distributed is not available")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    spawn_gloo(worker, WORLD, str(tmp_path / "init"))


def _abort_worker(rank: int, init_file: str, mark: bool) -> None:
    import time
    from pathlib import Path

    if mark:  # as after the last check of a real worker: both ranks marked before any teardown
        mark_done(init_file, rank)
        deadline = time.monotonic() + 30
        while not all(Path(f"{init_file}.done{r}").is_file() for r in range(2)) and time.monotonic() < deadline:
            time.sleep(0.005)
    os.abort()


def test_spawn_gloo_accepts_only_an_abort_after_every_check_passed(tmp_path):
    spawn_gloo(_abort_worker, 2, str(tmp_path / "a"), True)  # aborted after its marker: accepted
    with pytest.raises(mp.ProcessExitedException):
        spawn_gloo(_abort_worker, 2, str(tmp_path / "b"), False)  # aborted before: a failure
