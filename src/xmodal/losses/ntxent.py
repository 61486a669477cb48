"""``NTXent`` module: SimCLR's NT-Xent with video and text as the two views."""

from __future__ import annotations

import torch
from torch import nn

from xmodal._validate import flag
from xmodal.functional._common import Temperature
from xmodal.functional.ntxent import nt_xent
from xmodal.losses._common import DirectionalTemperatures
from xmodal.losses._gather import run_in_batch


class NTXent(DirectionalTemperatures, nn.Module):
    """NT-Xent (Chen et al. 2020): cross-modal positives, cross- and intra-modal negatives.

    See :func:`xmodal.functional.ntxent.nt_xent`.

    Args:
        temperature: > 0; ``t2v_temperature``/``v2t_temperature``: per-direction values
            for text/video anchors.
        normalize: L2-normalise first.
        gather, local_loss: distributed behaviour, as :class:`~xmodal.losses.InfoNCE`.

    Shape:
        video, text: ``[B, D]``; ``ids`` ``[B]``; ``temperature`` float or ``[B]``; scalar out.
    """

    accepts = ("ids", "temperature")
    scheduled = "temperature"  # what the trainer may schedule (xmodal.losses.loss_spec)

    def __init__(self, temperature: float = 0.05, *, t2v_temperature: float | None = None,
                 v2t_temperature: float | None = None, normalize: bool = True,
                 gather: bool = True, local_loss: bool = False) -> None:
        super().__init__()
        self._set_temperatures(temperature, t2v_temperature, v2t_temperature)
        self.normalize, self.gather, self.local_loss = (flag(normalize, "normalize"), flag(gather, "gather"),
                                                     flag(local_loss, "local_loss"))

    def forward(self, video, text, *, ids=None, temperature: Temperature | None = None,
                t2v_temperature: Temperature | None = None,
                v2t_temperature: Temperature | None = None) -> torch.Tensor:
        """Loss of a batch; keyword values override the constructed ones."""
        per_sample = self._temperatures(temperature, t2v_temperature, v2t_temperature)
        return run_in_batch(nt_xent, video, text, gather=self.gather, local_loss=self.local_loss,
                            ids=ids, per_sample=per_sample, normalize=self.normalize)
