"""Thumbnails for ``xmodal serve``: files inside ``--images`` only; videos by their middle frame.

A result's name (a line of the index's ``names.txt``) is looked up under the images directory exactly
as the report looks it up (:func:`xmodal.features.media.find_media`: ``NAME`` or ``NAME.<ext>``, never
outside the folder), and drawn by :func:`xmodal.features.media.make_thumbnail`, whose pixel budgets
are checked from the file's header and which decodes one file at a time per process. Made thumbnails
(and the reason an item has none) are kept in a cache bounded in entries and in bytes.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

from xmodal.features.media import find_media, make_thumbnail

#: Longest side of a thumbnail in pixels.
THUMB_SIZE = 192
#: Most thumbnails (or reasons for none) kept in memory.
CACHE_ENTRIES = 1024
#: Most bytes of JPEG kept in memory.
CACHE_BYTES = 32 * 1024 * 1024


class Thumbnails:
    """JPEG thumbnails of gallery items, made on first request and kept (least recently used dropped).

    Args:
        root: the images directory (``--images``).
        names: the index's item names (``names.txt``), or None (no thumbnails).
        size: longest side in pixels.
        cache: how many thumbnails to keep in memory.
        cache_bytes: how many bytes of JPEG to keep in memory.
    """

    def __init__(self, root: str | os.PathLike, names: list[str] | None, *, size: int = THUMB_SIZE,
                 cache: int = CACHE_ENTRIES, cache_bytes: int = CACHE_BYTES) -> None:
        root = Path(root)
        if not root.is_dir():
            raise ValueError(f"--images: {root} is not a directory")
        self.root = root.resolve()
        self.names = names
        self.size = int(size)
        self.max_entries, self.max_bytes = int(cache), int(cache_bytes)
        self._cache: OrderedDict[int, bytes | str] = OrderedDict()
        self._bytes = 0
        self._making: dict[int, threading.Event] = {}
        self._lock = threading.Lock()

    def get(self, item: int) -> bytes | None:
        """The item's JPEG, or None (no such item, no file, or no thumbnail: see :meth:`reason`)."""
        out = self._lookup(item)
        return out if isinstance(out, bytes) else None

    def reason(self, item: int) -> str | None:
        """Why the item has no thumbnail (None when it has one)."""
        out = self._lookup(item)
        return None if isinstance(out, bytes) else out

    def _lookup(self, item: int) -> bytes | str:
        while True:
            with self._lock:
                if item in self._cache:
                    self._cache.move_to_end(item)
                    return self._cache[item]
                waiting = self._making.get(item)
                if waiting is None:  # this thread makes it; the others asking for it wait for it
                    self._making[item] = threading.Event()
                    break
            waiting.wait()
        try:
            out = self._make(item)  # different items queue on the decoder's lock: one decode at a time
            with self._lock:
                self._cache[item] = out
                self._bytes += len(out) if isinstance(out, bytes) else 0
                while len(self._cache) > self.max_entries or self._bytes > self.max_bytes:
                    _, old = self._cache.popitem(last=False)
                    self._bytes -= len(old) if isinstance(old, bytes) else 0
            return out
        finally:
            with self._lock:
                self._making.pop(item).set()

    def _make(self, item: int) -> bytes | str:
        if self.names is None or not 0 <= item < len(self.names):
            return "no such item"
        path = find_media(self.root, self.names[item])
        if path is None:
            return "no file for this name inside --images"
        try:
            return make_thumbnail(path, self.size)
        except ValueError as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - a decoder's own error means no thumbnail, not a 500
            return f"{Path(path).name}: cannot make a thumbnail ({type(exc).__name__})"
