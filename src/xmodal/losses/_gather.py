"""Gathering a batch across ranks for the in-batch losses (open_clip's ``gather_features``).

The one gather path of every loss: :func:`gather_pair` (embeddings, with gradient),
:func:`gather_ids` (instance ids), :func:`gather_per_sample` (per-sample temperatures /
margins) and :func:`gather_inputs` (frozen input features, no gradient). Rank ``r``'s
rows sit at ``r*b:(r+1)*b`` of every gathered tensor. Nothing else in
:mod:`xmodal.losses` calls :mod:`xmodal.dist` to gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xmodal import dist
from xmodal._validate import float_matrix
from xmodal.functional._common import Temperature, check_ids


@dataclass
class Batch:
    """The (possibly gathered) batch a functional loss sees.

    ``rows``: the query rows this rank computes (``None``: all); set only with
    ``local_loss=True`` under ``world_size() > 1``.
    """

    video: torch.Tensor
    text: torch.Tensor
    rows: torch.Tensor | None
    local: int


def embeddings(video, text) -> tuple[torch.Tensor, torch.Tensor]:
    """Convert/validate the two ``[B, D]`` inputs (numpy or torch) with argument names
    (floating, 2-d, non-empty, same shape).

    Finiteness is not tested here: every functional loss tests it (``check_embeddings``,
    both tensors in one host sync), so a forward syncs once instead of four times.
    """
    v = float_matrix(video, "video", finite=False)
    t = float_matrix(text, "text", finite=False)
    if v.shape != t.shape:
        raise ValueError(f"video and text: batch shapes differ, {tuple(v.shape)} vs {tuple(t.shape)}")
    return v, t


def gather_pair(video: torch.Tensor, text: torch.Tensor, *, gather: bool,
                local_loss: bool) -> Batch:
    """All-gather (with grad) both modalities when distributed and ``gather`` is on.

    Every rank must pass the same local batch size; ids must be globally unique
    across ranks (rank ``r``'s rows sit at ``r*b:(r+1)*b`` of the gathered batch).
    """
    b = video.shape[0]
    if not gather or dist.world_size() == 1:
        return Batch(video, text, None, b)
    v = dist.all_gather_with_grad(video)
    t = dist.all_gather_with_grad(text)
    rows = None
    if local_loss:
        start = dist.rank() * b
        rows = torch.arange(start, start + b, device=video.device)
    return Batch(v, t, rows, b)


def gather_per_sample(value: Temperature | None, batch: Batch, name: str,
                      like: torch.Tensor) -> Temperature | None:
    """Gather a per-sample ``[b]`` tensor (temperature/margin) the way the embeddings were."""
    if not isinstance(value, torch.Tensor) or batch.video.shape[0] == batch.local:
        return value
    t = value.to(like.device)
    if t.ndim == 0:
        return t
    if t.shape != (batch.local,):
        raise ValueError(f"{name}: expected a float or a tensor of shape [{batch.local}], "
                         f"got shape {tuple(t.shape)}")
    return dist.all_gather_with_grad(t) if t.requires_grad else dist.all_gather_no_grad(t)


def gather_ids(ids, batch: Batch) -> torch.Tensor | None:
    """Validate and gather integer instance ids (no gradient)."""
    if ids is None:
        return None
    if not isinstance(ids, torch.Tensor):
        ids = torch.as_tensor(ids)
    ids = check_ids(ids, batch.local)
    if batch.video.shape[0] == batch.local:
        return ids
    return dist.all_gather_no_grad(ids.to(batch.video.device))


def gather_inputs(x: torch.Tensor, batch: Batch, name: str) -> torch.Tensor:
    """Detached per-sample inputs ``[b, *]`` (e.g. frozen input features), gathered the way
    the embeddings were (no gradient: they are inputs, not outputs of the towers).

    Shape:
        ``[b, *]`` -> ``[world_size * b, *]`` when ``batch`` was gathered, else ``[b, *]``.

    >>> b = gather_pair(torch.zeros(2, 3), torch.zeros(2, 3), gather=True, local_loss=False)
    >>> tuple(gather_inputs(torch.ones(2, 5), b, "video_input").shape)
    (2, 5)
    """
    if x.shape[0] != batch.local:
        raise ValueError(f"{name}: expected {batch.local} rows (the batch size), got {x.shape[0]}")
    x = x.detach()
    if batch.video.shape[0] == batch.local:
        return x
    return dist.all_gather_no_grad(x)


def run_in_batch(fn, video, text, *, gather: bool, local_loss: bool, ids=None,
                 use_ids: bool = True, per_sample: dict | None = None, **kwargs) -> torch.Tensor:
    """Validate, gather (when distributed) and call the functional loss ``fn``.

    ``per_sample``: keyword -> float / ``[b]`` tensor values gathered like the embeddings.
    """
    v, t = embeddings(video, text)
    batch = gather_pair(v, t, gather=gather, local_loss=local_loss)
    for key, value in (per_sample or {}).items():
        kwargs[key] = gather_per_sample(value, batch, key, v)
    if use_ids:
        kwargs["ids"] = gather_ids(ids, batch)
    return fn(batch.video, batch.text, rows=batch.rows, **kwargs)


def gather_relevancy(relevancy, batch_size: int, device: torch.device) -> torch.Tensor:
    """Relevancy rows of this rank's videos against the global texts, gathered to ``[N, N]``.

    Not distributed: ``[b, b]``. Distributed: each rank passes ``[b, world*b]`` (its videos'
    rows of the global matrix) and receives the whole ``[world*b, world*b]``.
    """
    rel = relevancy if isinstance(relevancy, torch.Tensor) else torch.as_tensor(relevancy)
    rel = rel.to(device)
    w = dist.world_size()
    if rel.ndim != 2 or rel.shape != (batch_size, batch_size * w):
        raise ValueError(f"relevancy: expected shape [{batch_size}, {batch_size * w}], "
                         f"got {tuple(rel.shape)}")
    return rel if w == 1 else dist.all_gather_no_grad(rel)
