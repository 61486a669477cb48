"""``MILNCE`` module: several positives (same ids) in the numerator."""

from __future__ import annotations

import torch
from torch import nn

from xmodal._validate import flag
from xmodal.functional._common import Temperature
from xmodal.functional.milnce import mil_nce
from xmodal.losses._common import DirectionalTemperatures
from xmodal.losses._gather import run_in_batch


class MILNCE(DirectionalTemperatures, nn.Module):
    """MIL-NCE (Miech et al. 2020): every same-id pair is a positive in the numerator.

    See :func:`xmodal.functional.milnce.mil_nce`.

    Batch: MIL-NCE needs several positives per anchor, i.e. ``K > 1`` captions of the same
    video in one batch, row ``i`` holding ``(video of caption i, caption i)`` (the video's
    embedding repeated on each of its ``K`` rows) and ``ids[i]`` the video's index. A
    batch of one caption per video (or no ``ids``) makes it exactly InfoNCE. The trainer's
    K-captions-per-video sampler builds such batches. With ``joint=True`` the loss is the
    official HowTo100M code's (tested against it with ``K`` captions per video).

    Args:
        temperature: > 0; ``t2v_temperature``/``v2t_temperature``: per-direction values
            for text/video anchors.
        normalize: L2-normalise first.
        joint: the official HowTo100M joint-denominator form (one float temperature,
            no ``local_loss``).
        gather, local_loss: distributed behaviour, as :class:`~xmodal.losses.InfoNCE`.

    Shape:
        video, text: ``[B, D]``; ``ids`` ``[B]``; ``temperature`` float or ``[B]``; scalar out.
    """

    accepts = ("ids", "temperature")
    scheduled = "temperature"  # what the trainer may schedule (xmodal.losses.loss_spec)

    def __init__(self, temperature: float = 0.05, *, t2v_temperature: float | None = None,
                 v2t_temperature: float | None = None, normalize: bool = True,
                 joint: bool = False, gather: bool = True, local_loss: bool = False) -> None:
        super().__init__()
        self.joint = flag(joint, "joint")
        local_loss = flag(local_loss, "local_loss")
        if self.joint and (local_loss or t2v_temperature is not None or v2t_temperature is not None):
            raise ValueError("joint: not combinable with local_loss or per-direction temperatures")
        self._set_temperatures(temperature, t2v_temperature, v2t_temperature)
        self.normalize, self.gather, self.local_loss = (flag(normalize, "normalize"), flag(gather, "gather"),
                                                     flag(local_loss, "local_loss"))

    def forward(self, video, text, *, ids=None, temperature: Temperature | None = None,
                t2v_temperature: Temperature | None = None,
                v2t_temperature: Temperature | None = None) -> torch.Tensor:
        """Loss of a batch; keyword values override the constructed ones."""
        per_sample = self._temperatures(temperature, t2v_temperature, v2t_temperature)
        return run_in_batch(mil_nce, video, text, gather=self.gather, local_loss=self.local_loss,
                            ids=ids, per_sample=per_sample, normalize=self.normalize,
                            joint=self.joint)
