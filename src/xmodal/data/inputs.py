"""Video inputs as the trainer feeds them to a model: frame masks and several experts.

A video input is ``(features, mask)``: a tensor ``[N, Dv]`` / ``[N, F, Dv]`` and an
optional bool ``[N, F]`` mask, or, with several experts, dicts keyed by expert name
(``"video"`` for the main features). These helpers index and move both together,
so the training loop never looks inside.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xmodal.data.layout import MAIN_EXPERT


def _map(x: Any, fn: Any) -> Any:
    if x is None:
        return None
    return {k: fn(v) for k, v in x.items()} if isinstance(x, dict) else fn(x)


def video_tensors(split: Any) -> tuple[Any, Any]:
    """All videos of a :class:`~xmodal.data.PairedSplit` as CPU tensors: float32
    features, bool masks (dicts with several experts)."""
    feats, mask = split.video_input()
    return (_map(feats, lambda a: torch.as_tensor(np.asarray(a, dtype=np.float32))),
            _map(mask, lambda a: torch.as_tensor(np.asarray(a, dtype=bool))))


def gather_rows(x: Any, rows: Any) -> Any:
    """``x[rows]`` as a CPU tensor: float features upcast to float32 after the gather (the
    same values as upcasting the whole array first), masks as bool; ``x`` a numpy array
    (memory-mapped ones read only those rows), a tensor, a dict of them, or None.

    >>> gather_rows(np.arange(6, dtype=np.float16).reshape(3, 2), [2, 0])
    tensor([[4., 5.],
            [0., 1.]])
    """
    rows = np.asarray(rows)

    def one(a: Any) -> torch.Tensor:
        if isinstance(a, torch.Tensor):
            t = a[torch.as_tensor(rows, dtype=torch.long)]
            return t.float() if t.is_floating_point() else t
        block = a[rows]
        if np.issubdtype(block.dtype, np.floating):
            return torch.from_numpy(np.asarray(block, dtype=np.float32))
        return torch.from_numpy(np.ascontiguousarray(block))

    return _map(x, one)


def take(features: Any, mask: Any, rows: Any, device: torch.device | str) -> tuple[Any, Any]:
    """``(features[rows], mask[rows])`` on ``device`` (tensors, numpy arrays or dicts of them;
    float features upcast to float32 after the gather, :func:`gather_rows`)."""
    return (_map(gather_rows(features, rows), lambda t: t.to(device)),
            _map(gather_rows(mask, rows), lambda t: t.to(device)))


def pooled(features: Any, mask: Any) -> torch.Tensor:
    """The main expert's input features, frame-averaged over real frames: ``[N, Dv]``
    (what losses that read raw inputs, CrossCLR / Cali-NCE, take as ``video_input``)."""
    from xmodal.models import masked_mean

    x = features[MAIN_EXPERT] if isinstance(features, dict) else features
    m = mask.get(MAIN_EXPERT) if isinstance(mask, dict) else mask
    if x.ndim == 2:
        return x if m is None or m.ndim == 2 else x.masked_fill(~m[:, None], 0.0)
    if m is not None and m.ndim == 1:
        return x.masked_fill(~m[:, None, None], 0.0).mean(1)
    return masked_mean(x if m is None else x.masked_fill(~m[..., None], 0.0), m)


def text_tensors(split: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """All texts of a :class:`~xmodal.data.PairedSplit` as CPU tensors: float32 features
    ``[T, Dt]`` or ``[T, L, Dt]`` and the bool token mask ``[T, L]`` (or None)."""
    feats, mask = split.text_input()
    return (torch.as_tensor(np.asarray(feats, dtype=np.float32)),
            None if mask is None else torch.as_tensor(np.asarray(mask, dtype=bool)))


def pooled_text(features: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Text input features as losses that read raw inputs take them (``text_input``): sentence
    features ``[N, Dt]`` as they are, token features averaged over real tokens."""
    from xmodal.models import masked_mean

    if features.ndim == 2:
        return features
    return masked_mean(features if mask is None else features.masked_fill(~mask[..., None], 0.0), mask)


def padded_rows(features: Any, *, missing_rows: bool = False) -> np.ndarray:
    """Rows that look zero-padded but come without a mask: ``[N, F, D]`` (``F > 1``) rows whose
    last frame is all zero or not finite; with ``missing_rows`` (an expert ``[N, D]``) rows
    that are all zero or not finite (a video lacking the expert). Such rows need a mask, else
    their padding is averaged in as real frames.

    >>> x = np.ones((3, 4, 2)); x[1, 2:] = 0
    >>> padded_rows(x).tolist()
    [1]
    """
    from xmodal.data.types import row_blocks

    x = features.detach().cpu().numpy() if hasattr(features, "detach") else features
    x = x if isinstance(x, np.ndarray) else np.asarray(x)
    if x.ndim == 3 and x.shape[1] > 1:
        last = x[:, -1]  # a view: a memory-mapped array is read block by block below
    elif x.ndim == 2 and missing_rows:
        last = x
    else:
        return np.zeros(0, dtype=np.int64)
    rows = []
    for sl in row_blocks(last):
        block = np.asarray(last[sl]).reshape(sl.stop - sl.start, -1)
        rows.append(sl.start + np.flatnonzero((block == 0).all(1) | ~np.isfinite(block).all(1)))
    return np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
