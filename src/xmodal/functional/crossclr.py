"""CrossCLR (Zolfaghari et al., ICCV 2021, sec. 3, eqs. 2-8, Algorithms 1-2, appendix B.1/C.1).

For an anchor ``x_i`` (video) with its pair ``y_i`` (text), ``delta(a, b) = exp(<z_a, z_b> / tau)``:

    L(x_i) = -log delta(x_i, y_i) / (delta(x_i, y_i) + sum_{y_k in N^E_i} delta(x_i, y_k)
                                     + lambda sum_{x_k in N^R_i} delta(x_i, x_k))      (eqs. 2, 6)

and symmetrically ``L(y_i)`` (eq. 3); the loss is ``(L_x + L_y) / 2`` with ``L_x`` the weighted
mean ``sum_i w_i L(x_i) / sum_i w_i``. Sets (sec. 3.2 and Algorithm 1, in the modality of
the anchor ``x``):

* connectivity (eq. 4) ``C(x_k) = mean_{j != k} cos(x_k, x_j)`` of the frozen *input*
  features over the set ``S`` = batch (+ queue); the self-similarity is excluded (Alg. 2
  masks the diagonal). Eq. 4 as printed, ``C(x_i) = 1/M sum_{j=1}^M cos(x_i, x_j)`` (Alg. 1:
  the average over the whole queue ``Q``), includes ``j = i``, i.e. ``(1 + (M-1) C) / M``
  with our ``C``; no option here reproduces that self-term, so none of the options below is
  eq. 4 "read literally";
* influential ``I_x = {x_k : C(x_k) / max_S C > gamma}`` (appendix B.1: "divide all scores
  in each set by the maximum score"; Alg. 2 ``scores_v = prox / max(prox)``).
  ``prune_norm="none"``: raw ``C > gamma`` (eq. 4's threshold without the max-normalisation,
  self-term excluded as above);
* inter-modal negatives ``N^E = {y_k : k != i, x_k not in I_x}``: a text is pruned when its
  *paired video* (the anchor's modality) is influential (sec. 3.2, Alg. 1 ``alpha_{x_i}``,
  Alg. 2 ``l_vt[:, scores_v < threshold]``);
* intra-modal negatives ``N^R = {x_k in S : k != i, x_k not in I_x}``: with a queue the
  queued samples are intra-modal negatives too (Alg. 1 ``N^IR`` ranges over ``Q``).

Weights (``weight_norm``), the reading chosen where eq. 5 and Alg. 2 disagree:

* ``"sum"`` (default, Alg. 2 with ``|C|``): ``w_i = exp((C_i / sum_batch |C_j|) / kappa)``,
  weighted mean ``sum_i w_i L_i / sum_i w_i``. Alg. 2 divides by ``sum C_j``, which is
  undefined when the connectivities cancel (``sum C ~ 0``, e.g. centred features) and flips
  the weighting when it is negative; ``sum |C_j|`` equals it whenever no ``C_j < 0``.
  Measured on Flickr8k (MiniLM captions, EfficientNet-Lite0 images; 20 seeded train batches
  of 64, kappa 0.0035; ``python bench/crossclr_weights.py --data ../shared/data/flickr8k``):
  images never have ``C < 0`` (both forms identical: effective sample size 53.34 of 64,
  ``max w / min w`` 9.28); captions do (smallest ``sum C / sum |C|`` 0.9936), and ``|C|``
  changes the caption ESS from 12.88 to 12.92 and ``max w / min w`` from 6.43e3 to 6.27e3,
  i.e. a negligible effect on these features, only a guard against the degenerate case.
  ``C_i / sum |C_j|`` is about ``1 / B``, so the paper's ``kappa`` in 0.003-0.009 (appendix
  B.2, Table 7: 35e-4 / 55e-4) gives weight ratios of a few units on image features and
  ``kappa = 0.1`` nearly uniform weights, matching Fig. 9 ("too high" kappa: the weighting
  fades). This is the reading that reproduces the reported hyper-parameters.
* ``"mean"``: eq. 5 ``exp(C_i / kappa)`` inside the weighted mean; ``"none"``: eq. 5's raw
  weights in eq. 6's plain mean (same run: effective sample size 1.70 / 1.56 of 64 for
  images / captions with ``"mean"``). With ``kappa = 0.0035`` a connectivity gap of 0.1 is a
  weight ratio ``e^28``: one sample carries the batch.

Where Alg. 2's pseudo-code disagrees with eqs. 3/6 (each shown by a test in
``tests/test_crossclr*.py``):

1. The positive is never pruned: Alg. 2 drops pruned *columns* and keeps ``labels =
   arange(B)``, losing an influential anchor's positive and shifting later labels.
2. ``delta(x_i, x_i)`` is excluded (``-inf``); Alg. 2 multiplies logits by ``1 - I``, which
   leaves ``exp(0) = 1`` in every denominator.
3. ``t_w`` in ``cat([l_vt_p, t_w * l_vv_p])`` is lambda, not kappa: Table 7 lists both
   (0.8 vs 0.0035) and ``0.0035 * logits`` would make every intra term ~1 (no intra-modal
   alignment, contradicting Table 2's IM gain). ``intra_mode="delta"`` (default) is eq. 3
   ``lambda * delta``; ``"logit"`` is Alg. 2 / official code ``delta ** lambda``. The value
   ``lambda = 0.8`` (Table 7, YouCook2) is the released code's: the official repository
   (amazon-science/crossmodal-contrastive-learning, ``trainer/loss.py``,
   ``CrossCLR_onlyIntraModality(temperature=0.03, negative_weight=0.8)``) concatenates
   ``[l_vt, 0.8 * l_vv]`` of logits already divided by tau, i.e. it multiplies the
   intra-modal *logits* (``delta ** lambda``, a temperature ``tau / lambda`` on the intra
   terms), not eq. 3's ``lambda * delta``; with eq. 3, 0.8 is only a mild down-weighting
   (``tests/test_crossclr.py::test_lambda_is_the_released_codes_weight_on_intra_modal_logits``).
   Both readings are available; the default stays eq. 3 (the paper's equation).

Multiple positives (appendix C.1, eq. 8): for anchor ``x_i`` the extra positives are
``P_y = {y_k : k in topK(I_x)}``, the ``K`` influential samples of the anchor's modality most
similar to ``x_i`` in input space (any sample when ``prune_threshold`` is None); they enter
the numerator scaled by ``beta`` and leave the denominator's negatives (eq. 8 has them only
in the numerator), so one anchor's ratio may exceed 1.

With ``lambda = 0``, no pruning and uniform weights the loss is exactly InfoNCE. ``B = 1``
without a queue: the positive is the only term, the loss is 0.
"""

from __future__ import annotations

import math

import torch

from xmodal._validate import choice, float_matrix, positive_number, short_repr
from xmodal.functional._common import (Temperature, check_embeddings, check_ids, compute_dtype,
                                       full_precision, l2_normalize, per_sample, prepare,
                                       same_id_mask)

__all__ = ["connectivity", "influence_scores", "connectivity_weights", "crossclr_loss"]


def connectivity(inputs: torch.Tensor, bank: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 4 over ``S = cat(inputs, bank)``: ``C_k = mean_{j != k} cos(s_k, s_j)``.

    Args:
        inputs: the batch's frozen input features.
        bank: queued input features of *earlier* batches (``None``: the batch alone).

    Shape:
        inputs ``[B, D]``, bank ``[M, D]`` -> ``[B + M]`` (batch rows first).

    >>> x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    >>> connectivity(x)
    tensor([0.5000, 0.5000, 0.0000])
    """
    inputs = float_matrix(inputs, "inputs", finite=False)  # no host sync: the loss checks its inputs once
    if bank is not None:
        bank = float_matrix(bank, "bank", allow_empty=True, finite=False)
        if bank.shape[1] != inputs.shape[1]:
            raise ValueError(f"bank: {bank.shape[1]} features per row, inputs have {inputs.shape[1]}")
    s = l2_normalize(inputs if bank is None else torch.cat([inputs, bank.to(inputs)]))
    with full_precision(s.device):
        # sum_{j != k} <s_k, s_j> = <s_k, sum_j s_j> - |s_k|^2: O(|S| D), no |S| x |S| matrix
        total = s @ s.sum(0) - (s * s).sum(1)
    return total / max(s.shape[0] - 1, 1)


def influence_scores(conn: torch.Tensor, norm: str = "max") -> torch.Tensor:
    """Scores thresholded by ``gamma``: ``C / max|C|`` (appendix B.1, Alg. 2) or raw C (``"none"``).

    Shape:
        ``[N]`` -> ``[N]``.

    >>> influence_scores(torch.tensor([0.2, 0.4]))
    tensor([0.5000, 1.0000])
    """
    conn = float_matrix(conn, "conn", ndim=1, finite=False)
    if choice(norm, "prune_norm", ("max", "none")) == "none":
        return conn
    return conn / conn.abs().max().clamp_min(torch.finfo(conn.dtype).tiny)


def connectivity_weights(conn: torch.Tensor, kappa: float | None, norm: str = "sum") -> torch.Tensor:
    """Per-sample loss weights, scaled so that ``mean(w * l)`` is the loss of one direction.

    ``"sum"`` (Alg. 2): ``B * softmax(C / sum(C) / kappa)``, i.e. the weighted mean with
    ``w = exp(norm_w(C) / kappa)``; ``"mean"``: ``B * softmax(C / kappa)`` (eq. 5 weights in a
    weighted mean); ``"none"``: raw ``exp(C / kappa)`` (eq. 5 in eq. 6's plain mean).
    ``kappa=None``: ones. ``"sum"`` divides by ``sum |C|``, not Alg. 2's ``sum C``
    (undefined when the connectivities cancel; identical when none is negative).

    Shape:
        ``[B]`` -> ``[B]``.

    >>> connectivity_weights(torch.tensor([0.5, 0.5]), 0.0035)
    tensor([1., 1.])
    """
    norm = choice(norm, "weight_norm", ("sum", "mean", "none"))
    conn = float_matrix(conn, "conn", ndim=1, finite=False)
    if kappa is not None:
        kappa = positive_number(kappa, "kappa")
    if kappa is None:
        return torch.ones_like(conn)
    if norm == "sum":
        conn = conn / conn.abs().sum().clamp_min(torch.finfo(conn.dtype).tiny)
    if norm in ("sum", "mean"):
        return conn.numel() * torch.softmax(conn / kappa, dim=0)
    w = torch.exp(conn / kappa)
    if not bool(torch.isfinite(w).all()):
        raise ValueError("weight_scale: exp(C / kappa) overflows; use weight_norm='sum'")
    return w


def _extra_positives(sim_in: torch.Tensor, candidates: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean ``[B, B]``: the ``k`` candidates most similar in input space (appendix C.1)."""
    scores = sim_in.masked_fill(~candidates, float("-inf"))
    vals, idx = scores.topk(min(k, scores.shape[1]), dim=1)
    return torch.zeros_like(candidates).scatter(1, idx, torch.isfinite(vals))


def _direction(za, zb, queue, tau, lam, mode, infl, infl_q, blocked, blocked_q, extra, log_beta):
    """Per-anchor ``-log(numerator / denominator)``; every negative is pruned by the anchor
    modality's influential set ``infl`` (``[B]``) / ``infl_q`` (queue ``[M]``)."""
    eye = torch.eye(za.shape[0], dtype=torch.bool, device=za.device)
    cross = (za @ zb.T) / tau[:, None]
    not_neg = eye | blocked | infl[None, :]
    num = cross.diagonal()
    if extra is not None:  # appendix C.1 positives (None when num_positives = 0: no host sync)
        not_neg = not_neg | extra
    if extra is not None and bool(extra.any()):
        num = torch.logsumexp(torch.cat([num[:, None], (cross + log_beta).masked_fill(
            ~extra, float("-inf"))], 1), 1)
    parts = [cross.diagonal()[:, None], cross.masked_fill(not_neg, float("-inf"))]
    if lam > 0:
        intra = [(za @ za.T).masked_fill(not_neg, float("-inf"))]
        if queue is not None:
            intra.append((za @ queue.T).masked_fill(infl_q[None, :] | blocked_q, float("-inf")))
        for s in intra:
            s = s / tau[:, None]
            parts.append(s + math.log(lam) if mode == "delta" else lam * s)
    return torch.logsumexp(torch.cat(parts, dim=1), dim=1) - num


def _inputs(x, bank, name: str, n: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    if x is None:
        raise ValueError(f"{name}: required for CrossCLR connectivity (pruning/weights/positives)")
    x = float_matrix(x, name, dtype=dtype, device=device).detach()
    if x.shape[0] != n:
        raise ValueError(f"{name}: expected {n} rows, got {x.shape[0]}")
    bname = name.replace("input", "bank")
    if bank is not None:
        if not isinstance(bank, torch.Tensor) or bank.ndim != 2 or bank.shape[1] != x.shape[1]:
            raise ValueError(f"{bname}: expected a [M, {x.shape[1]}] tensor")
        bank = float_matrix(bank, bname, dtype=dtype, device=device, allow_empty=True).detach()
    return x, bank


def crossclr_loss(video: torch.Tensor, text: torch.Tensor, video_input: torch.Tensor | None = None,
                  text_input: torch.Tensor | None = None, *, video_bank: torch.Tensor | None = None,
                  text_bank: torch.Tensor | None = None, video_queue: torch.Tensor | None = None,
                  text_queue: torch.Tensor | None = None, queue_ids: torch.Tensor | None = None,
                  temperature: Temperature = 0.03, intra_weight: float = 0.8,
                  prune_threshold: float | None = 0.9, weight_scale: float | None = 0.0035,
                  weight_norm: str = "sum", prune_norm: str = "max", intra_mode: str = "delta",
                  num_positives: int = 0, positive_weight: float = 0.15,
                  ids: torch.Tensor | None = None, normalize: bool = True) -> torch.Tensor:
    """CrossCLR loss ``(L_x + L_y) / 2`` (eqs. 3-8, Algs. 1-2; readings in the module doc).

    Args:
        video, text: joint-space embeddings ``[B, D]`` (x = video, y = text).
        video_input, text_input: frozen input features ``[B, Dv]``, ``[B, Dt]`` (connectivity);
            required when pruning, weighting or extra positives are on.
        video_bank, text_bank: queued input features ``[M, Dv]``, ``[M, Dt]`` of earlier
            batches (Alg. 1's queue minus the current batch); ``None``: no queue (Alg. 2).
        video_queue, text_queue: the queued samples' embeddings ``[M, D]`` (detached, row ``m``
            of ``video_bank``): intra-modal negatives (Alg. 1 ``N^IR``). Optional.
        queue_ids: integer ``[M]`` instance ids of the queued rows (with ``ids``: a queued row
            with the anchor's id is never its negative).
        temperature: ``tau`` (float or per-anchor ``[B]``).
        intra_weight: ``lambda >= 0`` (0: no intra-modal negatives, Table 2 "IM" off).
        prune_threshold: ``gamma`` (``None``: no pruning, Table 2 "NP" off).
        weight_scale: ``kappa`` (``None``: uniform weights, Table 2 "PW" off).
        weight_norm: ``"sum"`` (Alg. 2, default), ``"mean"`` or ``"none"`` (eq. 5).
        prune_norm: ``"max"`` (appendix B.1, default) or ``"none"`` (raw eq. 4 connectivity).
        intra_mode: ``"delta"`` (eq. 3, ``lambda * delta``) or ``"logit"`` (Alg. 2, ``delta ** lambda``).
        num_positives, positive_weight: appendix C.1 ``K`` and ``beta`` (paper: K = 2, beta =
            0.15 on YouCook2; K = 5, beta = 0.2 on LSMDC). ``K = 0``: off.
        ids: integer ``[B]``; same-id pairs other than ``(i, i)`` are never negatives.
        normalize: L2-normalise the embeddings (and the queued embeddings).

    Shape:
        ``[B, D]`` embeddings -> scalar (float32; float64 for float64 inputs).

    >>> g = torch.Generator().manual_seed(0)
    >>> v, t = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    >>> vi, ti = torch.rand(4, 5, generator=g), torch.rand(4, 6, generator=g)
    >>> bool(crossclr_loss(v, t, vi, ti) > 0)
    True
    """
    check_embeddings(video, text)
    n = video.shape[0]
    lam = float(intra_weight)
    if not math.isfinite(lam) or lam < 0:
        raise ValueError(f"intra_weight: must be a finite number >= 0, got {short_repr(intra_weight)}")
    gamma = None if prune_threshold is None else float(prune_threshold)
    if gamma is not None and not math.isfinite(gamma):
        raise ValueError(f"prune_threshold: must be finite or None, got {short_repr(prune_threshold)}")
    kappa = None if weight_scale is None else positive_number(weight_scale, "weight_scale")
    if isinstance(num_positives, bool) or not isinstance(num_positives, int) or num_positives < 0:
        raise ValueError(f"num_positives: must be an integer >= 0, got {short_repr(num_positives)}")
    log_beta = math.log(positive_number(positive_weight, "positive_weight"))
    choice(weight_norm, "weight_norm", ("sum", "mean", "none"))
    choice(prune_norm, "prune_norm", ("max", "none"))
    mode = choice(intra_mode, "intra_mode", ("delta", "logit"))
    dtype = compute_dtype(video, text)
    v, t = prepare(video, dtype, normalize), prepare(text, dtype, normalize)
    tau = per_sample(temperature, n, "temperature", like=v)
    dev = v.device
    ids = None if ids is None else check_ids(ids, n).to(dev)
    eye = torch.eye(n, dtype=torch.bool, device=dev)
    blocked = eye.new_zeros(n, n) if ids is None else same_id_mask(ids, ids) & ~eye
    needs_inputs = gamma is not None or kappa is not None or num_positives > 0 or (
        video_bank is not None or text_bank is not None)
    conn = [torch.ones(n, dtype=dtype, device=dev)] * 2
    infl = [eye.new_zeros(n)] * 2
    queues, infl_q, blocked_q = [None, None], [None, None], [None, None]
    sims_in = [None, None]
    if needs_inputs:
        for a, (x, b, q, name) in enumerate(((video_input, video_bank, video_queue, "video_input"),
                                             (text_input, text_bank, text_queue, "text_input"))):
            x, b = _inputs(x, b, name, n, dtype, dev)
            c = connectivity(x, b)
            scores = influence_scores(c, prune_norm)
            pruned = scores > gamma if gamma is not None else torch.zeros_like(scores, dtype=torch.bool)
            conn[a], infl[a] = c[:n], pruned[:n]
            if num_positives > 0:
                xn = l2_normalize(x)
                with full_precision(dev):
                    sims_in[a] = xn @ xn.T
            if q is not None:
                qname = name.replace("input", "queue")
                if b is None or not isinstance(q, torch.Tensor) or q.shape != (b.shape[0], v.shape[1]):
                    raise ValueError(f"{qname}: expected [M, {v.shape[1]}] rows aligned with the bank")
                queues[a] = prepare(float_matrix(q, qname, dtype=dtype, device=dev,
                                                 allow_empty=True).detach(), dtype, normalize)
                infl_q[a] = pruned[n:]
                blocked_q[a] = torch.zeros(n, q.shape[0], dtype=torch.bool, device=dev)
                if ids is not None and queue_ids is not None:
                    blocked_q[a] = same_id_mask(ids, check_ids(queue_ids, q.shape[0], "queue_ids"))
    with full_precision(dev):
        extra = [None, None]
        if num_positives > 0:
            off = ~(blocked | eye)
            for a in range(2):  # P_y = topK(I_x): candidates from the anchor's own modality
                cand = off if gamma is None else off & infl[a][None, :]
                extra[a] = _extra_positives(sims_in[a], cand, num_positives)
        losses = [_direction(za, zb, queues[a], tau, lam, mode, infl[a], infl_q[a], blocked,
                             blocked_q[a], extra[a], log_beta)
                  for a, (za, zb) in enumerate(((v, t), (t, v)))]
        w = [connectivity_weights(c, kappa, weight_norm) for c in conn]
        return ((w[0] * losses[0]).mean() + (w[1] * losses[1]).mean()) / 2
