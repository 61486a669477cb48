"""Shared input handling for the metrics: similarity blocks, positives, tie rules."""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import torch

from xmodal._validate import as_tensor, option, short_repr

TIES = ("pessimistic", "optimistic", "average")


def check_finite(t: torch.Tensor, name: str) -> None:
    """``ValueError`` on NaN/inf. One fused min/max pass (``torch.aminmax``, multi-threaded;
    NaN propagates through both), much cheaper than materialising ``isfinite`` for a large
    matrix and than numpy's separate ``max`` and ``min`` passes."""
    if not isinstance(name, str):
        raise TypeError(f"name: expected a string, got {short_repr(name)}")
    t = as_tensor(t, name)
    if t.numel() and t.is_floating_point():
        lo, hi = torch.aminmax(t.detach())
        ok = bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))
        if not ok:
            n_bad = int((~torch.isfinite(t)).sum())
            raise ValueError(f"{name}: contains {n_bad} NaN/inf value(s)")


def similarity(sim: Any, name: str = "sim", ndim: int = 2) -> torch.Tensor:
    """A finite, non-empty float tensor: float16/bfloat16 are widened to float32 (exactly),
    ints to float32; float32 and float64 are kept, so no new ties come from rounding."""
    t = as_tensor(sim, name)
    if t.dtype == torch.bool:
        raise TypeError(f"{name}: expected floating values, got bool")
    if t.is_complex():
        raise TypeError(f"{name}: complex values are not supported")
    if t.dtype not in (torch.float32, torch.float64):
        t = t.to(torch.float32)
    if t.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError(f"{name}: empty input, shape {tuple(t.shape)}")
    check_finite(t, name)
    return t


def check_ks(ks: Iterable[int]) -> tuple[int, ...]:
    """Recall cut-offs as a tuple of positive ints.

    Bools and non-integral numbers are rejected (``1.5`` or ``True`` used to become R@1).
    """
    if isinstance(ks, (str, bytes)) or not isinstance(ks, Iterable):
        raise TypeError(f"ks: expected a sequence of positive integers, got {short_repr(ks)}")
    out = []
    for k in ks:
        if isinstance(k, torch.Tensor) and k.ndim == 0:
            k = k.item()
        if isinstance(k, (bool, np.bool_)):
            raise TypeError(f"ks: expected positive integers, got a bool in {short_repr(ks)}")
        if isinstance(k, (int, np.integer)):
            out.append(int(k))
        elif isinstance(k, (float, np.floating)) and math.isfinite(k) and float(k).is_integer():
            out.append(int(k))
        else:
            raise TypeError(f"ks: expected positive integers, got {short_repr(k)} in {short_repr(ks)}")
    if not out or any(k < 1 for k in out):
        raise ValueError(f"ks: expected positive integers, got {short_repr(ks)}")
    return tuple(out)


def check_ties(ties: str) -> str:
    return option(ties, "ties", TIES)


def positives_of(positives: Any, num_queries: int, num_gallery: int,
                 device: torch.device, name: str = "positives") -> torch.Tensor:
    """Validate ``positives``: an int tensor [Q] of gallery indices, or a bool mask [Q, G]
    where every row holds at least one True."""
    p = as_tensor(positives, name)
    if p.dtype == torch.bool:
        if tuple(p.shape) != (num_queries, num_gallery):
            raise ValueError(f"{name}: a boolean mask must have shape {(num_queries, num_gallery)} "
                             f"(queries x gallery), got {tuple(p.shape)}")
        empty = ~p.any(1)
        if bool(empty.any()):
            rows = torch.nonzero(empty).flatten()[:5].tolist()
            raise ValueError(f"{name}: {int(empty.sum())} query row(s) have no positive item "
                             f"(first: {rows})")
        return p.to(device)
    if p.is_floating_point() or p.is_complex():
        raise TypeError(f"{name}: expected integer gallery indices [Q] or a boolean mask [Q, G], "
                        f"got dtype {p.dtype}")
    if p.ndim != 1 or p.shape[0] != num_queries:
        raise ValueError(f"{name}: expected {num_queries} integer indices (one per query), "
                         f"got shape {tuple(p.shape)}")
    p = p.to(torch.int64)
    if num_queries and (int(p.min()) < 0 or int(p.max()) >= num_gallery):
        raise ValueError(f"{name}: indices must lie in [0, {num_gallery}), got range "
                         f"[{int(p.min())}, {int(p.max())}]")
    return p.to(device)


def block_counts(block: torch.Tensor, index: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None, ties: str = "pessimistic"
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank information of the best-ranked correct item of each row of a score block.

    Returns ``(lo, n, p)`` (int64 [b]): ``lo`` = 1 + number of items scoring strictly
    higher than the best correct score; within the tie group at that score ``n``
    incorrect and ``p`` correct items. The rank is ``lo + (incorrect items placed before
    the first correct one)``: ``lo + n`` pessimistic, ``lo`` optimistic. For the
    deterministic rules ``n`` is folded into ``lo`` (and ``n = 0``) with one pass over
    the block, which is all they need.

    CPU blocks are counted with numpy: on small shared machines its single-threaded
    compare-and-count is several times faster than torch's threaded kernels.

    Shape:
        block: [b, G]; index: [b] int64 or mask: [b, G] bool.
    """
    if index is None and mask is None:
        raise ValueError("block_counts: give index or mask")
    if block.device.type == "cpu":
        x = block.detach().numpy()
        if index is not None:
            s = np.take_along_axis(x, index.numpy()[:, None], axis=1)
            lo, n, p = _counts(np, x, s, None, ties)
        else:
            m = mask.numpy()
            s = np.where(m, x, -np.inf).max(axis=1, keepdims=True)
            lo, n, p = _counts(np, x, s, m, ties)
        return torch.from_numpy(lo), torch.from_numpy(n), torch.from_numpy(p)
    if index is not None:
        s = block.gather(1, index[:, None])
        return _counts(torch, block, s, None, ties)
    s = block.masked_fill(~mask, -math.inf).amax(1, keepdim=True)
    return _counts(torch, block, s, mask, ties)


def _counts(xp, x, s, mask, ties):
    """(lo, n, p) for scores ``x`` [b, G] against best correct scores ``s`` [b, 1] with
    array module ``xp`` (numpy or torch)."""
    def count(t):
        if xp is np:
            return np.count_nonzero(t, axis=1).astype(np.int64, copy=False)
        return torch.count_nonzero(t, dim=1)

    def full(like, v):
        return xp.full_like(like, v)

    if mask is None:
        if ties == "pessimistic":  # the correct item counts itself: rank = #(>= s)
            lo = count(x >= s)
            return lo, full(lo, 0), full(lo, 1)
        gt = count(x > s)
        if ties == "optimistic":
            return gt + 1, full(gt, 0), full(gt, 1)
        eq = count(x == s)
        return gt + 1, eq - 1, full(gt, 1)
    gt = count(x > s)
    if ties == "optimistic":
        return gt + 1, full(gt, 0), full(gt, 1)
    tied = x == s
    p = count(tied & mask)
    n = count(tied) - p
    if ties == "pessimistic":
        return gt + 1 + n, full(n, 0), full(n, 1)
    return gt + 1, n, p


def summarize(lo: torch.Tensor, n: torch.Tensor, p: torch.Tensor, ks: tuple[int, ...]) -> dict:
    """R@K (percent), MdR and MnR from per-query ``(lo, n, p)`` (see :func:`block_counts`).

    Under random tie-breaking the number of incorrect items before the first correct one
    in a group of ``n`` incorrect and ``p`` correct items has mean ``n / (p + 1)``, and
    ``P(rank > K) = C(n, t) / C(n + p, t)`` with ``t = K - lo + 1`` slots of the group
    inside the top K. With ``n = 0`` both reduce to the deterministic rank ``lo``.
    """
    lo64 = lo.double().cpu()
    n64 = n.double().cpu()
    p64 = p.double().cpu()
    rank = lo64 + n64 / (p64 + 1.0)
    out: dict[str, float] = {}
    for k in ks:
        t = float(k) - lo64 + 1.0  # slots of the tie group inside the top K
        tc = torch.minimum(t.clamp(min=0.0), n64 + 1.0)
        miss = torch.ones_like(t)
        for i in range(int(tc.max()) if tc.numel() else 0):
            # P(first i+1 slots all incorrect) as a running product; hits 0 once i == n.
            step = (n64 - i) / (n64 + p64 - i)
            miss = torch.where(tc > i, miss * step, miss)
        hit = torch.where(t >= 1.0, 1.0 - miss, torch.zeros_like(t))
        out[f"R@{k}"] = 100.0 * float(hit.mean())
    out["MdR"] = float(np.median(rank.numpy()))
    out["MnR"] = float(rank.mean())
    return out


def default_block(num_gallery: int, budget: int = 1 << 21) -> int:
    """Rows per block so that one block holds about ``budget`` scores (cache friendly)."""
    return max(1, budget // max(1, num_gallery))


def check_block_size(block_size: Any, name: str = "block_size") -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
        raise TypeError(f"{name}: expected a positive integer, got {short_repr(block_size)}")
    if block_size < 1:
        raise ValueError(f"{name}: expected a positive integer, got {short_repr(block_size)}")
    return int(block_size)


__all__ = ["similarity", "check_ks", "check_ties", "positives_of", "block_counts", "summarize",
           "default_block", "check_block_size", "check_finite"]
