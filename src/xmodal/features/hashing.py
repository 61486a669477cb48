"""SHA-256 of weight and processor files (the encoders' identity, :mod:`xmodal.features.identity`),
read 1 MiB at a time and cached while a file's size, mtime and inode stay the same."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

_HASHES: dict[tuple, str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file, read 1 MiB at a time; cached while the file's size, mtime and inode stay."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _HASHES:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]


def files_sha256(paths: list[Path]) -> str | None:
    """One file: its SHA-256 (what ``sha256sum FILE`` prints); several: the SHA-256 of their ``sha256sum``
    lines (``HASH  NAME``, sorted by name); none: None."""
    paths = sorted(paths, key=lambda p: p.name)
    if not paths:
        return None
    if len(paths) == 1:
        return file_sha256(paths[0])
    lines = "".join(f"{file_sha256(p)}  {p.name}\n" for p in paths)
    return hashlib.sha256(lines.encode()).hexdigest()
