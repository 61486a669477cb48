"""Multi-instance max-margin (MI-MM) of the EPIC-KITCHENS-100 retrieval baseline."""

from __future__ import annotations

import torch

from xmodal.functional._common import (Temperature, col, full_precision, prepare_pair,
                                       resolve_rows, scalar_or_per_sample, similarity, take)


def check_relevancy(relevancy: torch.Tensor, n: int) -> torch.Tensor:
    """Validate a ``[n, n]`` relevancy matrix (rows: videos, columns: texts)."""
    if not isinstance(relevancy, torch.Tensor):
        raise TypeError(f"relevancy: expected a torch.Tensor, got {type(relevancy).__name__}")
    if relevancy.shape != (n, n):
        raise ValueError(f"relevancy: expected shape [{n}, {n}], got {tuple(relevancy.shape)}")
    if relevancy.is_floating_point() and not bool(torch.isfinite(relevancy).all()):
        raise ValueError("relevancy: contains NaN/inf")
    return relevancy


def triplet_terms(queries: torch.Tensor, gallery: torch.Tensor, margin: float | torch.Tensor,
                  positives: torch.Tensor) -> torch.Tensor:
    """Per query ``i``: mean over (positive ``p``, negative ``n``) of ``max(0, m_i + s_in - s_ip)``.

    Computed in ``O(B log B)`` per query instead of enumerating the ``|P| x |N|``
    triplets: with the positives' similarities sorted ascending and prefix-summed,
    ``sum_p max(0, x - s_p) = k x - (s_(1) + ... + s_(k))`` for ``x = m_i + s_in`` and
    ``k = #{p : s_p < x}`` (``searchsorted``). The sum is piecewise linear, so autograd
    through the sort/cumsum/gather gives the exact (sub)gradient.

    Shape:
        queries ``[R, D]``, gallery ``[B, D]``, margin ``[R]``, positives bool ``[R, B]``;
        returns ``[R]`` (0 for a query with no positive or no negative).
    """
    with full_precision(queries.device):
        sim = similarity(queries, gallery)
        pos_sorted = sim.masked_fill(~positives, float("inf")).sort(dim=1).values
        finite = positives.sum(dim=1, keepdim=True) > torch.arange(sim.shape[1], device=sim.device)
        prefix = torch.cat([torch.zeros_like(sim[:, :1]),
                            pos_sorted.masked_fill(~finite, 0.0).cumsum(dim=1)], dim=1)
        x = col(margin) + sim
        k = torch.searchsorted(pos_sorted.detach().contiguous(), x.detach().contiguous())
        per_negative = k.to(sim.dtype) * x - prefix.gather(1, k)
        negatives = ~positives
        total = per_negative.masked_fill(~negatives, 0.0).sum(dim=1)
        count = positives.sum(dim=1) * negatives.sum(dim=1)
        return total / count.clamp_min(1).to(total.dtype)


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
        video, text ``[B, D]``; relevancy ``[B, B]``; returns a scalar. Time ``O(B^2 log B)``.
    """
    v, t = prepare_pair(video, text, normalize)
    n = v.shape[0]
    rel = check_relevancy(relevancy, n).to(v.device)
    m = scalar_or_per_sample(margin, n, "margin", like=v, allow_zero=True)
    idx = resolve_rows(rows, n, v.device)
    pos = rel >= threshold
    l_v2t = triplet_terms(v[idx], t, take(m, idx), pos[idx])
    l_t2v = triplet_terms(t[idx], v, take(m, idx), pos.t()[idx])
    return (l_v2t.mean() + l_t2v.mean()) / 2
