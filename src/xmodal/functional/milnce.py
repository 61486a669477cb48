"""MIL-NCE: NCE with several positives in the numerator (Miech et al. 2020)."""

from __future__ import annotations

import torch

from xmodal.functional._common import (Temperature, check_ids, col, directional, full_precision,
                                       positive_logit_mask, prepare_pair, resolve_rows,
                                       same_id_mask, similarity, take)


def mil_terms(queries: torch.Tensor, gallery: torch.Tensor, tau: float | torch.Tensor,
              positives: torch.Tensor) -> torch.Tensor:
    """``-log sum_{p in P_i} exp(s_ip/tau_i) / sum_k exp(s_ik/tau_i)`` per query. Shape: ``[R]``."""
    with full_precision(queries.device):
        logits = similarity(queries, gallery) / col(tau)
        num = torch.logsumexp(logits.masked_fill(~positives, float("-inf")), dim=1)
        return torch.logsumexp(logits, dim=1) - num


def mil_nce(video: torch.Tensor, text: torch.Tensor, *, temperature: Temperature = 0.05,
            t2v_temperature: Temperature | None = None,
            v2t_temperature: Temperature | None = None, ids: torch.Tensor | None = None,
            normalize: bool = True, rows: torch.Tensor | slice | None = None) -> torch.Tensor:
    """Symmetric MIL-NCE (Miech et al., CVPR 2020, eq. 1) with the positives given by ``ids``.

    For a video anchor ``i`` the positive set ``P_i`` is every text with ``ids_j == ids_i``
    (its own pair included), the negatives the rest of the batch::

        L_v2t = -1/B sum_i log sum_{j in P_i} e^{s_ij/tau_i} / sum_k e^{s_ik/tau_i}

    ``L = (L_t2v + L_v2t) / 2``. Without ``ids`` it is exactly
    :func:`~xmodal.functional.infonce.info_nce`. The official HowTo100M code puts both
    directions' negatives in one joint denominator per video; here each direction has
    its own (the symmetric form used for paired batches).

    Args:
        video, text: ``[B, D]`` embeddings.
        temperature: float or ``[B]``; ``t2v_temperature``/``v2t_temperature`` override it.
        ids: optional integer ``[B]`` instance ids (``None``: each pair its own instance).
        normalize: L2-normalise first.
        rows: anchors computed (``None``: all; ``local_loss``).

    Shape:
        video, text: ``[B, D]``; returns a scalar.
    """
    v, t = prepare_pair(video, text, normalize)
    n = v.shape[0]
    tau_t2v, tau_v2t = directional(temperature, t2v_temperature, v2t_temperature, n,
                                   "temperature", v)
    idx = resolve_rows(rows, n, v.device)
    if ids is None:
        positives = positive_logit_mask(idx, n)
    else:
        ids = check_ids(ids, n).to(v.device)
        positives = same_id_mask(ids[idx], ids)
    l_v2t = mil_terms(v[idx], t, take(tau_v2t, idx), positives)
    l_t2v = mil_terms(t[idx], v, take(tau_t2v, idx), positives)
    return (l_t2v.mean() + l_v2t.mean()) / 2
