"""Thumbnails for ``xmodal serve``: files inside ``--images`` only; videos by their middle frame.

A result's name (a line of the index's ``names.txt``) is looked up under the images
directory. Absolute names, ``..`` parts and symlinks that lead out of the directory
give no thumbnail, so the page can show nothing but the gallery's own files. Video
files go through ``xmodal.video.middle_frame(path)`` when that module is importable
(extra ``video``); without it, or when decoding fails, a video simply has no thumbnail.
"""

from __future__ import annotations

import functools
import importlib
import io
import os
from pathlib import Path, PurePosixPath
from typing import Any

from xmodal.encoders import IMAGE_EXTENSIONS
from xmodal.video import VIDEO_EXTENSIONS  # numpy only at import; PyAV is loaded when a frame is decoded

#: Longest side of a thumbnail in pixels.
THUMB_SIZE = 192


def safe_path(root: Path, name: str) -> Path | None:
    """``root / name`` resolved, if it is a file inside the resolved ``root``; else None.

    Args:
        root: the images directory, already resolved (``Path.resolve()``).
        name: a gallery item's name, relative to ``root``.

    >>> safe_path(Path("/").resolve(), "../etc/passwd") is None
    True
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        return None
    rel = PurePosixPath(name)
    if rel.is_absolute() or ".." in rel.parts:
        return None
    try:
        resolved = (root / rel).resolve(strict=True)
    except (OSError, RuntimeError):  # missing file, symlink loop
        return None
    if not resolved.is_relative_to(root) or not resolved.is_file():
        return None  # a symlink that leads out of the images directory
    return resolved


def _middle_frame_fn():
    """``xmodal.video.middle_frame`` or None while that module (or its decoder) is missing."""
    try:
        module = importlib.import_module("xmodal.video")
    except ImportError:
        return None
    return getattr(module, "middle_frame", None)


def _jpeg(image: Any, size: int) -> bytes:
    """JPEG bytes of a PIL image or an ``[H, W, 3]`` uint8 array, fitted into ``size x size``."""
    import numpy as np
    from PIL import Image

    if not isinstance(image, Image.Image):
        image = Image.fromarray(np.ascontiguousarray(np.asarray(image, dtype=np.uint8)))
    image = image.convert("RGB")
    image.thumbnail((size, size))
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=85)
    return buf.getvalue()


class Thumbnails:
    """JPEG thumbnails of gallery items, made on first request and kept (LRU).

    Args:
        root: the images directory (``--images``).
        names: the index's item names (``names.txt``), or None (no thumbnails).
        size: longest side in pixels.
        cache: how many thumbnails to keep in memory.
    """

    def __init__(self, root: str | os.PathLike, names: list[str] | None, *, size: int = THUMB_SIZE,
                 cache: int = 512) -> None:
        root = Path(root)
        if not root.is_dir():
            raise ValueError(f"--images: {root} is not a directory")
        self.root = root.resolve()
        self.names = names
        self.size = int(size)
        self.get = functools.lru_cache(maxsize=cache)(self._make)

    def _make(self, item: int) -> bytes | None:
        if self.names is None or not 0 <= item < len(self.names):
            return None
        path = safe_path(self.root, self.names[item])
        if path is None:
            return None
        suffix = path.suffix.lower()
        try:
            if suffix in IMAGE_EXTENSIONS:
                from PIL import Image

                with Image.open(path) as im:
                    im.draft("RGB", (self.size, self.size))  # JPEG: decode at reduced scale
                    return _jpeg(im, self.size)
            if suffix in VIDEO_EXTENSIONS:
                middle_frame = _middle_frame_fn()
                return None if middle_frame is None else _jpeg(middle_frame(path), self.size)
        except Exception:  # noqa: BLE001 - an unreadable file or a decoder error means no thumbnail
            return None
        return None
