"""xmodal: cross-modal contrastive learning and retrieval between video/image and text.

Submodules are imported lazily (``xmodal.metrics``, ``xmodal.losses``,
``xmodal.normalize``, ``xmodal.data``, ``xmodal.schedules`` ...), so that
``import xmodal`` stays cheap.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = {
    "metrics", "losses", "functional", "normalize", "data", "schedules", "dist",
    "models", "train", "index", "config", "encoders", "cli", "plots", "evaluate",
    "testtime", "runs", "sampling", "report",
}


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"xmodal.{name}")
    raise AttributeError(f"module 'xmodal' has no attribute {name!r}")


def load_model(path):
    """Load a checkpoint written by ``xmodal train`` (see :func:`xmodal.models.load_model`)."""
    from xmodal.models import load_model as _load

    return _load(path)
