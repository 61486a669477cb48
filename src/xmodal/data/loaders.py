"""Loader for the paired-split directory layout (:mod:`xmodal.data.layout`,
``README.md, "Your data"``); ``../shared/data/flickr8k`` uses its Flickr8k aliases.

:func:`inspect_split` reads everything it can and lists every problem; the loader
raises them all in one ``ValueError``, ``xmodal data check`` prints them.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import numpy as np

from xmodal.data import layout
from xmodal.data.groups import group_problems
from xmodal.data.types import PairedSplit, check_relevancy, split_problems


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


def inspect_split(root: str | os.PathLike, split: str, *, names: bool = True,
                  uncaptioned: bool = False) -> tuple[dict[str, Any], list[str]]:
    """Read split ``split`` of ``root`` without raising on its content.

    Returns:
        ``(arrays, problems)``: ``arrays`` holds what could be read (keys ``video``,
        ``text``, ``text_to_video``, ``video_mask``, ``experts``, ``expert_masks``,
        ``video_labels``, ``text_labels``, ``captions``, ``video_names``,
        ``video_to_group``, ``group_names``; float
        features as float32 copies); ``problems`` lists every problem found, one
        message each, naming the file.
    """
    root = Path(root)
    if not isinstance(split, str) or not split:
        raise ValueError(f"split: expected a non-empty string, got {split!r}")
    if not root.is_dir():
        raise ValueError(f"{root}: data directory not found")
    problems = [f"{root / m}: file not found" for m in layout.missing_files(root, split)]
    out: dict[str, Any] = {"experts": {}, "expert_masks": {}}
    labels: dict[str, str] = {}

    def read(key: str, path: Path | None, label: str) -> None:
        if path is None:
            return
        labels[label] = path.name
        try:
            arr = _load_npy(path)
        except ValueError as exc:
            problems.append(str(exc))
            return
        if np.issubdtype(arr.dtype, np.floating):
            arr = arr.astype(np.float32)  # a fresh array: float16 storage -> float32
        if key.startswith("experts.") or key.startswith("expert_masks."):
            group, name = key.split(".", 1)
            out[group][name] = arr
        else:
            out[key] = arr

    for role in ("video", "video_mask", "text", "text_to_video", "video_labels", "text_labels"):
        read(role, layout.find(root, split, role), role)
    for name, path in layout.expert_files(root, split).items():
        read(f"experts.{name}", path, f"video.{name}")
        read(f"expert_masks.{name}", layout.expert_mask_file(root, split, name), f"video_mask.{name}")
    if any(k in out for k in ("video", "text", "text_to_video")):
        problems += split_problems(out.get("video"), out.get("text"), out.get("text_to_video"),
                                   video_mask=out.get("video_mask"), experts=out["experts"],
                                   expert_masks=out["expert_masks"], video_labels=out.get("video_labels"),
                                   text_labels=out.get("text_labels"), labels=labels, uncaptioned=uncaptioned)
    group_path = layout.find(root, split, "video_to_group")
    read("video_to_group", group_path, "video_to_group")
    if "video_to_group" in out:
        n = out["video"].shape[0] if isinstance(out.get("video"), np.ndarray) and out["video"].ndim else None
        problems += group_problems(out["video_to_group"], n, str(group_path))
    names_path = layout.find(root, split, "group_names")
    if names_path is not None and names:
        if group_path is None:
            problems.append(f"{names_path}: group names without {layout.describe(split, 'video_to_group')}")
        else:
            try:
                values = [v for v in read_captions(names_path) if v.strip()]
            except ValueError as exc:
                problems.append(str(exc))
                values = None
            g = out.get("video_to_group")
            count = int(g[-1]) + 1 if isinstance(g, np.ndarray) and g.ndim == 1 and g.size else None
            if values is not None and count is not None and len(values) != count:
                problems.append(f"{names_path}: {len(values)} names but {group_path.name} has {count} groups")
            elif values is not None:
                out["group_names"] = values
    for role, key, count_key in (("text_names", "captions", "text"), ("video_names", "video_names", "video")):
        path = layout.find(root, split, role)
        if not names or path is None:
            continue
        try:
            values = read_captions(path)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if path.suffix == ".txt":
            values = [v for v in values if v.strip()] if role == "video_names" else values
        n = out[count_key].shape[0] if isinstance(out.get(count_key), np.ndarray) and out[count_key].ndim else None
        if n is not None and len(values) != n:
            what = "captions" if role == "text_names" else "names"
            problems.append(f"{path}: {len(values)} {what} but {labels.get(count_key, count_key)} has {n} rows")
        else:
            out[key] = values
    return out, problems


def load_paired_split(root: str | os.PathLike, split: str, *, captions: bool = True) -> PairedSplit:
    """Load split ``split`` of a paired-split directory (:mod:`xmodal.data.layout`).

    Args:
        root: the directory, e.g. ``"../shared/data/flickr8k"``.
        split: the split prefix, e.g. ``"train"`` or ``"dev"``.
        captions: read ``{split}_texts.tsv`` / ``{split}_captions.tsv`` (and the video
            names) when present.

    Returns:
        A :class:`PairedSplit` with float32 features (float16 storage is upcast),
        ``text_to_video`` int64, the frame mask, further experts, labels and names
        when their files exist, and ``relevancy`` from ``{split}_relevancy.npy`` (float
        ``[T, V]`` in ``[0, 1]``) when present.

    Raises:
        ValueError: listing every problem at once, each naming its file: missing
            files, corrupt ``.npy``, wrong shapes or dtypes, mismatched counts, ids out
            of range, NaN/inf in real frames, videos without any real frame.
    """
    arrays, problems = inspect_split(root, split, names=captions)
    if problems:
        raise ValueError("; ".join(problems))
    labels = arrays.get("video_labels")
    relevancy = None
    rel_path = layout.find(root, split, "relevancy")  # optional [T, V] graded relevancy (EPIC-100 MIR)
    if rel_path is not None:
        try:
            relevancy = check_relevancy(_load_npy(rel_path), arrays["text"].shape[0], arrays["video"].shape[0],
                                        str(rel_path))
        except TypeError as exc:
            raise ValueError(str(exc)) from None
    return PairedSplit(video=arrays["video"], text=arrays["text"],
                       text_to_video=arrays["text_to_video"].astype(np.int64),
                       video_labels=None if labels is None else labels.astype(np.int64),
                       text_labels=None if arrays.get("text_labels") is None
                       else arrays["text_labels"].astype(np.int64),
                       captions=arrays.get("captions"), name=f"{Path(root).name}/{split}",
                       video_mask=arrays.get("video_mask"), experts=arrays["experts"],
                       expert_masks=arrays["expert_masks"], video_names=arrays.get("video_names"),
                       relevancy=relevancy,
                       video_to_group=None if arrays.get("video_to_group") is None
                       else arrays["video_to_group"].astype(np.int64),
                       group_names=arrays.get("group_names") if arrays.get("video_to_group") is not None else None)
