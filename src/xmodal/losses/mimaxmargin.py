"""``MIMaxMargin`` module: EPIC-KITCHENS-100 multi-instance max-margin."""

from __future__ import annotations

import torch
from torch import nn

from xmodal._validate import flag, number
from xmodal.functional._common import Temperature
from xmodal.functional.mimaxmargin import mi_max_margin
from xmodal.losses._common import non_negative
from xmodal.losses._gather import embeddings, gather_pair, gather_per_sample, gather_relevancy


class MIMaxMargin(nn.Module):
    """MI-MM (Wray et al. 2021): positives/negatives of each anchor from a relevancy matrix.

    See :func:`xmodal.functional.mimaxmargin.mi_max_margin`.

    Args:
        margin: >= 0 (official default 0.2).
        threshold: relevancy ``>=`` threshold is a positive (official default 0.5).
        normalize: L2-normalise first.
        gather, local_loss: distributed behaviour, as :class:`~xmodal.losses.InfoNCE`.
            Distributed, each rank passes ``relevancy`` ``[b, world*b]``: its videos'
            rows against the global batch of texts.

    Shape:
        video, text: ``[B, D]``; ``relevancy`` ``[B, B]`` (rows videos); scalar out.
    """

    accepts = ("relevancy", "margin")
    scheduled = "margin"  # what the trainer may schedule (xmodal.losses.loss_spec)

    def __init__(self, margin: float = 0.2, *, threshold: float = 0.5, normalize: bool = True,
                 gather: bool = True, local_loss: bool = False) -> None:
        super().__init__()
        self.margin = non_negative(margin, "margin")
        self.threshold = number(threshold, "threshold")
        self.normalize, self.gather, self.local_loss = (flag(normalize, "normalize"), flag(gather, "gather"),
                                                     flag(local_loss, "local_loss"))

    def forward(self, video, text, *, relevancy=None, margin: Temperature | None = None) -> torch.Tensor:
        """Loss of a batch; ``relevancy`` is required."""
        if relevancy is None:
            raise ValueError("relevancy: MIMaxMargin needs the [B, B] relevancy matrix")
        v, t = embeddings(video, text)
        batch = gather_pair(v, t, gather=self.gather, local_loss=self.local_loss)
        if batch.video.shape[0] == batch.local:
            rel = relevancy if isinstance(relevancy, torch.Tensor) else torch.as_tensor(relevancy)
        else:
            rel = gather_relevancy(relevancy, batch.local, v.device)
        m = gather_per_sample(self.margin if margin is None else margin, batch, "margin", v)
        return mi_max_margin(batch.video, batch.text, rel, margin=m, threshold=self.threshold,
                             normalize=self.normalize, rows=batch.rows)
