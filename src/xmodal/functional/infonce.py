"""Symmetric InfoNCE (CLIP loss) with per-sample and per-direction temperatures."""

from __future__ import annotations

import torch

from xmodal.functional._common import (Temperature, check_embeddings, check_ids, compute_dtype,
                                       full_precision, per_sample, positive_logit_mask, prepare,
                                       resolve_rows, same_id_mask, similarity)


def contrastive_terms(queries: torch.Tensor, gallery: torch.Tensor, tau: torch.Tensor,
                      idx: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Per-query cross-entropy ``-log softmax_k(s_ik / tau_i)`` at the positive ``k = idx[i]``.

    Args:
        queries: ``[R, D]`` (the query rows ``idx`` of the batch).
        gallery: ``[B, D]`` the whole batch of the other modality.
        tau: ``[R]`` temperature of each query.
        idx: ``[R]`` batch index of each query (its positive column).
        ids: optional ``[B]`` instance ids; gallery items sharing the query's id, other
            than its own pair, are removed from the denominator (``-inf``).

    Shape:
        returns ``[R]`` (float32, or float64 for float64 inputs).
    """
    with full_precision(queries.device):
        logits = similarity(queries, gallery) / tau[:, None]
        pos = logits.gather(1, idx[:, None]).squeeze(1)
        if ids is not None:
            other = same_id_mask(ids[idx], ids) & ~positive_logit_mask(idx, gallery.shape[0])
            logits = logits.masked_fill(other, float("-inf"))
        return torch.logsumexp(logits, dim=1) - pos


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
    check_embeddings(video, text)
    n = video.shape[0]
    dtype = compute_dtype(video, text)
    v = prepare(video, dtype, normalize)
    t = prepare(text, dtype, normalize)
    tau = per_sample(temperature, n, "temperature", like=v)
    tau_t2v = tau if t2v_temperature is None else per_sample(t2v_temperature, n, "t2v_temperature", like=v)
    tau_v2t = tau if v2t_temperature is None else per_sample(v2t_temperature, n, "v2t_temperature", like=v)
    if ids is not None:
        ids = check_ids(ids, n).to(v.device)
    idx = resolve_rows(rows, n, v.device)
    if rows is None:  # skip the row copies in the common case
        l_t2v = contrastive_terms(t, v, tau_t2v, idx, ids)
        l_v2t = contrastive_terms(v, t, tau_v2t, idx, ids)
    else:
        l_t2v = contrastive_terms(t[idx], v, tau_t2v[idx], idx, ids)
        l_v2t = contrastive_terms(v[idx], t, tau_v2t[idx], idx, ids)
    return (l_t2v.mean() + l_v2t.mean()) / 2
