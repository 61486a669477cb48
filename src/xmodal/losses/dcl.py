"""``DebiasedContrastive`` module (Chuang et al. 2020), cross-modal and symmetric."""

from __future__ import annotations

import torch
from torch import nn

from xmodal._validate import flag, number
from xmodal.functional._common import Temperature
from xmodal.functional.dcl import debiased_contrastive
from xmodal.losses._common import DirectionalTemperatures
from xmodal.losses._gather import run_in_batch


class DebiasedContrastive(DirectionalTemperatures, nn.Module):
    """Debiased contrastive loss with class prior ``tau_plus``.

    See :func:`xmodal.functional.dcl.debiased_contrastive` (raises for a batch whose
    anchors have no negatives, e.g. ``B = 1``).

    Args:
        temperature: > 0; ``t2v_temperature``/``v2t_temperature`` per direction.
        tau_plus: class prior, in ``[0, 1)``.
        normalize: L2-normalise first.
        gather, local_loss: distributed behaviour, as :class:`~xmodal.losses.InfoNCE`.

    Shape:
        video, text: ``[B, D]``; ``ids`` ``[B]``; ``temperature`` float or ``[B]``; scalar out.
    """

    accepts = ("ids", "temperature", "t2v_temperature", "v2t_temperature")
    scheduled = "temperature"  # what the trainer may schedule (xmodal.losses.loss_spec)

    def __init__(self, temperature: float = 0.05, tau_plus: float = 0.1, *,
                 t2v_temperature: float | None = None, v2t_temperature: float | None = None,
                 normalize: bool = True, gather: bool = True, local_loss: bool = False) -> None:
        super().__init__()
        self._set_temperatures(temperature, t2v_temperature, v2t_temperature)
        tau_plus = number(tau_plus, "tau_plus")
        if not 0.0 <= tau_plus < 1.0:
            raise ValueError(f"tau_plus: must lie in [0, 1), got {tau_plus}")
        self.tau_plus = tau_plus
        self.normalize, self.gather, self.local_loss = (flag(normalize, "normalize"), flag(gather, "gather"),
                                                     flag(local_loss, "local_loss"))

    def forward(self, video, text, *, ids=None, temperature: Temperature | None = None,
                t2v_temperature: Temperature | None = None,
                v2t_temperature: Temperature | None = None) -> torch.Tensor:
        """Loss of a batch; keyword values override the constructed ones."""
        per_sample = self._temperatures(temperature, t2v_temperature, v2t_temperature)
        return run_in_batch(debiased_contrastive, video, text, gather=self.gather,
                            local_loss=self.local_loss, ids=ids, per_sample=per_sample,
                            tau_plus=self.tau_plus, normalize=self.normalize)
