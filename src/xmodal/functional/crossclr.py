"""CrossCLR (Zolfaghari et al., ICCV 2021, eqs. 2-7, Algorithms 1-2, appendix B.1/C.1).

For an anchor ``x_i`` (video) with its pair ``y_i`` (text),
``delta(a, b) = exp(<z_a, z_b> / tau)`` and

    L(x_i) = -w(x_i) log delta(x_i, y_i) / (delta(x_i, y_i)
             + sum_{y_k in N^E_i} delta(x_i, y_k) + lambda sum_{x_k in N^R_i} delta(x_i, x_k))

(eqs. 3, 6), symmetrically ``L(y_i)``. ``N^E_i`` (inter-modal negatives) are the
``y_k``, ``k != i``, and ``N^R_i`` (intra-modal negatives) the ``x_k``, ``k != i``,
minus the *influential* samples ``C > gamma`` of their modality (pruning). The
connectivity ``C`` (eq. 4) is the mean cosine similarity of a sample's frozen input
features to a bank of input features, and ``w = exp(C / kappa)`` (eq. 5).

Deviations from Algorithm 2's pseudo-code (and the official
``CrossCLR_onlyIntraModality``), each shown by a test in ``tests/test_crossclr.py``:

1. Pruning never removes a sample's own positive: the pseudo-code drops the pruned
   columns and keeps ``labels = arange(B)``, so an influential anchor's positive
   can be dropped and the labels of later rows point at the wrong column. Here the
   logits stay ``[B, B]`` and pruned negatives are set to ``-inf``.
2. The intra-modal diagonal ``delta(x_i, x_i)`` is excluded (``-inf``); the
   pseudo-code multiplies the logits by ``1 - I``, so ``exp(0) = 1`` stays in
   every denominator.
3. ``lambda`` multiplies ``delta`` (``log lambda`` is added to the intra logits) as
   in eq. 3; the pseudo-code multiplies the logits, i.e. uses ``delta ** lambda``.

Weights: ``w_i = exp(C_i / kappa)`` normalised over the batch so that each
direction is the weighted mean ``sum_i w_i l_i / sum_i w_i`` (computed as
``B * softmax(C / kappa)``, which never overflows for small ``kappa``); uniform
weights give the plain mean. ``weight_norm="none"`` uses the raw ``exp(C / kappa)``.
With ``lambda = 0``, no pruning and uniform weights the loss is exactly InfoNCE.
``B = 1``: the positive is the only term, the loss is 0.
"""

from __future__ import annotations

import math

import torch

from xmodal._validate import choice, float_matrix, positive_number
from xmodal.functional._common import (Temperature, check_embeddings, check_ids, compute_dtype,
                                       full_precision, l2_normalize, per_sample, prepare,
                                       same_id_mask)

__all__ = ["connectivity", "connectivity_weights", "crossclr_loss"]


def connectivity(inputs: torch.Tensor, bank: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 4: ``C_i = mean_j cos(inputs_i, bank_j)``.

    ``bank=None`` is the no-queue setting (Algorithm 2, appendix B.1): the bank is
    the batch itself (self-similarity included) and the scores are divided by their
    largest absolute value (the max, for the usual positive scores) before any
    threshold is applied. With a bank (queue) the raw means are returned.

    Shape:
        inputs ``[B, D]``, bank ``[M, D]`` -> ``[B]``.
    """
    x = l2_normalize(inputs)
    with full_precision(x.device):
        # mean_j <x_i, q_j> = <x_i, mean_j q_j>: O((B + M) D) instead of O(B M D)
        if bank is None:
            c = x @ x.mean(0)
            return c / c.abs().max().clamp_min(torch.finfo(c.dtype).tiny)
        return x @ l2_normalize(bank.to(device=x.device, dtype=x.dtype)).mean(0)


def connectivity_weights(conn: torch.Tensor, kappa: float | None, norm: str = "mean") -> torch.Tensor:
    """Eq. 5 weights ``exp(C / kappa)``: ``"mean"``-normalised (mean 1) or raw (``"none"``).

    ``kappa=None``: uniform weights (all ones).
    """
    if kappa is None:
        return torch.ones_like(conn)
    if choice(norm, "weight_norm", ("mean", "none")) == "mean":
        return conn.numel() * torch.softmax(conn / kappa, dim=0)
    w = torch.exp(conn / kappa)
    if not bool(torch.isfinite(w).all()):
        raise ValueError("weight_scale: exp(C / kappa) overflows; use weight_norm='mean'")
    return w


def _extra_positives(sim_in: torch.Tensor, candidates: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean ``[B, B]``: the ``k`` candidates most similar in input space (appendix C.1)."""
    scores = sim_in.masked_fill(~candidates, float("-inf"))
    vals, idx = scores.topk(min(k, scores.shape[1]), dim=1)
    out = torch.zeros_like(candidates)
    return out.scatter(1, idx, torch.isfinite(vals))


def _direction(za, zb, tau, log_lam, prune_a, prune_b, blocked, extra, log_beta):
    """Per-anchor ``-log(numerator / denominator)`` for anchors ``za`` against ``zb``."""
    eye = torch.eye(za.shape[0], dtype=torch.bool, device=za.device)
    cross = (za @ zb.T) / tau[:, None]
    pos = eye if extra is None else eye | extra
    if extra is not None:
        cross = cross + extra.to(cross.dtype) * log_beta
    keep_cross = pos | ~(prune_b[None, :] | blocked | eye)
    num = torch.logsumexp(cross.masked_fill(~pos, float("-inf")), dim=1)
    parts = [cross.masked_fill(~keep_cross, float("-inf"))]
    if log_lam is not None:
        intra = (za @ za.T) / tau[:, None] + log_lam
        keep_intra = ~(prune_a[None, :] | blocked | eye | pos)
        parts.append(intra.masked_fill(~keep_intra, float("-inf")))
    return torch.logsumexp(torch.cat(parts, dim=1), dim=1) - num


def crossclr_loss(video: torch.Tensor, text: torch.Tensor, video_input: torch.Tensor | None = None,
                  text_input: torch.Tensor | None = None, *, video_bank: torch.Tensor | None = None,
                  text_bank: torch.Tensor | None = None, temperature: Temperature = 0.03,
                  intra_weight: float = 0.8, prune_threshold: float | None = 0.9,
                  weight_scale: float | None = 0.0035, weight_norm: str = "mean",
                  num_positives: int = 0, positive_weight: float = 1.0,
                  ids: torch.Tensor | None = None, normalize: bool = True) -> torch.Tensor:
    """CrossCLR loss ``(mean_w L(x) + mean_w L(y)) / 2`` (eqs. 3-7; see the module doc).

    Args:
        video, text: joint-space embeddings ``[B, D]`` (x = video, y = text).
        video_input, text_input: frozen input features ``[B, Dv]``, ``[B, Dt]`` for the
            connectivity; required when pruning, weighting or extra positives are on.
        video_bank, text_bank: input-feature banks ``[M, Dv]``, ``[M, Dt]`` (queue; it
            should hold the current batch); ``None``: batch connectivity / max.
        temperature: ``tau`` (float or per-anchor ``[B]``).
        intra_weight: ``lambda >= 0`` weight of the intra-modal negatives (0: none).
        prune_threshold: ``gamma``; samples with ``C > gamma`` leave both negative
            sets (``None``: no pruning).
        weight_scale: ``kappa`` of ``w = exp(C / kappa)`` (``None``: uniform weights).
        weight_norm: ``"mean"`` (weighted mean) or ``"none"`` (raw weights).
        num_positives: appendix C.1 multiple positives: besides ``y_i``, the
            ``num_positives`` influential samples (``C > gamma``; any sample when
            ``prune_threshold`` is None) most similar to the anchor in input space
            are positives of the anchor, their ``delta`` scaled by ``positive_weight``
            (``beta``); their pairs leave the intra-modal negatives.
        ids: integer ``[B]``; same-id pairs other than ``(i, i)`` are never negatives.
        normalize: L2-normalise the embeddings.

    Shape:
        ``[B, D]`` embeddings -> scalar (float32; float64 for float64 inputs).
    """
    check_embeddings(video, text)
    n = video.shape[0]
    lam = float(intra_weight)
    if not math.isfinite(lam) or lam < 0:
        raise ValueError(f"intra_weight: must be a finite number >= 0, got {intra_weight!r}")
    gamma = None if prune_threshold is None else float(prune_threshold)
    if gamma is not None and not math.isfinite(gamma):
        raise ValueError(f"prune_threshold: must be finite or None, got {prune_threshold!r}")
    kappa = None if weight_scale is None else positive_number(weight_scale, "weight_scale")
    if isinstance(num_positives, bool) or not isinstance(num_positives, int) or num_positives < 0:
        raise ValueError(f"num_positives: must be an integer >= 0, got {num_positives!r}")
    log_beta = math.log(positive_number(positive_weight, "positive_weight"))
    dtype = compute_dtype(video, text)
    v, t = prepare(video, dtype, normalize), prepare(text, dtype, normalize)
    tau = per_sample(temperature, n, "temperature", like=v)
    blocked = torch.zeros(n, n, dtype=torch.bool, device=v.device)
    if ids is not None:
        blocked = same_id_mask(*(2 * [check_ids(ids, n).to(v.device)]))
        blocked &= ~torch.eye(n, dtype=torch.bool, device=v.device)
    needs_inputs = gamma is not None or kappa is not None or num_positives > 0
    ones = torch.ones(n, dtype=dtype, device=v.device)
    conn_v = conn_t = ones
    if needs_inputs:
        xin, yin = [None if x is None else float_matrix(x, name, dtype=dtype, device=v.device).detach()
                    for x, name in ((video_input, "video_input"), (text_input, "text_input"))]
        for x, name in ((xin, "video_input"), (yin, "text_input")):
            if x is None:
                raise ValueError(f"{name}: required for CrossCLR connectivity (pruning/weights)")
            if x.shape[0] != n:
                raise ValueError(f"{name}: expected {n} rows, got {x.shape[0]}")
        conns = []
        for b, x, name in ((video_bank, xin, "video_bank"), (text_bank, yin, "text_bank")):
            if b is not None and (not isinstance(b, torch.Tensor) or b.ndim != 2 or b.shape[0] == 0
                                  or b.shape[1] != x.shape[1]):
                raise ValueError(f"{name}: expected a non-empty [M, {x.shape[1]}] tensor")
            c = connectivity(x, None if b is None else b.detach())
            if not bool(torch.isfinite(c).all()):  # cheaper than scanning a large bank
                raise ValueError(f"{name}: contains NaN/inf values")
            conns.append(c)
        conn_v, conn_t = conns
    no_prune = torch.zeros(n, dtype=torch.bool, device=v.device)
    prune_v = no_prune if gamma is None else conn_v > gamma
    prune_t = no_prune if gamma is None else conn_t > gamma
    log_lam = None if lam == 0 else math.log(lam)
    with full_precision(v.device):
        extra_v = extra_t = None
        if num_positives > 0:
            off = ~(blocked | torch.eye(n, dtype=torch.bool, device=v.device))
            cand_t = off & (~no_prune[None, :] if gamma is None else prune_t[None, :])
            cand_v = off & (~no_prune[None, :] if gamma is None else prune_v[None, :])
            xn, yn = l2_normalize(xin), l2_normalize(yin)
            extra_v = _extra_positives(xn @ xn.T, cand_t, num_positives)  # video anchors
            extra_t = _extra_positives(yn @ yn.T, cand_v, num_positives)  # text anchors
        l_v = _direction(v, t, tau, log_lam, prune_v, prune_t, blocked, extra_v, log_beta)
        l_t = _direction(t, v, tau, log_lam, prune_t, prune_v, blocked, extra_t, log_beta)
        w_v = connectivity_weights(conn_v, kappa, weight_norm)
        w_t = connectivity_weights(conn_t, kappa, weight_norm)
        return ((w_v * l_v).mean() + (w_t * l_t).mean()) / 2
