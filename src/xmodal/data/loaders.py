"""Loader for the paired-split directory layout (:mod:`xmodal.data.layout`,
``docs/data.md``); ``../shared/data/flickr8k`` uses its Flickr8k aliases.

:func:`inspect_split` reads everything it can and lists every problem; the loader
raises them all in one ``ValueError``, ``xmodal data check`` prints them.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import numpy as np

from xmodal._validate import short_repr
from xmodal.data import layout
from xmodal.data.groups import group_problems
from xmodal.data.inputs import padded_rows
from xmodal.data.npyfile import load_array
from xmodal.data.types import (PairedSplit, check_relevancy, nonfinite_rows, rows_text, split_problems,
                               token_mask)


#: Roles whose arrays stay on disk when a split is opened memory-mapped (masks, ids and labels are small).
MAPPED_ROLES = ("video", "text", "experts")


def _load_npy(path: Path, mmap: bool = False) -> np.ndarray:
    """A ``.npy`` array; its header is checked before anything is allocated (:mod:`xmodal.data.npyfile`)."""
    return load_array(path, mmap=mmap)


def read_captions(path: str | os.PathLike) -> list[str]:
    """Caption strings of a ``.tsv`` (header line, caption text in the last column)
    or a ``.txt`` (one caption per line)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: is a directory, not a text file")
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
                  uncaptioned: bool = False, mmap: bool = False) -> tuple[dict[str, Any], list[str]]:
    """Read split ``split`` of ``root`` without raising on its content.

    ``mmap``: video, text and expert features stay on disk, memory-mapped read-only in their
    stored dtype (:func:`~xmodal.data.npyfile.load_array`); every check reads them in row
    blocks. Without it they are read as float32 copies.

    Returns:
        ``(arrays, problems)``: ``arrays`` holds what could be read (keys ``video``,
        ``text``, ``text_mask``, ``text_to_video``, ``video_mask``, ``experts``, ``expert_masks``,
        ``video_labels``, ``text_labels``, ``captions``, ``video_names``, ``relevancy``, ``video_to_group``, ``group_names``;
        float features as float32 copies, or memory-mapped); ``problems`` lists every problem found, one
        message each, naming the file and the rows (and video names) concerned:
        also frame features padded with zeros but without a mask, and a relevancy
        outside ``[0, 1]``.
    """
    root = Path(root)
    if not isinstance(split, str) or not split:
        raise ValueError(f"split: expected a non-empty string, got {short_repr(split)}")
    if not root.is_dir():
        raise ValueError(f"{root}: data directory not found")
    # a folder (or anything but a file) under a layout name: never skipped as if absent
    odd = [p for p in sorted(root.iterdir()) if (layout.parse(p.name) or ("",))[0] == split and not p.is_file()]
    problems = [f"{p}: is a directory, not a file" if p.is_dir() else f"{p}: not a regular file" for p in odd]
    taken = {p.name for p in odd}
    problems += [f"{root / layout.describe(split, role)}: file not found" for role in layout.REQUIRED
                 if layout.find(root, split, role) is None and taken.isdisjoint(layout.names(split, role))]
    out: dict[str, Any] = {"experts": {}, "expert_masks": {}}
    labels: dict[str, str] = {}

    def read(key: str, path: Path | None, label: str) -> None:
        if path is None:
            return
        labels[label] = path.name
        mapped = mmap and key.split(".", 1)[0] in MAPPED_ROLES
        try:
            arr = _load_npy(path, mapped)
        except ValueError as exc:
            problems.append(str(exc))
            return
        if np.issubdtype(arr.dtype, np.floating) and not (mapped and isinstance(arr, np.memmap)):
            arr = arr.astype(np.float32)  # a fresh array: float16 storage -> float32
        if key.startswith("experts.") or key.startswith("expert_masks."):
            group, name = key.split(".", 1)
            out[group][name] = arr
        else:
            out[key] = arr

    for role in ("video", "video_mask", "text", "text_mask", "text_to_video", "video_labels", "text_labels"):
        read(role, layout.find(root, split, role), role)
    if "text_mask" in out:  # bool or 0/1 integers (uint8)
        out["text_mask"] = token_mask(out["text_mask"])
    for name, path in layout.expert_files(root, split).items():
        read(f"experts.{name}", path, f"video.{name}")
        read(f"expert_masks.{name}", layout.expert_mask_file(root, split, name), f"video_mask.{name}")
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
    vnames = out.get("video_names")
    if any(k in out for k in ("video", "text", "text_to_video")):
        problems += split_problems(out.get("video"), out.get("text"), out.get("text_to_video"),
                                   video_mask=out.get("video_mask"), experts=out["experts"],
                                   expert_masks=out["expert_masks"], video_labels=out.get("video_labels"),
                                   text_labels=out.get("text_labels"), labels=labels, uncaptioned=uncaptioned,
                                   video_names=vnames, text_mask=out.get("text_mask"))
    problems += _padding_problems(root, split, out, labels)
    rel_path = layout.find(root, split, "relevancy")  # optional [T, V] graded relevancy (EPIC-100 MIR)
    if rel_path is not None:
        try:
            rel = _load_npy(rel_path)
            t, v = out.get("text"), out.get("video")
            if isinstance(t, np.ndarray) and t.ndim == 2 and isinstance(v, np.ndarray) and v.ndim in (2, 3):
                out["relevancy"] = check_relevancy(rel, t.shape[0], v.shape[0], str(rel_path))
        except (ValueError, TypeError) as exc:
            problems.append(str(exc))
    return out, problems


def _padding_problems(root: Path, split: str, out: dict, labels: dict) -> list[str]:
    """Frame features that end in zero (or non-finite) frames with no mask file: padding that
    would be averaged in as real frames. One problem per array, naming its rows and videos."""
    problems = []
    arrays = [("video", "video_mask", out.get("video"), out.get("video_mask"), False)]
    arrays += [(f"video.{k}", f"video_mask.{k}", v, out["expert_masks"].get(k), True)
               for k, v in out["experts"].items()]
    for key, mask_key, x, mask, expert in arrays:
        if (mask is not None or mask_key in labels or not isinstance(x, np.ndarray) or x.ndim not in (2, 3)
                or not np.issubdtype(x.dtype, np.floating) or nonfinite_rows(x)[0]):
            continue  # a mask file (even a broken one), or a problem reported already
        rows = padded_rows(x, missing_rows=expert)
        if rows.size:
            mask_name = (layout.names(split, "video_mask")[0] if not expert
                         else f"{split}_video_mask.{key.split('.', 1)[1]}.npy")
            what = "end in all-zero frames" if x.ndim == 3 else "are all zero"
            problems.append(f"{labels.get(key, key)}: {rows.size} video(s) {what} ({rows_text(rows, out.get('video_names'))}) "
                            f"and there is no {mask_name}: padding would count as real frames; write the mask "
                            f"(True = real frame; 'xmodal data import' writes it)")
    text, tmask = out.get("text"), out.get("text_mask")
    if (tmask is None and "text_mask" not in labels and isinstance(text, np.ndarray) and text.ndim == 3
            and np.issubdtype(text.dtype, np.floating) and not nonfinite_rows(text)[0]):
        rows = padded_rows(text)
        if rows.size:
            problems.append(f"{labels.get('text', 'text')}: {rows.size} text(s) end in all-zero tokens "
                            f"({rows_text(rows)}) and there is no {layout.names(split, 'text_mask')[0]}: padding "
                            f"would count as real tokens; write the mask (True = real token; "
                            f"'xmodal encode text --tokens' writes it)")
    return problems


def load_paired_split(root: str | os.PathLike, split: str, *, captions: bool = True,
                      mmap: bool = True) -> PairedSplit:
    """Load split ``split`` of a paired-split directory (:mod:`xmodal.data.layout`).

    Args:
        root: the directory, e.g. ``"../shared/data/flickr8k"``.
        split: the split prefix, e.g. ``"train"`` or ``"dev"``.
        captions: read ``{split}_texts.tsv`` / ``{split}_captions.tsv`` (and the video
            names) when present.
        mmap: video, text and expert features stay on disk, memory-mapped read-only in
            their stored dtype (float16 stays float16; the trainer gathers and upcasts each
            batch's rows, :mod:`xmodal.training.batches`). ``False``: float32 copies in memory.

    Returns:
        A :class:`PairedSplit` with the features memory-mapped (``mmap``) or as float32 copies,
        ``text_to_video`` int64, the frame mask, the token mask (``S_text_mask.npy``, bool
        or 0/1 integers, beside token features ``[T, L, Dt]``), further experts, labels and names
        when their files exist, and ``relevancy`` from ``{split}_relevancy.npy`` (float
        ``[T, V]`` in ``[0, 1]``) when present.

    Raises:
        ValueError: listing every problem at once, each naming its file: missing
            files, corrupt ``.npy``, wrong shapes or dtypes, mismatched counts, ids out
            of range, NaN/inf in real frames, videos without any real frame.
    """
    arrays, problems = inspect_split(root, split, names=captions, mmap=mmap)
    if problems:
        raise ValueError("; ".join(problems))
    labels = arrays.get("video_labels")
    relevancy = arrays.get("relevancy")
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
                       group_names=arrays.get("group_names") if arrays.get("video_to_group") is not None else None,
                       text_mask=arrays.get("text_mask"))
