"""``InfoNCE`` module: the symmetric CLIP loss with fixed or learnable temperature."""

from __future__ import annotations

import math

import torch
from torch import nn

from xmodal._validate import flag, positive_number
from xmodal.functional._common import Temperature
from xmodal.functional.infonce import info_nce
from xmodal.losses._gather import embeddings, gather_ids, gather_pair, gather_per_sample


class InfoNCE(nn.Module):
    """Symmetric InfoNCE / CLIP loss (Radford et al. 2021; TS++ eq. 4.7 per-sample tau).

    See :func:`xmodal.functional.infonce.info_nce` for the equation, the ``ids`` rule
    (positive = the diagonal pair, other same-id entries masked from the denominator)
    and ``B = 1`` (loss 0).

    Args:
        temperature: initial/fixed temperature, > 0.
        learnable: learn the temperature as CLIP does, through ``logit_scale = log(1/tau)``,
            clamped in forward so that ``1/tau <= max_logit_scale`` (CLIP: 100).
        t2v_temperature, v2t_temperature: fixed per-direction temperatures (TS++ sec.
            5.6.4); not combinable with ``learnable``.
        normalize: L2-normalise the embeddings.
        gather: under ``torch.distributed``, compute the loss on the global batch
            (gather-with-grad, :mod:`xmodal.dist`); off: each rank uses only its local
            batch. Every rank must pass the same local batch size, per-sample values
            are gathered alongside, and ``ids`` must be globally unique per instance.
        local_loss: with ``gather``, each rank computes only its own rows against the
            global batch (open_clip); the mean over ranks equals the global loss and the
            DDP gradients are the same.
        max_logit_scale: clamp of ``1/tau`` for the learnable temperature.

    Shape:
        video, text: ``[B, D]``; ``ids``: ``[B]``; ``temperature``: float or ``[B]``;
        output: scalar.

    Examples:
        >>> import torch; _ = torch.manual_seed(0)
        >>> video, text = torch.randn(4, 8), torch.randn(4, 8)
        >>> loss = InfoNCE(temperature=0.05)(video, text)
        >>> loss.ndim, bool(InfoNCE(temperature=0.05)(video, video) < loss)   # matched pairs score lower
        (0, True)
    """

    accepts = ("ids", "temperature", "t2v_temperature", "v2t_temperature")
    scheduled = "temperature"  # what the trainer may schedule (xmodal.losses.loss_spec)

    def __init__(self, temperature: float = 0.05, learnable: bool = False, *,
                 t2v_temperature: float | None = None, v2t_temperature: float | None = None,
                 normalize: bool = True, gather: bool = True, local_loss: bool = False,
                 max_logit_scale: float = 100.0) -> None:
        super().__init__()
        temperature = positive_number(temperature, "temperature")
        self.max_logit_scale = positive_number(max_logit_scale, "max_logit_scale")
        self.learnable = flag(learnable, "learnable")
        if self.learnable and (t2v_temperature is not None or v2t_temperature is not None):
            raise ValueError("t2v_temperature/v2t_temperature: not combinable with learnable=True")
        self.t2v_temperature = None if t2v_temperature is None else positive_number(t2v_temperature, "t2v_temperature")
        self.v2t_temperature = None if v2t_temperature is None else positive_number(v2t_temperature, "v2t_temperature")
        self.normalize, self.gather, self.local_loss = (flag(normalize, "normalize"), flag(gather, "gather"),
                                                     flag(local_loss, "local_loss"))
        if self.learnable:
            self.logit_scale = nn.Parameter(torch.tensor(math.log(1.0 / temperature)))
        else:
            self._temperature = temperature

    @property
    def temperature(self) -> Temperature:
        """The current temperature (a 0-d tensor with grad when learnable)."""
        if self.learnable:
            return 1.0 / self.logit_scale.clamp(max=math.log(self.max_logit_scale)).exp()
        return self._temperature

    def forward(self, video, text, *, ids=None, temperature: Temperature | None = None,
                t2v_temperature: Temperature | None = None,
                v2t_temperature: Temperature | None = None) -> torch.Tensor:
        """Loss of a batch; ``temperature`` (float or ``[B]``) overrides the module's."""
        v, t = embeddings(video, text)
        batch = gather_pair(v, t, gather=self.gather, local_loss=self.local_loss)
        tau = self.temperature if temperature is None else temperature
        t2v = self.t2v_temperature if t2v_temperature is None else t2v_temperature
        v2t = self.v2t_temperature if v2t_temperature is None else v2t_temperature
        return info_nce(batch.video, batch.text,
                        temperature=gather_per_sample(tau, batch, "temperature", v),
                        t2v_temperature=gather_per_sample(t2v, batch, "t2v_temperature", v),
                        v2t_temperature=gather_per_sample(v2t, batch, "v2t_temperature", v),
                        ids=gather_ids(ids, batch), normalize=self.normalize, rows=batch.rows)
