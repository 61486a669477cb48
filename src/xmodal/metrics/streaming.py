"""Streaming retrieval evaluation from embeddings: the score matrix is never built.

Each block of queries is multiplied with the gallery, optionally shifted by a
per-gallery bias and passed through a row-wise transform, and ranks are counted against
the correct item's score taken from that same block (so ties are judged on exactly the
numbers that were compared). Memory is one ``[block, G]`` score block plus the
embeddings: 200,000 x 200,000 evaluates in a few hundred MB instead of 160 GB.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from xmodal._validate import choice
from xmodal.metrics._common import (block_counts, check_block_size, check_finite, check_ks,
                                    check_ties, positives_of, similarity, summarize)
from xmodal.metrics.ranking import V2T, caption_groups, group_max

#: most scores held in one block (float32: 128 MB), whatever ``block_size`` says
MAX_BLOCK_SCORES = 1 << 25


def _embeddings(x: Any, name: str) -> torch.Tensor:
    return similarity(x, name)  # 2-D, finite, float32/64


def _pair(queries: Any, gallery: Any, qname: str, gname: str) -> tuple[torch.Tensor, torch.Tensor]:
    q = _embeddings(queries, qname)
    g = _embeddings(gallery, gname)
    if q.shape[1] != g.shape[1]:
        raise ValueError(f"{gname}: embedding dimension {g.shape[1]} differs from {qname}'s {q.shape[1]}")
    dtype = torch.promote_types(q.dtype, g.dtype)
    return q.to(dtype), g.to(device=q.device, dtype=dtype)


def _bias(bias: Any, n: int, like: torch.Tensor, name: str) -> torch.Tensor | None:
    if bias is None:
        return None
    b = similarity(bias, name, ndim=1)
    if b.shape[0] != n:
        raise ValueError(f"{name}: expected {n} values (one per gallery item), got {b.shape[0]}")
    return b.to(device=like.device, dtype=like.dtype)


def _blocks(n: int, g: int, block_size: int, progress: bool | None, desc: str):
    """Query blocks ``(start, stop)``; ``progress`` as :func:`xmodal.progress.progress`'s ``show`` (False:
    silent, the default; None: a bar on a terminal, else a line every 30 s; True: a bar), counting queries."""
    b = max(1, min(block_size, MAX_BLOCK_SCORES // max(1, g)))
    if progress is False:
        for start in range(0, n, b):
            yield start, min(n, start + b)
        return
    from xmodal.progress import progress as reporter

    with reporter(total=n, desc=desc, unit="query", show=progress) as bar:
        for start in range(0, n, b):
            yield start, min(n, start + b)
            bar.update(min(n, start + b) - start)


def _scores(q: torch.Tensor, g: torch.Tensor, bias: torch.Tensor | None,
            transform: Callable | None) -> torch.Tensor:
    s = q @ g.t()
    if bias is not None:
        s += bias
    if transform is not None:
        out = transform(s)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(s.shape):
            raise ValueError(f"transform: must return a tensor of the block's shape {tuple(s.shape)}")
        check_finite(out, "transform")
        s = out.to(q.dtype) if out.dtype in (torch.float16, torch.bfloat16) else out
    return s


@torch.no_grad()
def streaming_retrieval(queries: Any, gallery: Any, positives: Any, *,
                        ks: Sequence[int] = (1, 5, 10, 50), ties: str = "pessimistic",
                        bias: Any = None, transform: Callable | None = None,
                        block_size: int = 4096, progress: bool | None = False) -> dict:
    """:func:`xmodal.metrics.retrieval` on ``queries @ gallery.T (+ bias)``, block by block.

    Args:
        queries: [Q, D] embeddings (float16 is computed in float32; float64 kept).
        gallery: [G, D] embeddings.
        positives: int [Q] or bool [Q, G] as in ``retrieval``.
        ks, ties: as in ``retrieval``.
        bias: optional [G] added to every query's scores (e.g. NCL test-time biases).
        transform: optional callable applied to each [b, G] score block (after the
            bias); it must treat rows independently, or results depend on blocking.
        block_size: query rows per block, capped so that a block holds at most
            ``MAX_BLOCK_SCORES`` scores.
        progress: False (silent), True (a tqdm bar) or None (a bar on a terminal, else a line every
            ``XMODAL_PROGRESS_SECONDS`` s with the count, fraction, rate and time left).

    Returns:
        The same dict as ``retrieval``, equal to it on the dense matrix.

    Shape:
        queries: [Q, D]; gallery: [G, D]; positives: [Q] or [Q, G]; bias: [G].
    """
    q, g = _pair(queries, gallery, "queries", "gallery")
    ks = check_ks(ks)
    ties = check_ties(ties)
    block_size = check_block_size(block_size)
    pos = positives_of(positives, q.shape[0], g.shape[0], q.device)
    b = _bias(bias, g.shape[0], g, "bias")
    parts = []
    for start, stop in _blocks(q.shape[0], g.shape[0], block_size, progress, "retrieval"):
        s = _scores(q[start:stop], g, b, transform)
        pb = pos[start:stop]
        parts.append(block_counts(s, mask=pb, ties=ties) if pb.dtype == torch.bool
                     else block_counts(s, index=pb, ties=ties))
    return summarize(*(torch.cat(x) for x in zip(*parts)), ks)


@torch.no_grad()
def streaming_text_video(text: Any, video: Any, text_to_video: Any, *,
                         ks: Sequence[int] = (1, 5, 10, 50), ties: str = "pessimistic",
                         v2t: str = "all-captions", t2v_bias: Any = None, v2t_bias: Any = None,
                         transform: Callable | None = None, block_size: int = 4096,
                         progress: bool | None = False) -> dict:
    """:func:`xmodal.metrics.text_video` on ``text @ video.T`` without building it.

    Args:
        text: [T, D] caption embeddings; video: [V, D]; text_to_video: int [T].
        t2v_bias: optional [V] added to the text->video scores.
        v2t_bias: optional [T] added to the video->text (caption) scores; with
            ``v2t="max-over-captions"`` before the max over each video's captions.
        transform: optional row-wise callable on every score block (both directions).
        ks, ties, v2t, block_size, progress: as in ``text_video`` / ``streaming_retrieval``.

    Returns:
        ``{"t2v": ..., "v2t": ...}`` like ``text_video``.

    Shape:
        text: [T, D]; video: [V, D]; text_to_video: [T].
    """
    t, v = _pair(text, video, "text", "video")
    v2t = choice(v2t, "v2t", V2T)
    t2v = caption_groups(text_to_video, t.shape[0], v.shape[0]).to(t.device)
    out = {"t2v": streaming_retrieval(t, v, t2v, ks=ks, ties=ties, bias=t2v_bias,
                                      transform=transform, block_size=block_size,
                                      progress=progress)}
    out["v2t"] = streaming_video_text(v, t, t2v, ks=ks, ties=ties, v2t=v2t, bias=v2t_bias, transform=transform,
                                      block_size=block_size, progress=progress)
    return out


@torch.no_grad()
def streaming_video_text(video: Any, text: Any, text_to_video: Any, *, ks: Sequence[int] = (1, 5, 10, 50),
                         ties: str = "pessimistic", v2t: str = "all-captions", bias: Any = None,
                         transform: Callable | None = None, block_size: int = 4096,
                         progress: bool | None = False) -> dict:
    """The ``v2t`` half of :func:`streaming_text_video`: videos as queries against the captions, in
    blocks of videos, with its own ``bias`` ``[T]`` / row-wise ``transform`` (a normaliser fitted for
    this direction, as :meth:`xmodal.retrieval.testtime.TestTime.similarities` fits one).

    Shape:
        video: [V, D]; text: [T, D]; text_to_video: [T] (every video needs a caption).
    """
    t, v = _pair(text, video, "text", "video")
    v2t = choice(v2t, "v2t", V2T)
    num_t, num_v = t.shape[0], v.shape[0]
    t2v = caption_groups(text_to_video, num_t, num_v).to(t.device)
    ks = check_ks(ks)
    ties = check_ties(ties)
    block_size = check_block_size(block_size)
    bt = _bias(bias, num_t, t, "bias")
    parts = []
    for start, stop in _blocks(num_v, num_t, block_size, progress, "v2t"):
        s = _scores(v[start:stop], t, bt, transform)
        vids = torch.arange(start, stop, device=t.device)
        if v2t == "all-captions":
            parts.append(block_counts(s, mask=t2v[None, :] == vids[:, None], ties=ties))
        else:
            parts.append(block_counts(group_max(s, t2v, num_v), index=vids, ties=ties))
    return summarize(*(torch.cat(x) for x in zip(*parts)), ks)


__all__ = ["streaming_retrieval", "streaming_text_video", "streaming_video_text", "MAX_BLOCK_SCORES"]
