"""``xmodal data check``: every problem of a data directory, within and across splits.

Per split, :func:`xmodal.data.loaders.inspect_split` lists what the loader would refuse.
Across splits this module adds what costs hours later: feature sizes (main features,
experts, texts) that differ from the training split's (a run trained on one cannot embed
the other), experts present in one split and not another, videos shared by two splits
(leakage, by video name and by identical feature rows), clips of one long video (group name,
``S_groups.txt``) in two splits, split names the config does not
read (``Train``, ``validation``), and splits whose frame axis is set by one long video.

Memory: the feature files are opened memory-mapped in their stored dtype and every check reads them
in row blocks (:func:`xmodal.data.types.row_blocks`), the identical-rows check included (a 16-byte hash
per row of its float32 values, so a float16 file and its float32 copy match), so the peak does not grow
with the size of the features (``bench/long_runs.py --only check`` measures it at 1M clips).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from xmodal._validate import short_repr
from xmodal.data import layout
from xmodal.data.groups import group_problems, shared_groups

#: the split names of the default config (``data.train_split`` / ``val_split`` / ``test_split``).
DEFAULT_SPLITS = ("train", "val", "test")

__all__ = ["check_directory", "cross_split_problems", "split_name_notes", "frames_note", "summarize",
           "check_same_sizes"]


def split_name_notes(names: list[str], configured: tuple[str, ...] = DEFAULT_SPLITS) -> list[str]:
    """One note per split name that is not a configured one (``Train``, ``validation``).

    >>> split_name_notes(["train", "Train"])[0][:40]
    "split 'Train' differs from 'train' only "
    """
    _strings(names, "names")
    configured = _strings(configured, "configured")
    notes = []
    for name in names:
        if name in configured:
            continue
        near = next((c for c in configured if c.lower() == name.lower()), None)
        hint = f"differs from {near!r} only in case" if near else f"is not one of {', '.join(configured)}"
        notes.append(f"split {name!r} {hint}: training reads data.train_split / val_split / test_split "
                     f"(here {', '.join(configured)}); rename its files or set those keys")
    return notes


def _strings(v: Any, name: str) -> tuple[str, ...]:
    if isinstance(v, str) or not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
        raise TypeError(f"{name}: expected a list of strings, got {short_repr(v)}")
    return tuple(v)


def _path(v: Any, name: str) -> str | os.PathLike:
    if not isinstance(v, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a path, got {short_repr(v)}")
    return v


def frames_note(lengths: Any, names: list[str] | None = None) -> str | None:
    """A note when one video sets a split's frame axis: the longest video has at least twice
    the frames of the next longest and padding fills over half of the frame array.

    >>> frames_note([1000, 40, 30, 20], ["long", "a", "b", "c"])[:52]
    "the longest video ('long', 1000 frames, row 0) is 25"
    """
    from xmodal._validate import int_array

    lengths = int_array(np.atleast_1d(np.asarray(lengths)) if not hasattr(lengths, "detach") else lengths,
                        "lengths", ndim=1)
    if lengths.size and lengths.min() < 0:
        raise ValueError(f"lengths: frame counts must be >= 0, got {lengths.min()}")
    if names is not None:
        names = _strings(names, "names")
    if lengths.size < 2:
        return None
    order = np.argsort(-lengths, kind="stable")
    first, second = int(lengths[order[0]]), int(lengths[order[1]])
    if first < 8 or first < 2 * max(second, 1):
        return None
    padding = 1.0 - lengths.sum() / (first * lengths.size)
    if padding <= 0.5:
        return None
    who = repr(names[order[0]]) + ", " if names is not None and len(names) == lengths.size else ""
    return (f"the longest video ({who}{first} frames, row {int(order[0])}) is {first / max(second, 1):.0f}x the "
            f"next longest ({second}): every video is padded to {first} frames ({100 * padding:.0f}% of the "
            f"frame array is padding); re-import with --max-frames {second} (uniform sampling)")


def _frame_lengths(arrays: dict) -> np.ndarray | None:
    video, mask = arrays.get("video"), arrays.get("video_mask")
    if isinstance(video, np.ndarray) and video.ndim == 3 and isinstance(mask, np.ndarray) \
            and mask.shape == video.shape[:2] and mask.dtype == np.bool_:
        return mask.sum(1)
    return None


def _dims(root: Path, split: str, arrays: dict) -> dict[str, tuple[int, str]]:
    """``{what: (feature size, file name)}`` of one split's readable arrays."""
    out = {}
    for key, role in (("video", "video"), ("text", "text")):
        x = arrays.get(key)
        path = layout.find(root, split, role)
        if isinstance(x, np.ndarray) and x.ndim >= 2 and path is not None:
            out[key] = (int(x.shape[-1]), path.name)
    for name, x in arrays.get("experts", {}).items():
        if isinstance(x, np.ndarray) and x.ndim in (2, 3):
            out[f"expert {name}"] = (int(x.shape[-1]), f"{split}_video_features.{name}.npy")
    return out


def _row_hashes(x: Any, progress: bool | None = False, desc: str = "data check: hashing rows"
                ) -> tuple[np.ndarray, np.ndarray]:
    """``(hashes, rows)``: a 16-byte hash (``V16``) of each video's feature row as float32 values and the
    row, all-zero rows left out; read in row blocks (``progress``: :func:`xmodal.progress.progress`'s ``show``)."""
    from xmodal.data.types import row_blocks
    from xmodal.progress import progress as reporter

    if not isinstance(x, np.ndarray) or x.ndim not in (2, 3) or not x.size:
        return np.zeros(0, "V16"), np.zeros(0, np.int64)
    hashes, rows = [], []
    with reporter(total=int(x.shape[0]), desc=desc, unit="video", show=progress) as bar:
        for sl in row_blocks(x):
            block = np.asarray(x[sl], dtype=np.float32).reshape(sl.stop - sl.start, -1)
            keep = np.flatnonzero(block.any(1))
            hashes.append(np.frombuffer(b"".join(hashlib.blake2b(block[i].tobytes(), digest_size=16).digest()
                                                 for i in keep), dtype="V16"))
            rows.append(sl.start + keep)
            bar.update(sl.stop - sl.start)
    return np.concatenate(hashes), np.concatenate(rows)


def _shared_rows(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[list, list, int]:
    """``(rows of a, rows of b, count)`` of the feature rows two splits share (each distinct row once, at
    its first row in either split), the first five in ``a``'s row order."""
    (ha, ra), (hb, rb) = a, b
    _, ia, ib = np.intersect1d(ha, hb, return_indices=True)  # the first occurrence of each shared hash
    order = np.argsort(ra[ia], kind="stable")
    return ra[ia][order][:5].tolist(), rb[ib][order][:5].tolist(), int(ia.size)


def cross_split_problems(root: str | os.PathLike, arrays: dict[str, dict],
                         reference: str | None = None, *, progress: bool | None = False) -> list[str]:
    """Problems between splits: feature sizes and experts against ``reference`` (the
    training split; default ``train`` when present, else the first), and shared videos
    (``progress``: the rows hashed, as :func:`xmodal.progress.progress`'s ``show``)."""
    root = Path(_path(root, "root"))
    if not isinstance(arrays, dict) or not all(isinstance(v, dict) for v in arrays.values()):
        raise TypeError(f"arrays: expected {{split: inspected arrays (a dict)}}, got {short_repr(arrays)}")
    if reference is not None and not isinstance(reference, str):
        raise TypeError(f"reference: expected a split name, got {short_repr(reference)}")
    splits = list(arrays)
    if len(splits) < 2:
        return []
    ref = reference if reference in arrays else ("train" if "train" in arrays else splits[0])
    problems = []
    ref_dims = _dims(root, ref, arrays[ref])
    for split in splits:
        if split == ref:
            continue
        dims = _dims(root, split, arrays[split])
        for what, (d, fname) in dims.items():
            if what in ref_dims and ref_dims[what][0] != d:
                problems.append(f"{fname}: feature size {d}, but {ref_dims[what][1]} has {ref_dims[what][0]}: "
                                f"a run trained on {ref!r} cannot embed {split!r}; every split needs the same sizes")
            elif what not in ref_dims and what.startswith("expert "):
                problems.append(f"{fname}: expert {what[7:]!r} is not in split {ref!r} (a run trained there has "
                                f"no tower for it)")
        for what, (d, fname) in ref_dims.items():
            if what.startswith("expert ") and what not in dims:
                problems.append(f"{split}_video_features.{what[7:]}.npy: file not found; split {ref!r} has "
                                f"expert {what[7:]!r} ({fname}) and a run trained there needs it in every split")
    problems += shared_groups({s: arrays[s].get("group_names") for s in splits})
    hashes: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # each split's row hashes, computed once
    for i, a in enumerate(splits):
        for b in splits[i + 1:]:
            na, nb = arrays[a].get("video_names"), arrays[b].get("video_names")
            if na is not None and nb is not None:
                shared = sorted(set(na) & set(nb))
                if shared:
                    rows_a = [na.index(v) for v in shared[:5]]
                    rows_b = [nb.index(v) for v in shared[:5]]
                    problems.append(f"{len(shared)} video(s) are in both {a!r} and {b!r} (leakage): "
                                    f"{', '.join(map(repr, shared[:5]))}{' ...' if len(shared) > 5 else ''} "
                                    f"({a} rows {rows_a}, {b} rows {rows_b})")
                    continue
            for s in (a, b):
                if s not in hashes:
                    hashes[s] = _row_hashes(arrays[s].get("video"), progress, f"data check: hashing {s} videos")
            rows_a, rows_b, count = _shared_rows(hashes[a], hashes[b])
            if count:
                problems.append(f"{count} video(s) of {a!r} and {b!r} have identical features (leakage?): "
                                f"{a} rows {rows_a}, {b} rows {rows_b}{' ...' if count > 5 else ''}")
    return problems


def check_directory(root: str | os.PathLike, splits: list[str] | None = None,
                    configured: tuple[str, ...] | None = None, *, progress: bool | None = False) -> dict[str, Any]:
    """Inspect every split of ``root`` and the splits against each other.

    Args:
        root: the data directory.
        splits: the splits to check (default: every split found).
        configured: the config's split names (train, val, test first); default
            :data:`DEFAULT_SPLITS`. Names differing from one only in case are problems;
            other unconfigured names are notes.
        progress: where the long steps are (the splits inspected, the rows hashed), as
            :func:`xmodal.progress.progress`'s ``show`` (False: silent; None: a bar on a terminal, else a
            line every 30 s with the count, fraction, rate and time left).

    Returns:
        ``{"problems": {split: [...]}, "summaries": {split: [...]}, "across": [...],
        "notes": [...]}``: every problem names its file, and rows / videos where it has them.
    """
    from xmodal.data.loaders import inspect_split

    root = Path(_path(root, "root"))
    if not root.is_dir():
        raise ValueError(f"root: data directory {root} not found")
    configured = DEFAULT_SPLITS if configured is None else _strings(configured, "configured") or DEFAULT_SPLITS
    found = layout.splits_in(root) if splits is None else list(_strings(splits, "splits"))
    found = found or layout.splits_in(root)
    if not found:
        raise ValueError(f"root: no split in {root} (no *_text_to_video.npy or alias; see docs/data.md "
                         f"section 'Your data')")
    problems, summaries, arrays = {}, {}, {}
    from xmodal.progress import progress as reporter

    with reporter(total=len(found), desc="data check: inspecting", unit="split", show=progress) as bar:
        for split in found:
            bar.set_postfix_str(split)
            arrays[split], problems[split] = inspect_split(root, split, uncaptioned=True, mmap=True)
            summaries[split] = summarize(arrays[split])
            bar.update(1)
    across = cross_split_problems(root, arrays, configured[0], progress=progress)
    notes = []
    for note in split_name_notes(found, configured):
        (across if "only in case" in note else notes).append(note)
    for split in found:
        lengths = _frame_lengths(arrays[split])
        note = None if lengths is None else frames_note(lengths, arrays[split].get("video_names"))
        if note:
            notes.append(f"{split}: {note}")
    return {"problems": problems, "summaries": summaries, "across": across, "notes": notes}


def _stats(values: np.ndarray) -> str:
    if values.size == 0:
        return "-"
    return f"min {values.min()}, median {float(np.median(values)):g}, max {values.max()}"


def summarize(arrays: dict) -> list[str]:
    """Counts, frames per video and captions per video of one inspected split."""
    from xmodal.data.types import present_rows

    if not isinstance(arrays, dict):
        raise TypeError(f"arrays: expected the dict of one inspected split, got {short_repr(arrays)}")
    video, text, t2v = arrays.get("video"), arrays.get("text"), arrays.get("text_to_video")
    lines = []
    if isinstance(video, np.ndarray) and video.ndim in (2, 3):
        n = video.shape[0]
        mask = arrays.get("video_mask")
        if video.ndim == 2:
            frames = "1 (no frame axis)"
        elif isinstance(mask, np.ndarray) and mask.shape == video.shape[:2]:
            frames = _stats(mask.sum(1)) + f" (padded to {video.shape[1]})"
        else:
            frames = f"{video.shape[1]} (no mask)"
        lines.append(f"videos {n}, feature dim {video.shape[-1]}, frames per video: {frames}")
        for name, feats in arrays.get("experts", {}).items():
            m = arrays.get("expert_masks", {}).get(name)
            ok = isinstance(m, np.ndarray) and m.shape in (feats.shape[:1], feats.shape[:2]) and m.dtype == bool
            here = int(present_rows(m, feats.shape[0]).sum()) if ok or m is None else "?"
            lines.append(f"expert {name}: shape {list(feats.shape)}, present for {here} of {feats.shape[0]} videos")
        if isinstance(t2v, np.ndarray) and t2v.ndim == 1 and np.issubdtype(t2v.dtype, np.integer) and (
                t2v.size == 0 or (t2v.min() >= 0 and t2v.max() < n)):
            lines.append(f"captions per video: {_stats(np.bincount(t2v, minlength=n))}")
    if isinstance(text, np.ndarray) and text.ndim == 2:
        lines.append(f"texts {text.shape[0]}, feature dim {text.shape[1]}")
    elif isinstance(text, np.ndarray) and text.ndim == 3:
        tmask = arrays.get("text_mask")
        if isinstance(tmask, np.ndarray) and tmask.shape == text.shape[:2] and tmask.dtype == np.bool_:
            tokens = _stats(tmask.sum(1)) + f" (padded to {text.shape[1]})"
        else:
            tokens = f"{text.shape[1]} (no mask)"
        lines.append(f"texts {text.shape[0]}, feature dim {text.shape[2]}, tokens per text: {tokens}")
    g = arrays.get("video_to_group")
    if isinstance(g, np.ndarray) and g.ndim == 1 and g.size and not group_problems(g, None):  # numbered 0, 1, ...
        sizes = np.bincount(g)
        lines.append(f"groups (long videos) {int(g.max()) + 1}, clips per group: {_stats(sizes[sizes > 0])}")
    if isinstance(arrays.get("relevancy"), np.ndarray):
        r = arrays["relevancy"]
        lines.append(f"relevancy {list(r.shape)}: {int((r > 0).sum())} graded entries > 0, "
                     f"{int((r == 1).sum())} equal to 1")
    return lines


def check_same_sizes(splits: dict[str, Any]) -> None:
    """Raise when a split's feature sizes or experts differ from ``splits["train"]``'s
    (:class:`~xmodal.data.PairedSplit` s; the trainer calls this before epoch 1, so a
    mismatched test split fails at once instead of after training)."""
    from xmodal.data.types import PairedSplit

    if not isinstance(splits, dict) or not all(v is None or isinstance(v, PairedSplit) for v in splits.values()):
        raise TypeError(f"splits: expected {{role: PairedSplit}}, got {short_repr(splits)}")
    ref = splits.get("train")
    if ref is None:
        return
    def sizes(s: Any) -> dict[str, int]:
        return {"video features": int(s.video.shape[-1]), "text features": int(s.text.shape[-1]),
                **{f"expert {k!r}": int(v.shape[-1]) for k, v in s.experts.items()}}

    want, problems = sizes(ref), []
    for role, split in splits.items():
        if role == "train" or split is None:
            continue
        if (split.text.ndim == 3) != (ref.text.ndim == 3):
            kind = lambda s: "token features [T, L, Dt]" if s.text.ndim == 3 else "sentence features [T, Dt]"  # noqa: E731
            problems.append(f"{split.name or role} has {kind(split)}, the training split {ref.name or ''} "
                            f"{kind(ref)}")
        got = sizes(split)
        for what in sorted(set(want) | set(got)):
            if what not in got:
                problems.append(f"{split.name or role} has no {what} (train {ref.name or ''} has size {want[what]})")
            elif what not in want:
                problems.append(f"{split.name or role} has {what} that the training split lacks")
            elif got[what] != want[what]:
                problems.append(f"{split.name or role} has {what} of size {got[what]}, the training split "
                                f"{ref.name or ''} {want[what]}")
    if problems:
        raise ValueError("data: every split needs the training split's feature sizes and experts: "
                         + "; ".join(problems) + " (xmodal data check names the files)")
