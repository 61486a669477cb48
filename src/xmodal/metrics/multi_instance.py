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

Ties in ``sim`` (left to argsort's whims in the official code) are resolved so that the
names are true bounds: ``ties="pessimistic"`` gives, per query and per metric, the
minimum over every order of the tied items, ``"optimistic"`` the maximum (so
pessimistic <= any tie-breaking, the official code's included, <= optimistic; the means
over queries inherit this). Without ties both equal the official code.

* nDCG: DCG weights ``1 / log2(k + 1)`` (0 beyond ``k_q``) do not increase with ``k``, so
  (rearrangement inequality) less relevant first within each group of equal scores is
  the worst order, more relevant first the best.
* mAP: a tie group's order changes only the precision of its own hits (later hits see
  the group's whole relevancy and length either way). Less relevant first is NOT always
  the worst: an item of relevancy ``0 < r < 1`` placed before a hit lowers that hit's
  precision ``C / k`` to ``(C + r) / (k + 1)`` only if ``r < C / k``. Exchange arguments
  fix the rest: items of relevancy 0 go before all the group's hits (worst) or after
  them (best); the other non-hits go in increasing (worst) or decreasing (best)
  relevancy; only where the hits sit among them is left, an exact dynamic programme
  over (non-hits placed, hits placed), ``O(#hits * #non-hits)`` per tie group. It runs
  only for queries whose tie group mixes a hit with an item of relevancy other than 0
  and 1, found among the tied relevant items the fast path sorts anyway (no extra pass
  over the scores); elsewhere less (more) relevant first is already the
  worst (best) order for both metrics.

A query with no item of relevancy 1 has no defined AP (the official code divides 0 by
0), one with no item of relevancy > 0 no defined nDCG. ``empty="skip"`` (default)
leaves such queries out of that metric's mean, ``"zero"`` counts them as 0, ``"error"``
raises. If no query is defined the metric is 0.0. Never NaN.

Speed: no argsort. Items with relevancy 0 add nothing to the graded cumulative
relevancy nor to DCG, they only shift positions. So for float32-representable inputs
each row is sorted once as 32-bit keys (descending score, one low bit saying "relevant"
and breaking ties by the tie rule), which gives every relevant item's position; the
relevant items alone (about a tenth of EPIC's gallery) are sorted by (score, column) to
know their relevancy in ranked order. Dropping the score's lowest bit can merge two
scores one float32 step apart; those rare cases are detected and counted exactly.
If they are not rare (more than one per query in a block) the block takes the former
path: one row sort of 64-bit keys (score, relevancy) for relevancy in [0, 2), else an
exact ``lexsort`` (also used for float64 scores that float32 would round).
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
_BIT62 = np.uint64(1 << 62)


def _relevancy(relevancy: Any, shape: tuple[int, int]) -> np.ndarray:
    r = as_tensor(relevancy, "relevancy")
    if r.dtype == torch.bool or not r.is_floating_point():
        r = r.to(torch.float64)
    if tuple(r.shape) != tuple(shape):
        raise ValueError(f"relevancy: expected shape {tuple(shape)} (same as sim), got {tuple(r.shape)}")
    r = r.detach().cpu()
    if r.dtype in (torch.float16, torch.bfloat16):
        r = r.float()
    x = r.numpy()
    if x.size:
        lo, hi = (float(v) for v in torch.aminmax(r))   # one fused pass; NaN propagates
        if not (np.isfinite(lo) and np.isfinite(hi)):
            check_finite(r, "relevancy")
        if lo < 0 or hi > 1:
            raise ValueError(f"relevancy: values must lie in [0, 1], got range [{lo:g}, {hi:g}]")
    return x


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


_SIGN = np.int32(-(1 << 31))
_ONE = np.uint32(1)
_EVEN = np.uint32(0xFFFFFFFE)


def _desc_keys(s: np.ndarray, out: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """uint32 keys ascending in descending float32 score (-0.0 == +0.0), written to ``out``."""
    np.subtract(np.float32(0), s, out=out.view(np.float32))   # 0 - s: -0.0 becomes +0.0
    bits = out.view(np.int32)
    np.right_shift(bits, 31, out=tmp)
    np.bitwise_or(tmp, _SIGN, out=tmp)
    np.bitwise_xor(bits, tmp, out=bits)
    return out


def _segment_sums(x: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``x[starts[i]:ends[i]].sum()`` for every i (0 for an empty segment)."""
    c = np.zeros(x.size + 1)
    np.cumsum(x, out=c[1:])
    return c[ends] - c[starts]


def _block_sparse(s: np.ndarray, r: np.ndarray, optimistic: bool, sub_elems: int = 1 << 16,
                  max_collisions: int | None = None):
    """Fast path: float32 scores, float32 relevancy (not modified). ``None`` when more
    than ``max_collisions`` (default: one per row) 1-ulp key collisions need fixing.

    Shape:
        s, r: [b, G] with b < 2 ** (29 - bits(G - 1)) -> (ap, dcg, idcg, #hits), each [b].
    """
    b, g = s.shape
    sub = max(1, min(b, sub_elems // g))
    kb, tb = np.empty((sub, g), np.uint32), np.empty((sub, g), np.uint32)
    mb = np.empty((sub, g), np.bool_)
    idx_l, u_l, pos_l, cand_l, m = [], [], [], [], 0
    for start in range(0, b, sub):
        stop = min(b, start + sub)
        k, t, mk = kb[:stop - start], tb[:stop - start], mb[:stop - start]
        kf, mf = k.ravel(), mk.ravel()
        _desc_keys(s[start:stop], k, t.view(np.int32))
        np.greater(r[start:stop], 0, out=mk)
        idx = np.flatnonzero(mf)                      # relevant items, row-major
        u_l.append(kf[idx])
        idx_l.append(idx + start * g)
        if optimistic:   # low bit 0 = relevant: first among equal keys
            np.bitwise_or(k, _ONE, out=k)
            np.subtract(k, mk, out=k, casting="unsafe")
        else:            # low bit 1 = relevant: after the irrelevant items of equal key
            np.bitwise_and(k, _EVEN, out=k)
            np.bitwise_or(k, mk, out=k, casting="unsafe")
        k.sort(axis=1)
        np.bitwise_and(k, _ONE, out=t)
        (np.equal if optimistic else np.not_equal)(t, 0, out=mk)
        pos = np.flatnonzero(mf)                      # positions of relevant items, ranked
        cur = kf[pos]
        # an irrelevant item whose key differs only in the dropped bit sits next to the
        # relevant ones of that key (before them if pessimistic, after if optimistic)
        if optimistic:
            cand = np.flatnonzero(np.take(kf, pos + 1, mode="clip") - cur <= _ONE)
        else:
            cand = np.flatnonzero(cur - np.take(kf, pos - 1, mode="clip") <= _ONE)
        cand_l.append(cand + m)
        m += pos.size
        pos_l.append(pos + start * g)
    cand = np.concatenate(cand_l)
    if cand.size > (b if max_collisions is None else max_collisions):
        return None
    if m == 0:                                        # nothing relevant in this block
        return np.zeros(b), np.zeros(b), np.zeros(b), np.zeros(b, dtype=np.int64), np.zeros(0, np.int64)
    idx, u, pos = np.concatenate(idx_l), np.concatenate(u_l), np.concatenate(pos_l)
    bounds = np.searchsorted(idx, np.arange(b + 1, dtype=np.int64) * g)
    n_pos = np.diff(bounds)
    starts = bounds[:-1]
    rowoff = np.repeat(np.arange(b, dtype=np.int64) * g, n_pos)
    # relevant items in ranked order: one sort of (row, score key, column)
    cb = max(1, int(g - 1).bit_length())
    # bit 62 set and row < 2 ** (29 - cb) (the caller's block cap): every key is a normal
    # positive float64 (exponent neither 0 nor all ones), so the float64 view sorts like the
    # unsigned integers and about twice as fast; no denormals, so flush-to-zero is harmless
    packed = np.repeat((np.arange(b, dtype=np.uint64) << np.uint64(32 + cb)) | _BIT62, n_pos)
    packed |= u.astype(np.uint64) << np.uint64(cb)
    packed |= (idx - rowoff).view(np.uint64)
    packed.view(np.float64).sort()
    rel = r.ravel()[(packed & np.uint64((1 << cb) - 1)).view(np.int64) + rowoff]
    tie = np.flatnonzero(np.diff(packed) < np.uint64(1 << cb))
    mixed = np.zeros(0, np.int64)
    if tie.size:     # relevant items with equal scores: order them by the tie rule
        hi = packed >> np.uint64(cb)
        members = np.unique(np.concatenate([tie, tie + 1]))
        group = np.cumsum(np.concatenate([[True], hi[members[1:]] != hi[members[:-1]]]))
        vals = rel[members]
        # rows where a tie group mixes a hit with a graded item need mAP's exact order;
        # the tied relevant items found here are all such groups (zeros never decide it)
        n_hit = np.bincount(group, weights=vals == 1)
        n_all = np.bincount(group)
        bad = (n_hit > 0) & (n_hit < n_all)
        if bad.any():
            mixed = np.unique(((packed[members[bad[group]]] & ~_BIT62) >> np.uint64(32 + cb)).astype(np.int64))
        rel[members] = vals[np.lexsort((-vals if optimistic else vals, group))]
    if cand.size:    # exact count of the irrelevant items 1 ulp away, on the wrong side
        us = ((packed[cand] >> np.uint64(cb)) & np.uint64(0xFFFFFFFF)).astype(np.int64)
        wrong = us % 2 == (1 if optimistic else 0)
        cand, us = cand[wrong], us[wrong]
        rows = np.searchsorted(bounds, cand, side="right") - 1
        target = (us + (-1 if optimistic else 1)).astype(np.uint32)
        cnt = np.empty(cand.size, dtype=np.int64)
        for c0 in range(0, cand.size, 64):
            rr = rows[c0:c0 + 64]
            keys = _desc_keys(s[rr], np.empty((rr.size, g), np.uint32), np.empty((rr.size, g), np.int32))
            cnt[c0:c0 + 64] = np.count_nonzero((keys == target[c0:c0 + 64, None]) & ~(r[rr] > 0), axis=1)
        pos[cand] += cnt if optimistic else -cnt
    p = pos - rowoff
    p += 1                                            # 1-based positions in the full ranking
    inv_log = _inv_log(g)
    # mAP: at hits (rel == 1), cumulative graded relevancy / position (irrelevant add 0).
    # Prefix sums are only needed at row starts and just after hits: one reduceat.
    hits = np.flatnonzero(rel == 1)
    hb = np.searchsorted(hits, bounds)
    mark = np.zeros(m + 1, np.bool_)                  # union of row starts and hit ends, sorted
    mark[starts] = True
    mark[0] = True
    mark[hits + 1] = True
    cuts = np.flatnonzero(mark[:m])
    prefix = np.zeros(cuts.size + 1)
    np.cumsum(np.add.reduceat(rel, cuts, dtype=np.float64), out=prefix[1:])
    inv_p = 1.0 / p[hits]
    ch = prefix[np.searchsorted(cuts, hits + 1)] * inv_p
    base = prefix[np.searchsorted(cuts, starts)]                       # rows before
    ap_sum = _segment_sums(ch, hb[:-1], hb[1:]) - base * _segment_sums(inv_p, hb[:-1], hb[1:])
    n1 = np.diff(hb)
    # DCG: the relevant items within the top k_q positions are a prefix of each row's list
    top_end = np.searchsorted(pos, np.arange(b, dtype=np.int64) * g + n_pos)
    w = np.empty(m + 1)                               # w[m] = 0: reduceat may index m
    np.take(inv_log, p, out=w[:m])
    w[:m] *= rel
    w[m] = 0.0
    seg = np.add.reduceat(w, np.stack([starts, top_end], 1).ravel())[::2]
    dcg = np.where(top_end > starts, seg, 0.0)
    # IDCG: each row's relevancy sorted (rows padded with zeros, one float32 sort)
    width = int(n_pos.max())
    idcg = np.zeros(b)
    if width:
        z = np.zeros((b, width), dtype=np.float32)
        z.ravel()[np.arange(m, dtype=np.int64) + np.repeat(np.arange(b, dtype=np.int64) * width - starts, n_pos)] = rel
        z.sort(axis=1)                                # ascending: zeros (padding) first
        idcg = z @ inv_log[width:0:-1]
    ap = np.divide(ap_sum, n1, out=np.zeros(b), where=n1 > 0)
    return ap, dcg, idcg, n1, mixed


def _block_fast(s: np.ndarray, r: np.ndarray, optimistic: bool):
    """Sparse path, or the 64-bit packed path for a block with many collisions; with
    the block's rows needing mAP's exact tie order (:func:`_mixed_tie_rows`)."""
    out = _block_sparse(s, r, optimistic)
    if out is None:
        if r.size and float(r.max()) < 2.0:
            return (*_block_packed(s, r + np.float32(0), optimistic), _mixed_tie_rows(s, r))
        return _block_general(s, r, optimistic)
    return out


def _block_general(s: np.ndarray, r: np.ndarray, optimistic: bool):
    """:func:`_block_exact` plus the rows needing mAP's exact tie order."""
    return (*_block_exact(s, r, optimistic), _mixed_tie_rows(s, r))


def _block_exact(s: np.ndarray, r: np.ndarray, optimistic: bool):
    """General path: full lexicographic sort by (score desc, relevancy asc/desc)."""
    b, g = s.shape
    order = np.lexsort((-r if optimistic else r, -s), axis=-1)
    rel_sorted = np.take_along_axis(r, order, axis=1)
    pos = np.broadcast_to(np.arange(1, g + 1, dtype=np.int64), (b, g))
    return _score(rel_sorted, pos, (r > 0).sum(1))


def _mixed_tie_rows(s: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Rows holding a hit (relevancy 1) and an item of relevancy not in {0, 1} with
    exactly equal scores (-0.0 == +0.0): one sort of the relevant items only.

    Shape:
        s, r: ``[b, G]`` -> sorted row indices.
    """
    g = s.shape[1]
    idx = np.flatnonzero(r.ravel() > 0)
    hit = r.ravel()[idx] == 1
    if not hit.any() or hit.all():
        return np.zeros(0, np.int64)
    # (row, rank of the score among the relevant scores) as one integer key
    levels, inv = np.unique(s.ravel()[idx].astype(np.float64) + 0.0, return_inverse=True)  # -0.0 == +0.0
    key = (idx // g) * levels.size + inv.ravel()
    order = np.argsort(key)
    key, hit = key[order], hit[order]
    new = np.concatenate([[True], key[1:] != key[:-1]])
    gid = np.cumsum(new) - 1
    n_hit = np.bincount(gid, weights=hit)
    bad = (n_hit > 0) & (n_hit < np.bincount(gid))
    return np.unique(key[new][bad] // levels.size)


def _hits_extreme(a: float, n: int, hits: int, x: np.ndarray, optimistic: bool) -> float:
    """Min (max) over the placements of ``hits`` hits among the sorted non-hits ``x`` of
    the sum of the hits' precisions, ``a``/``n``: relevancy sum and count before them.

    Hit ``j`` (1-based) after ``i`` non-hits has precision ``(a + P_i + j) / (n + i + j)``
    (``P_i`` = sum of the first ``i``); placements are non-decreasing in ``i``.
    """
    pre = np.concatenate([[0.0], np.cumsum(x)])
    i = np.arange(x.size + 1, dtype=np.float64)
    acc = np.maximum.accumulate if optimistic else np.minimum.accumulate
    best = np.zeros(x.size + 1)
    for j in range(1, hits + 1):
        best = acc(best) + (a + pre + j) / (n + i + j)
    return float(best.max() if optimistic else best.min())


def _ap_extreme_row(s: np.ndarray, r: np.ndarray, optimistic: bool) -> float:
    """AP of one query under the worst (best) order of its tied items (module docstring).

    Shape:
        s, r: ``[G]`` -> AP (0 when no hit).
    """
    s = s.astype(np.float64) + 0.0          # -0.0 -> +0.0
    r = r.astype(np.float64)
    order = np.argsort(-s, kind="stable")
    ss, rr = s[order], r[order]
    starts = np.flatnonzero(np.concatenate([[True], ss[1:] != ss[:-1]]))
    ends = np.append(starts[1:], ss.size)
    cum = np.concatenate([[0.0], np.cumsum(rr)])
    total, n1 = 0.0, 0
    for lo, hi in zip(starts, ends):
        grp = rr[lo:hi]
        hits = int(np.count_nonzero(grp == 1))
        if hits == 0:
            continue
        n1 += hits
        zeros = int(np.count_nonzero(grp == 0))
        x = np.sort(grp[(grp != 0) & (grp != 1)])
        if optimistic:
            x = x[::-1]
        total += _hits_extreme(cum[lo], int(lo) + (0 if optimistic else zeros), hits, x, optimistic)
    return total / n1 if n1 else 0.0


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
    ap, ndcg, has_ap, has_ndcg = _per_query(s, r, ties, block_size)
    return _mean(ap, has_ap, empty, "mAP (relevancy == 1)"), _mean(ndcg, has_ndcg, empty, "nDCG (relevancy > 0)")


def _per_query(s: torch.Tensor, r: np.ndarray, ties: str, block_size: int | None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-query AP and nDCG in [0, 1] (0 where undefined) and whether each is defined."""
    q, g = s.shape
    optimistic = ties == "optimistic"
    sn = np.ascontiguousarray(s.detach().cpu().numpy())  # row blocks must be contiguous
    fast = (sn.dtype == np.float32 or bool(np.array_equal(sn.astype(np.float32), sn))) and \
        (r.dtype == np.float32 or bool(np.array_equal(r.astype(np.float32), r)))
    if fast:   # the sparse path never writes to r: no copy
        sn = sn.astype(np.float32, copy=False)
        r = np.ascontiguousarray(r, dtype=np.float32)
    b = block_size or max(1, (1 << 18) // max(1, g))
    if fast:   # (bit 62, row, 32-bit key, column) must fit in 62 bits below bit 62
        b = min(b, 1 << (29 - max(1, int(g - 1).bit_length())))
    block_fn = _block_fast if fast else _block_general

    def one(start: int):
        ap, dcg, idcg, n1, mixed = block_fn(sn[start:start + b], r[start:start + b], optimistic)
        for row in mixed + start:   # mAP's worst / best order where a tie group mixes relevancies
            ap[row - start] = _ap_extreme_row(sn[row], r[row], optimistic)
        return ap, dcg, idcg, n1

    starts = range(0, q, b)
    workers = min(len(starts), torch.get_num_threads())
    if workers > 1:  # numpy's sorts and ufuncs release the GIL: blocks run in parallel
        with ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(one, starts))
    else:
        parts = [one(start) for start in starts]
    ap, dcg, idcg, n1 = (np.concatenate(x) for x in zip(*parts))
    ndcg = np.divide(dcg, idcg, out=np.zeros_like(dcg), where=idcg > 0)
    return ap, ndcg, n1 > 0, idcg > 0


@torch.no_grad()
def mir_per_query(sim: Any, relevancy: Any, *, ties: str = "pessimistic", block_size: int | None = None
                  ) -> dict[str, np.ndarray]:
    """Each query's AP and nDCG (percent; NaN for a query without an item of relevancy 1 /
    above 0): ``{"ap": [Q], "ndcg": [Q]}``, whose NaN-skipping means are :func:`mir`'s
    ``mAP`` / ``nDCG`` (``empty="skip"``, rows as queries).

    >>> out = mir_per_query(np.array([[0.9, 0.1], [0.2, 0.8]]), np.array([[1.0, 0.0], [1.0, 0.0]]))
    >>> out["ap"].tolist(), out["ndcg"].tolist()
    ([100.0, 50.0], [100.0, 0.0])
    """
    s = similarity(sim, "sim")
    r = _relevancy(relevancy, tuple(s.shape))
    ties = choice(ties, "ties", ("pessimistic", "optimistic"))
    if block_size is not None:
        block_size = check_block_size(block_size)
    ap, ndcg, has_ap, has_ndcg = _per_query(s, r, ties, block_size)
    return {"ap": np.where(has_ap, 100.0 * ap, np.nan), "ndcg": np.where(has_ndcg, 100.0 * ndcg, np.nan)}


@torch.no_grad()
def mir(sim: Any, relevancy: Any, *, ties: str = "pessimistic", empty: str = "skip",
        directions: str = "rows", block_size: int | None = None) -> dict:
    """EPIC-KITCHENS-100 multi-instance retrieval mAP and nDCG (percent).

    Args:
        sim: similarity matrix (queries x gallery), float16/32/64, numpy or torch.
        relevancy: graded relevancy in [0, 1] of the same shape (EPIC: mean of the
            verb-class IoU and the noun-class IoU, in [0, 1]).
        ties: "pessimistic" (per query and metric, the worst order of tied items: a
            true lower bound) or "optimistic" (the best: an upper bound); see module.
        empty: what a query without relevant items gets: "skip", "zero" or "error".
        directions: "rows" (rows are the queries) or "both" (also columns as queries;
            "mAP"/"nDCG" are then the mean of the two, with per-direction values under
            "mAP_rows", "mAP_cols", "nDCG_rows", "nDCG_cols").
        block_size: query rows per block (results do not depend on it).

    Returns:
        ``{"mAP": float, "nDCG": float}`` (plus per-direction keys for "both").

    Shape:
        sim: [Q, G]; relevancy: [Q, G].

    Examples:
        >>> import numpy as np
        >>> sim = np.array([[0.9, 0.1, 0.3], [0.2, 0.8, 0.1], [0.4, 0.7, 0.6]])
        >>> rel = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, 0.0], [0.5, 0.0, 1.0]])
        >>> {k: round(v, 2) for k, v in mir(sim, rel).items()}
        {'mAP': 83.33, 'nDCG': 82.65}
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


__all__ = ["mir", "mir_per_query"]
