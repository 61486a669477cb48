"""Normalized Contrastive Learning (NCL; Park et al., EMNLP 2022, eqs. 6-12).

Per batch, the text x video similarities ``S = s / gamma`` are scaled by a few
log-domain Sinkhorn-Knopp iterations (eqs. 7-9); the scalings give per-text and
per-video biases (eqs. 10-11) ``a_i = gamma log(alpha_i / sum alpha)`` and
``b_j = gamma log(beta_j / sum beta)``, and the symmetric InfoNCE is taken on the
normalised similarity (eq. 12) ``sim*_ij = a_i + b_j + <t_i, v_j>`` (eq. 4: the mean of
the two directions). The biases are computed from detached similarities: they are
constants for the gradient step. With a learnable temperature the Sinkhorn scalings
``log alpha``, ``log beta`` are the constants: the logits are
``s_ij / gamma + (a_i + b_j) / sg(gamma)``, so ``gamma`` receives the gradient of the
kernel ``S = s / gamma`` that Sinkhorn scales (Fig. 4).

Readings that are ours, not the paper's (sec. 3.3-3.4 only say "NCL computes the optimal
biases for the current batch of examples and use[s] the adjusted similarity score (Eq.
(12)) for learning"; the Fig. 4 pseudo-code is not in the text we have):

* detached biases (no gradient through the Sinkhorn iterations);
* the Sinkhorn order, rows (eq. 8) then columns (eq. 9) in each iteration
  (:func:`xmodal.functional.sinkhorn.log_sinkhorn`): with the paper's 4 iterations the
  result is not the fixed point, and the order decides which marginal is exact (here the
  columns, the video marginals);

Stated by the paper, not a reading: the similarity is the cosine (normalised embeddings,
``normalize=True``): sec. 3.1, eq. (1), "each embedding lies on the unit hypersphere ... the
cosine similarity is simply equivalent to their inner product" ``<t_i, v_j>``.
"""

from __future__ import annotations

import torch

from xmodal._validate import short_repr, text_label
from xmodal.functional._common import (check_embeddings, check_ids, check_tensor, compute_dtype,
                                       full_precision, prepare, same_id_mask, similarity)
from xmodal.functional.sinkhorn import log_sinkhorn

__all__ = ["ncl_biases", "ncl_loss", "scalar_temperature"]


def scalar_temperature(value: float | torch.Tensor, name: str = "temperature") -> float:
    """A positive finite float from a number or a 0-d / one-element tensor.

    NCL's Sinkhorn needs one ``gamma`` for the whole batch, so per-sample temperature
    tensors ``[B]`` are rejected with a ``ValueError``.
    """
    name = text_label(name, "name")
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name}: NCL needs one temperature per batch (Sinkhorn gamma), "
                             f"got a tensor of shape {tuple(value.shape)}")
        value = float(value.detach())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
    if not (value > 0 and value < float("inf")):
        raise ValueError(f"{name}: must be a positive finite number, got {short_repr(value)}")
    return float(value)


def ncl_biases(sim: torch.Tensor, *, gamma: float, iters: int = 4,
               ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Text and video biases of NCL eqs. 10-11 from a text x video similarity matrix.

    Uniform marginals (``1/T`` per text, ``1/V`` per video) unless ``ids`` is given
    (square batch of pairs, several captions of one video): the Sinkhorn then runs
    on the *distinct* videos (first occurrence of each id) with column marginal
    ``n_u / B`` (``n_u`` = captions of video ``u`` in the batch), so a video is
    expected to be retrieved once per caption. Each of the ``n_u`` batch columns of
    video ``u`` receives ``b_u - gamma log n_u`` (its share of the mass), so that the
    InfoNCE denominators, which count each other video ``n_u`` times, sum to the
    Sinkhorn mass. With identical duplicate videos the fixed point equals the one of
    the uniform-marginal Sinkhorn on the batch matrix (the finite-iteration iterates
    differ: the starting mass of a video is 1 here, ``n_u`` there).

    Args:
        sim: ``[T, V]`` similarities ``<t_i, v_j>`` (detach it first for NCL).
        gamma: Sinkhorn temperature (NCL uses the contrastive temperature).
        iters: Sinkhorn iterations (paper: 4).
        ids: optional ``[B]`` instance ids (requires ``T == V == B``).

    Returns:
        ``(a [T], b [V])`` in ``sim``'s dtype (float32 for half inputs).
    """
    if ids is None:
        log_alpha, log_beta, _ = log_sinkhorn(sim, gamma=gamma, iters=iters, track_errors=False)
        b = gamma * (log_beta - torch.logsumexp(log_beta, 0))
    else:
        check_tensor(sim, "sim")
        if sim.shape[0] != sim.shape[1]:
            raise ValueError(f"sim: ids need a square batch of pairs [B, B], got {tuple(sim.shape)}")
        check_ids(ids, sim.shape[1])
        uniq, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
        first = torch.full((uniq.numel(),), sim.shape[1], dtype=torch.long, device=sim.device)
        first = first.scatter_reduce(0, inverse, torch.arange(sim.shape[1], device=sim.device),
                                     reduce="amin")
        counts = counts.to(sim.dtype if sim.dtype == torch.float64 else torch.float32)
        log_alpha, log_beta_u, _ = log_sinkhorn(sim[:, first], gamma=gamma, iters=iters,
                                                col_marginal=counts, track_errors=False)
        b_u = gamma * (log_beta_u - torch.logsumexp(log_beta_u, 0))
        b = (b_u - gamma * torch.log(counts))[inverse]
    a = gamma * (log_alpha - torch.logsumexp(log_alpha, 0))
    return a, b


def ncl_loss(video: torch.Tensor, text: torch.Tensor, *, temperature: float | torch.Tensor = 0.05,
             sinkhorn_iters: int = 4, ids: torch.Tensor | None = None,
             normalize: bool = True, return_biases: bool = False,
             biases: tuple[torch.Tensor, torch.Tensor] | None = None):
    """NCL loss: symmetric InfoNCE on the Sinkhorn-normalised similarity (eq. 12).

    ``L = (L_t2v + L_v2t) / 2`` (eq. 4) with
    ``L_t2v = -1/B sum_i log softmax_j((a_i + b_j + s_ij) / gamma)[i]`` (``a_i``
    cancels) and ``L_v2t`` the same over columns (``b_j`` cancels); ``gamma`` is the
    temperature. A ``temperature`` tensor (0-d, e.g. a learnable one) carries its
    gradient through ``s_ij / gamma``; the biases enter as the constants
    ``(a_i + b_j) / sg(gamma)`` (module docstring). With ``ids``, same-id entries other than the pair are removed from
    the denominators (``-inf``), as in :func:`xmodal.functional.infonce.info_nce`.

    Args:
        video, text: ``[B, D]`` embeddings, row ``i`` of each forms pair ``i``.
        temperature: ``gamma > 0``, a float or a one-element tensor (one per batch; used
            by Sinkhorn, detached, and by the softmax).
        sinkhorn_iters: Sinkhorn-Knopp iterations (>= 1).
        ids: optional integer ``[B]`` instance ids.
        normalize: L2-normalise the embeddings first.
        return_biases: also return the detached biases ``(a [B], b [B])``.
        biases: use these ``(a [B], b [B])`` instead of running Sinkhorn (treated as
            constants). The gradient of the loss is always the one with the biases
            held constant, so ``gradcheck`` applies to the function with given biases.

    Shape:
        ``[B, D], [B, D]`` -> scalar (float32, float64 for float64 inputs).
    """
    check_embeddings(video, text)
    gamma = scalar_temperature(temperature)
    scale = temperature.reshape(()) if isinstance(temperature, torch.Tensor) else gamma
    n = video.shape[0]
    dtype = compute_dtype(video, text)
    v = prepare(video, dtype, normalize)
    t = prepare(text, dtype, normalize)
    if ids is not None:
        ids = check_ids(ids, n).to(v.device)
    with full_precision(v.device):
        s = similarity(t, v)  # [text, video]
        if biases is None:
            a, b = ncl_biases(s.detach(), gamma=gamma, iters=sinkhorn_iters, ids=ids)
        else:
            a, b = (x.detach().to(s.dtype) for x in biases)
        if isinstance(scale, torch.Tensor):
            scale = scale.to(device=s.device, dtype=s.dtype)
        logits = s / scale + (a[:, None] + b[None, :]) / gamma
        if ids is not None:
            off = same_id_mask(ids, ids) & ~torch.eye(n, dtype=torch.bool, device=v.device)
            logits = logits.masked_fill(off, float("-inf"))
        pos = logits.diagonal()
        l_t2v = torch.logsumexp(logits, dim=1) - pos
        l_v2t = torch.logsumexp(logits, dim=0) - pos
        loss = (l_t2v.mean() + l_v2t.mean()) / 2
    return (loss, (a, b)) if return_biases else loss
