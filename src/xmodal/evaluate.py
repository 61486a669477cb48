"""Evaluating a trained model on a split: embeddings -> test-time normaliser -> retrieval metrics.

Kept out of the training loop (open_clip's ``evaluate``): the trainer, ``xmodal eval``
and users call the same functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["embed_split", "retrieval_metrics", "score", "evaluate", "evaluate_normalizers"]


@torch.no_grad()
def embed_split(model, split, batch_size: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """(text embeddings ``[M, D]``, video embeddings ``[N, D]``), L2-normalised, float32.

    The split's frame mask and experts (``split.video_input()``) go to ``encode_video``.
    """
    video = model.encode_video(*split.video_input(), batch_size=batch_size)
    return model.encode_text(split.text, batch_size=batch_size), video


def retrieval_metrics(sim_t2v: torch.Tensor, sim_v2t: torch.Tensor | None, text_to_video: np.ndarray) -> dict:
    """``{"t2v": {...}, "v2t": {...}}`` as ``xmodal.metrics.text_video`` (v2t: all-captions
    protocol), where each direction may come from its own (normalised) similarity matrix
    ``[M, N]`` / ``[N, M]`` (``sim_v2t=None``: the transpose of ``sim_t2v``)."""
    from xmodal.metrics import retrieval, text_video

    if sim_v2t is None:
        return text_video(sim_t2v, text_to_video)
    t2v = torch.as_tensor(text_to_video)
    own = t2v[None, :] == torch.arange(sim_v2t.shape[0])[:, None]
    return {"t2v": retrieval(sim_t2v, t2v), "v2t": retrieval(sim_v2t, own)}


def score(metrics: dict, metric: str) -> float:
    """Early-stopping / selection score: ``rsum`` (sum of R@1,5,10 both ways) or
    ``r1`` (mean of t2v and v2t R@1)."""
    if metric == "r1":
        return 0.5 * (metrics["t2v"]["R@1"] + metrics["v2t"]["R@1"])
    return sum(metrics[d][f"R@{k}"] for d in ("t2v", "v2t") for k in (1, 5, 10))


def evaluate_normalizers(names: list[str], test_time: Any, model, split, batch_size: int = 8192
                         ) -> dict[str, dict]:
    """Metrics of ``split`` under each normaliser: ``{name: {"t2v": ..., "v2t": ...}}``.

    ``test_time``: a :class:`~xmodal.testtime.TestTime` (or the dict form of older runs).
    """
    from xmodal.testtime import TestTime

    tt = test_time if isinstance(test_time, TestTime) else TestTime.from_state_dict(test_time)
    text, video = embed_split(model, split, batch_size)
    return {name: retrieval_metrics(*tt.similarities(text, video, name), split.text_to_video) for name in names}


def evaluate(model, split, normalizer: str | None = None, batch_size: int = 8192) -> dict:
    """Metrics of a loaded model on a split with its selected (or the given) normaliser."""
    name = normalizer or "selected"
    return evaluate_normalizers([name], model.test_time, model, split, batch_size)[name]
