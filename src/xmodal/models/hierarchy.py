"""The global level of COOT's two-level model, as CrossCLR trains it (appendix A, Fig. 7).

A video is a sequence of clips and a paragraph a sequence of sentences. The local towers of
:class:`~xmodal.models.TwoTower` turn frames (a sentence's feature or tokens) into clip (sentence)
embeddings; a :class:`GlobalTower` per modality turns a group's clip (sentence) embeddings
into one video (paragraph) embedding: a transformer encoder over the group's sequence (masked for
variable group sizes), a pooler, and optionally COOT's context branch.

COOT (sec. 3.2, Fig. 2) and the CrossCLR release (``models/model.py`` l. 164-175, 471-516):

- ``pooling``: ``mean`` over the group's real rows (the release's global "avg"), ``max`` or
  ``atn`` (COOT's attention-aware aggregation, :class:`~xmodal.models.coot.AttentionPool`,
  ``pool_heads`` heads). CrossCLR Table 7's "Pooler" row (LSMDC "Max", YouCook2 "ATN", with "AF
  heads 2") is the *local* level's (:mod:`xmodal.models.towers`, ``model.local_pooling``): the
  release's ``config/lsmdc.yaml`` sets ``max`` for ``video_local`` and ``avg`` for ``video_global``,
  so the global level averages for both datasets; ``max`` here is ours, not Table 7's.
- ``context``: the local tower also embeds the *whole* video's frames (all its clips' frames in
  order; the whole paragraph's tokens or sentences) into one context vector; a
  Linear + GELU (``ctx_project``) and one cross-attention layer, the context as the query and the
  group's encoded clip sequence as keys and values, give a second vector concatenated after the
  pooler: the global embedding is ``[pooled, context]`` (``2 * dim``).
- ``block``: ``xmodal`` (learned positions, pre-norm encoder with 4x feed-forward, an output
  Linear back to ``dim``) or ``release`` (input layer norm, sine/cosine positions, post-norm
  encoder with feed-forward = ``dim``, truncated-normal init, no output Linear).

Ours, not the release's: padded rows are masked (the release masks nothing); a whole video longer
than the local tower's ``max_frames`` is subsampled uniformly to it for the context; the context
branch is the release's in both blocks (``xmodal`` then maps ``2 * dim`` back to ``dim``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from xmodal._validate import choice, flag, short_repr
from xmodal.models.coot import AttentionPool, CootLayerNorm, ReleaseBlock, ReleaseEncoder, init_release, sinusoid_table
from xmodal.models.towers import BLOCKS, TowerSpec, position_table, transformer_encoder
from xmodal.models.two_tower import TwoTower, specs_from_architecture

POOLINGS = ("mean", "max", "atn")


@dataclass(frozen=True)
class GlobalSpec:
    """Architecture of the two global towers (plain values, stored in checkpoints).

    ``dim``: the local embedding size (the input); ``heads``/``layers``: the encoder's (Table 7:
    8 heads, 1 layer); ``pooling``: ``mean``, ``max`` or ``atn`` (``pool_heads`` heads, scoring
    width ``pool_hidden``, 0 = ``dim``); ``context``: COOT's context branch; ``block``: ``xmodal``
    or ``release``; ``max_len``: the longest group (clips or sentences) the positions cover.
    """

    dim: int = 256
    heads: int = 8
    layers: int = 1
    dropout: float = 0.0
    pooling: str = "mean"
    max_len: int = 128
    pool_heads: int = 1
    pool_hidden: int = 0
    context: bool = False
    block: str = "xmodal"

    @property
    def out_dim(self) -> int:
        """The global embedding's size: ``2 * dim`` for the release block with context, else ``dim``."""
        return 2 * self.dim if self.context and self.block == "release" else self.dim


#: Bounds of a stored record's integer fields (``dim`` as ``model.dim``, ``layers`` / ``heads`` as the config's).
_GLOBAL_BOUNDS = {"dim": (1, 1 << 16), "heads": (1, 256), "layers": (1, 64), "max_len": (1, 2 ** 31 - 1),
                  "pool_heads": (1, 256), "pool_hidden": (0, 1 << 17)}


def global_spec_from_dict(d: Any, name: str) -> GlobalSpec:
    """A :class:`GlobalSpec` from a checkpoint's architecture record, each field checked (type, range)
    before anything is built.

    Raises:
        ValueError: naming the field (``{name}.dim`` ...) or the unknown keys.
    """
    from dataclasses import fields

    from xmodal._validate import integer

    if not isinstance(d, dict):
        raise ValueError(f"{name}: expected a mapping, got {short_repr(d)}")
    unknown = sorted(map(str, set(d) - {f.name for f in fields(GlobalSpec)}))
    if unknown:
        raise ValueError(f"{name}: unknown field(s) {', '.join(unknown)}")
    for field, (low, top) in _GLOBAL_BOUNDS.items():
        if field in d:
            integer(d[field], f"{name}.{field}", minimum=low, maximum=top)
    if "dropout" in d and (isinstance(d["dropout"], bool) or not isinstance(d["dropout"], (int, float))
                           or not 0.0 <= d["dropout"] < 1.0):
        raise ValueError(f"{name}.dropout: expected a number in [0, 1), got {short_repr(d['dropout'])}")
    if "context" in d:
        flag(d["context"], f"{name}.context")
    for field, options in (("pooling", POOLINGS), ("block", BLOCKS)):
        if field in d and (not isinstance(d[field], str) or d[field] not in options):
            raise ValueError(f"{name}.{field}: expected one of {', '.join(options)}, got {short_repr(d[field])}")
    return GlobalSpec(**d)


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


def group_frames(x: torch.Tensor, mask: torch.Tensor | None, owner: torch.Tensor, num_groups: int,
                 max_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A group's whole sequence: the real frames of its rows, row after row (COOT's video-level
    input of the context branch), zero-padded; longer than ``max_len``: ``max_len`` frames at
    uniformly spaced positions ``floor(j * n / max_len)``.

    Shape:
        - x: ``[R, F, D]`` (``mask`` ``[R, F]``, True = real) or ``[R, D]`` (a row is one frame)
        - output: ``([G, L, D], mask [G, L])``

    >>> x = torch.arange(6.).reshape(3, 2, 1)
    >>> s, m = group_frames(x, torch.tensor([[True, False], [True, True], [True, True]]), torch.tensor([0, 0, 1]), 2)
    >>> s[..., 0].tolist(), m.tolist()
    ([[0.0, 2.0, 3.0], [4.0, 5.0, 0.0]], [[True, True, True], [True, True, False]])
    """
    owner = owner.to(device=x.device, dtype=torch.long)
    if x.ndim == 2:
        frames, frame_owner = x, owner
    else:
        real = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device) if mask is None else mask.to(x.device)
        frames = x[real]  # row-major: a row's frames in order, rows in order
        frame_owner = owner.repeat_interleave(real.sum(1))
    seq, seq_mask = pad_groups(frames, frame_owner, num_groups)
    if max_len is None or seq.shape[1] <= max_len:
        return seq, seq_mask
    n = seq_mask.sum(1, keepdim=True)  # [G, 1]
    j = torch.arange(max_len, device=x.device)[None]
    idx = torch.where(n > max_len, torch.div(j * n, max_len, rounding_mode="floor"), j)
    idx = idx.clamp_max(seq.shape[1] - 1)
    return (torch.gather(seq, 1, idx[..., None].expand(-1, -1, seq.shape[-1])),
            torch.gather(seq_mask, 1, idx) & (j < n))


class GlobalTower(nn.Module):
    """A group's local embeddings -> one embedding (COOT's global transformer + pooler + context).

    Padded rows (``mask`` False) never change an output: they are zeroed, masked out of
    attention (keys) and out of the pooling.

    Shape:
        - x: ``[G, L, D]``; mask: ``[G, L]`` bool, every group with at least one real row;
          context: ``[G, D]`` (the local tower's embedding of the whole video / paragraph),
          required with ``spec.context``
        - output: ``[G, spec.out_dim]`` (not normalised)
    """

    def __init__(self, spec: GlobalSpec) -> None:
        super().__init__()
        choice(spec.pooling, "model.global_pooling", POOLINGS)
        choice(spec.block, "model.block", BLOCKS)
        flag(spec.context, "model.global_context")
        if spec.dim % spec.heads:
            raise ValueError(f"model.global_heads: must divide the embedding size {spec.dim}, got {spec.heads}")
        self.spec = spec
        release = spec.block == "release"
        if release:  # release models/model.py l. 475-497 (no input Linear at the global level)
            self.input_norm = CootLayerNorm(spec.dim)
            self.register_buffer("pos", sinusoid_table(spec.max_len, spec.dim), persistent=False)
            self.drop = nn.Dropout(spec.dropout)
            self.encoder = ReleaseEncoder(spec.dim, spec.heads, spec.layers, spec.dropout)
        else:
            self.pos = position_table(spec.max_len, spec.dim)
            self.encoder = transformer_encoder(spec.dim, spec.heads, spec.layers, spec.dropout)
        if spec.context:  # release l. 491-495: ctx_project, then cross-attention (tf_context)
            self.ctx_project = nn.Sequential(nn.Linear(spec.dim, spec.dim), nn.GELU())
            self.ctx_attend = ReleaseBlock(spec.dim, spec.heads, spec.dim, spec.dropout)
        if spec.pooling == "atn":
            self.pool = AttentionPool(spec.dim, spec.pool_hidden, spec.pool_heads, spec.dropout)
        if release:
            init_release(self)
        else:
            self.out = nn.Linear(2 * spec.dim if spec.context else spec.dim, spec.dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        if x.shape[1] > self.spec.max_len:
            raise ValueError(f"groups: a group has {x.shape[1]} clips or sentences, the model supports at most "
                             f"{self.spec.max_len}")
        if not bool(mask.any(1).all()):
            raise ValueError("groups: every group needs at least one clip and one sentence")
        if self.spec.context and (context is None or tuple(context.shape) != (x.shape[0], x.shape[2])):
            raise ValueError(f"context: expected [{x.shape[0]}, {x.shape[2]}] (model.global_context), got "
                             f"{None if context is None else tuple(context.shape)}")
        keep = mask[..., None]
        x = x.masked_fill(~keep, 0.0)
        if self.spec.block == "release":
            h = self.encoder(self.drop(self.input_norm(x) + self.pos[: x.shape[1]]), ~mask)
        else:
            h = self.encoder(x + self.pos[: x.shape[1]], src_key_padding_mask=~mask)
        h = h.masked_fill(~keep, 0.0)
        if self.spec.pooling == "max":
            pooled = h.masked_fill(~keep, float("-inf")).amax(1)
        elif self.spec.pooling == "atn":
            pooled = self.pool(h, mask)
        else:
            pooled = h.sum(1) / mask.sum(1, keepdim=True).to(h.dtype)
        if self.spec.context:
            ctx = self.ctx_attend(self.ctx_project(context)[:, None], h, ~mask)[:, 0]
            pooled = torch.cat([pooled, ctx], dim=-1)
        return pooled if self.spec.block == "release" else self.out(pooled)


class HierarchicalTwoTower(TwoTower):
    """:class:`TwoTower` (the local level: clips and sentences) plus global towers
    (videos and paragraphs), CrossCLR appendix A.

    The local API (``encode_video``, ``encode_text``, ``similarity``) is the flat
    model's; :meth:`forward_groups` (training) and :meth:`encode_groups` (evaluation)
    add the global level, :meth:`forward_context` the inputs of COOT's context branch.
    """

    def __init__(self, video: TowerSpec, text: TowerSpec, temperature: float = 0.05, *,
                 experts: dict[str, TowerSpec] | None = None, fusion: str = "gated",
                 hierarchy: GlobalSpec | None = None) -> None:
        super().__init__(video, text, temperature, experts=experts, fusion=fusion)
        spec = hierarchy or GlobalSpec(dim=video.out_dim)
        if spec.dim != video.out_dim:
            raise ValueError(f"model: the global towers' dim {spec.dim} differs from the local out_dim "
                             f"{video.out_dim}")
        if spec.context and experts:
            raise ValueError("model.global_context: not supported with several video experts (the context is "
                             "one tower's embedding of the whole video)")
        self.global_spec = spec
        self.global_video = GlobalTower(spec)
        self.global_text = GlobalTower(spec)

    def forward_context(self, video: torch.Tensor, video_mask: torch.Tensor | None, clip_group: torch.Tensor,
                        text: torch.Tensor, text_mask: torch.Tensor | None, sentence_group: torch.Tensor,
                        num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Context vectors of COOT's context branch (keeps grad): the local towers over each group's
        whole sequence (:func:`group_frames`; COOT ``model_retrieval.py`` l. 104, release
        ``models/model.py`` l. 165, 172).

        Shape:
            - video: ``[C, F, Dv]`` (mask ``[C, F]``) or ``[C, Dv]`` input features, clip_group ``[C]``;
              text: ``[S, L, Dt]`` (mask) or ``[S, Dt]``, sentence_group ``[S]``
            - output: ``([G, D], [G, D])``
        """
        cap = lambda tower: tower.spec.max_frames if tower.spec.kind == "transformer" else None  # noqa: E731
        v, vm = group_frames(video, video_mask, clip_group, num_groups, cap(self.video_tower))
        t, tm = group_frames(text, text_mask, sentence_group, num_groups, cap(self.text_tower))
        return self.video_tower(v, vm), self.text_tower(t, tm)

    def forward_groups(self, clips: torch.Tensor, clip_group: torch.Tensor, sentences: torch.Tensor,
                       sentence_group: torch.Tensor, num_groups: int, *, video_context: torch.Tensor | None = None,
                       text_context: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Video and paragraph embeddings (unnormalised, keeps grad) from local ones.

        Shape:
            - clips: ``[C, D]``, clip_group: ``[C]``; sentences: ``[S, D]``, sentence_group: ``[S]``
              (rows of one group in temporal order); video_context, text_context: ``[G, D]``
              (:meth:`forward_context`; needed with ``global_spec.context``)
            - output: ``([G, E] videos, [G, E] paragraphs)``, ``E = global_spec.out_dim``
        """
        return (self.global_video(*pad_groups(clips, clip_group, num_groups), video_context),
                self.global_text(*pad_groups(sentences, sentence_group, num_groups), text_context))

    @torch.no_grad()
    def encode_groups(self, video_features: Any, video_mask: Any, text_features: Any, text_to_video: Any,
                      video_to_group: Any, *, batch_size: int = 8192, text_mask: Any = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """L2-normalised ``(paragraphs [P, E], videos [P, E], groups [P])`` of the groups that
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
                sm = np.isin(new[text_group], sel)
                clip_rows = torch.as_tensor(np.flatnonzero(cm), device=dev)
                text_rows = torch.as_tensor(order[sm], device=dev)
                clip_g = torch.as_tensor(new[g[cm]] - lo, device=dev)
                text_g = torch.as_tensor(new[text_group[sm]] - lo, device=dev)
                ctx = {}
                if self.global_spec.context:
                    vc, tc = self.forward_context(x[clip_rows], _rows(m, clip_rows), clip_g, t[text_rows],
                                                  _rows(tm, text_rows), text_g, sel.size)
                    ctx = {"video_context": vc, "text_context": tc}
                v, p = self.forward_groups(clips[clip_rows], clip_g, sentences[text_rows], text_g, sel.size, **ctx)
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
        return cls(video, text, experts=experts, fusion=arch.get("fusion", "gated"),
                   hierarchy=global_spec_from_dict(arch["hierarchy"], "architecture['hierarchy']"))


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
