"""Symmetric InfoNCE (CLIP loss) with per-sample and per-direction temperatures."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xmodal.functional._common import (Temperature, check_ids, directional, full_precision,
                                       positive_logit_mask, prepare_pair, resolve_rows,
                                       same_id_mask, similarity, take)


def contrastive_terms(queries: torch.Tensor, gallery: torch.Tensor, tau: float | torch.Tensor,
                      idx: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Per-query cross-entropy ``-log softmax_k(s_ik / tau_i)`` at the positive ``k = idx[i]``.

    Args:
        queries: ``[R, D]`` (the query rows ``idx`` of the batch).
        gallery: ``[B, D]`` the whole batch of the other modality.
        tau: ``[R]`` temperature of each query, or one float.
        idx: ``[R]`` batch index of each query (its positive column).
        ids: optional ``[B]`` instance ids; gallery items sharing the query's id, other
            than its own pair, are removed from the denominator (``-inf``).

    Shape:
        returns ``[R]`` (float32, or float64 for float64 inputs).
    """
    return terms_from_similarity(similarity(queries, gallery), tau, idx, ids)


def terms_from_similarity(sim: torch.Tensor, tau: float | torch.Tensor, idx: torch.Tensor,
                          ids: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`contrastive_terms` from a precomputed ``[R, B]`` similarity block."""
    if not isinstance(tau, float):
        tau = tau[:, None]
    with full_precision(sim.device):
        logits = sim / tau
        if ids is not None:
            other = same_id_mask(ids[idx], ids) & ~positive_logit_mask(idx, sim.shape[1])
            logits = logits.masked_fill(other, float("-inf"))
        # == logsumexp(logits) - logits[idx]; the fused log-softmax kernel is ~2x faster
        # than logsumexp when logits span a wide range (unnormalised inputs, small tau)
        return F.cross_entropy(logits, idx, reduction="none")


def info_nce(video: torch.Tensor, text: torch.Tensor, *, temperature: Temperature = 0.05,
             t2v_temperature: Temperature | None = None,
             v2t_temperature: Temperature | None = None, ids: torch.Tensor | None = None,
             normalize: bool = True, rows: torch.Tensor | slice | None = None) -> torch.Tensor:
    """Symmetric InfoNCE, ``L = (L_t2v + L_v2t) / 2`` (CLIP; TS++ eq. 4.7 per-sample tau).

    ``L_t2v = -1/R sum_i log exp(s_ii / tau_i) / sum_k exp(s_ik / tau_i)`` with
    ``s_ik = <t_i, v_k>`` (cosine when ``normalize``); ``L_v2t`` swaps the roles. The
    temperature of pair ``i`` scales both of its rows; ``t2v_temperature`` /
    ``v2t_temperature`` override it per direction (TS++ sec. 5.6.4).

    ``ids``: the positive of row ``i`` stays the diagonal pair ``(i, i)``; every other
    entry sharing ``i``'s id is *masked out of the denominator* (neither positive nor
    negative). Use :func:`~xmodal.functional.milnce.mil_nce` to count them as positives.

    ``B = 1``: the only logit is the positive, the loss is exactly 0 (no negatives).

    Args:
        video, text: embeddings ``[B, D]``; row ``i`` of each forms pair ``i``.
        temperature: float or ``[B]`` tensor, > 0.
        t2v_temperature, v2t_temperature: optional per-direction overrides.
        ids: optional integer ``[B]`` instance ids.
        normalize: L2-normalise the embeddings first.
        rows: query rows whose terms are averaged (``None``: all); with gathered
            embeddings a rank passes its own rows (open_clip ``local_loss``).

    Shape:
        video, text: ``[B, D]``; temperatures ``[B]`` or scalar; returns a scalar.
    """
    v, t = prepare_pair(video, text, normalize)
    n = v.shape[0]
    tau_t2v, tau_v2t = directional(temperature, t2v_temperature, v2t_temperature, n,
                                   "temperature", v)
    if ids is not None:
        ids = check_ids(ids, n).to(v.device)
    idx = resolve_rows(rows, n, v.device)
    if rows is None:  # one matmul serves both directions (s_t2v = s_v2t^T)
        sim = similarity(v, t)
        l_v2t = terms_from_similarity(sim, tau_v2t, idx, ids)
        l_t2v = terms_from_similarity(sim.t(), tau_t2v, idx, ids)
    else:
        l_t2v = contrastive_terms(t[idx], v, take(tau_t2v, idx), idx, ids)
        l_v2t = contrastive_terms(v[idx], t, take(tau_v2t, idx), idx, ids)
    return (l_t2v.mean() + l_v2t.mean()) / 2
