"""MIL-NCE: NCE with several positives in the numerator (Miech et al. 2020)."""

from __future__ import annotations

import torch

from xmodal.functional._common import (Temperature, check_ids, col, directional, full_precision,
                                       positive_logit_mask, prepare_pair, resolve_rows,
                                       same_id_mask, scalar_or_per_sample, similarity,
                                       take)


def mil_terms(queries: torch.Tensor, gallery: torch.Tensor, tau: float | torch.Tensor,
              positives: torch.Tensor, *, sim: torch.Tensor | None = None) -> torch.Tensor:
    """``-log sum_{p in P_i} exp(s_ip/tau_i) / sum_k exp(s_ik/tau_i)`` per query. Shape: ``[R]``.

    ``sim``: ``queries @ gallery.T`` when the caller already has it (full batch, both directions).
    """
    with full_precision(queries.device):
        logits = (similarity(queries, gallery) if sim is None else sim) / col(tau)
        num = torch.logsumexp(logits.masked_fill(~positives, float("-inf")), dim=1)
        return torch.logsumexp(logits, dim=1) - num


def joint_mil_nce(v: torch.Tensor, t: torch.Tensor, tau: float, ids: torch.Tensor) -> torch.Tensor:
    """The official HowTo100M form: one loss per *video instance* with a joint denominator.

    Video instance ``u`` (first row of each id) with caption set ``P_u``::

        l_u = -log sum_{p in P_u} e^{s(v_u,t_p)/tau}
                  / (sum_k e^{s(v_u,t_k)/tau} + sum_{u'} sum_{p in P_u} e^{s(v_u',t_p)/tau})

    (the positives appear in both denominator sums, as in the official ``torch.cat((x,
    x.permute(1, 0, 2)), dim=1)``), averaged over the instances.
    """
    uniq, inverse = torch.unique(ids, return_inverse=True)
    order = torch.arange(ids.numel(), device=ids.device)
    first = torch.full((uniq.numel(),), ids.numel(), device=ids.device, dtype=torch.long)
    first = first.scatter_reduce(0, inverse, order, reduce="amin")
    positives = inverse[None, :] == torch.arange(uniq.numel(), device=ids.device)[:, None]
    with full_precision(v.device):
        logits = similarity(v[first], t) / tau  # [U, B]
        num = torch.logsumexp(logits.masked_fill(~positives, float("-inf")), dim=1)
        row = torch.logsumexp(logits, dim=1)
        col_lse = torch.logsumexp(logits, dim=0)  # [B]: every video instance vs caption p
        col = torch.logsumexp(col_lse[None, :].masked_fill(~positives, float("-inf")), dim=1)
        return (torch.logaddexp(row, col) - num).mean()


def mil_nce(video: torch.Tensor, text: torch.Tensor, *, temperature: Temperature = 0.05,
            t2v_temperature: Temperature | None = None,
            v2t_temperature: Temperature | None = None, ids: torch.Tensor | None = None,
            normalize: bool = True, rows: torch.Tensor | slice | None = None,
            joint: bool = False) -> torch.Tensor:
    """Symmetric MIL-NCE (Miech et al., CVPR 2020, eq. 1) with the positives given by ``ids``.

    For a video anchor ``i`` the positive set ``P_i`` is every text with ``ids_j == ids_i``
    (its own pair included), the negatives the rest of the batch::

        L_v2t = -1/B sum_i log sum_{j in P_i} e^{s_ij/tau_i} / sum_k e^{s_ik/tau_i}

    ``L = (L_t2v + L_v2t) / 2``. Without ``ids`` it is exactly
    :func:`~xmodal.functional.infonce.info_nce`. ``B = 1`` (or all ids equal): every
    logit is a positive, the loss is exactly 0.

    ``joint=True`` is the official HowTo100M code's form instead (see
    :func:`joint_mil_nce`): one term per video *instance* (same-id rows are one video;
    the first row's embedding is used), whose denominator joins the video's row and its
    captions' columns. It takes one float ``temperature`` and no ``rows``.

    Args:
        video, text: ``[B, D]`` embeddings.
        temperature: float or ``[B]``; ``t2v_temperature``/``v2t_temperature`` override it.
        ids: optional integer ``[B]`` instance ids (``None``: each pair its own instance).
        normalize: L2-normalise first.
        rows: anchors computed (``None``: all; ``local_loss``).
        joint: the official joint-denominator form.

    Raises:
        ValueError: ``joint`` with per-sample/per-direction temperatures or ``rows``.

    Shape:
        video, text: ``[B, D]``; returns a scalar.
    """
    from xmodal._validate import flag

    v, t = prepare_pair(video, text, normalize)
    n = v.shape[0]
    if flag(joint, "joint"):
        if not isinstance(temperature, (int, float)) or t2v_temperature is not None \
                or v2t_temperature is not None or rows is not None:
            raise ValueError("temperature: joint=True takes one float temperature, no per-direction "
                             "values and no rows (local_loss)")
        tau = scalar_or_per_sample(temperature, n, "temperature", like=v)
        ids = torch.arange(n, device=v.device) if ids is None else check_ids(ids, n).to(v.device)
        return joint_mil_nce(v, t, tau, ids)
    tau_t2v, tau_v2t = directional(temperature, t2v_temperature, v2t_temperature, n,
                                   "temperature", v)
    idx = resolve_rows(rows, n, v.device)
    if ids is None:
        positives = positive_logit_mask(idx, n)
    else:
        ids = check_ids(ids, n).to(v.device)
        positives = same_id_mask(ids[idx], ids)
    if rows is None:  # the whole batch: one similarity matrix, read both ways
        sim = similarity(v, t)
        l_v2t = mil_terms(v, t, tau_v2t, positives, sim=sim)
        l_t2v = mil_terms(t, v, tau_t2v, positives, sim=sim.T.contiguous())
    else:
        l_v2t = mil_terms(v[idx], t, take(tau_v2t, idx), positives)
        l_t2v = mil_terms(t[idx], v, take(tau_t2v, idx), positives)
    return (l_t2v.mean() + l_v2t.mean()) / 2
