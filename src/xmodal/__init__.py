"""xmodal: cross-modal contrastive learning and retrieval between video/image and text.

The parts, from the bottom of the import graph up (a package imports only those above it):

- ``functional`` (pure loss maths), ``losses``, ``metrics``, ``normalize``, ``schedules``, ``dist``:
  the papers' objectives, metrics and test-time normalisers;
- ``data`` (layouts, loaders, synthetic data), ``features`` (raw media to features), ``config``;
- ``models`` (two-tower heads, checkpoints), ``retrieval`` (applying a trained run: evaluation,
  test-time state, FAISS indexes), ``training`` (the trainer);
- ``reporting`` (HTML report, plots, bench grid), ``serve`` (search page), ``commands`` + ``cli``.

Submodules are imported lazily (``xmodal.metrics``, ``xmodal.losses`` ...), so that
``import xmodal`` stays cheap.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = {
    "metrics", "losses", "functional", "normalize", "data", "schedules", "dist", "models",
    "training", "retrieval", "features", "reporting", "serve", "config", "commands", "cli", "runs", "progress",
    "classify", "execute",
}


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"xmodal.{name}")
    raise AttributeError(f"module 'xmodal' has no attribute {name!r}")


def load_model(path):
    """Load a model written by ``xmodal train`` (a run directory or checkpoint) or by ``xmodal export`` (a folder
    with ``model.safetensors`` + ``config.json``); see :func:`xmodal.models.load_model`."""
    from xmodal.models import load_model as _load

    return _load(path)
