"""Debiased contrastive loss (Chuang et al., NeurIPS 2020), cross-modal and symmetric."""

from __future__ import annotations

import math

import torch

from xmodal.functional._common import (Temperature, check_ids, col, directional, full_precision,
                                       positive_logit_mask, prepare_pair, resolve_rows,
                                       same_id_mask, similarity, take)


def debiased_terms(queries: torch.Tensor, gallery: torch.Tensor, tau: float | torch.Tensor,
                   idx: torch.Tensor, negatives: torch.Tensor, tau_plus: float, *,
                   sim: torch.Tensor | None = None) -> torch.Tensor:
    """Per-query debiased loss ``-log e^{s+} / (e^{s+} + N g)`` (eqs. 6-7), log domain.

    Everything is shifted by the row maximum ``M`` (detached; it cancels exactly) so
    that ``exp`` never overflows at small temperatures.

    Shape:
        queries ``[R, D]``, gallery ``[B, D]``, tau ``[R]``, idx ``[R]``, negatives bool
        ``[R, B]``; returns ``[R]``. ``sim``: ``queries @ gallery.T`` when the caller already
        has it (the full batch: one matmul for both directions).
    """
    with full_precision(queries.device):
        logits = (similarity(queries, gallery) if sim is None else sim) / col(tau)
        pos = logits.gather(1, idx[:, None]).squeeze(1)
        shift = logits.detach().max(dim=1).values
        pos_e = torch.exp(pos - shift)
        neg_e = torch.exp(logits.masked_fill(~negatives, float("-inf")) - shift[:, None]).sum(dim=1)
        count = negatives.sum(dim=1).to(logits.dtype)
        ng = (neg_e - tau_plus * count * pos_e) / (1.0 - tau_plus)
        floor = count * torch.exp(-1.0 / tau - shift)
        ng = torch.maximum(ng, floor)
        return torch.log(pos_e + ng) - (pos - shift)


def debiased_contrastive(video: torch.Tensor, text: torch.Tensor, *,
                         temperature: Temperature = 0.05, tau_plus: float = 0.1,
                         t2v_temperature: Temperature | None = None,
                         v2t_temperature: Temperature | None = None,
                         ids: torch.Tensor | None = None, normalize: bool = True,
                         rows: torch.Tensor | slice | None = None) -> torch.Tensor:
    """Debiased contrastive loss (Chuang et al. 2020, eqs. 6-7 with the Ng estimator).

    For anchor ``i`` (video->text; text->video symmetric) with ``N_i`` cross-modal
    negatives (``j != i``; with ``ids`` also ``ids_j != ids_i``), ``N = |N_i|``::

        Ng_i = max( (sum_{j in N_i} e^{s_ij/t} - tau_plus * N * e^{s_ii/t}) / (1 - tau_plus),
                    N * e^{-1/t} )
        l_i  = -log e^{s_ii/t} / (e^{s_ii/t} + Ng_i)

    as the official code (``torch.clamp(Ng, min=N * e^{-1/t})``; its ``N = 2B - 2``
    counts the SimCLR views, here the cross-modal ``B - 1``). ``L = (L_t2v + L_v2t)/2``.
    ``tau_plus = 0`` is InfoNCE with the own pair left out of the negatives, i.e.
    exactly :func:`~xmodal.functional.infonce.info_nce` unless the clamp is active.

    Raises:
        ValueError: an anchor has no negative (``B = 1``, or all ids equal): the
            estimator divides by ``N``'s absence; ``tau_plus`` outside ``[0, 1)``.

    Shape:
        video, text: ``[B, D]``; temperature float or ``[B]``; returns a scalar.
    """
    tau_plus = float(tau_plus)
    if not 0.0 <= tau_plus < 1.0 or math.isnan(tau_plus):
        raise ValueError(f"tau_plus: must lie in [0, 1), got {tau_plus}")
    v, t = prepare_pair(video, text, normalize)
    n = v.shape[0]
    tau_t2v, tau_v2t = directional(temperature, t2v_temperature, v2t_temperature, n,
                                   "temperature", v)
    idx = resolve_rows(rows, n, v.device)
    negatives = ~positive_logit_mask(idx, n)
    if ids is not None:
        ids = check_ids(ids, n).to(v.device)
        negatives = negatives & ~same_id_mask(ids[idx], ids)
    if not bool(negatives.any(dim=1).all()):
        raise ValueError("video/text: DebiasedContrastive needs at least one negative per "
                         "anchor (B >= 2 and not all ids equal)")
    if rows is None:  # the whole batch: one similarity matrix, read both ways
        sim = similarity(v, t)
        l_v2t = debiased_terms(v, t, tau_v2t, idx, negatives, tau_plus, sim=sim)
        l_t2v = debiased_terms(t, v, tau_t2v, idx, negatives, tau_plus, sim=sim.T.contiguous())
    else:
        l_v2t = debiased_terms(v[idx], t, take(tau_v2t, idx), idx, negatives, tau_plus)
        l_t2v = debiased_terms(t[idx], v, take(tau_t2v, idx), idx, negatives, tau_plus)
    return (l_t2v.mean() + l_v2t.mean()) / 2
