"""The source videos' hashes of a frame store (``xmodal encode frames``): which bytes each stored video's
frames were decoded from, checked when the store is resumed and carried by ``data import`` into the layout.

A frame store keeps its frames, not its videos, so a video edited or replaced after its frames were stored
would leave stale frames behind an unchanged name. Each video's SHA-256 (of the file,
:func:`xmodal.features.hashing.file_sha256`) is written after its frames as
``FRAMES/.sources/<video id>.sha256``: one ``sha256sum`` line, ``HASH  NAME``, with NAME the video file's path
relative to the folder encoded (``cd VIDEOS && sha256sum -c FRAMES/.sources/clip.sha256`` checks it). One small
file per video, because ``--shard K/N`` processes write one store at once and a store may hold more videos than
one identity file holds (:data:`xmodal.features.identity.MAX_BYTES`); ``FRAMES/encoder.json`` names the folder.

On a re-run every stored video is hashed again (one read of each file, far less than decoding it): a video
whose hash changed, or whose frames have no recorded hash (a store written before xmodal recorded them, or a
run stopped between a video's frames and its hash), is decoded again, each named in one line. Re-decoding
rather than refusing: the store is a cache of the folder, and its rate and size (``encoder.json``) still hold.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

__all__ = ["SOURCES_DIR", "source_file", "read_source", "write_source", "stale_sources", "sources_digest"]

#: The folder of a store's per-video source hashes (hidden: no video id starts with ".", :mod:`.folder`).
SOURCES_DIR = ".sources"
#: A hash file is one ``sha256sum`` line; anything longer is not one.
MAX_LINE = 64 + 2 + 4096 + 1
_LINE = re.compile(r"^([0-9a-f]{64})  (\S.*)\n?$")


def _check(out: object, video_ids: object) -> None:
    """TypeError naming the argument unless ``out`` is a path and ``video_ids`` a list of relative video ids."""
    from xmodal._validate import short_repr

    if isinstance(out, bool) or not isinstance(out, (str, os.PathLike)) or not str(out):
        raise TypeError(f"out: expected a frame store folder, got {short_repr(out)}")
    if not isinstance(video_ids, (list, tuple)) or not all(
            isinstance(v, str) and v and "\n" not in v and not os.path.isabs(v) and ".." not in Path(v).parts
            for v in video_ids):
        raise TypeError(f"video ids: expected a list of video ids (relative names), got {short_repr(video_ids)}")


def source_file(out: str | os.PathLike, video_id: str) -> Path:
    """``out/.sources/<video id>.sha256``.

    >>> source_file("fr", "sub/clip").as_posix()
    'fr/.sources/sub/clip.sha256'
    """
    _check(out, [video_id])
    return Path(out) / SOURCES_DIR / f"{video_id}.sha256"


def read_source(out: str | os.PathLike, video_id: str) -> tuple[str, str] | None:
    """``(sha256, name)`` recorded for ``video_id``, or None (no file, or not one ``sha256sum`` line)."""
    path = source_file(out, video_id)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_LINE + 1)
    except OSError:
        return None
    if len(data) > MAX_LINE:
        return None
    m = _LINE.match(data.decode("utf-8", "replace"))
    return (m[1], m[2]) if m else None


def write_source(out: str | os.PathLike, video_id: str, sha256: str, name: str) -> Path:
    """Record ``video_id``'s source hash (atomically; after its frames, so a stop between leaves it unrecorded)."""
    from xmodal.runs import atomic_write_text

    if not isinstance(sha256, str) or not isinstance(name, str) or not re.fullmatch(r"[0-9a-f]{64}", sha256) \
            or not name or "\n" in name:
        from xmodal._validate import short_repr

        raise ValueError(f"{short_repr(video_id)}: expected a SHA-256 and a one-line file name, got "
                         f"{short_repr(sha256)}, {short_repr(name)}")
    path = source_file(out, video_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, f"{sha256}  {name}\n")
    return path


def stale_sources(out: str | os.PathLike, stored: list[tuple[str, Path]]) -> tuple[list[str], list[str]]:
    """``(lines, video ids)``: the stored videos whose source changed or was never recorded, each named in a line
    (one line for all the unrecorded ones); their frames are to be decoded again.

    Args:
        stored: ``(video id, path)`` of the videos whose frames ``out`` holds.
    """
    from xmodal.features.hashing import file_sha256

    if not isinstance(stored, list) or not all(isinstance(v, tuple) and len(v) == 2 and
                                               isinstance(v[1], (str, os.PathLike)) for v in stored):
        raise TypeError("stored: expected a list of (video id, path)")
    _check(out, [vid for vid, _ in stored])
    lines, redo, unrecorded = [], [], []
    for vid, path in stored:
        recorded = read_source(out, vid)
        if recorded is None:
            unrecorded.append(vid)
            continue
        try:
            now = file_sha256(path)
        except OSError as exc:
            now = f"unreadable ({exc.strerror or type(exc).__name__})"
        if now != recorded[0]:
            redo.append(vid)
            lines.append(f"xmodal encode: note: {Path(path).name}: changed since its frames were stored (SHA-256 "
                         f"{recorded[0][:12]}..., now {now[:12]}...): its frames are decoded again")
    if unrecorded:
        shown = ", ".join(unrecorded[:5]) + (" ..." if len(unrecorded) > 5 else "")
        lines.append(f"xmodal encode: note: {len(unrecorded)} stored video(s) without a recorded source hash (a "
                     f"store written before xmodal recorded them, or a run stopped before the hash): decoded again "
                     f"({shown})")
    return lines, redo + unrecorded


def sources_digest(store: str | os.PathLike, video_ids: list[str]) -> str | None:
    """The SHA-256 of the ``sha256sum`` lines (``HASH  VIDEO_ID``, sorted by video id) of ``video_ids``' recorded
    sources: one hash naming every source video of a layout; None when one of them has none recorded."""
    _check(store, video_ids)
    lines = []
    for vid in sorted(set(video_ids)):
        recorded = read_source(store, vid)
        if recorded is None:
            return None
        lines.append(f"{recorded[0]}  {vid}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest() if lines else None
