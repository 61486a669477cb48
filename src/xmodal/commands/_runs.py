"""Shared by the commands that apply a trained run (``eval --run``, ``index``, ``query``):
loading a run with one-line errors, and its similarity for new features."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def load_run(path: str, flag: str = "--run"):
    """``xmodal.load_model(path)``; a missing/corrupt/foreign run is a ValueError naming ``flag``."""
    import xmodal

    try:
        return xmodal.load_model(path)
    except (FileNotFoundError, ValueError, TypeError) as exc:
        msg = str(exc)
        if msg.startswith("path: "):
            msg = msg[len("path: "):]
        raise ValueError(f"{flag}: {msg}") from None


def checkpoint_file(path: str) -> Path:
    """The checkpoint file behind a run directory (or the file itself)."""
    from xmodal import models

    p = Path(path)
    if p.is_file():
        return p
    for name in getattr(models, "CHECKPOINT_NAMES", ("model.pt", "checkpoint.pt")):
        if (p / name).is_file():
            return p / name
    raise ValueError(f"--run: no checkpoint in {path}")


@torch.no_grad()
def run_similarity(model: Any, text_features: Any, video_features: Any,
                   normalizer: str = "selected", video_mask: Any = None) -> torch.Tensor:
    """``model.similarity(text_features, video_features, normalizer=..., video_mask=...)`` ``[T, V]``."""
    return torch.as_tensor(model.similarity(text_features, video_features, normalizer=normalizer,
                                            video_mask=video_mask))
