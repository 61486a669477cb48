"""Loader for the paired-split directory layout (that of ``../shared/data/flickr8k``).

A split ``S`` in directory ``root`` consists of::

    S_image_features.npy  or  S_video_features.npy   [N, Dv] or [N, F, Dv] float
    S_caption_features.npy                            [M, Dt] float
    S_caption_to_image.npy  or  S_caption_to_video.npy  [M] int, row of each caption's item
    S_captions.tsv        (optional) header + one row per caption, caption text last column
    S_image_labels.npy / S_video_labels.npy, S_caption_labels.npy  (optional) int class ids
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from xmodal.data.types import PairedSplit


def _load_npy(path: Path) -> np.ndarray:
    if not path.is_file():
        raise ValueError(f"{path}: file not found")
    try:
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"{path}: not a readable .npy array ({exc})") from None
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"{path}: expected a single .npy array, got {type(arr).__name__}")
    return arr


def _first_existing(root: Path, names: list[str]) -> Path:
    for name in names:
        if (root / name).is_file():
            return root / name
    raise ValueError(f"{root / names[0]}: file not found (also looked for {', '.join(names[1:])})")


def _features(path: Path, ndims: tuple[int, ...]) -> np.ndarray:
    arr = _load_npy(path)
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{path}: expected floating features, got dtype {arr.dtype}")
    if arr.ndim not in ndims:
        want = " or ".join(f"{d}-d" for d in ndims)
        raise ValueError(f"{path}: expected a {want} array, got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[-1] == 0:
        raise ValueError(f"{path}: empty array, shape {arr.shape}")
    arr = arr.astype(np.float32)  # always a fresh array (float16 storage -> float32)
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(f"{path}: contains {int(bad.sum())} NaN/inf value(s)")
    return arr


def _labels(path: Path, n: int) -> np.ndarray | None:
    if not path.is_file():
        return None
    arr = _load_npy(path)
    if arr.shape != (n,) or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{path}: expected {n} integer labels, got shape {arr.shape} dtype {arr.dtype}")
    return arr.astype(np.int64)


def read_captions(path: str | os.PathLike) -> list[str]:
    """Caption strings of a ``.tsv`` (header line, caption text in the last column)
    or a ``.txt`` (one caption per line)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: file not found")
    try:
        return _read_captions(path)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a UTF-8 text file (byte {exc.start}: {exc.reason})") from None


def _read_captions(path: Path) -> list[str]:
    with open(path, encoding="utf-8", newline="") as f:
        if path.suffix.lower() == ".tsv":
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
            if not rows:
                raise ValueError(f"{path}: empty file")
            header, body = rows[0], rows[1:]
            bad = [i + 2 for i, r in enumerate(body) if len(r) != len(header)]
            if bad:
                raise ValueError(f"{path}: line {bad[0]} has a different number of columns than the header")
            return [r[-1] for r in body]
        return [line.rstrip("\r\n") for line in f]


def load_paired_split(root: str | os.PathLike, split: str, *, captions: bool = True) -> PairedSplit:
    """Load split ``split`` of a paired-split directory (module docstring layout).

    Args:
        root: the directory, e.g. ``"../shared/data/flickr8k"``.
        split: the split prefix, e.g. ``"train"`` or ``"dev"``.
        captions: read ``{split}_captions.tsv`` when present.

    Returns:
        A :class:`PairedSplit` with float32 features (float16 storage is upcast),
        ``text_to_video`` int64, and labels/captions when their files exist.

    Raises:
        ValueError: naming the file, for a missing file, a corrupt ``.npy``, wrong
            shapes, mismatched counts, caption -> item indices out of range, or
            NaN/inf features.
    """
    root = Path(root)
    if not isinstance(split, str) or not split:
        raise ValueError(f"split: expected a non-empty string, got {split!r}")
    if not root.is_dir():
        raise ValueError(f"{root}: data directory not found")
    vpath = _first_existing(root, [f"{split}_image_features.npy", f"{split}_video_features.npy"])
    video = _features(vpath, (2, 3))
    tpath = root / f"{split}_caption_features.npy"
    text = _features(tpath, (2,))
    mpath = _first_existing(root, [f"{split}_caption_to_image.npy", f"{split}_caption_to_video.npy"])
    t2v = _load_npy(mpath)
    if t2v.ndim != 1 or not np.issubdtype(t2v.dtype, np.integer):
        raise ValueError(f"{mpath}: expected a 1-d integer array, got shape {t2v.shape} dtype {t2v.dtype}")
    if t2v.shape[0] != text.shape[0]:
        raise ValueError(f"{mpath}: {t2v.shape[0]} entries but {tpath.name} has {text.shape[0]} captions")
    if t2v.size and (t2v.min() < 0 or t2v.max() >= video.shape[0]):
        raise ValueError(f"{mpath}: caption -> item indices must lie in [0, {video.shape[0]}) "
                         f"({vpath.name} rows), got range [{t2v.min()}, {t2v.max()}]")
    item = "image" if vpath.name.endswith("_image_features.npy") else "video"
    video_labels = _labels(root / f"{split}_{item}_labels.npy", video.shape[0])
    text_labels = _labels(root / f"{split}_caption_labels.npy", text.shape[0])
    caps = None
    cpath = root / f"{split}_captions.tsv"
    if captions and cpath.is_file():
        caps = read_captions(cpath)
        if len(caps) != text.shape[0]:
            raise ValueError(f"{cpath}: {len(caps)} captions but {tpath.name} has {text.shape[0]} rows")
    return PairedSplit(video=video, text=text, text_to_video=t2v.astype(np.int64), video_labels=video_labels,
                       text_labels=text_labels, captions=caps, name=f"{root.name}/{split}")
