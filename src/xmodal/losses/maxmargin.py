"""``MaxMargin`` module: bidirectional hinge ranking loss, optional VSE++ hardest negative."""

from __future__ import annotations

import torch
from torch import nn

from xmodal._validate import choice, flag
from xmodal.functional._common import Temperature
from xmodal.functional.maxmargin import max_margin
from xmodal.losses._common import non_negative
from xmodal.losses._gather import run_in_batch


class MaxMargin(nn.Module):
    """Bidirectional max-margin loss (TS++ eqs. 3.3/4.8; VSE++ with ``hardest=True``).

    Normalisation: mean over each anchor's negatives, then over anchors, mean of the
    two directions; see :func:`xmodal.functional.maxmargin.max_margin`.

    Args:
        margin: >= 0.
        hardest: VSE++ hardest negative instead of the mean over negatives.
        negative_reduction: ``"mean"`` (default) or ``"sum"`` (TS++ eq. 3.3 literally)
            over each anchor's negatives.
        normalize: L2-normalise first.
        gather, local_loss: distributed behaviour, as :class:`~xmodal.losses.InfoNCE`.

    Shape:
        video, text: ``[B, D]``; ``ids`` ``[B]``; ``margin`` float or ``[B]``; scalar out.
    """

    accepts = ("ids", "margin")
    scheduled = "margin"  # what the trainer may schedule (xmodal.losses.loss_spec)

    def __init__(self, margin: float = 0.2, hardest: bool = False, *, normalize: bool = True,
                 negative_reduction: str = "mean", gather: bool = True,
                 local_loss: bool = False) -> None:
        super().__init__()
        self.negative_reduction = choice(negative_reduction, "negative_reduction", ("mean", "sum"))
        self.margin = non_negative(margin, "margin")
        self.hardest = flag(hardest, "hardest")
        self.normalize, self.gather, self.local_loss = (flag(normalize, "normalize"), flag(gather, "gather"),
                                                     flag(local_loss, "local_loss"))

    def forward(self, video, text, *, ids=None, margin: Temperature | None = None) -> torch.Tensor:
        """Loss of a batch; ``margin`` (float or ``[B]``) overrides the constructed one."""
        return run_in_batch(max_margin, video, text, gather=self.gather, local_loss=self.local_loss,
                            ids=ids, per_sample={"margin": self.margin if margin is None else margin},
                            hardest=self.hardest, normalize=self.normalize,
                            negative_reduction=self.negative_reduction)
