"""The one place that talks to ``torch.distributed`` (house style rule 3).

Losses gather embeddings with :func:`all_gather_with_grad` so that every rank sees the
global batch, as open_clip's ``gather_features(..., gather_with_grad=True)``.

Gradient convention (the one DDP needs): the backward of :func:`all_gather_with_grad`
*sums* the gradients that every rank computed for a rank's slice and hands the sum
back to that rank (``torch.distributed.nn.functional.all_gather``). If every rank
evaluates the same global loss ``L`` (``local_loss=False``) or its own share of the rows
with mean over ranks equal to ``L`` (``local_loss=True``), the gradient of the local
embeddings is ``world_size * dL/d(local)``; DDP's gradient *averaging* over ranks then
yields exactly ``dL/d(parameters)`` of the single-process loss on the concatenated batch.
"""

from __future__ import annotations

import torch
import torch.distributed as _dist


def is_distributed() -> bool:
    """True when ``torch.distributed`` is available and a process group is initialised."""
    return _dist.is_available() and _dist.is_initialized()


def world_size() -> int:
    """Number of processes; 1 when ``torch.distributed`` is not initialised."""
    return _dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    """This process' rank; 0 when ``torch.distributed`` is not initialised."""
    return _dist.get_rank() if is_distributed() else 0


def _check_same_shapes(t: torch.Tensor, name: str) -> None:
    shape = torch.tensor(list(t.shape), dtype=torch.long, device=t.device)
    shapes = [torch.empty_like(shape) for _ in range(world_size())]
    _dist.all_gather(shapes, shape)
    if any(not torch.equal(s, shapes[0]) for s in shapes):
        got = [tuple(s.tolist()) for s in shapes]
        raise ValueError(f"{name}: every rank must pass the same shape to a gather, got {got}")


class _GatherWithGrad(torch.autograd.Function):
    """All-gather whose backward sums every rank's gradient of a slice and returns it to
    the slice's owner (an all-reduce then a slice: works on gloo, which has no
    reduce-scatter; ``torch.distributed.nn.functional.all_gather`` is deprecated)."""

    @staticmethod
    def forward(ctx, t: torch.Tensor) -> torch.Tensor:
        ctx.rows = t.shape[0]
        out = [torch.empty_like(t) for _ in range(world_size())]
        _dist.all_gather(out, t.contiguous())
        return torch.cat(out, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        _dist.all_reduce(grad)
        start = rank() * ctx.rows
        return grad[start:start + ctx.rows]


def all_gather_with_grad(t: torch.Tensor, *, check_shapes: bool = True) -> torch.Tensor:
    """Concatenate ``t`` along dim 0 across ranks; gradients flow back to each rank's slice.

    Identity (the same tensor object) when ``world_size() == 1``.

    Args:
        t: the local tensor, same shape on every rank.
        check_shapes: gather the shapes first and raise ``ValueError`` on a mismatch
            (one small extra collective; otherwise a mismatch hangs or errors deep in
            the backend).

    Shape:
        ``[b, *]`` -> ``[world_size * b, *]``, rank ``r`` at rows ``r*b:(r+1)*b``.
    """
    if world_size() == 1:
        return t
    if check_shapes:
        _check_same_shapes(t, "all_gather_with_grad")
    return _GatherWithGrad.apply(t)


def all_gather_no_grad(t: torch.Tensor, *, check_shapes: bool = True) -> torch.Tensor:
    """Detached concatenation of ``t`` along dim 0 across ranks (queues, ids, relevancy).

    Returns ``t.detach()`` when ``world_size() == 1``.
    """
    t = t.detach()
    if world_size() == 1:
        return t
    if check_shapes:
        _check_same_shapes(t, "all_gather_no_grad")
    out = [torch.empty_like(t) for _ in range(world_size())]
    _dist.all_gather(out, t.contiguous())
    return torch.cat(out, dim=0)


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    """Mean of ``t`` over ranks (a new detached tensor); ``t.detach()`` when not distributed."""
    t = t.detach().clone()
    if world_size() == 1:
        return t
    _dist.all_reduce(t)
    return t / world_size()


def init_from_env(*, cuda: bool = False) -> bool:
    """Initialise the process group when launched by ``torchrun`` (``WORLD_SIZE`` > 1):
    nccl when ``cuda`` (binding ``LOCAL_RANK``'s GPU), else gloo. Returns whether a
    process group is active (one that was already initialised counts)."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or is_distributed():
        return is_distributed()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    _dist.init_process_group("nccl" if cuda else "gloo")
    return True


def shutdown() -> None:
    """Barrier, then destroy the process group (a gloo group torn down while a peer still
    communicates aborts that peer). No-op when not distributed."""
    if is_distributed():
        _dist.barrier()
        _dist.destroy_process_group()


def average_gradients(params) -> None:
    """DDP's gradient averaging over ranks, done explicitly (see the module docstring).

    A parameter without a gradient on this rank contributes zeros (its ``.grad`` is set).
    """
    if world_size() == 1:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        _dist.all_reduce(p.grad)
        p.grad.div_(world_size())
