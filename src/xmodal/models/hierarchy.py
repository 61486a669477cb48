"""The global level of COOT's two-level model, as CrossCLR trains it (appendix A, Fig. 7).

A video is a sequence of clips and a paragraph a sequence of sentences. The local towers of
:class:`~xmodal.models.TwoTower` turn frames (a sentence's feature) into clip (sentence)
embeddings; a :class:`GlobalTower` per modality turns a group's clip (sentence) embeddings
into one video (paragraph) embedding: a transformer encoder over the group's sequence with
a learned position embedding and a padding mask for variable group sizes, then max or
attention pooling (Table 7, "Pooler": Max for LSMDC, ATN for YouCook2), then a linear map.

Ours, not the paper's: COOT's global transformer also attends to a pooled local context
(its cross-modal cycle and context losses are dropped by CrossCLR, appendix A); here the
global input is the local embeddings only. The feed-forward width (4 x dim) is not given
in the paper.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from xmodal._validate import choice, short_repr
from xmodal.models.towers import TowerSpec, position_table, transformer_encoder
from xmodal.models.two_tower import TwoTower, specs_from_architecture

POOLINGS = ("max", "atn")


@dataclass(frozen=True)
class GlobalSpec:
    """Architecture of the two global towers (plain values, stored in checkpoints).

    ``dim``: the local embedding size (input and output); ``heads``/``layers``: the
    encoder's (Table 7: 8 heads, 1 layer); ``pooling``: ``max`` or ``atn``;
    ``max_len``: the longest group (clips or sentences) the position embedding covers.
    """

    dim: int = 256
    heads: int = 8
    layers: int = 1
    dropout: float = 0.0
    pooling: str = "atn"
    max_len: int = 128


def pad_groups(x: torch.Tensor, owner: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``x`` gathered per group, in row order, zero-padded to the longest group.

    Args:
        x: ``[R, D]`` rows (clip or sentence embeddings).
        owner: int ``[R]`` in ``[0, num_groups)``: the group of each row.
        num_groups: ``G``.

    Returns:
        ``(padded [G, L, D], mask [G, L])``; ``mask`` True = a real row. Row ``j`` of group
        ``g`` is the ``j``-th row of ``x`` (in row order) whose owner is ``g``.

    >>> p, m = pad_groups(torch.arange(4.)[:, None], torch.tensor([1, 0, 1, 1]), 2)
    >>> p[..., 0].tolist(), m.tolist()
    ([[1.0, 0.0, 0.0], [0.0, 2.0, 3.0]], [[True, False, False], [True, True, True]])
    """
    owner = owner.to(device=x.device, dtype=torch.long)
    counts = torch.bincount(owner, minlength=num_groups)
    length = int(counts.max()) if owner.numel() else 0
    order = torch.sort(owner, stable=True).indices
    sorted_owner = owner[order]
    start = torch.cumsum(counts, 0) - counts
    pos = torch.arange(owner.numel(), device=x.device) - start[sorted_owner]
    padded = x.new_zeros(num_groups, length, x.shape[-1])
    padded[sorted_owner, pos] = x[order]
    mask = torch.zeros(num_groups, length, dtype=torch.bool, device=x.device)
    mask[sorted_owner, pos] = True
    return padded, mask


class GlobalTower(nn.Module):
    """A group's local embeddings -> one embedding (COOT's global transformer + pooler).

    Padded rows (``mask`` False) never change an output: they are zeroed, masked out of
    attention (``src_key_padding_mask``) and out of the pooling.

    Shape:
        - x: ``[G, L, D]``; mask: ``[G, L]`` bool, every group with at least one real row
        - output: ``[G, D]`` (not normalised)
    """

    def __init__(self, spec: GlobalSpec) -> None:
        super().__init__()
        choice(spec.pooling, "model.pooling", POOLINGS)
        if spec.dim % spec.heads:
            raise ValueError(f"model.global_heads: must divide the embedding size {spec.dim}, got {spec.heads}")
        self.spec = spec
        self.pos = position_table(spec.max_len, spec.dim)
        self.encoder = transformer_encoder(spec.dim, spec.heads, spec.layers, spec.dropout)
        if spec.pooling == "atn":  # attention pooling: a learned score per row, softmax over the group
            self.score = nn.Sequential(nn.Linear(spec.dim, spec.dim), nn.GELU(), nn.Linear(spec.dim, 1))
        self.out = nn.Linear(spec.dim, spec.dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if x.shape[1] > self.spec.max_len:
            raise ValueError(f"groups: a group has {x.shape[1]} clips or sentences, the model supports at most "
                             f"{self.spec.max_len}")
        if not bool(mask.any(1).all()):
            raise ValueError("groups: every group needs at least one clip and one sentence")
        keep = mask[..., None]
        x = x.masked_fill(~keep, 0.0)
        h = self.encoder(x + self.pos[: x.shape[1]], src_key_padding_mask=~mask)
        h = h.masked_fill(~keep, 0.0)
        if self.spec.pooling == "max":
            pooled = h.masked_fill(~keep, float("-inf")).amax(1)
        else:
            w = torch.softmax(self.score(h).squeeze(-1).masked_fill(~mask, float("-inf")), dim=1)
            pooled = (w[..., None] * h).sum(1)
        return self.out(pooled)


class HierarchicalTwoTower(TwoTower):
    """:class:`TwoTower` (the local level: clips and sentences) plus global towers
    (videos and paragraphs), CrossCLR appendix A.

    The local API (``encode_video``, ``encode_text``, ``similarity``) is the flat
    model's; :meth:`forward_groups` (training) and :meth:`encode_groups` (evaluation)
    add the global level.
    """

    def __init__(self, video: TowerSpec, text: TowerSpec, temperature: float = 0.05, *,
                 experts: dict[str, TowerSpec] | None = None, fusion: str = "gated",
                 hierarchy: GlobalSpec | None = None) -> None:
        super().__init__(video, text, temperature, experts=experts, fusion=fusion)
        spec = hierarchy or GlobalSpec(dim=video.out_dim)
        if spec.dim != video.out_dim:
            raise ValueError(f"model: the global towers' dim {spec.dim} differs from the local out_dim "
                             f"{video.out_dim}")
        self.global_spec = spec
        self.global_video = GlobalTower(spec)
        self.global_text = GlobalTower(spec)

    def forward_groups(self, clips: torch.Tensor, clip_group: torch.Tensor, sentences: torch.Tensor,
                       sentence_group: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Video and paragraph embeddings (unnormalised, keeps grad) from local ones.

        Shape:
            - clips: ``[C, D]``, clip_group: ``[C]``; sentences: ``[S, D]``, sentence_group: ``[S]``
              (rows of one group in temporal order)
            - output: ``([G, D] videos, [G, D] paragraphs)``
        """
        return (self.global_video(*pad_groups(clips, clip_group, num_groups)),
                self.global_text(*pad_groups(sentences, sentence_group, num_groups)))

    @torch.no_grad()
    def encode_groups(self, video_features: Any, video_mask: Any, text_features: Any, text_to_video: Any,
                      video_to_group: Any, *, batch_size: int = 8192, text_mask: Any = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """L2-normalised ``(paragraphs [P, D], videos [P, D], groups [P])`` of the groups that
        have a paragraph (at least one text), in group order (eval mode, no grad).

        ``video_features``/``video_mask`` as :meth:`encode_video`; ``text_to_video`` int
        ``[T]``; ``video_to_group`` int ``[N]`` (:mod:`xmodal.data.groups`); ``text_features``
        / ``text_mask`` as :meth:`encode_text` (sentence or token features).
        """
        import numpy as np

        from xmodal.data.groups import check_groups

        was_training = self.training
        self.eval()
        try:
            x, m = self._prepare_video(video_features, video_mask)
            n = next(iter(x.values())).shape[0] if isinstance(x, dict) else x.shape[0]
            g = check_groups(np.asarray(video_to_group), n)
            t2v = np.asarray(text_to_video, dtype=np.int64)
            rows = lambda fn, count: torch.cat([fn(slice(i, i + batch_size))  # noqa: E731
                                                for i in range(0, count, batch_size)])
            clips = rows(lambda sl: self.video_tower(_rows(x, sl), _rows(m, sl)), n)
            t, tm = self._prepare_text(text_features, text_mask)
            sentences = rows(lambda sl: self.text_tower(t[sl], _rows(tm, sl)), t.shape[0])
            order = np.lexsort((np.arange(t2v.size), t2v))  # a paragraph: texts in clip order
            text_group = g[t2v[order]]
            have = np.unique(text_group)  # groups with a paragraph, renumbered 0..P-1
            keep_clip = np.isin(g, have)
            new = np.full(int(g[-1]) + 1 if g.size else 0, -1, dtype=np.int64)
            new[have] = np.arange(have.size)
            dev = clips.device
            video, paragraph = [], []
            for lo in range(0, have.size, batch_size):  # groups in batches
                sel = np.arange(lo, min(lo + batch_size, have.size))
                cm = keep_clip & np.isin(new[g], sel) if g.size else keep_clip
                tm = np.isin(new[text_group], sel)
                v, p = self.forward_groups(
                    clips[torch.as_tensor(np.flatnonzero(cm), device=dev)],
                    torch.as_tensor(new[g[cm]] - lo, device=dev),
                    sentences[torch.as_tensor(order[tm], device=dev)],
                    torch.as_tensor(new[text_group[tm]] - lo, device=dev), sel.size)
                video.append(v)
                paragraph.append(p)
        finally:
            self.train(was_training)
        return (F.normalize(torch.cat(paragraph).float(), dim=-1), F.normalize(torch.cat(video).float(), dim=-1),
                torch.as_tensor(have))

    def architecture(self) -> dict:
        return {**super().architecture(), "hierarchy": asdict(self.global_spec)}

    @classmethod
    def from_architecture(cls, arch: dict) -> "HierarchicalTwoTower":
        video, text, experts = specs_from_architecture(arch)
        if not isinstance(arch["hierarchy"], dict):
            raise ValueError(f"architecture['hierarchy']: expected a mapping, got {short_repr(arch['hierarchy'])}")
        return cls(video, text, experts=experts, fusion=arch.get("fusion", "gated"),
                   hierarchy=GlobalSpec(**arch["hierarchy"]))


def _rows(x: Any, sl: slice) -> Any:
    if x is None:
        return None
    return {k: v[sl] for k, v in x.items()} if isinstance(x, dict) else x[sl]


def with_global_towers(model: TwoTower, spec: GlobalSpec) -> HierarchicalTwoTower:
    """A :class:`HierarchicalTwoTower` whose local towers are ``model``'s (same weights and
    standardisation), plus freshly initialised global towers of ``spec``."""
    arch = {**model.architecture(), "hierarchy": asdict(spec)}
    out = HierarchicalTwoTower.from_architecture(arch)
    missing, unexpected = out.load_state_dict(model.state_dict(), strict=False)
    if unexpected or any(not k.startswith(("global_video.", "global_text.")) for k in missing):
        raise ValueError(f"model: cannot add global towers ({unexpected or missing})")
    out.temperature = model.temperature
    return out
