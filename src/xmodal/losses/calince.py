"""CaliNCE module: calibrated contrastive loss with its correspondence head (Cali-NCE eqs. 1-6)."""

from __future__ import annotations

import torch
from torch import nn

from xmodal import dist
from xmodal._validate import choice, float_matrix, positive_number
from xmodal.functional._common import Temperature, check_ids, l2_normalize
from xmodal.functional.calince import (calibrated_nce, correspondence_loss, derangement,
                                       predictive_coding_loss)
from xmodal.losses._gather import embeddings

__all__ = ["CaliNCE"]


def _linear(in_dim: int | None, out_dim: int) -> nn.Module:
    return nn.LazyLinear(out_dim) if in_dim is None else nn.Linear(in_dim, out_dim)


class CaliNCE(nn.Module):
    """Cali-NCE (Zhao et al., CVPR-W 2023, eqs. 1-6), with the co-training sum.

    ``L = theta1 L_corr + theta2 L_cont + theta3 L_pred`` where

    * ``L_corr`` (eq. 1): the correspondence head ``C`` (``Linear -> ReLU -> Linear``
      on the concatenation ``[f_v, f_t]``, 2-way softmax) is trained with
      cross-entropy on the matched pairs (class 1) and on mismatched pairs
      ``(v_i, t_sigma(i))`` (class 0), ``sigma`` a random derangement of the (global)
      batch; shuffled pairs that share an instance id are dropped.
    * ``L_cont`` (eq. 6): ``1/B sum_i c_ii (NCE(v_i, t_i) + NCE(t_i, v_i))`` with
      ``c_ii = C(v_i, t_i)[1]``. ``c_ii`` is **detached** by default
      (``detach_weight=True``): otherwise the head lowers the loss by driving
      ``c_ii -> 0`` (the trivial solution); the head then learns only from ``L_corr``.
    * ``L_pred`` (eqs. 3-5, optional, ``predictive_weight > 0``): linear heads
      ``G_v``, ``G_t`` map the (normalised) embedding of one modality to a prediction
      of the other's; predictions are normalised and compared with stop-gradient
      targets (squared distance).

    Eq. 6's ``lambda1, lambda2`` are ``contrastive_weight`` (``theta2``) and
    ``correspondence_weight`` (``theta1``).

    Head inputs (``head_input``): ``"embeddings"`` (default) feeds the joint-space
    embeddings (L2-normalised when ``normalize``) to ``C``; ``L_corr`` then also
    trains the encoders. ``"inputs"`` feeds the frozen input features
    ``video_input``, ``text_input`` (required in forward). Pass ``embed_dim`` /
    ``input_dims`` so the parameters exist at construction; otherwise lazy layers are
    used and one forward must run before the optimizer is built.

    Shuffling: ``seed`` makes a private ``torch.Generator`` (reproducible, and equal on
    every rank so distributed ranks shuffle alike); ``seed=None`` uses torch's global
    RNG. ``B = 1``: no mismatched pair, ``L_corr`` uses the matched pair only.
    ``last_terms`` holds the last step's components as floats
    (``corr``, ``cont``, ``pred``, ``c_mean``, ``loss``).

    Shape:
        video, text ``[B, D]``; ``*_input`` ``[B, Dv]``, ``[B, Dt]``; ids ``[B]``; scalar out.
    """

    accepts: tuple[str, ...] = ("ids", "temperature", "video_input", "text_input")
    scheduled = "temperature"  # what the trainer may schedule (xmodal.losses.loss_spec)

    def __init__(self, temperature: float = 0.05, *, contrastive_weight: float = 1.0,
                 correspondence_weight: float = 1.0, predictive_weight: float = 0.0,
                 hidden_dim: int = 256, embed_dim: int | None = None,
                 input_dims: tuple[int, int] | None = None, head_input: str = "embeddings",
                 detach_weight: bool = True, normalize: bool = True, seed: int | None = None) -> None:
        super().__init__()
        self.temperature = positive_number(temperature, "temperature")
        self.contrastive_weight = float(contrastive_weight)
        self.correspondence_weight = float(correspondence_weight)
        self.predictive_weight = float(predictive_weight)
        for name in ("contrastive_weight", "correspondence_weight", "predictive_weight"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)!r}")
        self.head_input = choice(head_input, "head_input", ("embeddings", "inputs"))
        self.detach_weight, self.normalize = bool(detach_weight), bool(normalize)
        in_dim = None
        if head_input == "embeddings" and embed_dim is not None:
            in_dim = 2 * int(embed_dim)
        elif head_input == "inputs" and input_dims is not None:
            in_dim = int(input_dims[0]) + int(input_dims[1])
        self.head = nn.Sequential(_linear(in_dim, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 2))
        self.predict_v = self.predict_t = None
        if self.predictive_weight > 0:
            if embed_dim is None:
                raise ValueError("embed_dim: required when predictive_weight > 0 (G_v, G_t are D x D)")
            self.predict_v = nn.Linear(int(embed_dim), int(embed_dim))
            self.predict_t = nn.Linear(int(embed_dim), int(embed_dim))
        self.generator = None if seed is None else torch.Generator().manual_seed(int(seed))
        self.last_terms: dict[str, float] = {}

    def _head_features(self, v, t, video_input, text_input):
        if self.head_input == "embeddings":
            return (l2_normalize(v), l2_normalize(t)) if self.normalize else (v, t)
        feats = []
        for x, name in ((video_input, "video_input"), (text_input, "text_input")):
            if x is None:
                raise ValueError(f"{name}: required with head_input='inputs'")
            x = float_matrix(x, name, device=v.device).detach()
            if x.shape[0] != v.shape[0]:
                raise ValueError(f"{name}: expected {v.shape[0]} rows, got {x.shape[0]}")
            feats.append(dist.all_gather_no_grad(x))
        return feats

    def forward(self, video, text, video_input=None, text_input=None, *, ids=None,
                temperature: Temperature | None = None) -> torch.Tensor:
        v, t = embeddings(video, text)
        n_local = v.shape[0]
        if ids is not None:
            ids = dist.all_gather_no_grad(check_ids(torch.as_tensor(ids), n_local).to(v.device))
        fv, ft = self._head_features(v, t, video_input, text_input)
        v, t = dist.all_gather_with_grad(v), dist.all_gather_with_grad(t)
        if self.head_input == "embeddings":
            fv, ft = dist.all_gather_with_grad(fv), dist.all_gather_with_grad(ft)
        n = v.shape[0]
        hd = self.head[-1].weight.dtype  # the head runs in its own dtype (float32 unless .double())
        fv, ft = fv.to(hd), ft.to(hd)
        match_logits = self.head(torch.cat([fv, ft], dim=1))
        c = torch.softmax(match_logits.float() if hd != torch.float64 else match_logits, dim=1)[:, 1]
        mismatch_logits, valid = match_logits[:0], None  # B = 1: matched pair only
        if n >= 2:
            sigma = derangement(n, generator=self.generator, device=v.device)
            valid = None if ids is None else ids[sigma] != ids
            mismatch_logits = self.head(torch.cat([fv, ft[sigma]], dim=1))
        corr = correspondence_loss(match_logits.to(c.dtype), mismatch_logits.to(c.dtype), valid)
        tau = self.temperature if temperature is None else temperature
        if isinstance(tau, torch.Tensor) and tau.ndim == 1 and dist.world_size() > 1:
            tau = dist.all_gather_with_grad(tau) if tau.requires_grad else dist.all_gather_no_grad(tau)
        weights = c.detach() if self.detach_weight else c
        cont = calibrated_nce(v, t, weights, temperature=tau, ids=ids, normalize=self.normalize)
        pred = cont.new_zeros(())
        if self.predict_v is not None:
            pd = self.predict_v.weight.dtype
            zv, zt = (l2_normalize(v), l2_normalize(t)) if self.normalize else (v, t)
            pred = predictive_coding_loss(self.predict_v(zv.to(pd)), self.predict_t(zt.to(pd)), zv, zt)
        loss = (self.correspondence_weight * corr + self.contrastive_weight * cont
                + self.predictive_weight * pred)
        self.last_terms = {"corr": float(corr.detach()), "cont": float(cont.detach()),
                           "pred": float(pred.detach()), "c_mean": float(c.detach().mean()),
                           "loss": float(loss.detach())}
        return loss
