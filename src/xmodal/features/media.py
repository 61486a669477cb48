"""Gallery files by name, for the report and the search page: one resolver (:func:`find_media`) and one
thumbnail maker (:func:`thumbnail`), so both show the same file for the same name.

A name (a line of ``names.txt`` or ``S_videos.txt``) is looked up under a media folder ``root``:
``root/NAME`` itself, else ``root/NAME.<ext>`` for an image or video extension (a layout names its
videos by file stem). Absolute names, ``..`` parts and symlinks that lead out of ``root``
give nothing, so nothing outside the folder is ever read. A video file is shown by its middle frame
(:func:`xmodal.features.video.middle_frame`, extra ``video``); without PyAV it simply has no thumbnail.

Memory is bounded by the settings, not by the file (a 100 KB PNG may declare 12000x12000 pixels):

- the size is read from the file's header before any pixel is decoded; a JPEG is first set to decode
  at the smallest scale (1/2 .. 1/8) that still covers the thumbnail (``Image.draft``);
- an image that would still decode to more than ``max_pixels`` (:data:`MAX_PIXELS`, 36 MP: at most
  ~250 MB at 4 bytes a pixel plus its RGB copy) or a video whose frames are larger than
  ``max_video_pixels`` (:data:`MAX_VIDEO_PIXELS`, 4096x2304) gets no thumbnail, with a one-line reason
  (:func:`make_thumbnail` raises it; :func:`thumbnail` returns None);
- only one thumbnail is decoded at a time in a process (the others wait), so 20 requests at once
  cost what one does;
- only the formats of the image extensions are opened (JPEG, PNG, WebP, BMP, GIF).
"""

from __future__ import annotations

import importlib
import io
import os
import threading
import warnings
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = ["find_media", "thumbnail", "make_thumbnail", "media_extensions", "MAX_PIXELS", "MAX_VIDEO_PIXELS"]

#: Most pixels an image may decode to (after JPEG draft scaling) for a thumbnail.
MAX_PIXELS = 36_000_000
#: Most pixels a video frame may have for a thumbnail (the decoder keeps several such frames).
MAX_VIDEO_PIXELS = 4096 * 2304
#: Formats opened for a thumbnail (those of the image extensions; a camera's MPO opens as JPEG).
IMAGE_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF")
#: One decode at a time per process: peak memory is one thumbnail's, however many are requested.
_DECODE_LOCK = threading.Lock()


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


def _budget(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {str(value)[:40]!r}")
    return int(value)


def _video_size(path: Path, max_video_pixels: int) -> tuple[int, int] | None:
    """``(width, height)`` of the first video stream, read while probing with the decoder capped at
    ``max_video_pixels`` and one thread (a probe may decode a frame: an 8192x8192 one cost 189 MiB
    uncapped); ``(0, 0)`` when the size could not be read within the cap. None without PyAV."""
    try:
        import av
    except ImportError:
        return None
    try:
        with av.open(str(path), stream_options=[{"max_pixels": str(max_video_pixels), "threads": "1"}]) as container:
            if not container.streams.video:
                raise ValueError(f"{path.name}: no video stream in the file")
            ctx = container.streams.video[0].codec_context
            return int(ctx.width or 0), int(ctx.height or 0)
    except (av.FFmpegError, OSError, UnicodeDecodeError) as exc:
        text = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{path.name}: cannot read video file ({text})") from None


def _video_image(path: Path, max_video_pixels: int):
    from PIL import Image
    import numpy as np

    middle_frame = _middle_frame_fn()
    if middle_frame is None:
        raise ValueError(f"{path.name}: video thumbnails need PyAV (pip install 'xmodal[video]')")
    size = _video_size(path, max_video_pixels)
    if size is not None and (size[0] * size[1] > max_video_pixels or not size[0] * size[1]):
        shown = f"{size[0]}x{size[1]} pixels" if size[0] * size[1] else "a size not readable within the budget"
        raise ValueError(f"{path.name}: video frames of {shown}, over the thumbnail budget of "
                         f"{max_video_pixels:,} pixels")
    return Image.fromarray(np.ascontiguousarray(np.asarray(middle_frame(path), dtype=np.uint8)))


def _open_image(path: Path, size: int, max_pixels: int):
    """The image decoded at reduced scale where the format allows it, never over ``max_pixels``."""
    from PIL import Image

    with warnings.catch_warnings():  # the budget below is the check, PIL's own warning is noise
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            Image.init()
            im = Image.open(path, formats=[f for f in IMAGE_FORMATS if f in Image.OPEN])
        except Image.DecompressionBombError:
            raise ValueError(f"{path.name}: declares more than {2 * Image.MAX_IMAGE_PIXELS:,} pixels, over "
                             f"the thumbnail budget of {max_pixels:,} pixels") from None
    with im:
        declared = im.size
        im.draft("RGB", (size, size))  # JPEG: decode at 1/2 .. 1/8 scale, header only so far
        w, h = im.size
        if w * h > max_pixels:
            raise ValueError(f"{path.name}: {declared[0]}x{declared[1]} pixels, over the thumbnail budget of "
                             f"{max_pixels:,} pixels")
        im.load()
        if im.mode in ("RGB", "RGBA", "L", "LA"):  # shrink first, then convert the small copy
            im.thumbnail((size, size))
            return im.convert("RGB")
        return im.convert("RGB")


def make_thumbnail(path: str | os.PathLike, size: int, *, quality: int = 85, max_pixels: int = MAX_PIXELS,
                   max_video_pixels: int = MAX_VIDEO_PIXELS) -> bytes:
    """JPEG bytes of an image file, or of a video file's middle frame, fitted into ``size x size``.

    Args:
        path: an image or video file.
        size: longest side of the thumbnail in pixels.
        quality: JPEG quality.
        max_pixels: most pixels an image may decode to (checked from its header, after JPEG draft scaling).
        max_video_pixels: most pixels of a video frame (checked from the stream's header).

    Raises:
        ValueError: one line naming the file: missing, unreadable, over a budget, a video without PyAV.

    >>> make_thumbnail("missing.png", 64)
    Traceback (most recent call last):
    ...
    ValueError: missing.png: no such file
    """
    size, quality = _budget(size, "size"), _budget(quality, "quality")
    max_pixels, max_video_pixels = _budget(max_pixels, "max_pixels"), _budget(max_video_pixels, "max_video_pixels")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a file path, got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path.name}: no such file")
    from PIL import Image, UnidentifiedImageError

    from xmodal.features.video import VIDEO_EXTENSIONS

    with _DECODE_LOCK:
        try:
            if path.suffix.lower() in VIDEO_EXTENSIONS:
                image = _video_image(path, max_video_pixels).convert("RGB")
            else:
                image = _open_image(path, size, max_pixels)
            image.thumbnail((size, size))
            buf = io.BytesIO()
            image.save(buf, format="JPEG", quality=quality)
            return buf.getvalue()
        except ValueError:
            raise
        except (OSError, UnidentifiedImageError, SyntaxError, MemoryError, RuntimeError,
                Image.DecompressionBombError) as exc:
            text = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"{path.name}: cannot make a thumbnail ({text})") from None


def thumbnail(path: str | os.PathLike | None, size: int, *, quality: int = 85, max_pixels: int = MAX_PIXELS,
              max_video_pixels: int = MAX_VIDEO_PIXELS) -> bytes | None:
    """:func:`make_thumbnail`, or None when the file is missing, unreadable, over a budget, or a video
    without the ``video`` extra (``path`` None: None)."""
    if path is None:
        return None
    try:
        return make_thumbnail(path, size, quality=quality, max_pixels=max_pixels, max_video_pixels=max_video_pixels)
    except (ValueError, TypeError):
        return None
    except Exception:  # noqa: BLE001 - a decoder's own error type means no thumbnail, never a failed page
        return None
