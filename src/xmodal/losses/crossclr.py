"""CrossCLR module: the complete loss with Algorithm 1's queue."""

from __future__ import annotations

import torch
from torch import nn

from xmodal._validate import choice, flag, float_matrix, integer, number, positive_number
from xmodal.functional._common import Temperature, l2_normalize
from xmodal.functional.crossclr import crossclr_loss
from xmodal.losses._gather import embeddings, gather_ids, gather_inputs, gather_pair, gather_per_sample
from xmodal.losses.ncl import fifo_enqueue

__all__ = ["CrossCLR"]


class CrossCLR(nn.Module):
    """CrossCLR loss (Zolfaghari et al., ICCV 2021, eqs. 2-8, Algorithms 1-2).

    Inter- and intra-modal negatives, influential-sample pruning, connectivity weights and
    (optionally) the appendix C.1 multiple positives; the equations, and which reading is
    taken where the paper's text and pseudo-code disagree, are in
    :mod:`xmodal.functional.crossclr`. Defaults are the paper's (Table 7, YouCook2): tau 0.03,
    lambda 0.8 (the released code's weight on the intra-modal logits, ``delta ** lambda``:
    ``intra_mode="logit"``, which ``configs/crossclr/coot_youcook2.yaml`` uses; the default
    ``"delta"`` is eq. 3's ``lambda * delta``),
    gamma 0.9, kappa 0.0035 (the extracted text's "35e4").

    Connectivity (eq. 4) uses the frozen *input* features (``video_input``, ``text_input``):

    * ``queue_size=0``: Algorithm 2 (no queue), connectivity over the (global) batch.
    * ``queue_size=M > 0``: Algorithm 1. The queue ``Q`` holds the newest ``M`` samples
      *including the current batch*: connectivity is taken over ``Q``, and the queued samples
      of earlier batches are extra intra-modal negatives, pruned by their own connectivity.
      Their embeddings are the detached ones of the step that enqueued them (a memory bank:
      the loss has no access to the encoders Alg. 1 would re-run on them). Same-id rows
      (``ids``) are never negatives. The queue is updated only in training mode; ``M`` must
      be at least the global batch size.

    Distributed (:mod:`xmodal.losses._gather`): embeddings are gathered with gradient,
    inputs and ids without, and every rank computes the loss of the global batch (the
    single-process loss on the concatenated batch; DDP's gradient averaging gives the same update).

    Args:
        temperature: ``tau`` (float, or a per-sample ``[B]`` tensor in forward).
        intra_weight: ``lambda`` (0: no intra-modal negatives).
        prune_threshold: ``gamma`` on ``C / max C`` (``None``: no pruning).
        weight_scale: ``kappa`` in ``w = exp((C_i / sum_j |C_j|) / kappa)`` (``None``: uniform;
            ``|C|`` instead of Alg. 2's ``sum C``, which is undefined when the connectivities
            cancel; on Flickr8k MiniLM captions the effect is an ESS of 12.92 vs 12.88 of 64,
            see :mod:`xmodal.functional.crossclr`).
        queue_size: ``M`` (0: no queue).
        weight_norm, prune_norm, intra_mode: the alternative readings (eq. 5 / raw eq. 4 /
            Alg. 2's ``delta ** lambda``), see :func:`xmodal.functional.crossclr.crossclr_loss`.
        num_positives, positive_weight: appendix C.1 ``K`` and ``beta`` (0: off).
        normalize: L2-normalise the embeddings.

    Shape:
        video, text ``[B, D]``; video_input ``[B, Dv]``; text_input ``[B, Dt]``;
        ids ``[B]``; returns a scalar.

    >>> g = torch.Generator().manual_seed(0)
    >>> v, t = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
    >>> loss = CrossCLR(queue_size=16)
    >>> l = loss(v, t, video_input=torch.rand(8, 5, generator=g), text_input=torch.rand(8, 3, generator=g))
    >>> tuple(loss.video_queue.shape), tuple(loss.video_embed_queue.shape)
    ((8, 5), (8, 4))
    """

    accepts: tuple[str, ...] = ("ids", "temperature", "video_input", "text_input")
    scheduled = "temperature"  # what the trainer may schedule (xmodal.losses.loss_spec)

    def __init__(self, temperature: float = 0.03, intra_weight: float = 0.8,
                 prune_threshold: float | None = 0.9, weight_scale: float | None = 0.0035,
                 queue_size: int = 0, *, weight_norm: str = "sum", prune_norm: str = "max",
                 intra_mode: str = "delta", num_positives: int = 0, positive_weight: float = 0.15,
                 normalize: bool = True) -> None:
        super().__init__()
        self.temperature = positive_number(temperature, "temperature")
        self.intra_weight = number(intra_weight, "intra_weight", minimum=0.0)
        self.queue_size = integer(queue_size, "queue_size", minimum=0)
        self.prune_threshold = None if prune_threshold is None else number(prune_threshold, "prune_threshold")
        self.weight_scale = None if weight_scale is None else positive_number(weight_scale, "weight_scale")
        choice(weight_norm, "weight_norm", ("sum", "mean", "none"))
        choice(prune_norm, "prune_norm", ("max", "none"))
        choice(intra_mode, "intra_mode", ("delta", "logit"))
        positive_number(positive_weight, "positive_weight")
        num_positives = integer(num_positives, "num_positives", minimum=0)
        self.options = dict(weight_norm=weight_norm, prune_norm=prune_norm, intra_mode=intra_mode,
                            num_positives=num_positives, positive_weight=positive_weight)
        self.normalize = flag(normalize, "normalize")
        for name in ("video_queue", "text_queue", "video_embed_queue", "text_embed_queue"):
            self.register_buffer(name, torch.zeros(0, 0))
        self.register_buffer("id_queue", torch.zeros(0, dtype=torch.long))

    def forward(self, video, text, *, video_input=None, text_input=None, ids=None,
                temperature: Temperature | None = None) -> torch.Tensor:
        v, t = embeddings(video, text)
        batch = gather_pair(v, t, gather=True, local_loss=False)
        inputs = []
        for x, name in ((video_input, "video_input"), (text_input, "text_input")):
            if x is None:
                raise ValueError(f"{name}: CrossCLR needs the frozen input features "
                                 f"(forward(video, text, video_input=..., text_input=...))")
            x = float_matrix(x, name, device=v.device).detach()
            x = x.double() if x.dtype == torch.float64 else x.float()
            inputs.append(gather_inputs(l2_normalize(x), batch, name))
        tau = gather_per_sample(self.temperature if temperature is None else temperature, batch, "temperature", v)
        ids = gather_ids(ids, batch)
        v_all, t_all = batch.video, batch.text
        queue = {}
        if self.queue_size > 0:
            queue = self._queue_view(v_all.shape[0])
        loss = crossclr_loss(v_all, t_all, inputs[0], inputs[1], temperature=tau,
                             intra_weight=self.intra_weight, prune_threshold=self.prune_threshold,
                             weight_scale=self.weight_scale, ids=ids, normalize=self.normalize,
                             **queue, **self.options)
        if self.queue_size > 0 and self.training:
            self._enqueue(inputs, v_all, t_all, ids)
        return loss

    def _queue_view(self, b: int) -> dict:
        """Earlier batches: the newest ``M - b`` queued rows (the batch completes ``Q``)."""
        if self.queue_size < b:
            raise ValueError(f"queue_size: {self.queue_size} is smaller than the global batch size {b}")
        if self.video_queue.numel() == 0:
            return {}
        keep = self.queue_size - b
        return dict(video_bank=self.video_queue[:keep], text_bank=self.text_queue[:keep],
                    video_queue=self.video_embed_queue[:keep], text_queue=self.text_embed_queue[:keep],
                    queue_ids=self.id_queue[:keep])

    def _enqueue(self, inputs, v_all, t_all, ids) -> None:
        # embeddings as the loss sees them (normalised), detached; ids -1: unknown (no blocking)
        emb = [l2_normalize(z) if self.normalize else z for z in (v_all, t_all)]
        emb = [z.detach().to(torch.float64 if z.dtype == torch.float64 else torch.float32) for z in emb]
        ids = torch.full((v_all.shape[0],), -1, dtype=torch.long, device=v_all.device) if ids is None else ids
        m = self.queue_size
        self.video_queue = fifo_enqueue(self.video_queue.to(inputs[0].device), inputs[0], m)
        self.text_queue = fifo_enqueue(self.text_queue.to(inputs[1].device), inputs[1], m)
        self.video_embed_queue = fifo_enqueue(self.video_embed_queue.to(emb[0].device), emb[0], m)
        self.text_embed_queue = fifo_enqueue(self.text_embed_queue.to(emb[1].device), emb[1], m)
        self.id_queue = torch.cat([ids.long(), self.id_queue.to(ids.device)])[:m]

    def extra_repr(self) -> str:
        return (f"temperature={self.temperature}, intra_weight={self.intra_weight}, "
                f"prune_threshold={self.prune_threshold}, weight_scale={self.weight_scale}, "
                f"queue_size={self.queue_size}")
