"""A small text file a user names (a list of ids, class names, templates): its non-blank lines, read
with a size bound and refused in one line when missing, too large or not UTF-8."""

from __future__ import annotations

import os
from pathlib import Path

#: The largest list file read (64 MiB: millions of ids, never a whole model or feature file by mistake).
MAX_LIST_BYTES = 64 << 20


def nonblank_lines(path: str | os.PathLike, *, label: str, missing: str | None = None,
                   max_bytes: int = MAX_LIST_BYTES) -> list[str]:
    """The stripped, non-blank lines of ``path`` (UTF-8, a BOM allowed); ``label`` starts every message and
    ``missing`` replaces the one for a path that is not a file.

    >>> import pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "ids.txt"
    >>> _ = p.write_text(chr(10).join(["a", "", " b "]))
    >>> nonblank_lines(p, label="--ids")
    ['a', 'b']
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(missing or f"{label}: {path} not found")
    size = path.stat().st_size
    if size > max_bytes:
        raise ValueError(f"{label}: {path} is {size:,} bytes, more than the {max_bytes:,} a list file may hold")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{label}: {path} is not UTF-8 text (byte {exc.start})") from None
    return [line.strip() for line in text.splitlines() if line.strip()]
