"""Retrieval mass per gallery item and false-negative / false-positive rates by mass.

NCL (Park et al., "Normalized Contrastive Learning for Text-Video Retrieval", EMNLP
2022), Sec. 3.2: the *retrieval mass* of gallery item ``v_j`` is the sum of its
retrieval probabilities over the test queries, ``sum_i P(v_j | t_i)`` with
``P(v_j | t_i) = softmax_j(sim_ij / tau)`` (eq. 5's summand). With one query per item a
balanced gallery has every mass at 1 (in general ``Q / G``). Items with mass below it
are under-represented and are "not retrieved by the true query" (false negatives);
items above it are "wrongly retrieved by irrelevant queries" (false positives). Fig. 3
plots both rates against the mass.

The paper does not spell out the rates. Here, with a cut-off ``k`` (Fig. 3: top-1):

* FN rate of a set of items = (pairs (query, positive item) whose item is NOT in the
  query's top-k) / (all (query, positive item) pairs of those items).
* FP rate of a set of items = (query top-k slots holding one of those items for a query
  it does not match) / (all query top-k slots holding one of those items), i.e.
  ``100 - precision@k`` of the items.

Top-k membership uses the pessimistic tie rule of :func:`xmodal.metrics.retrieval`: item
``j`` is in query ``i``'s top-k iff ``#{l : sim_il >= sim_ij} <= k``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xmodal._validate import positive_number, short_repr
from xmodal.metrics._common import default_block, positives_of, similarity


@torch.no_grad()
def retrieval_mass(sim: Any, temperature: float) -> np.ndarray:
    """Per gallery item, ``sum_i softmax_j(sim_ij / temperature)`` (NCL Sec. 3.2, Fig. 3).

    Args:
        sim: similarities ``[Q, G]`` (rows: queries).
        temperature: softmax temperature (> 0), e.g. the model's ``temperature``.

    Returns:
        float64 ``[G]``; the masses sum to ``Q``.

    Shape:
        sim: [Q, G] -> [G].

    Examples:
        >>> import numpy as np
        >>> retrieval_mass(np.array([[1.0, 0.0], [1.0, 0.0]]), 1.0).round(3)
        array([1.462, 0.538])
    """
    s = similarity(sim, "sim")
    t = positive_number(temperature, "temperature")
    q, g = s.shape
    mass = torch.zeros(g, dtype=torch.float64)
    b = default_block(g)
    for start in range(0, q, b):
        blk = s[start:start + b].to(torch.float64)
        mass += torch.softmax(blk / t, dim=1).sum(0).cpu()
    return mass.numpy()


def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k: expected a positive integer, got {short_repr(k)}")
    return int(k)


@torch.no_grad()
def item_error_counts(sim: Any, positives: Any, k: int = 1) -> dict[str, np.ndarray]:
    """Per gallery item: positive pairs, missed positives, top-k slots and wrong slots.

    Returns:
        int64 ``[G]`` arrays ``num_positive_pairs``, ``false_negatives`` (positive pairs
        whose item is outside the query's top-k), ``num_retrieved`` (queries with the item
        in their top-k) and ``false_positives`` (of those, queries it does not match).

    Shape:
        sim: [Q, G]; positives: int [Q] or bool [Q, G].
    """
    s = similarity(sim, "sim")
    k = _check_k(k)
    q, g = s.shape
    pos = positives_of(positives, q, g, s.device)
    out = {n: torch.zeros(g, dtype=torch.int64) for n in
           ("num_positive_pairs", "false_negatives", "num_retrieved", "false_positives")}
    b = default_block(g)
    for start in range(0, q, b):
        blk = s[start:start + b]
        pb = pos[start:start + b]
        if pb.dtype != torch.bool:
            pb = torch.zeros_like(blk, dtype=torch.bool).scatter_(1, pb[:, None], True)
        if g > k:   # in top-k (pessimistic) iff strictly above the (k+1)-th largest score
            kth = blk.topk(k + 1, dim=1).values[:, -1:]
            top = blk > kth
        else:
            top = torch.ones_like(blk, dtype=torch.bool)
        out["num_positive_pairs"] += pb.sum(0).cpu()
        out["false_negatives"] += (pb & ~top).sum(0).cpu()
        out["num_retrieved"] += top.sum(0).cpu()
        out["false_positives"] += (top & ~pb).sum(0).cpu()
    return {n: v.numpy() for n, v in out.items()}


def _edges(mass: np.ndarray, bins: Any) -> np.ndarray:
    if isinstance(bins, (int, np.integer)) and not isinstance(bins, bool):
        if bins < 1:
            raise ValueError(f"bins: expected a positive number of bins, got {bins}")
        edges = np.unique(np.quantile(mass, np.linspace(0.0, 1.0, int(bins) + 1)))
        return edges if edges.size > 1 else np.array([mass.min(), mass.max() + 1e-12])
    edges = np.asarray(bins, dtype=np.float64)
    if edges.ndim != 1 or edges.size < 2 or not np.all(np.diff(edges) > 0) or not np.isfinite(edges).all():
        raise ValueError("bins: expected an int or at least two finite, strictly increasing edges")
    return edges


def fn_fp_by_mass(sim: Any, positives: Any, temperature: float, *, bins: Any = 10,
                  k: int = 1) -> dict[str, Any]:
    """False-negative and false-positive rates of gallery items binned by retrieval mass.

    NCL Sec. 3.2, Fig. 3 (definitions of the rates: module docstring).

    Args:
        sim: similarities ``[Q, G]``.
        positives: int ``[Q]`` (the correct item per query) or bool ``[Q, G]``.
        temperature: softmax temperature of the retrieval probabilities (> 0).
        bins: number of equal-count (quantile) bins of the mass, or increasing bin edges
            (items outside the edges are left out). Bins are ``[e_i, e_{i+1})``, the last
            one closed.
        k: top-k cut-off (Fig. 3: 1).

    Returns:
        ``{"edges", "num_items", "mean_mass", "num_positive_pairs", "fn_rate",
        "num_retrieved", "fp_rate"}`` as lists with one entry per bin (rates in percent,
        ``None`` where a bin has no positive pair / no retrieval), plus ``"expected_mass"``
        (``Q / G``) and ``"k"``.

    Shape:
        sim: [Q, G]; positives: [Q] or [Q, G].

    Examples:
        >>> import numpy as np
        >>> sim = np.array([[0.9, 0.1, 0.0], [0.8, 0.2, 0.1], [0.7, 0.1, 0.3]])
        >>> r = fn_fp_by_mass(sim, np.array([0, 1, 2]), 0.1, bins=[0.0, 1.0, 3.0])
        >>> r["fn_rate"], r["fp_rate"]
        ([100.0, 0.0], [None, 66.66666666666667])
    """
    mass = retrieval_mass(sim, temperature)
    counts = item_error_counts(sim, positives, k)
    edges = _edges(mass, bins)
    idx = np.searchsorted(edges, mass, side="right") - 1
    idx[mass == edges[-1]] = edges.size - 2
    keep = (idx >= 0) & (idx < edges.size - 1)
    nb = edges.size - 1

    def per_bin(v: np.ndarray) -> np.ndarray:
        return np.bincount(idx[keep], weights=v[keep].astype(np.float64), minlength=nb)

    def rate(num: np.ndarray, den: np.ndarray) -> list:
        return [100.0 * float(a) / float(b) if b > 0 else None for a, b in zip(num, den)]

    n_items = per_bin(np.ones_like(mass))
    npos, nret = per_bin(counts["num_positive_pairs"]), per_bin(counts["num_retrieved"])
    mean_mass = np.divide(per_bin(mass), n_items, out=np.full(nb, np.nan), where=n_items > 0)
    q, g = len(similarity(sim, "sim")), mass.size
    return {"edges": edges.tolist(), "num_items": n_items.astype(int).tolist(),
            "mean_mass": [None if np.isnan(m) else float(m) for m in mean_mass],
            "num_positive_pairs": npos.astype(int).tolist(),
            "fn_rate": rate(per_bin(counts["false_negatives"]), npos),
            "num_retrieved": nret.astype(int).tolist(),
            "fp_rate": rate(per_bin(counts["false_positives"]), nret),
            "expected_mass": q / g, "k": int(k)}


__all__ = ["retrieval_mass", "item_error_counts", "fn_fp_by_mass"]
