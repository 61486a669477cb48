"""``fit(config, splits)``: train on in-memory :class:`~xmodal.data.PairedSplit` s, no data files.

The splits replace the files of ``config.data`` (its ``name``/``root``/``*_split`` keys are
not read); ``data.noise`` and ``data.max_train_texts`` still apply to the training split,
exactly as for files, so ``fit(cfg, splits)`` equals ``train`` on the same splits written
with :meth:`PairedSplit.save` (same seed, same weights and metrics).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from xmodal.config import Config


def fit(config: Config, splits: dict, *, out: str | os.PathLike | None = None, **kwargs: Any
        ) -> tuple[Any, dict]:
    """Train on in-memory splits; returns ``(model, summary)``.

    Args:
        config: the resolved :class:`~xmodal.config.Config` (e.g. ``xmodal.config.from_dict``).
        splits: ``{"train": PairedSplit, "val": PairedSplit[, "test": PairedSplit]}``; "val"
            may be left out when ``data.val_from_train`` carves it from "train".
        out: optional run directory. Given, it is a full run directory (checkpoint, logs,
            ``model.pt``; ``provenance.json`` lists no data files). Resuming it needs the
            same ``splits`` again (the checkpoint records the config, not the arrays).
            ``None`` (default): a temporary directory, removed before returning.
        **kwargs: passed to :func:`xmodal.training.loop.train` (``progress``, ``verbose``, ``resume``).

    Returns:
        The trained model as :func:`xmodal.load_model` reads it (test-time normalisers
        fitted, the selected one stored) and the summary dict (``metrics.json``).

    Raises:
        ValueError / TypeError: ``splits`` without ``train`` and ``val`` PairedSplits (``val``
            is optional with ``data.val_from_train``).

    >>> import numpy as np
    >>> from xmodal.config import from_dict
    >>> from xmodal.data import synthetic
    >>> s = synthetic(num_train=80, num_val=40, num_test=40, num_concepts=8, seed=0)
    >>> cfg = from_dict({"model": {"dim": 8}, "train": {"epochs": 1, "batch_size": 16, "device": "cpu"},
    ...                  "test_time": {"normalizers": ["none"]}})
    >>> model, summary = fit(cfg, {"train": s["train"], "val": s["val"]}, verbose=False, progress=False)
    >>> summary["normalizer"], model.encode_text(s["val"].text).shape[0] == s["val"].num_texts
    ('none', True)
    """
    from xmodal._validate import short_repr
    from xmodal.models import load_model
    from xmodal.training.loop import train

    if not isinstance(config, Config):
        raise TypeError(f"config: expected an xmodal.config.Config (xmodal.config.from_dict / load_config), "
                        f"got {short_repr(config)}")
    if not isinstance(splits, dict):
        raise TypeError(f"splits: expected {{'train': PairedSplit, 'val': PairedSplit}}, got {short_repr(splits)}")
    if out is not None and not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out: expected a folder path or None, got {short_repr(out)}")
    if out is not None:
        summary = train(config, out, splits=splits, **kwargs)
        return load_model(out), summary
    with tempfile.TemporaryDirectory(prefix="xmodal-fit-") as tmp:
        summary = train(config, Path(tmp) / "run", splits=splits, **kwargs)
        return load_model(Path(tmp) / "run"), summary
