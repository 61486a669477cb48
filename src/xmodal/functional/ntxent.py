"""NT-Xent (SimCLR) across the two modalities, with intra-modal negatives."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xmodal.functional._common import (Temperature, check_ids, directional, full_precision,
                                       per_sample, positive_logit_mask, prepare_pair, resolve_rows,
                                       same_id_mask, similarity)


def nt_xent(video: torch.Tensor, text: torch.Tensor, *, temperature: Temperature = 0.05,
            t2v_temperature: Temperature | None = None,
            v2t_temperature: Temperature | None = None, ids: torch.Tensor | None = None,
            normalize: bool = True, rows: torch.Tensor | slice | None = None) -> torch.Tensor:
    """NT-Xent of SimCLR (Chen et al. 2020, eq. 1) with video and text as the two views.

    ``z = [v_1..v_B, t_1..t_B]``; anchor ``a`` of the ``2B`` has the other view of its
    pair as positive ``p(a)`` and every other item (cross- *and* intra-modal) except
    itself in the denominator::

        l(a) = -log exp(z_a.z_p(a) / tau_a) / sum_{k != a} exp(z_a.z_k / tau_a)

    ``L`` is the mean of ``l`` over the ``2B`` anchors (SimCLR's ``1/2N sum``). A video
    anchor uses the ``v2t`` temperature of its pair, a text anchor the ``t2v`` one.
    ``ids``: other items sharing the anchor's id (either view) leave the denominator.
    ``B = 1``: the only logit left is the positive, loss 0.

    Args:
        video, text: ``[B, D]`` embeddings.
        temperature: float or ``[B]``; ``t2v_temperature``/``v2t_temperature`` override it.
        ids: optional integer ``[B]`` instance ids.
        normalize: L2-normalise first.
        rows: pair indices whose two anchors are computed (``None``: all; ``local_loss``).

    Shape:
        video, text: ``[B, D]``; returns a scalar.
    """
    v, t = prepare_pair(video, text, normalize)
    n = v.shape[0]
    tau_t2v, tau_v2t = directional(temperature, t2v_temperature, v2t_temperature, n,
                                   "temperature", v)
    idx = resolve_rows(rows, n, v.device)
    z = torch.cat([v, t], dim=0)
    anchors = torch.cat([idx, idx + n])
    partner = torch.cat([idx + n, idx])
    tau = torch.cat([per_sample(tau_v2t, n, "v2t_temperature", like=v)[idx],
                     per_sample(tau_t2v, n, "t2v_temperature", like=v)[idx]])
    with full_precision(v.device):
        logits = similarity(z[anchors], z) / tau[:, None]
        drop = positive_logit_mask(anchors, 2 * n)
        if ids is not None:
            ids = check_ids(ids, n).to(v.device)
            ids2 = torch.cat([ids, ids])
            drop = drop | (same_id_mask(ids2[anchors], ids2) & ~positive_logit_mask(partner, 2 * n))
        logits = logits.masked_fill(drop, float("-inf"))
        return F.cross_entropy(logits, partner)  # == mean(logsumexp - positive logit)
