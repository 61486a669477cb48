"""Thumbnails for ``xmodal serve``: files inside ``--images`` only; videos by their middle frame.

A result's name (a line of the index's ``names.txt``) is looked up under the images directory exactly
as the report looks it up (:func:`xmodal.features.media.find_media`: ``NAME`` or ``NAME.<ext>``, never
outside the folder), and drawn by :func:`xmodal.features.media.thumbnail`.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from xmodal.features.media import find_media, thumbnail

#: Longest side of a thumbnail in pixels.
THUMB_SIZE = 192


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
        return thumbnail(find_media(self.root, self.names[item]), self.size)
