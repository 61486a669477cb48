"""Embedding-space diagnostics: normalisation error (NCL), modality gap, hubness."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from xmodal._validate import positive_number, short_repr
from xmodal.metrics._common import check_finite, default_block, similarity


@torch.no_grad()
def normalization_error(sim: Any, temperature: float, target: Any = None) -> float:
    """How far the softmax retrieval mass each gallery item receives is from its target.

    NCL (Park et al., "Normalized Contrastive Learning for Text-Video Retrieval", EMNLP
    2022), eq. 5: ``mean_j | target_j - sum_i softmax_j(sim_i / temperature) |``, where the
    softmax of query ``i`` runs over the gallery. The paper's target is uniform,
    ``num_queries / num_gallery``; here any per-item target is allowed, e.g. the number
    of queries that match item ``j`` (5 for every image of a 5-caption dataset).

    Args:
        sim: [Q, G] similarities.
        temperature: softmax temperature (> 0).
        target: optional [G] non-negative expected mass per gallery item.

    Returns:
        The mean absolute deviation (0 is perfectly balanced), a float.

    Shape:
        sim: [Q, G]; target: [G].

    Examples:
        >>> import numpy as np
        >>> round(normalization_error(np.eye(3), temperature=0.1), 6)   # every item gets its share
        0.0
        >>> sim = np.array([[0.9, 0.1, 0.3], [0.2, 0.8, 0.1], [0.4, 0.7, 0.6]])
        >>> round(normalization_error(sim, temperature=0.1), 4)
        0.4914
    """
    s = similarity(sim, "sim")
    t = positive_number(temperature, "temperature")
    q, g = s.shape
    if target is None:
        tgt = torch.full((g,), q / g, dtype=torch.float64)
    else:
        tgt = similarity(target, "target", ndim=1).to(torch.float64).cpu()
        if tgt.shape[0] != g:
            raise ValueError(f"target: expected {g} values (one per gallery item), got {tgt.shape[0]}")
        if float(tgt.min()) < 0:
            raise ValueError("target: values must be >= 0")
    mass = torch.zeros(g, dtype=torch.float64)
    for start in range(0, q, default_block(g)):
        blk = s[start:start + default_block(g)].to(torch.float64)
        mass += torch.softmax(blk / t, dim=1).sum(0).cpu()
    return float((tgt - mass).abs().mean())


@torch.no_grad()
def modality_gap(a: Any, b: Any) -> float:
    """Distance between the centroids of two L2-normalised embedding sets.

    Liang et al., "Mind the Gap", NeurIPS 2022: ``|| mean(normalize(a)) -
    mean(normalize(b)) ||_2``. All-zero rows stay zero after normalisation.

    Shape:
        a: [N, D]; b: [M, D].

    Examples:
        >>> import numpy as np
        >>> round(modality_gap(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[1.0, 0.0], [1.0, 0.0]])), 4)
        0.7071
    """
    x = similarity(a, "a").to(torch.float64)
    y = similarity(b, "b").to(torch.float64)
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"b: embedding dimension {y.shape[1]} differs from a's {x.shape[1]}")
    y = y.to(x.device)
    gap = F.normalize(x, dim=1).mean(0) - F.normalize(y, dim=1).mean(0)
    return float(gap.norm())


@torch.no_grad()
def k_occurrence(sim: Any, k: int = 10) -> np.ndarray:
    """How often each gallery item appears in the queries' top-k lists (int64 [G]).

    Ties at the k-th score are broken by ``torch.topk`` (deterministic, arbitrary).
    """
    s = similarity(sim, "sim")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"k: expected a positive integer, got {short_repr(k)}")
    q, g = s.shape
    if not 1 <= k <= g:
        raise ValueError(f"k: must lie in [1, {g}] (the gallery size), got {k}")
    counts = torch.zeros(g, dtype=torch.int64)
    b = default_block(g)
    for start in range(0, q, b):
        idx = s[start:start + b].topk(int(k), dim=1).indices.flatten().cpu()
        counts += torch.bincount(idx, minlength=g)
    return counts.numpy()


def hubness(sim: Any, k: int = 10) -> float:
    """Skewness of the k-occurrence distribution (Radovanovic et al., JMLR 2010).

    Large positive values mean a few gallery items ("hubs") sit in many queries' top-k.
    Uses the (biased) sample skewness of ``scipy.stats.skew``; 0.0 when every item
    occurs equally often.

    Shape:
        sim: [Q, G].
    """
    from scipy.stats import skew

    counts = k_occurrence(sim, k).astype(np.float64)
    if counts.std() == 0:
        return 0.0
    return float(skew(counts))


__all__ = ["normalization_error", "modality_gap", "hubness", "k_occurrence", "check_finite"]
