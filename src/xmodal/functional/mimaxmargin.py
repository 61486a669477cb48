"""Multi-instance max-margin (MI-MM) of the EPIC-KITCHENS-100 retrieval baseline."""

from __future__ import annotations

import torch

from xmodal.functional._common import (Temperature, full_precision, per_sample, prepare_pair,
                                       resolve_rows, similarity)


def check_relevancy(relevancy: torch.Tensor, n: int) -> torch.Tensor:
    """Validate a ``[n, n]`` relevancy matrix (rows: videos, columns: texts)."""
    if not isinstance(relevancy, torch.Tensor):
        raise TypeError(f"relevancy: expected a torch.Tensor, got {type(relevancy).__name__}")
    if relevancy.shape != (n, n):
        raise ValueError(f"relevancy: expected shape [{n}, {n}], got {tuple(relevancy.shape)}")
    if relevancy.is_floating_point() and not bool(torch.isfinite(relevancy).all()):
        raise ValueError("relevancy: contains NaN/inf")
    return relevancy


def triplet_terms(queries: torch.Tensor, gallery: torch.Tensor, margin: torch.Tensor,
                  positives: torch.Tensor) -> torch.Tensor:
    """Per query ``i``: mean over (positive ``p``, negative ``n``) of ``max(0, m_i + s_in - s_ip)``.

    Shape:
        queries ``[R, D]``, gallery ``[B, D]``, margin ``[R]``, positives bool ``[R, B]``;
        returns ``[R]`` (0 for a query with no positive or no negative). Memory ``R*B*B``.
    """
    with full_precision(queries.device):
        sim = similarity(queries, gallery)
        # [R, p, n]
        hinge = (margin[:, None, None] + sim[:, None, :] - sim[:, :, None]).clamp_min(0.0)
        valid = positives[:, :, None] & ~positives[:, None, :]
        total = hinge.masked_fill(~valid, 0.0).sum(dim=(1, 2))
        return total / valid.sum(dim=(1, 2)).clamp_min(1).to(total.dtype)


def mi_max_margin(video: torch.Tensor, text: torch.Tensor, relevancy: torch.Tensor, *,
                  margin: Temperature = 0.2, threshold: float = 0.5, normalize: bool = True,
                  rows: torch.Tensor | slice | None = None) -> torch.Tensor:
    """Multi-Instance Max-Margin (Wray et al., EPIC-KITCHENS-100, IJCV 2021, MI-MM baseline).

    Positives of video ``i`` are the texts ``j`` with ``relevancy[i, j] >= threshold``,
    negatives the rest (and symmetrically for a text anchor over the column). Per
    direction::

        L_v2t = 1/B sum_i 1/|P_i x N_i| sum_{p in P_i, n in N_i} max(0, m_i + s(v_i,t_n) - s(v_i,t_p))

    ``L = (L_v2t + L_t2v) / 2``. The threshold ``>= 0.5`` and margin 0.2 are the
    defaults of the official code (github.com/adrianofragomeni/MI-MM, ``--rel 0.5``,
    ``--margin 0.2``, ``np.where(relevancy >= rel)``). That code samples one relevant
    caption per video and uses the in-batch max-margin; here every in-batch pair is
    classified by the relevancy matrix (a relevant off-diagonal pair is a positive, never
    a negative). With an identity relevancy this equals
    :func:`~xmodal.functional.maxmargin.max_margin`. Anchors with no positive or no
    negative contribute 0.

    Args:
        video, text: ``[B, D]`` embeddings.
        relevancy: ``[B, B]`` graded relevancy, rows videos, columns texts.
        margin: float or ``[B]`` (per anchor), >= 0.
        threshold: relevancy at or above which a pair is positive.
        normalize: L2-normalise first.
        rows: anchors computed (``None``: all; ``local_loss``).

    Shape:
        video, text ``[B, D]``; relevancy ``[B, B]``; returns a scalar. Memory ``O(B^3)``.
    """
    v, t = prepare_pair(video, text, normalize)
    n = v.shape[0]
    rel = check_relevancy(relevancy, n).to(v.device)
    m = per_sample(margin, n, "margin", like=v, allow_zero=True)
    idx = resolve_rows(rows, n, v.device)
    pos = rel >= threshold
    l_v2t = triplet_terms(v[idx], t, m[idx], pos[idx])
    l_t2v = triplet_terms(t[idx], v, m[idx], pos.t()[idx])
    return (l_v2t.mean() + l_t2v.mean()) / 2
