"""``frames:S``: the "encoder" of a frame store (``xmodal encode frames``): each sampled video frame
resized so its short side is ``S`` (bicubic) and centre-cropped to ``S x S``, kept as uint8 RGB,
flattened ``[S * S * 3]`` (row-major ``S x S x 3``). This is what ``CLIPImageProcessor`` does to an
image before rescaling and normalising (``resize`` with ``shortest_edge``, ``center_crop``), so a
CLIP with ``image_size`` S reads these frames with only ``x / 255`` and its mean/std left to apply
(:class:`xmodal.models.clip4clip.ClipVideoTower`). CLIP4Clip's ``compress_video.py`` likewise stores
frames at short side 224 (at 3 fps; ``--feature_framerate 1`` samples them at 1 fps).

Everything else about a frame store is ``xmodal encode videos``' folder (:mod:`xmodal.features.folder`):
one ``FRAMES/<video id>.npy`` per video (here uint8 ``[F, S*S*3]``), ``FRAMES/encoder.json`` naming
the size and sampling, no silent skips, ``--workers``, ``--shard``, resumable; and, for a frame store only,
each source video's SHA-256 in ``FRAMES/.sources/`` (:mod:`xmodal.features.sources`), checked on resume.
"""

from __future__ import annotations

from typing import Any

import numpy as np

PREFIX = "frames:"
DEFAULT_SIZE = 224


def frame_size(spec: str) -> int:
    """``S`` of ``frames:S``; ValueError naming the spec otherwise."""
    text = spec[len(PREFIX):]
    if not text.isdigit() or not 8 <= int(text) <= 2048:
        raise ValueError(f"model: {spec[:60]!r}: expected frames:S with a frame size S in [8, 2048]")
    return int(text)


def crop_frame(image: Any, size: int) -> np.ndarray:
    """One PIL image -> uint8 ``[size * size * 3]``: short side to ``size`` (bicubic), centre crop.

    >>> from PIL import Image
    >>> crop_frame(Image.new("RGB", (40, 20), (1, 2, 3)), 8).reshape(8, 8, 3)[0, 0].tolist()
    [1, 2, 3]
    """
    from PIL import Image

    im = image.convert("RGB")
    w, h = im.size
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(size * long / short)
    new = (size, new_long) if w <= h else (new_long, size)
    if new != (w, h):
        im = im.resize(new, Image.BICUBIC)
    w, h = im.size
    top, left = (h - size) // 2, (w - size) // 2
    return np.asarray(im.crop((left, top, left + size, top + size)), dtype=np.uint8).reshape(-1)


def encoder_parts(spec: str):
    """``(fn, identity)`` of ``frames:S`` (uint8 rows), which
    :func:`xmodal.features.encoders.get_encoder` wraps in its ``Encoder`` (this module imports no
    other part of ``xmodal.features``)."""
    size = frame_size(spec)

    def fn(images: list, *, batch_size: int = 32, progress: bool = False) -> np.ndarray:
        return np.stack([crop_frame(im, size) for im in images])

    def identity() -> dict:
        return {"spec": spec, "kind": "image", "level": "frame", "family": "frames", "hub_name": None,
                "weights_sha256": None, "preprocessing_sha256": None,
                "preprocessing": {"resize": f"short side {size}, bicubic", "crop": f"centre {size} x {size}",
                                  "dtype": "uint8", "layout": f"RGB {size} x {size} x 3, flattened",
                                  "source_hashes": "SHA-256 of each video in .sources/<video id>.sha256"},
                "dim": size * size * 3, "normalized": False}

    return fn, identity
