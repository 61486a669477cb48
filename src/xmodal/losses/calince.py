"""CaliNCE module: calibrated contrastive loss with its correspondence head (Cali-NCE eqs. 1-6)
and the uncalibrated co-training combinations of its Table 1."""

from __future__ import annotations

import torch
from torch import nn

from xmodal._validate import choice, flag, float_matrix, integer, number, positive_number, short_repr
from xmodal.functional._common import Temperature
from xmodal.functional.calince import (calibrated_nce, correspondence_loss, derangement,
                                       predictive_coding_loss)
from xmodal.losses._gather import Batch, embeddings, gather_ids, gather_inputs, gather_pair, gather_per_sample

__all__ = ["CaliNCE"]


def _linear(in_dim: int | None, out_dim: int) -> nn.Module:
    return nn.LazyLinear(out_dim) if in_dim is None else nn.Linear(in_dim, out_dim)


class CaliNCE(nn.Module):
    """Cali-NCE (Zhao et al., CVPR-W 2023, eq. 6) and the co-training sums of Table 1.

    ``L = theta1 L_corr + theta2 L_cont + theta3 L_pred`` (sec. 3.4) where

    * ``L_corr`` (eq. 1, sec. 3.1): a correspondence head ``C`` (two-layer MLP
      ``Linear -> ReLU -> Linear`` on ``[f_v, f_t]``, 2-way softmax, sec. 3.4) is trained
      per sample with ``-log c_ii - log(1 - c_ij)`` on the matched pair and a mismatched
      pair ``(v_i, t_sigma(i))``, ``sigma`` a random derangement of the (global) batch;
      shuffled pairs that share an instance id are dropped.
    * ``L_cont``: ``1/B sum_i w_i (NCE(v_i, t_i) + NCE(t_i, v_i))`` (eq. 2 summed over the
      two directions), on COSINE similarities by default (our reading: eq. 2 prints the
      dot product ``f_v^T f_t / tau``; ``normalize=False`` is that literal form).
      ``calibration=True`` is Cali-NCE (eq. 6): ``w_i = c_ii``, the head's matching probability; ``calibration=False`` is plain co-training, ``w_i = 1``.
    * ``L_pred`` (eqs. 3-5, sec. 3.3; ``predictive_weight > 0``): linear ``D x D`` heads
      ``G_v``, ``G_t`` act on the embeddings as given (not normalised); their outputs are
      normalised and compared with the normalised, stop-gradient embedding of the other
      modality (squared distance).

    Weights: ``correspondence_weight`` = ``theta1`` (eq. 6's ``lambda2``),
    ``contrastive_weight`` = ``theta2`` (``lambda1``), ``predictive_weight`` =
    ``theta3`` (the paper uses 1, 1 and 200). Table 1's rows: Contra. ``(cal=False,
    corr=0)``; Corr. ``(cal=False, cont=0)``; Coding. ``(cal=False, cont=0, corr=0,
    pred=200)``; Contra.+Corr. ``(cal=False)``; Contra.+Coding. ``(cal=False, corr=0,
    pred=200)``; all three ``(cal=False, pred=200)``; Cali-NCE ``(cal=True)``.
    ``calibration=True`` needs ``correspondence_weight > 0`` (eq. 6: ``L_corr`` is what
    trains ``c_ii``; an untrained head would weight the NCE terms at random), so that
    combination raises ``ValueError``. The head exists only when it is used
    (``calibration`` or ``correspondence_weight > 0``).

    ``c_ii`` is **detached** in ``L_cont`` by default (``detach_weight=True``, our reading,
    not the paper's: eq. 6 does not say whether the weight carries gradient): otherwise the head lowers the loss by driving
    ``c_ii -> 0`` (the trivial solution) and learns from more than ``L_corr``.

    Head inputs (``head_input``): ``"embeddings"`` (default, sec. 3.1: ``f_v``, ``f_t``
    are the backbones' embeddings, given as they are, not normalised); ``L_corr`` then
    also trains the encoders. ``"inputs"`` feeds the frozen input features
    ``video_input``, ``text_input`` (required in forward). Pass ``embed_dim`` /
    ``input_dims`` so the parameters exist at construction; otherwise lazy layers are
    used and one forward must run before the optimizer is built.

    Shuffling: ``seed`` makes a private ``torch.Generator`` (reproducible, and equal on
    every rank so distributed ranks shuffle alike); ``seed=None`` uses torch's global
    RNG. ``B = 1``: no mismatched pair, ``L_corr`` uses the matched pair only.
    ``last_terms`` holds the last step's unweighted terms as floats: ``"contrastive"``,
    ``"correspondence"`` (eq. 1, batch mean of the per-sample sum; 0 without a head),
    ``"predictive"``, ``"loss"`` and, with a head, ``"c_mean"`` (mean ``c_ii``).

    Shape:
        video, text ``[B, D]``; ``*_input`` ``[B, Dv]``, ``[B, Dt]``; ids ``[B]``; scalar out.

    Examples:
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> v, t = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
        >>> loss = CaliNCE(embed_dim=16, calibration=False, predictive_weight=200.0, seed=0)
        >>> out = loss(v, t)
        >>> sorted(loss.last_terms)
        ['c_mean', 'contrastive', 'correspondence', 'loss', 'predictive']
    """

    accepts: tuple[str, ...] = ("ids", "temperature", "video_input", "text_input")
    scheduled = "temperature"  # what the trainer may schedule (xmodal.losses.loss_spec)

    def __init__(self, temperature: float = 0.05, *, calibration: bool = True,
                 contrastive_weight: float = 1.0, correspondence_weight: float = 1.0,
                 predictive_weight: float = 0.0, hidden_dim: int = 256, embed_dim: int | None = None,
                 input_dims: tuple[int, int] | None = None, head_input: str = "embeddings",
                 detach_weight: bool = True, normalize: bool = True, seed: int | None = None) -> None:
        super().__init__()
        self.temperature = positive_number(temperature, "temperature")
        self.calibration = flag(calibration, "calibration")
        self.contrastive_weight = number(contrastive_weight, "contrastive_weight", minimum=0.0)
        self.correspondence_weight = number(correspondence_weight, "correspondence_weight", minimum=0.0)
        self.predictive_weight = number(predictive_weight, "predictive_weight", minimum=0.0)
        if self.calibration and self.correspondence_weight == 0:
            raise ValueError("correspondence_weight: calibration=True needs the correspondence loss "
                             "(eq. 6) to train c_ii; use calibration=False for uncalibrated co-training")
        if self.contrastive_weight == self.correspondence_weight == self.predictive_weight == 0:
            raise ValueError("contrastive_weight, correspondence_weight, predictive_weight: all are 0")
        self.head_input = choice(head_input, "head_input", ("embeddings", "inputs"))
        self.detach_weight, self.normalize = flag(detach_weight, "detach_weight"), flag(normalize, "normalize")
        hidden_dim = integer(hidden_dim, "hidden_dim", minimum=1)
        embed_dim = None if embed_dim is None else integer(embed_dim, "embed_dim", minimum=1)
        if input_dims is not None:
            if not isinstance(input_dims, (tuple, list)) or len(input_dims) != 2:
                raise TypeError(f"input_dims: expected a pair (video dim, text dim), got {short_repr(input_dims)}")
            input_dims = tuple(integer(d, "input_dims", minimum=1) for d in input_dims)
        if seed is not None:
            seed = integer(seed, "seed", minimum=-(1 << 63), maximum=(1 << 64) - 1)
        in_dim = None
        if head_input == "embeddings" and embed_dim is not None:
            in_dim = 2 * embed_dim
        elif head_input == "inputs" and input_dims is not None:
            in_dim = input_dims[0] + input_dims[1]
        self.head = None
        if self.calibration or self.correspondence_weight > 0:
            self.head = nn.Sequential(_linear(in_dim, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 2))
        self.predict_v = self.predict_t = None
        if self.predictive_weight > 0:
            if embed_dim is None:
                raise ValueError("embed_dim: required when predictive_weight > 0 (G_v, G_t are D x D)")
            self.predict_v = nn.Linear(embed_dim, embed_dim)
            self.predict_t = nn.Linear(embed_dim, embed_dim)
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)
        self.last_terms: dict[str, float] = {}

    def _head_features(self, batch: Batch, video_input, text_input):
        """``(f_v, f_t)`` of the global batch: the gathered embeddings or input features."""
        if self.head_input == "embeddings":
            return batch.video, batch.text
        feats = []
        for x, name in ((video_input, "video_input"), (text_input, "text_input")):
            if x is None:
                raise ValueError(f"{name}: required with head_input='inputs'")
            feats.append(gather_inputs(float_matrix(x, name, device=batch.video.device), batch, name))
        return feats

    def _correspondence(self, batch: Batch, video_input, text_input, ids):
        """``(L_corr, c [B])`` of the global batch (eq. 1)."""
        v, t = batch.video, batch.text
        fv, ft = self._head_features(batch, video_input, text_input)
        n = v.shape[0]
        hd = self.head[-1].weight.dtype  # the head runs in its own dtype (float32 unless .double())
        fv, ft = fv.to(hd), ft.to(hd)
        match_logits = self.head(torch.cat([fv, ft], dim=1))
        work = torch.float64 if hd == torch.float64 else torch.float32
        c = torch.softmax(match_logits.to(work), dim=1)[:, 1]
        mismatch_logits, valid = match_logits[:0], None  # B = 1: matched pair only
        if n >= 2:
            sigma = derangement(n, generator=self.generator, device=v.device)
            valid = None if ids is None else ids[sigma] != ids
            mismatch_logits = self.head(torch.cat([fv, ft[sigma]], dim=1))
        return correspondence_loss(match_logits.to(work), mismatch_logits.to(work), valid), c

    def forward(self, video, text, video_input=None, text_input=None, *, ids=None,
                temperature: Temperature | None = None) -> torch.Tensor:
        v_local, t_local = embeddings(video, text)
        batch = gather_pair(v_local, t_local, gather=True, local_loss=False)
        ids = gather_ids(ids, batch)
        v, t = batch.video, batch.text
        corr, c = v.new_zeros(()), None
        if self.head is not None:
            corr, c = self._correspondence(batch, video_input, text_input, ids)
        tau = gather_per_sample(self.temperature if temperature is None else temperature, batch,
                                "temperature", v_local)
        if self.calibration:
            weights = c.detach() if self.detach_weight else c
        else:
            weights = torch.ones(v.shape[0], dtype=v.dtype, device=v.device)
        cont = calibrated_nce(v, t, weights, temperature=tau, ids=ids, normalize=self.normalize)
        pred = cont.new_zeros(())
        if self.predict_v is not None:
            pd = self.predict_v.weight.dtype
            pred = predictive_coding_loss(self.predict_v(v.to(pd)), self.predict_t(t.to(pd)), v, t)
        loss = (self.correspondence_weight * corr.to(cont.dtype) + self.contrastive_weight * cont
                + self.predictive_weight * pred.to(cont.dtype))
        self.last_terms = {"contrastive": float(cont.detach()), "correspondence": float(corr.detach()),
                           "predictive": float(pred.detach()), "loss": float(loss.detach())}
        if c is not None:
            self.last_terms["c_mean"] = float(c.detach().mean())
        return loss

    def extra_repr(self) -> str:
        return (f"temperature={self.temperature}, calibration={self.calibration}, "
                f"contrastive_weight={self.contrastive_weight}, "
                f"correspondence_weight={self.correspondence_weight}, "
                f"predictive_weight={self.predictive_weight}, head_input={self.head_input!r}")
