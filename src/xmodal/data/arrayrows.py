"""One features array for a whole collection, as ``xmodal encode images --out feats.npy`` writes it:
row ``i`` is the ``i``-th image of the list it was encoded from (``--list LIST``, else the image files
of ``--dir`` sorted by name). ``data import PAIRS --features feats.npy --ids LIST_OR_DIR`` names the
rows by that same list, so each table id finds its row without splitting the array into files (and
the sidecar ``feats.npy.encoder.json`` stays the layout's encoder record).

An id is an image's file stem (``1000268201_693b08cb0e`` for ``1000268201_693b08cb0e.jpg``); the
file name with its extension finds the same row.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from xmodal._validate import short_repr

__all__ = ["ArrayRow", "array_rows", "is_array_file"]


class ArrayRow:
    """Row ``row`` of the ``[N, D]`` array in ``path`` (memory-mapped): one item's features; ``name``
    is the item's id (its file stem), whichever spelling of it the table used."""

    __slots__ = ("path", "row", "array", "name")

    def __init__(self, path: Path, row: int, array: np.ndarray, name: str) -> None:
        if isinstance(row, (bool, np.bool_)) or not isinstance(row, (int, np.integer)) or row < 0:
            from xmodal._validate import short_repr

            raise TypeError(f"row: expected a row index (a non-negative integer), got {short_repr(row)}")
        self.path, self.row, self.array, self.name = path, int(row), array, name

    @property
    def dim(self) -> int:
        return int(self.array.shape[1])

    def read(self) -> np.ndarray:
        """float ``[1, D]``."""
        return np.asarray(self.array[self.row:self.row + 1])

    def __str__(self) -> str:
        return f"{self.path} row {self.row}"



def is_array_file(features: object) -> bool:
    """Whether ``--features`` names one ``.npy`` file (not a folder or a glob)."""
    if not isinstance(features, (str, os.PathLike)):
        return False
    p = Path(features)
    return p.suffix.lower() == ".npy" and p.is_file() and not any(c in str(features) for c in "*?[")


def _ids(source: str | os.PathLike) -> list[str]:
    """File names from ``--ids``: a list file (one per line) or a folder (its image files, sorted)."""
    from xmodal.features.encoders import list_images

    p = Path(source)
    if p.is_dir():
        names = [q.name for q in list_images(p)]
        if not names:
            raise ValueError(f"--ids: {p} holds no image file")
        return names
    from xmodal._files.textfile import nonblank_lines

    names = nonblank_lines(p, label="--ids", missing=f"--ids: {p} not found (give the --list file or the --dir folder "
                                                     f"given to 'xmodal encode images')")
    if not names:
        raise ValueError(f"--ids: {p} names no item")
    return names


def array_rows(features: str | os.PathLike, ids: str | os.PathLike | None, items: list[str], *,
               allow_missing: bool = False) -> dict[str, ArrayRow | None]:
    """``{item id: ArrayRow}`` for the table's ``items``; every id without a row named in one line
    (``allow_missing``: mapped to None instead).

    Raises:
        ValueError: no ``ids``, a list whose length is not the array's row count, a name listed
            twice, or (without ``allow_missing``) table ids the list does not hold.
    """
    from xmodal.data.npyfile import load_array

    path = Path(features)
    if ids is None:
        raise ValueError(f"--ids: {path} is one array; give the --list file (or the --dir folder) it was encoded "
                         f"from with --ids, so that each row has its image's name")
    array = load_array(path, f"--features: {path}", mmap=True)
    if array.ndim != 2 or 0 in array.shape or not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"--features: {path}: expected float [N, D] (one row per item), got shape "
                         f"{list(array.shape)} dtype {array.dtype}")
    names = _ids(ids)
    if len(names) != array.shape[0]:
        raise ValueError(f"--ids: {ids} names {len(names)} item(s), but {path} holds {array.shape[0]} rows")
    where: dict[str, int] = {}
    for i, name in enumerate(names):
        for key in dict.fromkeys((name, Path(name).stem)):
            if key in where and where[key] != i:
                raise ValueError(f"--ids: {ids}: {key!r} names rows {where[key]} and {i}")
            where[key] = i
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        raise TypeError(f"items: expected a list of ids, got {short_repr(items)}")
    found = {v: (ArrayRow(path, where[v], array, Path(names[where[v]]).stem) if v in where else None)
             for v in items}
    missing = [v for v, r in found.items() if r is None]
    if missing and not allow_missing:
        raise ValueError(f"--features: no row for {len(missing)} item(s) of the table in {path} (names from {ids}): "
                         f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    return found
