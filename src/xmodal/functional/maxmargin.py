"""Bidirectional max-margin (hinge) ranking loss; VSE++ hardest-negative variant."""

from __future__ import annotations

import torch

from xmodal._validate import choice
from xmodal.functional._common import (Temperature, check_ids, col, full_precision,
                                       positive_logit_mask, prepare_pair, resolve_rows,
                                       same_id_mask, scalar_or_per_sample, similarity, take)


def hinge_terms(queries: torch.Tensor, gallery: torch.Tensor, margin: float | torch.Tensor,
                idx: torch.Tensor, negatives: torch.Tensor, hardest: bool,
                negative_reduction: str = "mean") -> torch.Tensor:
    """Per-query hinge ``max(0, s_ij - s_ii + m_i)`` over the negatives ``j``.

    Args:
        queries: ``[R, D]``; gallery: ``[B, D]``; margin: ``[R]``; idx: ``[R]`` positive
            column of each query; negatives: bool ``[R, B]``.
        hardest: max over the negatives (VSE++) instead of their mean.
        negative_reduction: ``"mean"`` or ``"sum"`` over each query's negatives.

    Shape:
        returns ``[R]``; a query without negatives gives 0.
    """
    with full_precision(queries.device):
        sim = similarity(queries, gallery)
        pos = sim.gather(1, idx[:, None])
        hinge = (sim - pos + col(margin)).clamp_min(0.0)
        # hinge >= 0, so filling non-negatives with 0 leaves the max/sum over negatives exact
        hinge = hinge.masked_fill_(~negatives, 0.0)  # in place: clamp_min keeps only its input
        if hardest:
            return hinge.max(dim=1).values
        if negative_reduction == "sum":
            return hinge.sum(dim=1)
        return hinge.sum(dim=1) / negatives.sum(dim=1).clamp_min(1).to(hinge.dtype)


def _hinge_both(sim: torch.Tensor, margin: float | torch.Tensor, negatives: torch.Tensor,
                hardest: bool, negative_reduction: str, dim: int) -> torch.Tensor:
    """:func:`hinge_terms` of the whole batch read off one ``[B, B]`` similarity: ``dim=1``
    reduces each row (video anchors, v2t), ``dim=0`` each column (text anchors, t2v) without a
    transposed copy. ``negatives`` is symmetric here (no ``rows``). Shape: returns ``[B]``."""
    shape = (-1, 1) if dim == 1 else (1, -1)
    pos = sim.diagonal().reshape(shape)
    m = margin if isinstance(margin, float) else margin.reshape(shape)
    hinge = (sim - pos + m).clamp_min(0.0).masked_fill_(~negatives, 0.0)
    if hardest:
        return hinge.max(dim=dim).values
    if negative_reduction == "sum":
        return hinge.sum(dim=dim)
    return hinge.sum(dim=dim) / negatives.sum(dim=dim).clamp_min(1).to(hinge.dtype)


def max_margin(video: torch.Tensor, text: torch.Tensor, *, margin: Temperature = 0.2,
               ids: torch.Tensor | None = None, hardest: bool = False, normalize: bool = True,
               rows: torch.Tensor | slice | None = None,
               negative_reduction: str = "mean") -> torch.Tensor:
    """Bidirectional max-margin ranking loss (TS++ eqs. 3.3 / 4.8; VSE++, Faghri et al. 2018).

    Per direction (``v2t``: anchor ``v_i`` against texts; ``t2v``: anchor ``t_i``)::

        L_dir = 1/B sum_i 1/|N_i| sum_{j in N_i} max(0, s_ij - s_ii + m_i)

    with ``N_i`` the negatives of anchor ``i`` (all ``j != i``; with ``ids`` also
    ``ids_j != ids_i``) and ``m_i`` the per-sample margin (TS++ eq. 4.8).
    ``L = (L_t2v + L_v2t) / 2``.

    Normalisation, exactly: *mean over the negatives of each anchor, then mean over
    anchors* (the API's "mean over negatives"). Without ids this is
    ``1/(B(B-1)) sum_i sum_{j != i}``, i.e. TS++ eq. 3.3's ``1/N sum_i sum_{j != i}``
    divided by ``B - 1``, and equals the official MI-MM/EPIC-100 baseline's
    ``MaxMarginRankingLoss(...).mean()`` per direction (that code *sums* the two
    directions: 2x this value). ``negative_reduction="sum"`` gives TS++ eq. 3.3 literally
    (sum over the negatives, ``1/N`` over anchors). An anchor without negatives
    (``B = 1``, or all ids equal) contributes 0.

    ``hardest=True`` (VSE++ eq. 5): ``max_{j in N_i}`` replaces the mean over ``N_i``.

    Args:
        video, text: ``[B, D]`` embeddings.
        margin: float or ``[B]`` tensor, >= 0.
        ids: optional integer ``[B]`` instance ids.
        hardest: VSE++ hardest negative.
        normalize: L2-normalise first.
        rows: anchors computed (``None``: all; ``local_loss``).
        negative_reduction: ``"mean"`` (default) or ``"sum"`` over each anchor's negatives.

    Shape:
        video, text: ``[B, D]``; returns a scalar.
    """
    choice(negative_reduction, "negative_reduction", ("mean", "sum"))
    v, t = prepare_pair(video, text, normalize)
    n = v.shape[0]
    m = scalar_or_per_sample(margin, n, "margin", like=v, allow_zero=True)
    idx = resolve_rows(rows, n, v.device)
    negatives = ~positive_logit_mask(idx, n)
    if ids is not None:
        ids = check_ids(ids, n).to(v.device)
        negatives = negatives & ~same_id_mask(ids[idx], ids)
    if rows is None:  # the whole batch: one similarity matrix, rows for v2t, columns for t2v
        with full_precision(v.device):
            sim = similarity(v, t)
            l_v2t, l_t2v = (_hinge_both(sim, m, negatives, hardest, negative_reduction, dim)
                            for dim in (1, 0))
    else:
        l_v2t = hinge_terms(v[idx], t, take(m, idx), idx, negatives, hardest, negative_reduction)
        l_t2v = hinge_terms(t[idx], v, take(m, idx), idx, negatives, hardest, negative_reduction)
    return (l_t2v.mean() + l_v2t.mean()) / 2
