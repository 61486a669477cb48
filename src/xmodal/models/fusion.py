"""Several video experts fused into one embedding (Collaborative Experts / MEE)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from xmodal._validate import choice, short_repr
from xmodal.models.towers import Tower, TowerSpec, check_spec

FUSIONS = ("concat", "gated")


def check_experts(specs: Any, name: str) -> dict[str, TowerSpec]:
    """A ``{expert name: TowerSpec}`` mapping (names: non-empty strings without a dot,
    as module names must be), each spec validated."""
    if not isinstance(specs, dict):
        raise TypeError(f"{name}: expected a dict {{expert name: TowerSpec}}, got {short_repr(specs)}")
    for key, spec in specs.items():
        if not isinstance(key, str) or not key or "." in key:
            raise ValueError(f"{name}: expert names must be non-empty strings without '.', got {short_repr(key)}")
        check_spec(spec, f"{name}[{key!r}]")
    return specs


class ExpertFusion(nn.Module):
    """Several video experts into one embedding (Collaborative Experts, Liu et al. 2019;
    Mixture-of-Embedding-Experts, Miech et al. 2018).

    Each expert ``e`` has its own :class:`Tower` (its own dim, frames and mask) giving
    ``y_e`` ``[N, D]``. ``fusion``:

    - ``concat``: ``W [y_1; ...; y_E] + b``, a missing expert's block is zero.
    - ``gated``: a gated embedding unit per expert (CE sec. 3.1 / MEE eq. 1),
      ``u_e = normalize(y_e * sigmoid(W_e y_e + b_e))``, mixed with weights
      ``w = softmax_e(a_e . y_e + c_e)`` over the experts present for that video
      (missing ones are ``masked_fill(-inf)``: they contribute nothing and the
      remaining weights renormalise, MEE sec. 3.2), output ``sum_e w_e u_e``.
      Deviation: CE/MEE condition the weights on the text query; here they depend on
      the video only, so retrieval stays one dot product of two embeddings.

    Shape:
        - features: ``{name: [N, De] or [N, Fe, De]}``; masks: ``{name: [N] or [N, Fe]}``
        - output: ``[N, D]``
    """

    def __init__(self, specs: dict[str, TowerSpec], fusion: str = "gated") -> None:
        super().__init__()
        choice(fusion, "model.fusion", FUSIONS)
        check_experts(specs, "specs")
        dims = {s.out_dim for s in specs.values()}
        if len(specs) < 2 or len(dims) != 1:
            raise ValueError(f"experts: need at least two experts with one out_dim, got {len(specs)} / {dims}")
        self.fusion = fusion
        self.names = list(specs)
        self.spec = specs[self.names[0]]
        self.towers = nn.ModuleDict({k: Tower(s) for k, s in specs.items()})
        d = self.spec.out_dim
        if fusion == "gated":
            self.gates = nn.ModuleDict({k: nn.Linear(d, d) for k in specs})
            self.scores = nn.ModuleDict({k: nn.Linear(d, 1) for k in specs})
        else:
            self.proj = nn.Linear(len(specs) * d, d)

    def forward(self, features: dict[str, torch.Tensor], masks: dict[str, torch.Tensor] | None = None
                ) -> torch.Tensor:
        masks = masks or {}
        outs, present = [], []
        for name in self.names:
            x, m = features[name], masks.get(name)
            here = torch.ones(x.shape[0], dtype=torch.bool, device=x.device) if m is None else (
                m if m.ndim == 1 else m.any(1))
            # Whatever a missing expert's row holds (zeros, NaN) is replaced before any arithmetic.
            x = x.masked_fill(~here.view(-1, *([1] * (x.ndim - 1))), 0.0)
            present.append(here)
            outs.append(self.towers[name](x, m if m is not None and m.ndim == 2 else None))
        here = torch.stack(present, 1)  # [N, E]
        # (not while torch.export traces the graph for ONNX: a data-dependent branch; encode_video checks it)
        if not torch.compiler.is_compiling() and not bool(here.any(1).all()):
            raise ValueError("mask: some videos have no expert present (every expert masked)")
        if self.fusion == "concat":
            blocks = [y.masked_fill(~p[:, None], 0.0) for y, p in zip(outs, present)]
            return self.proj(torch.cat(blocks, 1))
        units = torch.stack([F.normalize(y * torch.sigmoid(self.gates[k](y)), dim=-1)
                             for k, y in zip(self.names, outs)], 1)  # [N, E, D]
        logits = torch.cat([self.scores[k](y) for k, y in zip(self.names, outs)], 1)  # [N, E]
        weights = torch.softmax(logits.masked_fill(~here, float("-inf")), dim=1)
        units = units.masked_fill(~here[..., None], 0.0)  # no 0 * (whatever a missing expert gave)
        return (weights[..., None] * units).sum(1)
