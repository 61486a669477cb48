"""Exact rank metrics (R@K, MdR, MnR) with explicit tie rules, computed block by block.

A query's rank is ``1 + (items scoring above its best correct item) + (tied items placed
before it)``: counting against the correct score needs one pass over each row and no
sort, so it is exact and O(Q * G) (style rule 4). The tie rule says where items with
exactly the correct score go:

* ``"pessimistic"`` (default): every tied incorrect item ranks ahead (never flatters a
  model that outputs constant scores; CLIP4Clip's ``np.where(sorted == gt)`` does not
  guarantee this).
* ``"optimistic"``: the correct item ranks first among its ties.
* ``"average"``: ranks are expectations under uniformly random tie-breaking. With
  several correct items, ``n`` incorrect and ``p`` correct items tied at the best correct
  score, the expected rank is ``lo + n / (p + 1)`` (expected position of the first
  correct item in a random order of the group). R@K is then the *expected* recall,
  ``P(rank <= K)``, MnR the exact expected mean rank, and MdR the median of the
  per-query expected ranks.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from xmodal._validate import as_tensor, choice, positive_int, text_label
from xmodal.metrics._common import (block_counts, check_block_size, check_ks, check_ties,
                                    default_block, positives_of, similarity, summarize)

V2T = ("all-captions", "max-over-captions")


def _ranks(sim: torch.Tensor, positives: torch.Tensor, ties: str, block_size: int | None
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, g = sim.shape
    b = default_block(g) if block_size is None else block_size
    parts = []
    for start in range(0, q, b):
        blk = sim[start:start + b]
        pb = positives[start:start + b]
        if pb.dtype == torch.bool:
            parts.append(block_counts(blk, mask=pb, ties=ties))
        else:
            parts.append(block_counts(blk, index=pb, ties=ties))
    return tuple(torch.cat(x) for x in zip(*parts))  # type: ignore[return-value]


@torch.no_grad()
def retrieval(sim: Any, positives: Any, ks: Sequence[int] = (1, 5, 10, 50),
              ties: str = "pessimistic", *, block_size: int | None = None) -> dict:
    """Recall@K, median rank and mean rank of retrieving the correct gallery items.

    Args:
        sim: similarity matrix, higher is more similar (numpy or torch, float16/32/64).
        positives: int [Q] (the correct gallery index of each query) or bool [Q, G]
            (several correct items; the query's rank is that of its best-ranked one).
        ks: cut-offs for R@K.
        ties: "pessimistic", "optimistic" or "average" (see the module docstring).
        block_size: rows per block (default: about 2M scores per block). Results do not
            depend on it.

    Returns:
        ``{"R@k": percent for k in ks, "MdR": float, "MnR": float}`` (ranks 1-based).

    Shape:
        sim: [Q, G]; positives: [Q] or [Q, G].

    Examples:
        >>> import numpy as np
        >>> sim = np.array([[0.9, 0.1, 0.3], [0.2, 0.8, 0.1], [0.4, 0.7, 0.6]])
        >>> r = retrieval(sim, [0, 1, 2], ks=(1, 5))
        >>> round(r["R@1"], 2), r["R@5"], r["MdR"]
        (66.67, 100.0, 1.0)
    """
    s = similarity(sim, "sim")
    ks = check_ks(ks)
    ties = check_ties(ties)
    if block_size is not None:
        block_size = check_block_size(block_size)
    pos = positives_of(positives, s.shape[0], s.shape[1], s.device)
    return summarize(*_ranks(s, pos, ties, block_size), ks)


def caption_groups(text_to_video: Any, num_texts: int, num_videos: int,
                   name: str = "text_to_video") -> torch.Tensor:
    """Validated caption -> video index map (int64 [T]); every video needs a caption."""
    name = text_label(name, "name")
    num_texts, num_videos = positive_int(num_texts, "num_texts"), positive_int(num_videos, "num_videos")
    t2v = positives_of(text_to_video, num_texts, num_videos, torch.device("cpu"), name)
    if t2v.dtype == torch.bool:
        raise TypeError(f"{name}: expected integer video indices [num_texts], got a boolean mask")
    counts = torch.bincount(t2v, minlength=num_videos)
    if bool((counts == 0).any()):
        missing = torch.nonzero(counts == 0).flatten()
        raise ValueError(f"{name}: {missing.numel()} video(s) have no caption "
                         f"(first: {missing[:5].tolist()}); v2t is undefined for them")
    return t2v


def group_max(sim_vt: torch.Tensor, t2v: torch.Tensor, num_videos: int) -> torch.Tensor:
    """Scores of each query against each caption group: max over the group's captions.

    Shape:
        sim_vt: [b, T] (rows: queries, columns: captions); t2v: [T] -> [b, num_videos].
    """
    num_videos = positive_int(num_videos, "num_videos")
    sim_vt = as_tensor(sim_vt, "sim_vt")
    t2v = as_tensor(t2v, "t2v")
    if sim_vt.ndim != 2 or not sim_vt.is_floating_point():
        raise TypeError(f"sim_vt: expected float scores [queries, captions], got {sim_vt.dtype} "
                        f"of shape {tuple(sim_vt.shape)}")
    if t2v.shape != (sim_vt.shape[1],) or t2v.dtype == torch.bool or t2v.is_floating_point() or t2v.is_complex():
        raise TypeError(f"t2v: expected integer video indices [{sim_vt.shape[1]}], got {t2v.dtype} "
                        f"of shape {tuple(t2v.shape)}")
    if t2v.device.type == "cpu" and t2v.numel() and (int(t2v.min()) < 0 or int(t2v.max()) >= num_videos):
        raise ValueError(f"t2v: video indices must lie in [0, {num_videos})")  # (a CPU map: no device sync)
    out = torch.full((sim_vt.shape[0], num_videos), float("-inf"), dtype=sim_vt.dtype,
                     device=sim_vt.device)
    idx = t2v.to(sim_vt.device)[None, :].expand_as(sim_vt)
    return out.scatter_reduce(1, idx, sim_vt, reduce="amax", include_self=True)


@torch.no_grad()
def text_video(sim_tv: Any, text_to_video: Any, ks: Sequence[int] = (1, 5, 10, 50),
               ties: str = "pessimistic", v2t: str = "all-captions", *,
               block_size: int | None = None) -> dict:
    """Text-to-video and video-to-text retrieval for datasets with several captions per video.

    t2v: each text queries the videos; its single correct video is ``text_to_video[t]``.
    v2t, ``"all-captions"``: each video queries all texts; correct = any of its own captions
    (the rank of its best-ranked caption). ``"max-over-captions"``: the gallery is the
    videos' caption groups, each scored by its best caption; correct = its own group.

    Returns:
        ``{"t2v": retrieval dict, "v2t": retrieval dict}``.

    Shape:
        sim_tv: [num_texts, num_videos]; text_to_video: int [num_texts].

    Examples:
        >>> import numpy as np
        >>> sim = np.array([[0.9, 0.1], [0.7, 0.2], [0.3, 0.8]])   # 3 captions x 2 videos
        >>> r = text_video(sim, [0, 0, 1], ks=(1,))
        >>> r["t2v"]["R@1"], r["v2t"]["R@1"]
        (100.0, 100.0)
    """
    ks = check_ks(ks)
    counts = _text_video_counts(sim_tv, text_to_video, ties, v2t, block_size)
    return {d: summarize(*c, ks) for d, c in counts.items()}


def _text_video_counts(sim_tv: Any, text_to_video: Any, ties: str, v2t: str, block_size: int | None) -> dict:
    """``{"t2v": (lo, n, p), "v2t": (lo, n, p)}``: the rank counts behind :func:`text_video` and
    :func:`text_video_ranks` (arguments checked here)."""
    s = similarity(sim_tv, "sim_tv")
    v2t = choice(v2t, "v2t", V2T)
    ties = check_ties(ties)
    if block_size is not None:
        block_size = check_block_size(block_size)
    num_t, num_v = s.shape
    t2v = caption_groups(text_to_video, num_t, num_v)
    out = {"t2v": _ranks(s, t2v.to(s.device), ties, block_size)}
    st = s.t()
    b = default_block(num_t) if block_size is None else block_size
    parts = []
    for start in range(0, num_v, b):
        blk = st[start:start + b].contiguous()
        vids = torch.arange(start, start + blk.shape[0], device=s.device)
        if v2t == "all-captions":
            parts.append(block_counts(blk, mask=t2v.to(s.device)[None, :] == vids[:, None], ties=ties))
        else:
            parts.append(block_counts(group_max(blk, t2v, num_v), index=vids, ties=ties))
    out["v2t"] = tuple(torch.cat(x) for x in zip(*parts))
    return out


def _as_ranks(lo: torch.Tensor, n: torch.Tensor, p: torch.Tensor, ties: str) -> np.ndarray:
    """1-based ranks from :func:`~xmodal.metrics._common.block_counts`: int64 for the deterministic
    tie rules, the expected rank ``lo + n / (p + 1)`` (float64) for ``"average"``."""
    if ties == "average":
        return (lo.double() + n.double() / (p.double() + 1.0)).cpu().numpy()
    return (lo + n).cpu().numpy().astype(np.int64)


@torch.no_grad()
def query_ranks(sim: Any, positives: Any, ties: str = "pessimistic", *, block_size: int | None = None
                ) -> np.ndarray:
    """Each query's 1-based rank of its best-ranked correct item: the per-query values behind
    :func:`retrieval` (its R@K is ``100 * mean(rank <= K)``, MdR / MnR the median / mean rank
    for ``"pessimistic"`` and ``"optimistic"``; ``"average"`` gives expected ranks, whose
    mean is MnR).

    Args:
        sim, positives, ties, block_size: as :func:`retrieval`.

    Returns:
        int64 ``[Q]`` (float64 for ``ties="average"``).

    Shape:
        sim: [Q, G]; positives: [Q] or [Q, G] -> [Q].

    >>> query_ranks(np.array([[0.9, 0.1], [0.8, 0.8]]), np.array([0, 1])).tolist()
    [1, 2]
    """
    s = similarity(sim, "sim")
    ties = check_ties(ties)
    if block_size is not None:
        block_size = check_block_size(block_size)
    pos = positives_of(positives, s.shape[0], s.shape[1], s.device)
    return _as_ranks(*_ranks(s, pos, ties, block_size), ties)


@torch.no_grad()
def text_video_ranks(sim_tv: Any, text_to_video: Any, ties: str = "pessimistic", v2t: str = "all-captions", *,
                     block_size: int | None = None) -> dict[str, np.ndarray]:
    """Per-query ranks of :func:`text_video`: ``{"t2v": [num_texts], "v2t": [num_videos]}``
    (each direction's metrics are those of :func:`query_ranks`' values).

    >>> r = text_video_ranks(np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]]), np.array([0, 1, 1]))
    >>> r["t2v"].tolist(), r["v2t"].tolist()
    ([1, 1, 2], [1, 1])
    """
    ties = check_ties(ties)
    return {d: _as_ranks(*c, ties) for d, c in _text_video_counts(sim_tv, text_to_video, ties, v2t,
                                                                    block_size).items()}


@torch.no_grad()
def label_retrieval_from_sim(sim: Any, labels: Any, ks: Sequence[int] = (1, 5, 10, 50),
                    ties: str = "pessimistic", *, block_size: int | None = None) -> dict:
    """Retrieval within one set by class label (e.g. video -> video), from ``[N, N]`` scores.

    The embedding-level entry point is :func:`xmodal.metrics.label_retrieval`, which calls this.

    Every item queries all the *other* items (itself excluded from its gallery by a
    ``-inf`` score); its positives are the other items of its class, and its rank is
    that of the best-ranked one. Items alone in their class have no positive and are
    left out of the averages (``"queries"`` says how many were scored).

    Args:
        sim: ``[N, N]`` similarities of the items to themselves (higher = more similar).
        labels: int ``[N]`` class of each item.
        ks, ties, block_size: as in :func:`retrieval`.

    Returns:
        ``{"R@k": ..., "MdR": ..., "MnR": ..., "num_queries": int}``.

    Shape:
        sim: [N, N]; labels: [N].

    >>> import numpy as np
    >>> x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    >>> label_retrieval_from_sim(x @ x.T, np.array([0, 0, 1, 1]), ks=(1,))["R@1"]
    100.0
    """
    s = similarity(sim, "sim")
    if s.shape[0] != s.shape[1]:
        raise ValueError(f"sim: expected a square [N, N] matrix of items against themselves, "
                         f"got shape {tuple(s.shape)}")
    lab = as_tensor(labels, "labels")
    if lab.dtype == torch.bool or lab.is_floating_point() or lab.is_complex():
        raise TypeError(f"labels: expected integer class ids, got dtype {lab.dtype}")
    if tuple(lab.shape) != (s.shape[0],):
        raise ValueError(f"labels: expected shape ({s.shape[0]},) (one class per item), "
                         f"got {tuple(lab.shape)}")
    ks = check_ks(ks)
    ties = check_ties(ties)
    if block_size is not None:
        block_size = check_block_size(block_size)
    lab = lab.to(device=s.device, dtype=torch.int64)
    n = s.shape[0]
    b = default_block(n) if block_size is None else block_size
    parts = []
    for start in range(0, n, b):
        rows = torch.arange(start, min(start + b, n), device=s.device)
        self_mask = rows[:, None] == torch.arange(n, device=s.device)[None, :]
        pos = (lab[rows][:, None] == lab[None, :]) & ~self_mask
        keep = pos.any(1)
        if not bool(keep.any()):
            continue
        blk = s[rows].masked_fill(self_mask, float("-inf"))[keep]
        parts.append(block_counts(blk.contiguous(), mask=pos[keep], ties=ties))
    if not parts:
        raise ValueError("labels: no class has two or more items; nothing to retrieve")
    out = summarize(*(torch.cat(x) for x in zip(*parts)), ks)
    out["num_queries"] = int(sum(p[0].numel() for p in parts))
    return out


__all__ = ["retrieval", "text_video", "query_ranks", "text_video_ranks", "label_retrieval_from_sim",
           "caption_groups", "group_max"]
