"""What every benchmark-format reader shares: the files a source must hold, JSON / text reading with
one-line errors, and the ``{"video", "caption", "split"}`` rows :func:`xmodal.data.importer.import_rows`
takes (the rows a ``pairs.csv`` gives)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xmodal._validate import short_repr


@dataclass(frozen=True)
class FormatRows:
    """A benchmark's pairs, ready for :func:`xmodal.data.importer.import_rows`.

    Attributes:
        rows: ``{"video", "caption", "split"}`` per caption, in the files' order.
        kind: ``"images"`` or ``"videos"``: what the collection holds (for messages).
        splits: ``{split: where it comes from}``, in words (printed beside the sizes).
        notes: conventions applied, one line each (e.g. ``restval`` counted as train).
        files: ``{id: the item's file, relative to the media folder}`` where the format names it
            (``data import --images DIR`` looks there first).
    """

    rows: list[dict[str, str]]
    kind: str
    splits: dict[str, str]
    notes: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)


def source_dir(source: Any, fmt: str) -> Path:
    """The folder a format reads (one line when it is not a folder)."""
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"--format {fmt}: expected the benchmark's folder, got {short_repr(source)}")
    path = Path(source)
    if not path.is_dir():
        raise ValueError(f"--format {fmt}: {path} is not a folder (give the folder holding the benchmark's files)")
    return path


def need_files(folder: Path, fmt: str, names: dict[str, str]) -> dict[str, Path]:
    """``{name: path}`` of files the format reads; every missing one named in one line
    (``names``: ``{file name: what it is}``)."""
    missing = [f"{n} ({what})" for n, what in names.items() if not (folder / n).is_file()]
    if missing:
        raise ValueError(f"--format {fmt}: {folder} lacks {', '.join(missing)}")
    return {n: folder / n for n in names}


def read_json(path: Path, fmt: str) -> Any:
    """A JSON file, or one line naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"--format {fmt}: {path} is not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--format {fmt}: {path} is not JSON ({exc.msg}, line {exc.lineno})") from None


def read_lines(path: Path, fmt: str) -> list[str]:
    """Non-blank stripped lines of a text file (an id list)."""
    try:
        return [line.strip() for line in path.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
    except UnicodeDecodeError as exc:
        raise ValueError(f"--format {fmt}: {path} is not UTF-8 text (byte {exc.start})") from None


def lacks(fmt: str, where: str, what: str) -> ValueError:
    """The one line for an entry that lacks a field the public loaders read."""
    return ValueError(f"--format {fmt}: {where} lacks {what}")


def text_field(value: Any, fmt: str, where: str, what: str) -> str:
    """A caption-like string field: whitespace collapsed (no tab or newline reaches ``S_texts.tsv``),
    non-empty."""
    if not isinstance(value, str) or not value.strip():
        raise lacks(fmt, where, f"{what} (a non-empty string; got {short_repr(value, 60)})")
    return " ".join(value.split())


def row(video: Any, caption: str, split: str, fmt: str, where: str) -> dict[str, str]:
    """One pair; the video id must name a file inside ``--features``."""
    from xmodal.data.importer import check_video_id

    if not isinstance(video, str) or not video.strip():
        raise lacks(fmt, where, f"a video / image id (got {short_repr(video, 60)})")
    return {"video": check_video_id(video.strip(), f"--format {fmt}: {where}"), "caption": caption, "split": split}


def strip_video_extension(name: str) -> str:
    """``clip.mp4`` -> ``clip``: feature files are named by the video's stem (``encode videos``).

    >>> strip_video_extension("12090392@N02_13482799053_87ef417396.mov"), strip_video_extension("v_abc")
    ('12090392@N02_13482799053_87ef417396', 'v_abc')
    """
    from xmodal.features.video import VIDEO_EXTENSIONS

    suffix = Path(name).suffix
    return name[: -len(suffix)] if suffix and suffix.lower() in VIDEO_EXTENSIONS else name
