"""Cali-NCE pieces (Zhao et al., "Cali-NCE: Boosting cross-modal video representation
learning with calibrated alignment", CVPR-W 2023, eqs. 1-6), as pure tensor functions.

* eq. 1 ``correspondence_loss``: per sample ``-log c_ii - log(1 - c_ij)`` (the two
  binary cross-entropy terms SUMMED: matched pair class 1, shuffled pair class 0),
  averaged over the batch.
* eq. 2/6 ``calibrated_nce``: ``mean_i c_ii (NCE(v_i, t_i) + NCE(t_i, v_i))`` with
  ``c_ii`` the head's matching probability of pair ``i``.

Readings that are ours, not the paper's: cosine similarities in eq. 2 (it prints the
dot product ``f_v^T f_t``; ``normalize=False`` is the literal form) and ``c_ii``
detached in eq. 6 (:class:`xmodal.losses.CaliNCE` ``detach_weight``; the paper does not
say whether the head receives the gradient of the calibrated term).
* eqs. 3-5 ``predictive_coding_loss``: ``||n(G_v(v)) - sg(n(t))||^2 + ||n(G_t(t)) - sg(n(v))||^2``
  (``n``: L2 normalisation, ``sg``: stop-gradient), averaged over the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xmodal._validate import float_matrix, integer, short_repr
from xmodal.functional._common import (Temperature, check_embeddings, check_ids, check_tensor, compute_dtype,
                                       full_precision, l2_normalize, per_sample, prepare)
from xmodal.functional.infonce import contrastive_terms

__all__ = ["derangement", "correspondence_loss", "calibrated_nce", "predictive_coding_loss"]


def derangement(n: int, *, generator: torch.Generator | None = None,
                device: torch.device | str | None = None) -> torch.Tensor:
    """A random permutation ``sigma`` of ``range(n)`` without fixed points (``n >= 2``).

    A uniformly random order ``p`` is turned into one cycle ``p[k] -> p[k + 1]``, so no
    text is paired with its own video. Drawn from ``generator`` (CPU) when given,
    otherwise from torch's global RNG (seed it with ``torch.manual_seed``).
    """
    n = integer(n, "n")
    if n < 2:
        raise ValueError(f"n: a derangement needs at least 2 items, got {n}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: expected a torch.Generator or None, got {short_repr(generator)}")
    p = torch.randperm(n, generator=generator)
    sigma = torch.empty_like(p)
    sigma[p] = p.roll(-1)
    if device is None:
        return sigma
    try:
        return sigma.to(device)
    except (RuntimeError, TypeError, ValueError) as exc:  # an unknown name, a GPU this machine lacks
        raise ValueError(f"device: cannot use {short_repr(device)} ({str(exc).splitlines()[0][:120]})") from None


def correspondence_loss(match_logits: torch.Tensor, mismatch_logits: torch.Tensor,
                        mismatch_valid: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 1 (sec. 3.1): ``L_corr = -log c_ii - log(1 - c_ij)`` per sample, batch mean.

    ``c = softmax(logits)[1]`` is the head's matching probability; ``c_ii`` that of the
    matched pair ``(v_i, t_i)``, ``c_ij`` that of the mismatched pair ``(v_i, t_sigma(i))``.
    The two terms are summed per sample (not averaged over ``2B`` terms), so with every
    shuffled pair valid the result is ``mean_i(-log c_ii) + mean_i(-log(1 - c_ij))``.
    Shuffled pairs marked invalid (same instance id: not a negative) are left out of the
    second mean; with no valid shuffled pair (or ``B = 1``) it is 0.

    Args:
        match_logits: head logits ``[B, 2]`` of the matched pairs (target class 1).
        mismatch_logits: head logits ``[B, 2]`` (or ``[0, 2]``) of the shuffled pairs
            (target class 0).
        mismatch_valid: optional bool ``[B]``; False drops a shuffled pair.

    Shape:
        ``[B, 2], [B, 2]`` -> scalar.

    Examples:
        >>> import torch
        >>> logit = torch.log(torch.tensor([[0.2, 0.8]]))          # c = 0.8 on both pairs
        >>> round(correspondence_loss(logit, logit).item(), 4)      # -log 0.8 - log 0.2
        1.8326
    """
    for x, name in ((match_logits, "match_logits"), (mismatch_logits, "mismatch_logits")):
        if check_tensor(x, name).shape[1] != 2:
            raise ValueError(f"{name}: expected shape [B, 2] (mismatch, match), got {tuple(x.shape)}")
    if mismatch_valid is not None and mismatch_logits.shape[0]:
        check_tensor(mismatch_valid, "mismatch_valid", ndim=1, floating=False)
        if mismatch_valid.dtype != torch.bool or mismatch_valid.shape[0] != mismatch_logits.shape[0]:
            raise ValueError(f"mismatch_valid: expected a bool mask of shape [{mismatch_logits.shape[0]}], "
                             f"got {mismatch_valid.dtype} {tuple(mismatch_valid.shape)}")
    pos = -F.log_softmax(match_logits, dim=1)[:, 1]
    neg = -F.log_softmax(mismatch_logits, dim=1)[:, 0]
    if mismatch_valid is not None and neg.numel():
        neg = neg[mismatch_valid]
    return pos.mean() + (neg.mean() if neg.numel() else neg.sum())


def calibrated_nce(video: torch.Tensor, text: torch.Tensor, weights: torch.Tensor, *,
                   temperature: Temperature = 0.05, ids: torch.Tensor | None = None,
                   normalize: bool = True) -> torch.Tensor:
    """Eq. 6 contrastive part: ``1/B sum_i c_ii (NCE(v_i, t_i) + NCE(t_i, v_i))``.

    With ``weights = 1`` this is eq. 2's ``L_cont`` averaged over the batch (the
    uncalibrated co-training term of sec. 3.4 / Table 1).

    ``NCE(v_i, t_i) = -log exp(s_ii / tau_i) / sum_k exp(s_ik / tau_i)`` (eq. 2), with
    same-id entries other than the pair removed from the denominator (``ids``).
    Our reading: ``s_ik`` is the COSINE of the embeddings (``normalize=True``, default).
    Eq. 2 prints the raw dot product ``f_v^T f_t / tau`` and the paper never says the
    embeddings are normalised; ``normalize=False`` gives that literal form.
    Note the sum of both directions (not their mean, unlike InfoNCE): with
    ``weights = 1`` this is twice :func:`~xmodal.functional.infonce.info_nce`.

    Args:
        video, text: ``[B, D]`` embeddings.
        weights: ``c_ii`` ``[B]`` (detach them to keep the head out of this term).
        temperature: float or ``[B]``.
        ids: optional integer ``[B]``.
        normalize: L2-normalise the embeddings first.

    Shape:
        returns a scalar.
    """
    check_embeddings(video, text)
    n = video.shape[0]
    weights = float_matrix(weights, "weights", ndim=1, allow_empty=True, finite=False)
    if weights.shape != (n,):
        raise ValueError(f"weights: expected shape [{n}], got {tuple(weights.shape)}")
    dtype = compute_dtype(video, text)
    v, t = prepare(video, dtype, normalize), prepare(text, dtype, normalize)
    tau = per_sample(temperature, n, "temperature", like=v)
    if ids is not None:
        ids = check_ids(ids, n).to(v.device)
    idx = torch.arange(n, device=v.device)
    with full_precision(v.device):
        nce = contrastive_terms(v, t, tau, idx, ids) + contrastive_terms(t, v, tau, idx, ids)
        return (weights.to(dtype) * nce).mean()


def predictive_coding_loss(pred_v: torch.Tensor, pred_t: torch.Tensor, video: torch.Tensor,
                           text: torch.Tensor) -> torch.Tensor:
    """Eqs. 3-5 (sec. 3.3): squared distance of normalised predictions to stop-gradient targets.

    ``pred_v = G_v(f_v)`` predicts the text, ``pred_t = G_t(f_t)`` the video, the heads
    acting on the features ``f`` as they are (eqs. 4-5 normalise only the head's output
    and the target); per pair
    ``||n(pred_v) - sg(n(t))||^2 + ||n(pred_t) - sg(n(v))||^2`` (``= 4 - 2 cos - 2 cos``),
    averaged over the batch.

    Shape:
        all ``[B, D]`` -> scalar.
    """
    for pred, target, names in ((pred_v, text, ("pred_v", "text")), (pred_t, video, ("pred_t", "video"))):
        check_tensor(pred, names[0]), check_tensor(target, names[1])
        if pred.shape != target.shape or not target.numel():
            raise ValueError(f"{names[0]} and {names[1]}: expected the same non-empty shape [B, D], "
                             f"got {tuple(pred.shape)} and {tuple(target.shape)}")
    if video.shape[0] != text.shape[0]:
        raise ValueError(f"video and text: batch sizes differ, {video.shape[0]} vs {text.shape[0]}")
    with full_precision(video.device):
        dtype = compute_dtype(pred_v, pred_t, video, text)
        tv = l2_normalize(text.detach().to(dtype))
        vv = l2_normalize(video.detach().to(dtype))
        d_v = (l2_normalize(pred_v.to(dtype)) - tv).pow(2).sum(1)
        d_t = (l2_normalize(pred_t.to(dtype)) - vv).pow(2).sum(1)
        return (d_v + d_t).mean()
