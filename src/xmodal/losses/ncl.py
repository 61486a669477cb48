"""NCL module: Sinkhorn-normalised contrastive loss with train-time query queues."""

from __future__ import annotations

import math

import torch
from torch import nn

from xmodal._validate import flag, integer, positive_number
from xmodal.functional._common import l2_normalize
from xmodal.functional.ncl import ncl_loss, scalar_temperature
from xmodal.losses._gather import embeddings, gather_ids, gather_pair

__all__ = ["NCL", "fifo_enqueue"]


def fifo_enqueue(queue: torch.Tensor, new: torch.Tensor, size: int) -> torch.Tensor:
    """A new queue ``cat([new, queue])[:size]``: newest rows first, oldest rows drop out.

    ``queue`` is not modified (a new tensor is returned). If ``new`` alone has more than
    ``size`` rows, only its first ``size`` rows are kept. An empty queue takes ``new``'s
    dtype; later rows are cast to the queue's dtype.

    Shape:
        queue ``[Q, D]`` (``Q <= size``), new ``[b, D]`` -> ``[min(Q + b, size), D]``.
    """
    from xmodal._validate import float_matrix, positive_int

    size = positive_int(size, "size")
    queue = float_matrix(queue, "queue", allow_empty=True, finite=False)
    new = float_matrix(new, "new", allow_empty=True, finite=False)
    if queue.numel() == 0:
        return new.detach()[:size].clone()
    new = new.detach().to(queue.dtype)
    if queue.shape[1] != new.shape[1]:
        raise ValueError(f"queue: feature dimension changed from {queue.shape[1]} to {new.shape[1]}")
    return torch.cat([new, queue], dim=0)[:size]


class NCL(nn.Module):
    """Normalized Contrastive Learning loss (Park et al., EMNLP 2022, eqs. 6-12).

    Each step runs ``sinkhorn_iters`` log-domain Sinkhorn-Knopp iterations on the
    batch similarities ``S = s / temperature``, turns the scalings into detached
    biases ``a_i`` (texts) and ``b_j`` (videos) (eqs. 10-11) and applies the symmetric
    InfoNCE to ``a_i + b_j + <t_i, v_j>`` (eq. 12); see
    :func:`xmodal.functional.ncl.ncl_loss` (``ids``: Sinkhorn over distinct videos
    with marginals from the caption counts). Two readings are ours, not the paper's
    (details in :mod:`xmodal.functional.ncl`): the biases are detached, and each Sinkhorn
    iteration rescales rows (eq. 8) before columns (eq. 9).

    Queues: in training mode every forward enqueues the (L2-normalised when
    ``normalize``) detached text and video embeddings, gathered across ranks with
    the gather of :mod:`xmodal.losses._gather`, into two FIFO queues of ``queue_size``
    rows (newest first, oldest batch out). :meth:`query_bank` returns them for the
    test-time Sinkhorn bias (:class:`xmodal.normalize.SinkhornBias`). Until
    ``queue_size`` rows have been seen, the bank holds only the rows seen so far
    (no padding, no error); ``queue_size=0`` keeps no queue. Eval mode never
    changes the queues. The queues are buffers (saved in ``state_dict``) but change
    shape while filling: load a state dict only into a module of the same fill.

    Distributed: embeddings (with gradient) and ``ids`` are gathered by
    :func:`xmodal.losses._gather.gather_pair` / ``gather_ids``, every rank computes the loss of the
    global batch, so with DDP's gradient averaging the update equals the one of a
    single process on the concatenated batch.

    Learnable temperature (``learnable=True``): as CLIP / CLIP4Clip, the backbone NCL
    fine-tunes, ``logit_scale = log(1 / gamma)`` is a parameter, clamped in forward so
    that ``1 / gamma <= max_logit_scale``; Sinkhorn uses its current (detached) value
    and the gradient reaches it through ``s / gamma`` (see
    :mod:`xmodal.functional.ncl`). ``.temperature`` is then a 0-d tensor with grad.

    Args:
        temperature: ``gamma > 0``, the softmax and Sinkhorn temperature (initial value
            when learnable).
        sinkhorn_iters: Sinkhorn-Knopp iterations per batch (paper: 4).
        queue_size: rows kept in each query queue (paper: 16,384; 0: none).
        normalize: L2-normalise the embeddings.
        learnable: learn the temperature through ``logit_scale`` (CLIP).
        max_logit_scale: clamp of ``1 / gamma`` for the learnable temperature.

    Shape:
        video, text: ``[B, D]``; ids: ``[B]``; returns a scalar.

    Examples:
        >>> import torch; _ = torch.manual_seed(0)
        >>> ncl = NCL(temperature=0.05, queue_size=16)
        >>> loss = ncl(torch.randn(4, 8), torch.randn(4, 8))
        >>> text_queries, video_queries = ncl.query_bank()   # kept for the test-time biases
        >>> loss.ndim, tuple(text_queries.shape)
        (0, (4, 8))
    """

    accepts: tuple[str, ...] = ("ids", "temperature")
    scheduled = "temperature:per_step"  # what the trainer may schedule (xmodal.losses.loss_spec)

    def __init__(self, temperature: float = 0.05, sinkhorn_iters: int = 4,
                 queue_size: int = 16384, normalize: bool = True, learnable: bool = False,
                 max_logit_scale: float = 100.0) -> None:
        super().__init__()
        temperature = positive_number(temperature, "temperature")
        self.max_logit_scale = positive_number(max_logit_scale, "max_logit_scale")
        self.learnable = flag(learnable, "learnable")
        if self.learnable:
            self.logit_scale = nn.Parameter(torch.tensor(math.log(1.0 / temperature)))
        else:
            self._temperature = temperature
        self.sinkhorn_iters = integer(sinkhorn_iters, "sinkhorn_iters", minimum=1)
        self.queue_size = integer(queue_size, "queue_size", minimum=0)
        self.normalize = flag(normalize, "normalize")
        self.register_buffer("text_queue", torch.zeros(0, 0))
        self.register_buffer("video_queue", torch.zeros(0, 0))
        self.last_biases: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def temperature(self) -> float | torch.Tensor:
        """The current temperature (a 0-d tensor with grad when learnable)."""
        if self.learnable:
            return 1.0 / self.logit_scale.clamp(max=math.log(self.max_logit_scale)).exp()
        return self._temperature

    def forward(self, video: torch.Tensor, text: torch.Tensor, *, ids: torch.Tensor | None = None,
                temperature: float | torch.Tensor | None = None) -> torch.Tensor:
        video, text = embeddings(video, text)
        tau = self.temperature if temperature is None else scalar_temperature(temperature)
        batch = gather_pair(video, text, gather=True, local_loss=False)
        ids = gather_ids(ids, batch)
        video_all, text_all = batch.video, batch.text
        loss, biases = ncl_loss(video_all, text_all, temperature=tau,
                                sinkhorn_iters=self.sinkhorn_iters, ids=ids,
                                normalize=self.normalize, return_biases=True)
        self.last_biases = biases
        if self.training and self.queue_size > 0:
            self._enqueue(video_all, text_all)
        return loss

    @torch.no_grad()
    def _enqueue(self, video_all: torch.Tensor, text_all: torch.Tensor) -> None:
        v = video_all.detach().float()
        t = text_all.detach().float()
        if self.normalize:
            v, t = l2_normalize(v), l2_normalize(t)
        self.video_queue = fifo_enqueue(self.video_queue.to(v.device), v, self.queue_size)
        self.text_queue = fifo_enqueue(self.text_queue.to(t.device), t, self.queue_size)

    def query_bank(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(text_queries [K, D], video_queries [K, D])`` seen in training, detached.

        ``K`` is at most ``queue_size`` (fewer while the queues fill; ``[0, 0]`` before
        the first training step). Rows are newest first.
        """
        return self.text_queue.detach().clone(), self.video_queue.detach().clone()

    def extra_repr(self) -> str:
        return (f"temperature={float(torch.as_tensor(self.temperature).detach()):g}, learnable={self.learnable}, sinkhorn_iters={self.sinkhorn_iters}, "
                f"queue_size={self.queue_size}, normalize={self.normalize}")
