"""Training the two-level model (clips inside videos): batches of whole groups and
``L = L_local + w L_global`` (CrossCLR appendix A: ``L_local + 0.6 L_global``, CrossCLR with
a queue at the local level, without one at the global level).

- :func:`group_batches`: every group (long video) with a paragraph once per epoch, shuffled
  with a generator seeded by ``(seed, epoch)``, ``batch_size`` whole groups per batch (the
  last incomplete batch is dropped), so the global loss sees complete videos and paragraphs.
- :class:`HierarchicalLoss`: the local loss on the batch's clip/sentence pairs plus
  ``global_weight`` times the global loss on its video/paragraph pairs; any registered loss
  at either level.
- :class:`HierarchyData`: the training split's groups, the batches, one step's loss.

The local pairs of a batch are every text of its groups with its clip (``ids`` = clip row,
so the texts of one clip are positives of each other, as in flat training); a group's
clips without any text still enter its video. The global pairs are the ``B`` groups
(``ids`` = 0..B-1). Losses that read raw inputs (CrossCLR's proximity weights) get, at
the global level, the mean over the group's clips of the frame-averaged input features and
the mean of its sentences' input features (our reading: the paper does not say what
``in_v``/``in_t`` of Alg. 2 are at the global level).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from torch import nn

from xmodal._validate import short_repr
from xmodal.config import Config
from xmodal.data import inputs as video_inputs
from xmodal.data.groups import paragraph_texts
from xmodal.models.hierarchy import GlobalSpec
from xmodal.training.parts import build_loss_from_config, loss_extras


def group_batches(epoch: int, *, seed: int, groups: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Group ids of every batch of one epoch (each group once, whole), seeded by ``(seed, epoch)``.

    Shape:
        a list of int64 ``[batch_size]`` arrays.

    >>> b = group_batches(0, seed=0, groups=np.arange(5), batch_size=2)
    >>> [len(x) for x in b], len(set(np.concatenate(b).tolist()))  # the fifth group waits
    ([2, 2], 4)
    """
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size: must be a positive integer, got {short_repr(batch_size)}")
    order = np.random.default_rng([seed, epoch, 2]).permutation(np.asarray(groups, dtype=np.int64))
    n = len(order) // batch_size
    return [order[i * batch_size:(i + 1) * batch_size] for i in range(n)]


def global_spec(cfg: Config) -> GlobalSpec:
    """The global towers of ``cfg.model`` (Table 7: heads 8, 1 layer, dim = the local dim;
    ``global_pooling``, ``global_context``, ``block``, ``pool_heads``, ``pool_hidden``)."""
    m = cfg.model
    return GlobalSpec(dim=m.dim, heads=m.global_heads, layers=m.global_layers, dropout=m.dropout,
                      pooling=m.global_pooling, pool_heads=m.pool_heads, pool_hidden=m.pool_hidden,
                      context=m.global_context, block=m.block)


def global_loss_config(cfg: Config) -> Config:
    """``cfg`` with ``loss.name``/``loss.kwargs`` of the global level: ``loss.global_name``
    (default: the local loss) and ``loss.global_kwargs`` (default: the local kwargs without
    the ``queue`` entries when the loss is the same, else none)."""
    lc = cfg.loss
    name = lc.global_name or lc.name
    if lc.global_kwargs is not None:
        kwargs = dict(lc.global_kwargs)
    elif name == lc.name:
        kwargs = {k: v for k, v in lc.kwargs.items() if "queue" not in k}
    else:
        kwargs = {}
    return dataclasses.replace(cfg, loss=dataclasses.replace(lc, name=name, kwargs=kwargs))


class HierarchicalLoss(nn.Module):
    """``L = L_local + weight * L_global`` (CrossCLR appendix A, weight 0.6).

    ``last_terms`` holds both levels' values (and the local loss's own terms, prefixed
    ``local.``); ``temperature`` and ``query_bank`` are the local loss's.
    """

    def __init__(self, local: nn.Module, global_: nn.Module, weight: float = 0.6) -> None:
        super().__init__()
        self.local = local
        self.global_ = global_
        self.weight = float(weight)
        self.last_terms: dict[str, Any] = {}

    @property
    def temperature(self) -> Any:
        return getattr(self.local, "temperature", None)

    def query_bank(self) -> Any:
        return self.local.query_bank() if hasattr(self.local, "query_bank") else None

    def forward(self, local: tuple[torch.Tensor, torch.Tensor, dict], global_: tuple[torch.Tensor, torch.Tensor, dict]
                ) -> torch.Tensor:
        """``local``/``global_``: ``(video [B, D], text [B, D], forward keywords)`` of each level."""
        lv, lt, lkw = local
        gv, gt, gkw = global_
        l_local = self.local(lv, lt, **lkw)
        l_global = self.global_(gv, gt, **gkw)
        terms = {f"local.{k}": v for k, v in (getattr(self.local, "last_terms", None) or {}).items()}
        self.last_terms = {**terms, "local": l_local.detach(), "global": l_global.detach()}
        return l_local + self.weight * l_global


def build_hierarchical_loss(cfg: Config, *, video_dim: int | None = None, text_dim: int | None = None
                            ) -> HierarchicalLoss:
    """The two levels' losses of ``cfg`` (:func:`global_loss_config`) and ``loss.global_weight``."""
    local = build_loss_from_config(cfg, video_dim=video_dim, text_dim=text_dim)
    try:
        global_ = build_loss_from_config(global_loss_config(cfg), video_dim=video_dim, text_dim=text_dim)
    except ValueError as exc:
        raise ValueError(f"loss.global_kwargs: {str(exc).partition(': ')[2] or exc}") from None
    return HierarchicalLoss(local, global_, cfg.loss.global_weight)


def _group_mean(x: torch.Tensor, owner: torch.Tensor, num_groups: int) -> torch.Tensor:
    total = x.new_zeros(num_groups, x.shape[-1]).index_add_(0, owner, x)
    return total / torch.bincount(owner, minlength=num_groups).clamp_min(1)[:, None].to(x.dtype)


class HierarchyData:
    """The training split's groups, batches of whole groups and one step's loss.

    Args:
        split: a :class:`~xmodal.data.PairedSplit` with ``video_to_group``.
        video_all, mask_all, text_all: its inputs as CPU tensors (:mod:`xmodal.data.inputs`).
        text_mask_all: the token mask of token features ``text_all`` ``[T, L, Dt]`` (or None).
        seed, batch_size: groups per batch (``train.batch_size``).
    """

    def __init__(self, split: Any, video_all: Any, mask_all: Any, text_all: torch.Tensor, *, seed: int,
                 batch_size: int, text_mask_all: torch.Tensor | None = None) -> None:
        if split.video_to_group is None:
            raise ValueError(f"model.hierarchy: the training split {split.name or ''} has no groups; add "
                             f"S_video_to_group.npy (docs/data.md, 'Clips inside long videos')")
        self.split, self.video_all, self.mask_all, self.text_all = split, video_all, mask_all, text_all
        self.text_mask_all = text_mask_all
        self.seed, self.batch_size = seed, batch_size
        self.rows = split.group_rows()
        self.paragraphs = paragraph_texts(split.text_to_video, split.video_to_group)
        self.eligible = np.array([g for g, p in enumerate(self.paragraphs) if len(p)], dtype=np.int64)

    def batches(self, epoch: int) -> list[np.ndarray]:
        return group_batches(epoch, seed=self.seed, groups=self.eligible, batch_size=self.batch_size)

    def texts(self, batch: np.ndarray) -> np.ndarray:
        """The text indices of a batch's groups (paragraph order)."""
        return np.concatenate([self.paragraphs[g] for g in batch])

    def loss(self, model: Any, loss_fn: HierarchicalLoss, batch: np.ndarray, *, device: torch.device, amp: Any,
             scheduled: Any, keyword: str) -> torch.Tensor:
        """``L_local + w L_global`` of one batch of whole groups (keeps grad)."""
        b = len(batch)
        clip_rows = np.concatenate([self.rows[g] for g in batch])
        clip_group = np.repeat(np.arange(b), [len(self.rows[g]) for g in batch])
        texts = self.texts(batch)
        text_group = np.repeat(np.arange(b), [len(self.paragraphs[g]) for g in batch])
        pos_of_row = {int(r): i for i, r in enumerate(clip_rows)}
        text_clip = np.array([pos_of_row[int(r)] for r in self.split.text_to_video[texts]], dtype=np.int64)
        video_in, mask_in = video_inputs.take(self.video_all, self.mask_all, clip_rows, device)
        text_in, tmask_in = video_inputs.take(self.text_all, self.text_mask_all, texts, device)
        clip_g = torch.as_tensor(clip_group, device=device)
        text_g = torch.as_tensor(text_group, device=device)
        with amp:
            clips = model.forward_video(video_in, mask_in)
            sentences = model.forward_text(text_in, tmask_in)
            ctx = {}
            if model.global_spec.context:  # COOT's context: the local towers over the whole video / paragraph
                vc, tc = model.forward_context(video_in, mask_in, clip_g, text_in, tmask_in, text_g, b)
                ctx = {"video_context": vc, "text_context": tc}
            gv, gt = model.forward_groups(clips, clip_g, sentences, text_g, b, **ctx)
        ids = torch.as_tensor(self.split.text_to_video[texts], device=device)
        pooled_in = video_inputs.pooled(video_in, mask_in)
        text_in = video_inputs.pooled_text(text_in, tmask_in)  # raw inputs of CrossCLR's weights: [S, Dt]
        tc = torch.as_tensor(text_clip, device=device)
        local_kw = loss_extras(loss_fn.local, ids=ids, video_in=pooled_in[tc], text_in=text_in,
                               scheduled=scheduled, keyword=keyword)
        global_kw = loss_extras(loss_fn.global_, ids=torch.arange(b, device=device),
                                video_in=_group_mean(pooled_in.float(), clip_g, b),
                                text_in=_group_mean(text_in.float(), text_g, b), scheduled=None, keyword=keyword)
        return loss_fn((clips[tc].float(), sentences.float(), local_kw), (gv.float(), gt.float(), global_kw))
