"""What a W&B run stream holds, read back from its ``.wandb`` transaction log (no W&B API, no network).

A W&B run writes every record it is given to ``RUN/wandb/offline-run-<time>-<id>/run-<id>.wandb`` (online
runs too: ``run-<time>-<id>``) in the LevelDB log format: a 7-byte header (``:W&B``, a version), then
32 KiB blocks of records, each ``crc32c (4) | length (2) | type (1) | data``, type 1 a whole record, 2 / 3
/ 4 the first / middle / last piece of one split across blocks; the data is a ``wandb_internal_pb2.Record``.

A process killed (or a disk filled) while writing leaves a torn record at the end: :func:`scan` stops at
the first record that does not parse and reports where the whole records end, and :func:`repair` cuts
the file there, so ``wandb sync`` and a resumed run read every step that reached the disk. The CRC is not
checked (Python has no CRC-32C); a torn tail is found by its length running past the file or its bytes
not parsing.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, Iterator

BLOCK = 32768
HEADER = 7
_KINDS = (1, 2, 3, 4)


def _check(path: Any, name: str = "path") -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a .wandb file path, got {type(path).__name__}")
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{name}: {p} is not a file")
    if p.suffix != ".wandb":
        raise ValueError(f"{name}: expected a W&B run file (run-ID.wandb), got {p.name[:80]!r}")
    return p


def records(path: str | os.PathLike) -> Iterator[tuple[Any, int]]:
    """``(record, end)`` of each whole record of a ``.wandb`` file, read block by block (memory: one block and
    one record), ``end`` the byte offset where it ends; stops at the first torn or unparsable record."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    p = _check(path)
    size = p.stat().st_size
    with open(p, "rb") as f:
        if f.read(4) != b":W&B" or size < HEADER:
            return
        f.seek(HEADER)
        pos, buf = HEADER, b""
        while pos + 7 <= size:
            left = BLOCK - pos % BLOCK
            if left < 7:  # a block's tail too short for a header is padding
                pos += left
                f.seek(pos)
                continue
            head = f.read(7)
            _crc, length, kind = struct.unpack("<IHB", head)
            if kind not in _KINDS or pos + 7 + length > size or length > left - 7:
                return  # zeros after the end, or a torn record
            chunk = f.read(length)
            pos += 7 + length
            if kind == 2:
                buf = chunk
                continue
            if kind == 3:
                buf += chunk
                if len(buf) > 64 << 20:  # no record of a run is this large
                    return
                continue
            raw, buf = (chunk, b"") if kind == 1 else (buf + chunk, b"")
            rec = pb.Record()
            try:
                rec.ParseFromString(raw)
            except DecodeError:
                return
            yield rec, pos


def scan(path: str | os.PathLike) -> tuple[int, int]:
    """``(count, end)``: how many whole records a ``.wandb`` file holds and the byte offset where the last of
    them ends (the file's size when nothing is torn)."""
    p = _check(path)
    with open(p, "rb") as f:
        if f.read(4) != b":W&B" or p.stat().st_size < HEADER:
            return 0, 0  # not a W&B file: nothing to keep, nothing to cut
    count, end = 0, HEADER
    for _, end in records(p):
        count += 1
    return count, end


def streams(folder: str | os.PathLike, run_id: str) -> list[Path]:
    """The ``.wandb`` files of run ``run_id`` under ``folder`` (``RUN/wandb``), oldest stream first."""
    import re

    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder: expected a folder path, got {type(folder).__name__}")
    if not isinstance(run_id, str) or not re.fullmatch(r"[a-z0-9]{1,64}", run_id):
        raise ValueError(f"run_id: expected a W&B run id (lower-case letters and digits), got {str(run_id)[:40]!r}")
    found = [p / f"run-{run_id}.wandb" for p in Path(folder).glob(f"*-{run_id}")
             if p.is_dir() and not p.is_symlink() and p.name.startswith(("offline-run-", "run-"))]
    return sorted((p for p in found if p.is_file()), key=lambda p: p.parent.name.split("-", 2)[-1])


def repair(path: str | os.PathLike) -> bool:
    """Cut a torn record off the end of a ``.wandb`` file; True when something was cut."""
    p = _check(path)
    _, end = scan(p)
    if end and end < p.stat().st_size:
        os.truncate(p, end)
        return True
    return False


def history(path: str | os.PathLike) -> Iterator[tuple[int, str, Any]]:
    """``(step, key, value)`` of every history item of one ``.wandb`` file (``_step`` ... excluded)."""
    import json

    for rec, _ in records(path):
        if rec.WhichOneof("record_type") != "history":
            continue
        step = rec.history.step.num
        for item in rec.history.item:
            key = item.key or "/".join(item.nested_key)
            if not key.startswith("_"):
                yield step, key, json.loads(item.value_json)


__all__ = ["records", "scan", "streams", "repair", "history"]
