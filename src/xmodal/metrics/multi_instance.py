"""EPIC-KITCHENS-100 multi-instance retrieval metrics: mAP and nDCG with graded relevancy.

Definitions (Damen et al., "Rescaling Egocentric Vision", IJCV 2022, Sec. on MIR, as
computed by the official ``calculate_mAP`` / ``calculate_nDCG`` of the EPIC-KITCHENS
MIR evaluation code), for a query with gallery ranked by decreasing similarity,
``rel_k`` the relevancy of the item at position ``k`` (1-based):

* AP = (1 / #{k: rel_k == 1}) * sum over k with rel_k == 1 of (rel_1 + ... + rel_k) / k.
  Only items with relevancy exactly 1 are "hits"; precision uses the GRADED cumulative
  relevancy.
* nDCG = DCG / IDCG, DCG = sum_{k <= k_q} rel_k / log2(k + 1), k_q = #{items with
  relevancy > 0} for that query; IDCG is the DCG of the gallery sorted by relevancy.

Both are averaged over queries and reported in percent. Rows of ``sim`` are the queries;
``directions="both"`` also evaluates the transposed problem and averages the two, as the
EPIC leaderboard does (vis->txt and txt->vis).

Ties in ``sim`` (left to argsort's whims in the official code) are broken by relevancy:
``ties="pessimistic"`` puts less relevant items first within a group of equal scores,
``"optimistic"`` more relevant first. Items equal in both score and relevancy are
interchangeable, so the result is exact and invariant to permuting the gallery. Without
ties both equal the official code.

A query with no item of relevancy 1 has no defined AP (the official code divides 0 by
0), one with no item of relevancy > 0 no defined nDCG. ``empty="skip"`` (default)
leaves such queries out of that metric's mean, ``"zero"`` counts them as 0, ``"error"``
raises. If no query is defined the metric is 0.0. Never NaN.

Speed: no argsort. For float32-representable scores and relevancy in [0, 2), each
row's (score, relevancy, relevant?) is packed into one 64-bit key whose numeric order is
the ranking; one value sort per block then gives the relevant items in ranked order and
the irrelevant ones sorted by score, so a relevant item's position is its index plus a
binary search among the irrelevant ones. Other inputs (float64 scores that float32 would
round) take an exact ``lexsort`` path.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from xmodal._validate import as_tensor, choice
from xmodal.metrics._common import check_block_size, check_finite, similarity

EMPTY = ("skip", "zero", "error")
_REL_BITS = np.uint64(0x3FFFFFFF)


def _relevancy(relevancy: Any, shape: tuple[int, int]) -> np.ndarray:
    r = as_tensor(relevancy, "relevancy")
    if r.dtype == torch.bool or not r.is_floating_point():
        r = r.to(torch.float64)
    if tuple(r.shape) != tuple(shape):
        raise ValueError(f"relevancy: expected shape {tuple(shape)} (same as sim), got {tuple(r.shape)}")
    check_finite(r, "relevancy")
    if r.numel() and float(r.min()) < 0:
        raise ValueError("relevancy: values must be >= 0")
    r = r.detach().cpu()
    if r.dtype in (torch.float16, torch.bfloat16):
        r = r.float()
    return r.numpy()


def _inv_log(n: int) -> np.ndarray:
    """``1 / log2(k + 1)`` for k = 0..n (index 0 unused)."""
    k = np.arange(n + 1, dtype=np.float64)
    k[0] = 1.0
    return 1.0 / np.log2(k + 1.0)


def _score(rel: np.ndarray, pos: np.ndarray, n_pos: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-query AP, DCG, IDCG and #hits from relevancy in ranked order (exact path).

    Shape:
        rel: [b, W] float32/64 in ranked order (trailing zeros allowed); pos: [b, W] int64
        1-based positions of those entries in the full ranking; n_pos: [b] number of
        items with relevancy > 0.
    """
    b, w = rel.shape
    inv_log = _inv_log(int(pos.max()) if pos.size else 1)
    cum = np.cumsum(rel, axis=1, dtype=np.float64)
    ri, ci = np.nonzero(rel == 1)
    p_hit = pos[ri, ci]
    ap_sum = np.bincount(ri, weights=cum[ri, ci] / p_hit, minlength=b)
    n1 = np.bincount(ri, minlength=b)
    # DCG: only positions <= k_q count (official k_counts mask)
    gain = np.where(pos <= n_pos[:, None], np.take(inv_log, pos), 0.0)
    dcg = np.einsum("ij,ij->i", rel.astype(np.float64), gain)
    ideal = -np.sort(-rel, axis=1)
    idcg = ideal.astype(np.float64) @ inv_log[1:w + 1] if w else np.zeros(b)
    ap = np.divide(ap_sum, n1, out=np.zeros(b), where=n1 > 0)
    return ap, dcg, idcg, n1


def _hit_precision_sums(rel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum over hits (rel == 1) of cumulative graded relevancy / position, and #hits.

    Only the prefix sums at hits are needed, so one ``reduceat`` over the segments
    between hits replaces a full cumulative sum.

    Shape:
        rel: [b, G] float32 in ranked order -> ([b], [b]).
    """
    b, g = rel.shape
    flat = rel.ravel()
    hit = np.flatnonzero(flat == 1)             # much faster than a 2-D nonzero
    ri, ci = np.divmod(hit, g)
    n1 = np.bincount(ri, minlength=b)
    if ri.size == 0:
        return np.zeros(b), n1
    ends = hit + 1                      # prefix sum up to and including the hit
    starts = np.arange(b, dtype=np.int64) * g
    cuts = np.sort(np.concatenate([starts, ends[ends < b * g]]), kind="stable")
    cuts = cuts[np.concatenate([[True], cuts[1:] != cuts[:-1]])]  # a hit in a row's last column
    seg = np.add.reduceat(flat, cuts, dtype=np.float64)
    pref = np.concatenate([[0.0], np.cumsum(seg)])  # pref[i] = sum(flat[:cuts[i]])
    cuts_ext = np.append(cuts, b * g)
    cum = pref[np.searchsorted(cuts_ext, ends)] - pref[np.searchsorted(cuts_ext, starts[ri])]
    return np.bincount(ri, weights=cum / (ci + 1.0), minlength=b), n1


def _block_packed(s: np.ndarray, r: np.ndarray, optimistic: bool):
    """Fast path for one block of float32 scores and float32 relevancy in [0, 2).

    ``r`` must be the caller's own scratch copy without -0.0: its rows are sorted in place.
    """
    b, g = s.shape
    # order-preserving unsigned int of -s (best score first); 0 - s maps -0.0 to +0.0
    bits = np.subtract(np.float32(0), s).view(np.int32)
    u = (bits ^ ((bits >> 31) | np.int32(-(1 << 31)))).view(np.uint32)
    relbits = r.view(np.uint32)  # < 2**30 for 0 <= r < 2
    if optimistic:
        relbits = np.uint32(_REL_BITS) - relbits
    # key = u * 2**30 + relbits, written as two 32-bit halves (little-endian words)
    packed = np.empty((b, g), dtype=np.uint64)
    words = packed.view(np.uint32).reshape(b, g, 2)
    if sys.byteorder == "little":
        hi, lo = words[:, :, 1], words[:, :, 0]
    else:  # pragma: no cover
        hi, lo = words[:, :, 0], words[:, :, 1]
    np.right_shift(u, np.uint32(2), out=hi)
    np.bitwise_or((u & np.uint32(3)) << np.uint32(30), relbits, out=lo)
    # bit 63 is clear and the float64 exponent is never all ones, so sorting the float64
    # view orders the keys as unsigned integers (float64 sorts are the fast ones here)
    packed.view(np.float64).sort(axis=1)
    rb = lo & np.uint32(_REL_BITS)
    if optimistic:
        rb = np.uint32(_REL_BITS) - rb
    rel = rb.view(np.float32)
    ap_sum, n1 = _hit_precision_sums(rel)
    n_pos = np.count_nonzero(r, axis=1)
    width = int(n_pos.max()) if b else 0
    w = _inv_log(g)
    head = np.where(np.arange(width)[None, :] < n_pos[:, None], rel[:, :width], np.float64(0))
    dcg = head @ w[1:width + 1]
    r.sort(axis=1)                                # ascending: the top k_q values at the end
    idcg = r[:, g - width:] @ w[width:0:-1] if width else np.zeros(b)
    ap = np.divide(ap_sum, n1, out=np.zeros(b), where=n1 > 0)
    return ap, dcg, idcg, n1


def _block_exact(s: np.ndarray, r: np.ndarray, optimistic: bool):
    """General path: full lexicographic sort by (score desc, relevancy asc/desc)."""
    b, g = s.shape
    order = np.lexsort((-r if optimistic else r, -s), axis=-1)
    rel_sorted = np.take_along_axis(r, order, axis=1)
    pos = np.broadcast_to(np.arange(1, g + 1, dtype=np.int64), (b, g))
    return _score(rel_sorted, pos, (r > 0).sum(1))


def _mean(values: np.ndarray, defined: np.ndarray, empty: str, what: str) -> float:
    if not defined.all():
        if empty == "error":
            rows = np.flatnonzero(~defined)[:5].tolist()
            raise ValueError(f"relevancy: {int((~defined).sum())} quer(ies) have no item "
                             f"defining {what} (first rows: {rows}); pass empty='skip' or 'zero'")
        if empty == "skip":
            values = values[defined]
    return 100.0 * float(values.mean()) if values.size else 0.0


def _one_direction(s: torch.Tensor, r: np.ndarray, ties: str, empty: str,
                   block_size: int | None) -> tuple[float, float]:
    q, g = s.shape
    optimistic = ties == "optimistic"
    sn = np.ascontiguousarray(s.detach().cpu().numpy())  # row blocks must be contiguous
    fast = (sn.dtype == np.float32 or bool(np.array_equal(sn.astype(np.float32), sn))) and \
        (r.size == 0 or float(r.max()) < 2.0) and \
        (r.dtype == np.float32 or bool(np.array_equal(r.astype(np.float32), r)))
    if fast:
        sn = sn.astype(np.float32, copy=False)
        r = np.ascontiguousarray(r, dtype=np.float32) + np.float32(0)  # own copy, no -0.0
    b = block_size or max(1, (1 << 17) // max(1, g))
    block_fn = _block_packed if fast else _block_exact

    def one(start: int):
        return block_fn(sn[start:start + b], r[start:start + b], optimistic)

    starts = range(0, q, b)
    workers = min(len(starts), torch.get_num_threads())
    if workers > 1:  # numpy's sorts and ufuncs release the GIL: blocks run in parallel
        with ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(one, starts))
    else:
        parts = [one(start) for start in starts]
    ap, dcg, idcg, n1 = (np.concatenate(x) for x in zip(*parts))
    ndcg = np.divide(dcg, idcg, out=np.zeros_like(dcg), where=idcg > 0)
    return _mean(ap, n1 > 0, empty, "mAP (relevancy == 1)"), _mean(ndcg, idcg > 0, empty, "nDCG (relevancy > 0)")


@torch.no_grad()
def mir(sim: Any, relevancy: Any, *, ties: str = "pessimistic", empty: str = "skip",
        directions: str = "rows", block_size: int | None = None) -> dict:
    """EPIC-KITCHENS-100 multi-instance retrieval mAP and nDCG (percent).

    Args:
        sim: similarity matrix (queries x gallery), float16/32/64, numpy or torch.
        relevancy: graded relevancy in [0, inf) of the same shape (EPIC: mean of the
            verb-class IoU and the noun-class IoU, in [0, 1]).
        ties: "pessimistic" or "optimistic" (how equal scores are ordered; see module).
        empty: what a query without relevant items gets: "skip", "zero" or "error".
        directions: "rows" (rows are the queries) or "both" (also columns as queries;
            "mAP"/"nDCG" are then the mean of the two, with per-direction values under
            "mAP_rows", "mAP_cols", "nDCG_rows", "nDCG_cols").
        block_size: query rows per block (results do not depend on it).

    Returns:
        ``{"mAP": float, "nDCG": float}`` (plus per-direction keys for "both").

    Shape:
        sim: [Q, G]; relevancy: [Q, G].
    """
    s = similarity(sim, "sim")
    r = _relevancy(relevancy, tuple(s.shape))
    ties = choice(ties, "ties", ("pessimistic", "optimistic"))
    empty = choice(empty, "empty", EMPTY)
    directions = choice(directions, "directions", ("rows", "both"))
    if block_size is not None:
        block_size = check_block_size(block_size)
    m_r, n_r = _one_direction(s, r, ties, empty, block_size)
    if directions == "rows":
        return {"mAP": m_r, "nDCG": n_r}
    m_c, n_c = _one_direction(s.t().contiguous(), np.ascontiguousarray(r.T), ties, empty, block_size)
    return {"mAP": (m_r + m_c) / 2, "nDCG": (n_r + n_c) / 2, "mAP_rows": m_r, "mAP_cols": m_c,
            "nDCG_rows": n_r, "nDCG_cols": n_c}


__all__ = ["mir"]
