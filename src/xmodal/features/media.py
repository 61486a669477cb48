"""Gallery files by name, for the report and the search page: one resolver (:func:`find_media`) and one
thumbnail maker (:func:`thumbnail`), so both show the same file for the same name.

A name (a line of ``names.txt`` or ``S_videos.txt``) is looked up under a media folder ``root``:
``root/NAME`` itself, else ``root/NAME.<ext>`` for an image or video extension (a layout names its
videos by file stem). Absolute names, ``..`` parts and symlinks that lead out of ``root``
give nothing, so nothing outside the folder is ever read. A video file is shown by its middle frame
(:func:`xmodal.features.video.middle_frame`, extra ``video``); without PyAV it simply has no thumbnail.
"""

from __future__ import annotations

import importlib
import io
import os
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = ["find_media", "thumbnail", "media_extensions"]


def media_extensions() -> tuple[str, ...]:
    """The image and video file extensions a name may lack (``.jpg`` ... ``.mp4`` ...)."""
    from xmodal.features.encoders import IMAGE_EXTENSIONS
    from xmodal.features.video import VIDEO_EXTENSIONS

    return tuple(IMAGE_EXTENSIONS) + tuple(VIDEO_EXTENSIONS)


def find_media(root: str | os.PathLike, name: Any) -> Path | None:
    """The file of ``name`` inside the folder ``root`` (resolved), or None.

    Args:
        root: the media folder (``--images``).
        name: a gallery item's name, relative to ``root``, with or without its extension.

    >>> find_media("/", "../etc/passwd") is None
    True
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        return None
    rel = PurePosixPath(name)
    if rel.is_absolute() or ".." in rel.parts:
        return None
    try:
        root = Path(root).resolve()
    except (OSError, RuntimeError):
        return None
    for candidate in [name] + [name + ext for ext in media_extensions()]:
        try:
            resolved = (root / candidate).resolve(strict=True)
        except (OSError, RuntimeError, ValueError):  # missing, symlink loop, a name too long
            continue
        if resolved.is_relative_to(root) and resolved.is_file():
            return resolved
    return None


def _middle_frame_fn():
    """``xmodal.features.video.middle_frame``, or None while that module (or its decoder) is missing."""
    try:
        module = importlib.import_module("xmodal.features.video")
    except ImportError:
        return None
    return getattr(module, "middle_frame", None)


def thumbnail(path: str | os.PathLike | None, size: int, *, quality: int = 85) -> bytes | None:
    """JPEG bytes of an image file, or of a video file's middle frame, fitted into ``size x size``;
    None when the file is missing, unreadable, or a video without the ``video`` extra."""
    if path is None:
        return None
    path = Path(path)
    try:
        import numpy as np
        from PIL import Image

        from xmodal.features.video import VIDEO_EXTENSIONS

        if path.suffix.lower() in VIDEO_EXTENSIONS:
            middle_frame = _middle_frame_fn()
            if middle_frame is None:
                return None
            image = Image.fromarray(np.ascontiguousarray(np.asarray(middle_frame(path), dtype=np.uint8)))
        else:
            with Image.open(path) as im:
                im.draft("RGB", (size, size))  # JPEG: decode at reduced scale
                image = im.convert("RGB")
        image = image.convert("RGB")
        image.thumbnail((size, size))
        buf = io.BytesIO()
        image.save(buf, format="JPEG", quality=quality)
        return buf.getvalue()
    except Exception:  # noqa: BLE001 - an unreadable file or a decoder error means no thumbnail
        return None
