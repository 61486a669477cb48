"""How good an approximate index is: recall@k against exact search, and the smallest
search parameter that reaches a target recall.

``recall@k`` of an approximate top-``k`` is the share of the exact top-``k`` items it
returns, averaged over the queries: ``mean_q |approx_q ∩ exact_q| / k`` (faiss's
"intersection measure", ``faiss.contrib.evaluation.knn_intersection_measure``). The exact
top-``k`` comes from :func:`exact_topk`, a blockwise brute-force search over the same
folded vectors the index holds (of several items tied at the ``k``-th score, which one
counts is ``torch.topk``'s choice; with continuous embeddings ties do not occur in practice).
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import torch

__all__ = ["exact_topk", "recall_at_k", "smallest_reaching", "sample_rows"]


@torch.no_grad()
def exact_topk(queries: np.ndarray, blocks: Iterable[tuple[int, int, np.ndarray]], k: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force top-``k`` inner products of ``queries`` ``[Q, W]`` over gallery blocks.

    Args:
        queries: float32 ``[Q, W]`` (folded, as the index searches them).
        blocks: ``(start, stop, gallery[start:stop])`` float32 ``[b, W]`` blocks, in order.
        k: results per query.

    Returns:
        ``(scores [Q, k] float32, rows [Q, k] int64)``, best first.

    >>> g = np.eye(4, dtype=np.float32); q = np.array([[0, 0, 1, 0.5]], np.float32)
    >>> exact_topk(q, [(0, 2, g[:2]), (2, 4, g[2:])], 2)[1].tolist()
    [[2, 3]]
    """
    from xmodal._validate import positive_int, short_repr

    k = positive_int(k, "k")
    if not isinstance(queries, np.ndarray) or queries.ndim != 2 or queries.dtype.kind != "f":
        raise TypeError(f"queries: expected a float array [Q, W], got {short_repr(queries)}")
    if isinstance(blocks, (str, bytes)) or not hasattr(blocks, "__iter__"):
        raise TypeError(f"blocks: expected (start, stop, rows) blocks, got {short_repr(blocks)}")
    q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
    best_s = torch.full((q.shape[0], 0), float("-inf"))
    best_i = torch.zeros((q.shape[0], 0), dtype=torch.long)
    step = max(1, (1 << 20) // max(1, q.shape[0]))  # score buffers of about 1M values (4 MB)
    for item in blocks:
        if not isinstance(item, tuple) or len(item) != 3:
            raise TypeError(f"blocks: expected (start, stop, rows) tuples, got {short_repr(item)}")
        start, stop, block = item
        if not hasattr(block, "shape") or len(block.shape) != 2 or block.shape[1] != q.shape[1] \
                or not isinstance(start, (int, np.integer)) or not isinstance(stop, (int, np.integer)) \
                or block.shape[0] != stop - start:
            raise ValueError(f"blocks: block ({short_repr(start)}, {short_repr(stop)}) must hold stop - start "
                             f"rows of {q.shape[1]} values")
        g = block if isinstance(block, torch.Tensor) else torch.from_numpy(np.asarray(block, np.float32))
        for a in range(0, stop - start, step):
            part = g[a:a + step].float()
            s = torch.cat([best_s, q @ part.T], 1)
            top = torch.topk(s, min(k, s.shape[1]), dim=1).indices  # O(b) per block, not a sort
            kept = best_i.shape[1]  # positions < kept are earlier winners, the rest rows of this part
            rows = torch.where(top < kept, torch.gather(best_i, 1, top.clamp(max=max(kept - 1, 0)))
                               if kept else top, top - kept + start + a)
            best_s, best_i = torch.gather(s, 1, top), rows
    # best first; equal scores by row (which of several items tied at the k-th score is kept is
    # topk's choice)
    order = np.lexsort((best_i.numpy(), -best_s.numpy()))
    return np.take_along_axis(best_s.numpy(), order, 1), np.take_along_axis(best_i.numpy(), order, 1).astype(np.int64)


def recall_at_k(approx: np.ndarray, exact: np.ndarray, k: int) -> float:
    """``mean_q |approx_q[:k] ∩ exact_q[:k]| / k`` (``-1`` = no result, never a hit).

    >>> recall_at_k(np.array([[1, 2, -1]]), np.array([[2, 1, 3]]), 3)
    0.6666666666666666
    """
    from xmodal._validate import int_array, positive_int

    k = positive_int(k, "k")
    a, e = int_array(approx, "approx", ndim=2)[:, :k], int_array(exact, "exact", ndim=2)[:, :k]
    if a.shape[0] != e.shape[0] or e.shape[1] < k or not e.shape[0]:
        raise ValueError(f"approx, exact: expected the same queries (rows) and at least k={k} exact results, "
                         f"got {list(a.shape)} and {list(e.shape)}")
    hits = (a[:, :, None] == e[:, None, :]).any(2) & (a >= 0)
    return float(hits.sum()) / float(e.shape[0] * k)


def smallest_reaching(measure: Callable[[int], float], candidates: list[int], target: float,
                      plateau: float | None = None) -> tuple[int, float, bool, dict[int, float]]:
    """The smallest parameter whose ``measure(p)`` (the recall) reaches ``target``.

    Tries ``candidates`` (increasing) in order, then bisects between the last one that
    fell short and the first that reached the target (recall grows with nprobe /
    efSearch). When none reaches it: the largest candidate tried, flagged.

    With ``plateau``, the scan also stops (flagged) once two consecutive candidates each gained less
    than ``plateau`` recall over the one before: the recall has stopped growing (a product quantiser's
    codes, not the cells searched, limit it), and every later candidate only costs more. At 10M clips
    the largest ``nprobe`` scans every code, minutes a pass; the plateau stop never tries it.

    Returns:
        ``(parameter, its recall, target reached?, {parameter: recall} of every try)``.

    >>> smallest_reaching(lambda p: min(1.0, p / 10), [1, 2, 4, 8, 16], 0.95)[:3]
    (10, 1.0, True)
    >>> smallest_reaching(lambda p: min(0.6, p / 10), [1, 2, 4, 8, 16, 32, 64], 0.95, plateau=0.001)[:3]
    (32, 0.6, False)
    """
    from xmodal._validate import number, short_repr

    if not callable(measure):
        raise TypeError(f"measure: expected a callable parameter -> recall, got {short_repr(measure)}")
    if not isinstance(candidates, (list, tuple)) or not candidates or not all(
            isinstance(c, (int, np.integer)) and not isinstance(c, bool) and c >= 1 for c in candidates) \
            or list(candidates) != sorted(set(candidates)):
        raise ValueError(f"candidates: expected increasing positive integers, got {short_repr(candidates)}")
    target = number(target, "target")
    tried: dict[int, float] = {}

    def at(p: int) -> float:
        if p not in tried:
            tried[p] = float(measure(p))
        return tried[p]

    if plateau is not None:
        plateau = number(plateau, "plateau")
    low = None
    flat = 0  # consecutive candidates that gained less than ``plateau``
    for p in candidates:
        if at(p) >= target:
            high = p
            break
        if plateau is not None and low is not None:
            flat = flat + 1 if tried[p] - tried[low] < plateau else 0
        low = p
        if flat >= 2:
            return p, tried[p], False, tried
    else:
        return candidates[-1], tried[candidates[-1]], False, tried
    lo = 0 if low is None else low  # at(lo) < target (or lo is below every candidate)
    while high - lo > 1:
        mid = (lo + high) // 2
        if mid < 1:
            break
        if at(mid) >= target:
            high = mid
        else:
            lo = mid
    return high, tried[high], True, tried


def sample_rows(n: int, size: int, seed: int) -> np.ndarray:
    """``min(n, size)`` sorted distinct rows of ``range(n)``, seeded."""
    from xmodal._validate import whole_number

    n, size, seed = whole_number(n, "n"), whole_number(size, "size"), whole_number(seed, "seed")
    return np.sort(np.random.default_rng(seed).choice(n, min(int(n), int(size)), replace=False))


