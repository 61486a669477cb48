"""Writing a :class:`~xmodal.data.PairedSplit` as the file layout (:mod:`xmodal.data.layout`),
so that :func:`~xmodal.data.load_paired_split` reads back an equal split.

Every file goes through a temporary name renamed at the end (no half-written ``.npy``).
Canonical names are written (``S_video_features.npy``, ``S_texts.tsv``, ...); optional
parts only when the split has them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from xmodal.data import layout


def _replace_into(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _npy(path: Path, array: np.ndarray) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # np.save on a path would append ".npy" to the temporary name
            np.save(f, np.asarray(array), allow_pickle=False)
    _replace_into(path, write)


def _text(path: Path, text: str) -> None:
    _replace_into(path, lambda tmp: tmp.write_text(text, encoding="utf-8", newline=""))


def _lines(values: list[str], what: str) -> None:
    for i, v in enumerate(values):
        if any(c in str(v) for c in "\t\r\n"):
            raise ValueError(f"{what}: entry {i} holds a tab or line break, which the layout's text files "
                             f"cannot store")


def save_split(split: Any, root: str | os.PathLike, name: str) -> list[Path]:
    """Write ``split`` as split ``name`` under ``root`` (created); returns the files written.

    Raises:
        ValueError: a bad split name, or captions / video names holding tabs or line breaks.
    """
    root = Path(root)
    first = lambda role: root / layout.names(name, role)[0]  # noqa: E731  (canonical file name)
    root.mkdir(parents=True, exist_ok=True)
    files: dict[Path, Any] = {first("video"): split.video, first("text"): split.text,
                              first("text_to_video"): np.asarray(split.text_to_video, dtype=np.int64)}
    optional = {"video_mask": split.video_mask, "video_labels": split.video_labels,
                "text_labels": split.text_labels, "relevancy": split.relevancy}
    for role in ("video_to_group", "text_mask"):  # roles other modules add to the layout and the split
        if role in layout.ROLES and getattr(split, role, None) is not None:
            optional[role] = getattr(split, role)
    for role, value in optional.items():
        if value is not None:
            files[first(role)] = value
    for expert, value in split.experts.items():
        files[root / f"{name}_video_features.{layout.check_expert_name(expert)}.npy"] = value
    for expert, value in split.expert_masks.items():
        files[root / f"{name}_video_mask.{layout.check_expert_name(expert)}.npy"] = value
    texts: dict[Path, str] = {}
    if split.captions is not None:
        _lines(split.captions, "captions")
        texts[first("text_names")] = "text\n" + "".join(f"{c}\n" for c in split.captions)
    if split.video_names is not None:
        _lines(split.video_names, "video_names")
        if any(not str(v).strip() for v in split.video_names):
            raise ValueError("video_names: empty names cannot be stored (the layout skips blank lines)")
        texts[first("video_names")] = "".join(f"{v}\n" for v in split.video_names)
    for path, array in files.items():
        _npy(path, array)
    for path, text in texts.items():
        _text(path, text)
    return sorted([*files, *texts])
