"""Gradient caching (Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory
Limited Setup", Sec. 3.2, Alg. 1): a contrastive batch whose graph does not fit, trained to the same
gradients as plain back-propagation.

    1. embed every chunk of ``chunk_size`` rows without a graph (the RNG state before each chunk kept);
    2. the loss on the whole batch's embeddings, back-propagated to the embeddings only
       (``d loss / d embedding``, the "representation gradient" cache, and the loss's own parameters);
    3. each chunk re-embedded with a graph under its kept RNG state (the same dropout masks) and
       ``backward(embedding, cached gradient)``: by the chain rule the encoder's gradient
       accumulates to exactly what one backward over the whole batch gives.

Peak memory holds one chunk's graph plus the batch's embeddings, not the whole batch's graph.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch


def _rng() -> tuple:
    return torch.get_rng_state(), (torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)


def _set_rng(state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


def _rows(x: Any, sl: slice) -> Any:
    if x is None:
        return None
    return {k: v[sl] for k, v in x.items()} if isinstance(x, dict) else x[sl]


def _size(x: Any) -> int:
    return next(iter(x.values())).shape[0] if isinstance(x, dict) else x.shape[0]


def cached_backward(embed_video: Callable, embed_text: Callable, loss_of: Callable, *, video: Any, video_mask: Any,
                    text: Any, text_mask: Any, chunk_size: int, autocast: Any = None,
                    scale: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """One step's backward by gradient caching; returns the loss (detached).

    Args:
        embed_video, embed_text: ``(inputs, mask) -> [n, D]`` (the model's ``forward_video`` /
            ``forward_text``).
        loss_of: ``(video [B, D], text [B, D]) -> scalar`` (the loss with its extra arguments).
        video, video_mask, text, text_mask: the batch's inputs (rows aligned).
        chunk_size: rows per re-embedded chunk.
        autocast: the forward's precision context (default none).
        scale: applied to the loss before its backward (a gradient scaler's ``scale``).
    """
    ctx = autocast if autocast is not None else nullcontext()
    steps = {}
    cached = {}
    for side, fn, x, m in (("video", embed_video, video, video_mask), ("text", embed_text, text, text_mask)):
        n = _size(x)
        slices = [slice(i, min(i + chunk_size, n)) for i in range(0, n, chunk_size)]
        states, outs = [], []
        with torch.no_grad():
            for sl in slices:
                states.append(_rng())
                with ctx:
                    outs.append(fn(_rows(x, sl), _rows(m, sl)).float())
        steps[side] = (fn, x, m, slices, states)
        cached[side] = torch.cat(outs).requires_grad_(True)
    after = _rng()
    loss = loss_of(cached["video"], cached["text"])
    (scale(loss) if scale is not None else loss).backward()
    for side, (fn, x, m, slices, states) in steps.items():
        grad = cached[side].grad
        for sl, state in zip(slices, states):
            _set_rng(state)
            with ctx:
                out = fn(_rows(x, sl), _rows(m, sl)).float()
            out.backward(grad[sl])
    _set_rng(after)
    return loss.detach()
