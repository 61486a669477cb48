"""Build the paired-split layout from a table of (video, caption[, split]) pairs and
per-video feature files (``xmodal data import``).

Table: a ``.csv`` (header row) or ``.jsonl`` (one object per line) with a video id
column (``video``, ``video_id`` or ``image``), a caption column (``caption`` or
``text``) and optionally ``split``. Feature files: ``DIR/<video id>.npy`` / ``.npz``
or the files a glob matches (stem = video id); each holds ``[D]`` (one vector) or
``[F, D]`` (frames, any ``F``); an ``.npz`` its only array or the one named
``features``. Variable-length videos are zero-padded to the longest and a frame mask
``{split}_video_mask.npy`` is written (``max_frames``: longer videos are first sampled
uniformly, see :func:`sample_frames`). Videos are numbered in order of first appearance
in the table; texts keep the table order.

The layout is built in a temporary folder beside ``out`` and renamed to ``out`` at the
end: a failed import leaves nothing, and a second import into the same ``out`` replaces
every file of the first (splits and experts included). ``out`` may only hold files an
import writes; anything else there is refused, never deleted.

Clips inside long videos (CrossCLR / COOT): a table with a clip column (``clip_id`` or
``clip``) beside ``video_id`` (or ``group``), e.g. ``video_id,clip_id,start,end,caption``,
makes each clip a row of the layout (features ``DIR/<clip id>.npy``) and writes
``{split}_video_to_group.npy`` / ``{split}_groups.txt`` (:mod:`xmodal.data.groups`): clips
grouped by video in order of first appearance, by ``start`` within a video when given.
"""

from __future__ import annotations

import csv
import errno
import glob
import io
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np

from xmodal._validate import positive_int, short_repr, text_label
from xmodal.data import groups, layout
from xmodal.data.check import frames_note, split_name_notes
from xmodal.data.npyfile import load_array

VIDEO_COLUMNS = ("video", "video_id", "image")
TEXT_COLUMNS = ("caption", "text")
#: the layout roles an import writes (canonical names; experts too): the files it owns in ``out``.
IMPORT_ROLES = ("video", "video_mask", "text", "text_to_video", "video_names", "text_names", "video_to_group",
                "group_names")
#: Control characters and every line boundary of ``str.splitlines`` (U+0085, U+2028, U+2029): an id
#: or group name is one line of ``S_videos.txt`` / ``S_groups.txt`` / an index's ``names.txt``.
_BAD_ID = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")

__all__ = ["import_pairs", "import_rows", "read_pairs", "check_video_id", "check_group_name", "feature_files", "sample_frames", "read_features",
           "pad_frames", "pad_expert", "parse_experts", "import_owns"]


def _read_csv(path: Path) -> list[dict]:
    """Rows of a CSV: UTF-8 with or without a byte-order mark (spreadsheet exports),
    delimiter ``,``, ``;`` or tab (detected on the header line)."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        text = f.read()
    header = text.split("\n", 1)[0]
    counts = {d: header.count(d) for d in (",", ";", "\t")}
    delimiter = max(counts, key=lambda d: counts[d]) if any(counts.values()) else ","
    rows = list(csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter))
    return [{(k or "").strip(): v for k, v in r.items()} for r in rows]


def check_video_id(video: str, where: str) -> str:
    """A video id names a file inside ``--features``: no absolute path, ``..`` or control character.

    >>> check_video_id("P01/P01_11", "pairs: pairs.csv line 2")
    'P01/P01_11'
    """
    if not isinstance(video, str):
        raise TypeError(f"{text_label(where, 'where')}: video id {short_repr(video)} is not a string")
    where = text_label(where, "where")
    parts = video.replace("\\", "/").split("/")
    if (_BAD_ID.search(video) or video.startswith(("/", "\\")) or os.path.isabs(video) or ".." in parts
            or re.match(r"^[A-Za-z]:[\\/]", video)):
        raise ValueError(f"{where}: video id {video!r} is not a file name inside --features "
                         f"(no absolute path, '..', control character or line break)")
    return video


def check_group_name(group: str, where: str) -> str:
    """A group (long video) name is one line of ``S_groups.txt``: no control character or line
    break (U+2028 included), not blank.

    >>> check_group_name("P01_11", "pairs: pairs.csv line 2")
    'P01_11'
    """
    where = text_label(where, "where")
    if not isinstance(group, str) or not group.strip() or _BAD_ID.search(group):
        raise ValueError(f"{where}: group (long video) name {short_repr(group, 80)} must be one line of text "
                         f"(no control character or line break)")
    return group


def read_pairs(path: str | os.PathLike) -> list[dict[str, str]]:
    """Rows ``{"video", "caption", "split"?}`` of a ``.csv`` or ``.jsonl`` pairs table.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "pairs.csv"
    >>> _ = p.write_text("video_id,caption\\nv1,a dog runs\\n")
    >>> read_pairs(p)
    [{'video': 'v1', 'caption': 'a dog runs'}]
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"pairs: expected a .csv or .jsonl file path, got {short_repr(path)}")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"pairs: {path} is a directory, not a .csv or .jsonl file")
    if not path.is_file():
        raise ValueError(f"pairs: {path} not found")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        try:
            raw = _read_csv(path)
        except UnicodeDecodeError as exc:
            raise ValueError(f"pairs: {path} is not a UTF-8 text file (byte {exc.start}: {exc.reason})") from None
    elif suffix in (".jsonl", ".ndjson"):
        raw = []
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"pairs: {path} is not a UTF-8 text file (byte {exc.start}: {exc.reason})") from None
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"pairs: {path} line {i} is not JSON ({exc.msg})") from None
                if not isinstance(obj, dict):
                    raise ValueError(f"pairs: {path} line {i} is not a JSON object")
                raw.append(obj)
    else:
        raise ValueError(f"pairs: expected a .csv or .jsonl file, got {path}")
    if not raw:
        raise ValueError(f"pairs: {path} has no rows")
    keys = set(raw[0])
    vcol = next((c for c in VIDEO_COLUMNS if c in keys), None)
    tcol = next((c for c in TEXT_COLUMNS if c in keys), None)
    if vcol is None or tcol is None:
        raise ValueError(f"pairs: {path} needs a video column ({'/'.join(VIDEO_COLUMNS)}) and a caption "
                         f"column ({'/'.join(TEXT_COLUMNS)}); found {sorted(keys)}")
    gcol = None
    ccol = next((c for c in groups.CLIP_COLUMNS if c in keys), None)
    if ccol is not None:  # clips inside long videos: the clip is the row, the video its group
        gcol, vcol = next((c for c in groups.GROUP_COLUMNS if c in keys), vcol), ccol
    rows, bad = [], []
    for i, r in enumerate(raw):
        video, caption = r.get(vcol), r.get(tcol)
        line = i + (2 if suffix == ".csv" else 1)
        if video is None or not str(video).strip() or caption is None or not str(caption).strip():
            bad.append(line)
            continue
        row = {"video": check_video_id(str(video).strip(), f"pairs: {path} line {line}"),
               "caption": " ".join(str(caption).split())}  # no tabs/newlines in the TSV
        if r.get("split") and str(r["split"]).strip():
            row["split"] = str(r["split"]).strip()
        if gcol is not None:
            if r.get(gcol) is None or not str(r[gcol]).strip():
                bad.append(line)
                continue
            row.update(group=check_group_name(str(r[gcol]).strip(), f"pairs: {path} line {line}"),
                       start=str(r.get("start") or ""))
        rows.append(row)
    if bad:
        what = "a video id, caption or group" if gcol else "a video id or caption"
        raise ValueError(f"pairs: {path}: {len(bad)} row(s) without {what} (lines {bad[:5]})")
    return rows


def feature_files(features: str | os.PathLike, videos: list[str], *, flag: str = "--features",
                  allow_missing: bool = False) -> dict[str, Path | None]:
    """``{video id: feature file}`` from a directory or a glob; every missing id is named
    (``allow_missing``: missing ids map to ``None``, e.g. an expert some videos lack)."""
    flag = text_label(flag, "flag")
    if not isinstance(features, (str, os.PathLike)):
        raise TypeError(f"{flag}: expected a directory or a glob, got {short_repr(features)}")
    if not isinstance(videos, list) or not all(isinstance(v, str) for v in videos):
        raise TypeError(f"videos: expected a list of video ids, got {short_repr(videos)}")
    spec = str(features)
    try:
        is_dir = Path(spec).is_dir()
    except (OSError, ValueError) as exc:  # a name too long for the file system
        raise ValueError(f"{flag}: {short_repr(spec)}: {getattr(exc, 'strerror', None) or exc}") from None
    if is_dir:
        for v in videos:
            check_video_id(v, flag)
        lookup = lambda v: next((p for p in (Path(spec) / f"{v}.npy", Path(spec) / f"{v}.npz")  # noqa: E731
                                 if p.is_file()), None)
    else:
        matched = {Path(p).stem: Path(p) for p in sorted(glob.glob(spec)) if p.endswith((".npy", ".npz"))}
        if not matched:
            raise ValueError(f"{flag}: {spec} is neither a directory nor a glob matching .npy/.npz files")
        lookup = matched.get
    found = {v: lookup(v) for v in videos}
    missing = [v for v, p in found.items() if p is None]
    if missing and not allow_missing:
        raise ValueError(f"{flag}: no feature file for {len(missing)} video(s): {', '.join(missing[:5])}"
                         f"{' ...' if len(missing) > 5 else ''} (looked in {spec}){stems_hint(missing)}")
    return found  # type: ignore[return-value]


def stems_hint(missing: list[str]) -> str:
    """What a user most likely got wrong when video ids find no feature file: ids are file stems.

    >>> stems_hint(["clip1.mp4"]).split("; ")[-1]
    "'clip1.mp4' includes its extension: write 'clip1'"
    """
    from xmodal.features.video import VIDEO_EXTENSIONS

    text = ("; a video id is the feature file's name without .npy, i.e. the video's file stem ('clip1' for "
            "clip1.mp4 -> clip1.npy, 'sub/clip1' with 'encode videos --recursive')")
    named = [v for v in missing if Path(v).suffix.lower() in VIDEO_EXTENSIONS]
    if named:
        text += f"; {named[0]!r} includes its extension: write {named[0][: -len(Path(named[0]).suffix)]!r}"
    return text


def sample_frames(arr: np.ndarray, max_frames: int | None) -> np.ndarray:
    """At most ``max_frames`` frames of ``[F, D]``, sampled uniformly over the whole video:
    the middle frame of each of ``max_frames`` equal segments (frame ``floor((i + 1/2) F / N)``).

    >>> sample_frames(np.arange(10)[:, None], 4)[:, 0].tolist()
    [1, 3, 6, 8]
    """
    if not isinstance(arr, np.ndarray) or arr.ndim < 1:
        raise TypeError(f"arr: expected a numpy array [F, D], got {short_repr(arr)}")
    if max_frames is not None:
        max_frames = positive_int(max_frames, "max_frames")
    if max_frames is None or arr.shape[0] <= max_frames:
        return arr
    idx = np.floor((np.arange(max_frames) + 0.5) * arr.shape[0] / max_frames).astype(np.int64)
    return arr[idx]


def read_features(path: Path, max_frames: int | None = None) -> np.ndarray:
    """One video's features, float32 ``[F, D]`` (a ``[D]`` vector becomes one frame), or a frame
    store's uint8 frames ``[F, S*S*3]`` as they are (``xmodal encode frames``);
    ``max_frames``: see :func:`sample_frames`. ``path`` may be a row of one array
    (:class:`xmodal.data.arrayrows.ArrayRow`)."""
    from xmodal.data.arrayrows import ArrayRow

    arr = path.read() if isinstance(path, ArrayRow) else load_array(path, npz="features")
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim == 2 and 0 not in arr.shape and arr.dtype == np.uint8:
        return sample_frames(arr, max_frames)
    if arr.ndim != 2 or 0 in arr.shape or not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{path}: expected float features [D] or [F, D], got shape {arr.shape} dtype {arr.dtype}")
    bad = np.flatnonzero(~np.isfinite(arr).all(1))
    if bad.size:
        raise ValueError(f"{path}: NaN/inf in frame(s) {bad[:5].tolist()}{' ...' if bad.size > 5 else ''}")
    return sample_frames(arr, max_frames).astype(np.float32)


def _dim_culprits(dims: list[int | None], names: list[str], files: list[Path | None], flag: str) -> None:
    """Raise naming the videos whose feature size is not the most common one."""
    present = [d for d in dims if d is not None]
    if len(set(present)) <= 1:
        return
    values, counts = np.unique(present, return_counts=True)
    common = int(values[np.argmax(counts)])
    odd = [(n, f, d) for n, f, d in zip(names, files, dims) if d is not None and d != common]
    listed = ", ".join(f"{n} ({f}: {d})" for n, f, d in odd[:5]) + (" ..." if len(odd) > 5 else "")
    raise ValueError(f"{flag}: {len(odd)} video(s) have a feature size other than the {common} of the "
                     f"{int(counts.max())} others: {listed}")


def _frame_arrays(per_video: Any, names: Any, files: Any, *, missing: bool) -> None:
    """``per_video``: a non-empty list of float ``[F_i, D]`` arrays (``None`` for a video without
    the expert where ``missing``); ``names`` / ``files``: None or one entry per video."""
    ok = isinstance(per_video, list) and per_video and all(
        (a is None and missing) or (isinstance(a, np.ndarray) and a.ndim == 2 and 0 not in a.shape
                                    and np.issubdtype(a.dtype, np.floating)) for a in per_video)
    if not ok:
        raise TypeError(f"per_video: expected a non-empty list of float [frames, D] arrays"
                        f"{' (or None)' if missing else ''}, got {short_repr(per_video)}")
    if names is not None and (not isinstance(names, list) or len(names) != len(per_video)
                              or not all(isinstance(n, str) for n in names)):
        raise TypeError(f"names: expected one video id per array ({len(per_video)}), got {short_repr(names)}")
    if files is not None and (not isinstance(files, list) or len(files) != len(per_video)
                              or not all(f is None or isinstance(f, (str, os.PathLike)) for f in files)):
        raise TypeError(f"files: expected one path (or None) per array ({len(per_video)}), got {short_repr(files)}")


def pad_frames(per_video: list[np.ndarray], names: list[str] | None = None,
               files: list[Path] | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Stack ``[F_i, D]`` arrays into ``[N, max F, D]`` (zero padding) and a bool mask
    ``[N, max F]``; all single-frame -> ``([N, D], None)``.

    >>> v, m = pad_frames([np.ones((2, 3)), np.ones((1, 3))])
    >>> v.shape, m.tolist()
    ((2, 2, 3), [[True, True], [True, False]])
    """
    _frame_arrays(per_video, names, files, missing=False)
    if names is not None:
        _dim_culprits([a.shape[1] for a in per_video], names, files or [None] * len(names), "--features")
    dims = {a.shape[1] for a in per_video}
    if len(dims) != 1:
        raise ValueError(f"--features: videos have different feature dims {sorted(dims)}")
    lengths = np.array([a.shape[0] for a in per_video])
    if lengths.max() == 1:
        return np.concatenate(per_video).astype(np.float32), None
    out = np.zeros((len(per_video), lengths.max(), dims.pop()), dtype=np.float32)
    for i, a in enumerate(per_video):
        out[i, : len(a)] = a
    return out, np.arange(lengths.max())[None, :] < lengths[:, None]


def pad_expert(per_video: list[np.ndarray | None], name: str = "expert", names: list[str] | None = None,
               files: list[Path | None] | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Stack one expert's ``[F_i, D]`` arrays (``None``: the video lacks the expert).

    Returns ``([N, D], None)`` when every video has one vector; ``([N, D], bool [N])``
    (True = present) when some lack it; ``([N, max F, D], bool [N, max F])`` (True = real
    frame, an all-False row = missing) when any has several frames. Missing rows are zeros.

    >>> v, m = pad_expert([np.ones((1, 2)), None])
    >>> v.tolist(), m.tolist()
    ([[1.0, 1.0], [0.0, 0.0]], [True, False])
    """
    _frame_arrays(per_video, names, files, missing=True)
    name = text_label(name, "name")
    present = [a for a in per_video if a is not None]
    if not present:
        raise ValueError(f"--expert {name}: no video of the split has a feature file")
    if names is not None:
        _dim_culprits([None if a is None else a.shape[1] for a in per_video], names,
                      files or [None] * len(names), f"--expert {name}")
    dims = {a.shape[1] for a in present}
    if len(dims) != 1:
        raise ValueError(f"--expert {name}: videos have different feature dims {sorted(dims)}")
    dim = dims.pop()
    lengths = np.array([0 if a is None else a.shape[0] for a in per_video])
    if lengths.max() == 1:
        out = np.zeros((len(per_video), dim), dtype=np.float32)
        for i, a in enumerate(per_video):
            if a is not None:
                out[i] = a[0]
        return out, (None if (lengths == 1).all() else lengths == 1)
    out = np.zeros((len(per_video), lengths.max(), dim), dtype=np.float32)
    for i, a in enumerate(per_video):
        if a is not None:
            out[i, : len(a)] = a
    return out, np.arange(lengths.max())[None, :] < lengths[:, None]


def parse_experts(specs: list[str] | None) -> dict[str, str]:
    """``["audio=feats/audio/", "flow=flow/*.npy"]`` -> ``{"audio": ..., "flow": ...}``.

    >>> parse_experts(["audio=a/"])
    {'audio': 'a/'}
    """
    if specs is not None and (isinstance(specs, (str, bytes)) or not isinstance(specs, (list, tuple))):
        raise TypeError(f"specs: expected a list of NAME=DIR_OR_GLOB strings, got {short_repr(specs)}")
    out: dict[str, str] = {}
    for spec in specs or []:
        if not isinstance(spec, str):
            raise TypeError(f"--expert: expected NAME=DIR_OR_GLOB, got {short_repr(spec)}")
        name, sep, where = str(spec).partition("=")
        if not sep or not name or not where:
            raise ValueError(f"--expert: expected NAME=DIR_OR_GLOB, got {short_repr(spec)}")
        try:
            layout.check_expert_name(name)
        except ValueError as exc:
            raise ValueError(f"--expert: {exc}") from None
        if name in out:
            raise ValueError(f"--expert: expert {name!r} given twice")
        out[name] = where
    return out


#: ``--dtype`` choices: the stored dtype of the feature arrays (video, experts, text) an import writes.
DTYPES = {"float32": np.float32, "float16": np.float16}


class _RowWriter:
    """A ``.npy`` file of a known shape written row block by row block, never whole in memory; a full
    disk raises ``OSError(ENOSPC)`` naming the file (as :func:`_save`)."""

    def __init__(self, path: Path, shape: tuple[int, ...], dtype) -> None:
        self.path, self.shape, self.dtype = path, tuple(int(n) for n in shape), np.dtype(dtype)
        self.rows = 0
        self.file = open(path, "wb")
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": self.shape}
        self._do(lambda: np.lib.format.write_array_header_2_0(self.file, header)
                 if len(repr(header)) > 60000 else np.lib.format.write_array_header_1_0(self.file, header))

    def _do(self, fn) -> None:
        from xmodal.runs import _write_failed

        try:
            fn()
        except OSError as exc:
            try:  # a buffered file flushes again on close: a full disk fails there too
                self.file.close()
            except OSError:
                pass
            err = _write_failed(exc, self.path)
            if err is None:
                raise
            raise err from None

    def write(self, block: np.ndarray) -> None:
        block = np.ascontiguousarray(block, dtype=self.dtype)
        if block.shape[1:] != self.shape[1:] or self.rows + block.shape[0] > self.shape[0]:
            raise ValueError(f"{self.path.name}: block of shape {block.shape} does not fit {self.shape}")
        self._do(lambda: self.file.write(memoryview(block).cast("B")))
        self.rows += block.shape[0]

    def close(self) -> None:
        if self.rows != self.shape[0]:
            self._do(self.file.close)
            raise ValueError(f"{self.path.name}: {self.rows} of {self.shape[0]} rows written")
        self._do(self.file.close)


def _feature_shape(path: Path, max_frames: int | None) -> tuple[int, int]:
    """``(frames after max_frames, dim)`` of one video's feature file, from its header alone for a ``.npy``
    (an ``.npz`` is read, one at a time); a row of one array is one frame."""
    from xmodal.data.arrayrows import ArrayRow
    from xmodal.data.npyfile import array_header

    if isinstance(path, ArrayRow):
        return 1, path.dim
    if path.suffix.lower() == ".npy":
        try:
            shape, dtype = array_header(path)
        except (ValueError, OSError, EOFError) as exc:
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ValueError(text if text.startswith(str(path)) else f"{path}: not a readable .npy array ({text})"
                             ) from None
    else:
        arr = load_array(path, npz="features")
        shape, dtype = arr.shape, arr.dtype
        del arr
    if len(shape) == 1:
        shape = (1,) + tuple(shape)
    if len(shape) != 2 or 0 in shape or not (np.issubdtype(dtype, np.floating) or np.dtype(dtype) == np.uint8):
        raise ValueError(f"{path}: expected float features [D] or [F, D], got shape {tuple(shape)} dtype {dtype}")
    frames = shape[0] if max_frames is None else min(shape[0], int(max_frames))
    return int(frames), int(shape[1])


def _holds_frames(files: list[Path | None]) -> bool:
    """Whether the videos' files are a frame store's uint8 frames (all of them, or a clear error)."""
    from xmodal.data.arrayrows import ArrayRow
    from xmodal.data.npyfile import array_header

    def uint8(f) -> bool:
        if isinstance(f, ArrayRow):  # a row of encode images' one array
            return f.array.dtype == np.uint8
        return np.dtype(array_header(f)[1]) == np.uint8 if f.suffix.lower() == ".npy" else False

    kinds = {uint8(f) for f in files if f is not None}
    if len(kinds) > 1:
        raise ValueError("--features: mixes a frame store's uint8 frames with float features; import one kind")
    return kinds == {True}


def _write_padded(path: Path, mask_path: Path, files: list[Path | None], lengths: list[int], dim: int, dtype,
                  max_frames: int | None, bar) -> np.ndarray | None:
    """Stream one video at a time into ``path``: ``[N, D]`` when no video has more than one frame, else
    ``[N, max F, D]`` zero-padded; returns (and writes to ``mask_path``) the mask :func:`pad_expert`
    would give: None, bool ``[N]`` (present) or bool ``[N, max F]`` (real frames)."""
    n, longest = len(files), max(lengths)
    if _holds_frames(files):  # a frame store: uint8 frames stay uint8 (model.kind clip4clip)
        dtype = np.uint8
    writer = _RowWriter(path, (n, dim) if longest == 1 else (n, longest, dim), dtype)
    for f, length in zip(files, lengths):
        if f is None:
            writer.write(np.zeros((1,) + writer.shape[1:], dtype))
        else:
            a = read_features(f, max_frames)
            if longest > 1 and length < longest:
                a = np.concatenate([a, np.zeros((longest - length, dim), a.dtype)])
            writer.write(a[None] if longest > 1 else a)
        if bar is not None:
            bar.update(1)
    writer.close()
    present = np.array([f is not None for f in files])
    if longest == 1:
        mask = None if present.all() else present
    else:
        mask = np.arange(longest)[None, :] < np.asarray(lengths)[:, None]
    if mask is not None:
        _save(mask_path, mask)
    return mask


def _save(path: Path, arr: np.ndarray) -> None:
    """``np.save`` inside the import's private temporary folder; a full disk raises
    ``OSError(ENOSPC)`` naming the file (the folder is removed by :func:`import_pairs`)."""
    from xmodal.runs import _write_failed

    try:
        np.save(path, arr, allow_pickle=False)
    except OSError as exc:
        err = _write_failed(exc, path)
        if err is None:
            raise
        raise err from None


def import_owns(name: str) -> bool:
    """Whether a file name in ``--out`` is one an import writes (and may replace)."""
    if name == "encoders.json":  # the encoders of the features (xmodal.features.identity)
        return True
    parsed = layout.parse(name)
    return parsed is not None and parsed[3] and parsed[1] in IMPORT_ROLES


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _prepare_out(out: Path) -> Path:
    """Check ``out`` and return a fresh private temporary folder beside it."""
    if out.is_symlink():
        raise ValueError(f"--out: {out} is a symbolic link; give a real folder")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} is a file; give a folder (new or from an earlier import)")
    if out.is_dir():
        foreign = sorted(p.name for p in out.iterdir() if not (p.is_file() and not p.is_symlink()
                                                                and import_owns(p.name)))
        if foreign:
            raise ValueError(f"--out: {out} holds {len(foreign)} file(s) that 'xmodal data import' does not "
                             f"write ({', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''}); an import "
                             f"replaces the whole folder, so give a new or empty folder")
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    for old in parent.glob(f".{out.name}.import-*"):  # left by a killed import
        pid = old.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _pid_alive(int(pid)) and old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
    tmp = parent / f".{out.name}.import-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished folder to ``out``, replacing an earlier import's folder."""
    if not out.exists():
        os.replace(tmp, out)
        return
    old = out.parent / f".{out.name}.import-old-{os.getpid()}"
    os.replace(out, old)
    try:
        os.replace(tmp, out)
    except OSError:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _check_options(max_frames: Any, dtype: Any) -> int | None:
    """``max_frames`` (a positive whole number or None) and ``dtype`` (a key of :data:`DTYPES`), checked."""
    if max_frames is not None:
        whole = not isinstance(max_frames, (bool, np.bool_)) and (
            isinstance(max_frames, (int, np.integer)) or (isinstance(max_frames, (float, np.floating))
                                                         and np.isfinite(max_frames) and float(max_frames).is_integer()))
        # inf / 2.5 / True: refused
        if not whole or max_frames < 1:
            raise ValueError(f"--max-frames: expected a positive integer, got {short_repr(max_frames)}")
        max_frames = int(max_frames)
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(f"--dtype: expected one of {', '.join(DTYPES)}, got {short_repr(dtype)}")
    return max_frames


def import_pairs(pairs: str | os.PathLike, *, features: str | os.PathLike, out: str | os.PathLike,
                 split: str = "train", text_features: str | os.PathLike | None = None,
                 encode: Callable[[list[str]], np.ndarray] | None = None,
                 experts: dict[str, str | os.PathLike] | None = None,
                 max_frames: int | None = None, skip_missing: bool = False, dtype: str = "float32",
                 progress: bool | None = False, encoders: dict | None = None,
                 ids: str | os.PathLike | None = None) -> dict[str, dict[str, Any]]:
    """Write the layout of :mod:`xmodal.data.layout` under ``out``, one split per
    ``split`` value of the table (rows without one go to ``split``).

    Every video's feature file is looked up before any caption is encoded; features are then streamed,
    one video at a time, into the split's arrays (never every video's features at once).

    Args:
        pairs: the ``.csv`` / ``.jsonl`` table (CSV: UTF-8 with or without a BOM, delimiter
            ``,``, ``;`` or tab).
        features: directory or glob of per-video ``.npy`` / ``.npz`` files (ids name files
            inside the directory: no absolute path or ``..``; a video id is its file's stem), or
            one ``[N, D]`` ``.npy`` whose rows ``ids`` names (``xmodal encode images``' output;
            :mod:`xmodal.data.arrayrows`).
        out: output directory; built in a temporary folder beside it and renamed at the end,
            replacing an earlier import's folder entirely. A folder holding other files is refused.
        split: split name of rows with no ``split`` column value.
        text_features: a ``.npy`` ``[rows, Dt]`` aligned with the table rows (read memory-mapped);
            else ``encode(captions)`` (default: the MiniLM encoder of :mod:`xmodal.features.encoders`),
            called on blocks of at most 8192 captions in table order.
        experts: further experts ``{name: directory or glob}`` (same file rules as
            ``features``), written as ``{split}_video_features.NAME.npy``; videos without a
            file for an expert get zeros and ``{split}_video_mask.NAME.npy`` marks them
            (see :func:`pad_expert`).
        max_frames: longer videos (main features and experts) are sampled uniformly to this
            many frames (:func:`sample_frames`); None keeps every frame.
        skip_missing: drop the rows of videos without a feature file (named in the summary's
            ``"missing"``) instead of refusing the table.
        dtype: ``"float32"`` or ``"float16"``: the stored dtype of the video, expert and text features.
        progress: as :func:`xmodal.progress.progress` (None: a bar on a terminal, else lines).
        encoders: ``{"text", "video", "experts"}`` identity records of the encoders that made the
            features (:mod:`xmodal.features.identity`; None: ``--features`` folders' ``encoder.json``
            and ``--text-features``' sidecar are read), written as ``out/encoders.json`` with each
            size checked against the features (a record of another size is refused).
        ids: with ``features`` one array: the ``--list`` file (or the ``--dir`` folder) it was encoded
            from, naming its rows in order.

    Returns:
        ``{split: {"videos", "texts", "kind", "max_frames", "frames_note": str or None, "groups": int or None,
        "experts": {name: videos with it}, "notes": [...], "missing": [...], "dropped_rows": int}}``
        (``kind``: ``"images"`` or ``"videos"``, see :func:`import_rows`)
        (``notes``: split names the default config does not read, videos in several splits;
        ``missing`` / ``dropped_rows``: what ``skip_missing`` left out; the same for every split).
    """
    _check_options(max_frames, dtype)
    return import_rows(read_pairs(pairs), features=features, out=out, split=split, text_features=text_features,
                       encode=encode, experts=experts, max_frames=max_frames, skip_missing=skip_missing,
                       dtype=dtype, progress=progress, encoders=encoders, ids=ids)


def import_rows(rows: list[dict[str, str]], *, features: str | os.PathLike, out: str | os.PathLike,
                split: str = "train", text_features: str | os.PathLike | None = None,
                encode: Callable[[list[str]], np.ndarray] | None = None,
                experts: dict[str, str | os.PathLike] | None = None,
                max_frames: int | None = None, skip_missing: bool = False, dtype: str = "float32",
                progress: bool | None = False, encoders: dict | None = None,
                ids: str | os.PathLike | None = None, kind: str | None = None) -> dict[str, dict[str, Any]]:
    """:func:`import_pairs` on rows already read: ``[{"video", "caption", "split"?}, ...]`` as
    :func:`read_pairs` returns them (or a benchmark format's reader, :mod:`xmodal.data.formats`).
    ``kind``: ``"images"`` or ``"videos"``, the collection's word in ``S_texts.tsv``'s header and the
    summary (None: images for one array or an image encoder's record beside ``features``, else
    videos). Every other argument and the result are :func:`import_pairs`'."""
    if kind not in (None, "images", "videos"):
        raise ValueError(f"kind: expected images or videos, got {short_repr(kind)}")
    max_frames = _check_options(max_frames, dtype)
    if not isinstance(rows, list) or not rows or not all(
            isinstance(r, dict) and isinstance(r.get("video"), str) and isinstance(r.get("caption"), str)
            for r in rows):
        raise TypeError(f"rows: expected a non-empty list of {{'video', 'caption'[, 'split']}} dicts, "
                        f"got {short_repr(rows)}")
    table_rows = len(rows)
    texts = None
    if text_features is not None:
        texts = _open_text_features(text_features, table_rows)
    all_videos = list(dict.fromkeys(r["video"] for r in rows))
    from xmodal.data.arrayrows import array_rows, is_array_file

    if is_array_file(features):  # one array for the collection (encode images): rows named by --ids
        files = array_rows(features, ids, all_videos, allow_missing=skip_missing)
        kind = kind or "images"
        # one spelling per item: "im03.jpg" and "im03" are the same image, named by its stem
        canon = {v: (f.name if f is not None else v) for v, f in files.items()}
        rows = [{**r, "video": canon[r["video"]]} for r in rows]
        files = {canon[v]: f for v, f in files.items()}
        all_videos = list(dict.fromkeys(canon[v] for v in all_videos))
    else:
        if ids is not None:
            raise ValueError(f"--ids: only with --features FILE.npy (one array); {features} is not one")
        files = feature_files(features, all_videos, allow_missing=skip_missing)  # before any caption is encoded
    missing = [v for v in all_videos if files[v] is None]
    keep = np.array([files[r["video"]] is not None for r in rows])
    if missing:
        rows = [r for r, k in zip(rows, keep) if k]
        if not rows:
            raise ValueError(f"--features: no video of the table has a feature file (looked in {features})"
                             f"{stems_hint(missing)}")
        all_videos = [v for v in all_videos if files[v] is not None]
    by_split: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_split.setdefault(r.get("split", split), []).append(i)
    for name in by_split:
        layout.names(name, "video")  # validates the split name
    lowered: dict[str, list[str]] = {}
    for name in by_split:
        lowered.setdefault(name.lower(), []).append(name)
    clash = [v for v in lowered.values() if len(v) > 1]
    if clash:
        raise ValueError(f"pairs: split names that differ only in case: {', '.join(map(repr, clash[0]))}; "
                         f"they would become separate splits")
    expert_files = {}
    for name, spec in (experts or {}).items():
        layout.check_expert_name(name)
        expert_files[name] = feature_files(spec, all_videos, flag=f"--expert {name}", allow_missing=True)
    plans = _plan_splits(rows, by_split, files, expert_files, max_frames)  # every header checked, nothing read
    if texts is not None:
        texts.keep = np.flatnonzero(keep)  # the rows skip_missing left in
    elif encode is None:
        from xmodal.features.encoders import encode_text

        encode = lambda caps: encode_text(caps, progress=False)  # noqa: E731
    out = Path(out)
    tmp = _prepare_out(out)
    try:
        try:
            if texts is None:
                texts = _encode_captions(tmp, rows, encode, progress)
            recorded = _write_encoders(tmp, encoders, plans, texts.dim, features, text_features, experts,
                                       files={v: files[v] for v in all_videos})
            kind = kind or ("images" if (recorded.get("video") or {}).get("level") == "image" else "videos")
            summary = _write_splits(tmp, rows, plans, texts, files, max_frames, DTYPES[dtype], progress, kind)
            texts.close()
        except OSError as exc:  # name the file under --out, not the private temporary folder
            if exc.errno != errno.ENOSPC:
                raise
            where = exc.filename if exc.filename is not None else str(exc)
            if str(tmp) in str(where):
                text = str(where)[str(where).index(str(tmp)):].replace(str(tmp), str(out), 1)
                raise OSError(errno.ENOSPC, f"no space left on device while writing {text}") from None
            raise OSError(errno.ENOSPC, f"no space left on device while writing into {out}") from None
        _publish(tmp, out)
    finally:
        if texts is not None:
            texts.close()
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    notes = split_name_notes(list(by_split))
    seen: dict[str, list[str]] = {}
    for name, idx in by_split.items():
        for v in dict.fromkeys(rows[i]["video"] for i in idx):
            seen.setdefault(v, []).append(name)
    shared = [v for v, where in seen.items() if len(where) > 1]
    if shared:
        notes.append(f"{len(shared)} video(s) appear in several splits ({', '.join(shared[:5])}"
                     f"{' ...' if len(shared) > 5 else ''}): test results would be inflated (leakage)")
    notes += groups.shared_groups({name: [rows[i]["group"] for i in idx if "group" in rows[i]] or None
                                   for name, idx in by_split.items()})
    for s in summary.values():
        s["notes"] = notes
        s["missing"] = missing
        s["dropped_rows"] = int(table_rows - len(rows))
    return summary


def _write_encoders(tmp: Path, given: dict | None, plans: dict, text_dim: int, features: Any, text_features: Any,
                    experts: dict | None, files: dict | None = None) -> dict:
    """``encoders.json`` of the layout: the records given, else those found beside the inputs, each
    checked against the size of the features it describes; returns the records. A frame store's record
    gains ``sources_sha256``, the hash of the imported videos' recorded source hashes
    (:func:`xmodal.features.sources.sources_digest`), when every one of them has one."""
    from xmodal.features import identity

    def beside(source: Any, flag: str) -> dict | None:
        p = Path(source)
        if p.is_file() and p.suffix.lower() == ".npy":  # one array: its OUT.encoder.json (encode images)
            return identity.read_sidecar(p, flag)
        folder = p if p.is_dir() else p.parent if any(c in str(source) for c in "*?[") else None
        return identity.read_sidecar(folder, flag) if folder is not None and folder.is_dir() else None

    given = dict(given or {})
    records = {"text": given.get("text", identity.read_sidecar(text_features, "--text-features")
                                  if text_features is not None else None),
               "video": given.get("video", beside(features, "--features")),
               "experts": {k: (given.get("experts") or {}).get(k, beside(v, f"--expert {k}"))
                           for k, v in (experts or {}).items()}}
    plan = next(iter(plans.values()))
    dims = {"text": text_dim, "video": plan["dim"], **{k: e[2] for k, e in plan["experts"].items()}}
    flags = {"text": "--text-features" if text_features is not None else "--text-model", "video": "--features"}
    for key, record in [("text", records["text"]), ("video", records["video"]), *records["experts"].items()]:
        if record is None:
            continue
        if record.get("dim") is None:
            record["dim"] = int(dims[key])
        elif record["dim"] != dims[key]:
            raise ValueError(f"{flags.get(key, f'--expert {key}')}: its encoder record ({record['spec']}) says "
                             f"{record['dim']}-d features, but the files hold {dims[key]}-d ones")
    if records["video"] is not None and str(records["video"].get("spec", "")).startswith("frames:") and files:
        records["video"] = {**records["video"], "sources_sha256": _frame_sources(features, files)}
    identity.write_encoders(tmp, records)
    return records


def _frame_sources(features: Any, files: dict) -> str | None:
    """The sources digest of the frame store ``features`` over the videos of ``files`` (video -> its .npy)."""
    from xmodal.features.sources import sources_digest

    p = Path(features)
    store = p if p.is_dir() else p.parent
    try:
        stems = [Path(os.path.relpath(f, store)).with_suffix("").as_posix() for f in files.values()]
    except (TypeError, ValueError):  # not files of one folder (rows of one array)
        return None
    return None if any(s.startswith("..") for s in stems) else sources_digest(store, stems)


def _open_text_features(path: str | os.PathLike, table_rows: int) -> "_TableText":
    """``--text-features``: header checked (one line naming the flag), then memory-mapped."""
    from xmodal.data.npyfile import array_header

    where = f"--text-features: {path}"
    load_array_checks = Path(path).is_dir() or not Path(path).is_file()
    if load_array_checks:
        load_array(path, where)  # raises the usual one-line error
    with open(path, "rb") as f:
        if f.read(2) == b"PK":
            load_array(path, where)  # an .npz: refused with the usual line
    try:
        shape, dtype = array_header(path)
    except (ValueError, OSError) as exc:
        text = str(exc)
        raise ValueError(f"--text-features: {text[len(str(path)) + 2:] if text.startswith(str(path)) else text}"
                         ) from None
    if len(shape) != 2 or shape[0] != table_rows or not np.issubdtype(dtype, np.floating):
        raise ValueError(f"--text-features: expected float [{table_rows}, Dt] (one row per pair), "
                         f"got shape {shape} dtype {dtype}")
    return _TableText(np.load(path, mmap_mode="r", allow_pickle=False), np.arange(table_rows))


#: Captions encoded per call of ``encode`` (and text rows gathered per block).
TEXT_BLOCK = 8192


class _TableText:
    """Text features of the table's rows, read by row indices in blocks: a memory-mapped ``[rows, Dt]``
    array (``keep``: the table rows still in the import, in order)."""

    def __init__(self, array: np.ndarray, keep: np.ndarray, owned: Path | None = None) -> None:
        self.array, self.keep, self.owned = array, keep, owned

    @property
    def dim(self) -> int:
        return int(self.array.shape[1])

    def rows(self, idx: np.ndarray) -> np.ndarray:
        block = np.asarray(self.array[self.keep[idx]], dtype=np.float32)
        bad = np.flatnonzero(~np.isfinite(block).all(1))
        if bad.size:
            rows = self.keep[idx][bad]
            raise ValueError(f"--text-features: NaN/inf in the row(s) of pair(s) {rows[:5].tolist()}"
                             f"{' ...' if rows.size > 5 else ''} (0 = the table's first row)")
        return block

    def close(self) -> None:
        self.array = np.zeros((0, self.dim), np.float32)  # drops the map (closed when its views are gone)
        if self.owned is not None:
            self.owned.unlink(missing_ok=True)
            self.owned = None


def _encode_captions(tmp: Path, rows: list[dict], encode: Callable, progress: bool | None) -> _TableText:
    """Encode every caption in blocks of :data:`TEXT_BLOCK` into a scratch ``.npy`` inside the import's
    temporary folder (removed before it is published), read back memory-mapped."""
    from xmodal.progress import progress as progress_bar

    scratch = tmp / ".captions.npy"
    writer = None
    with progress_bar(total=len(rows), desc="data import: encode captions", unit="caption", show=progress) as bar:
        for start in range(0, len(rows), TEXT_BLOCK):
            caps = [r["caption"] for r in rows[start:start + TEXT_BLOCK]]
            block = np.asarray(encode(caps), dtype=np.float32)
            if block.ndim != 2 or block.shape[0] != len(caps):
                raise ValueError(f"--text-model: the encoder returned shape {block.shape} for {len(caps)} captions")
            if writer is None:
                writer = _RowWriter(scratch, (len(rows), block.shape[1]), np.float32)
            writer.write(block)
            bar.update(len(caps))
        writer.close()
    return _TableText(np.load(scratch, mmap_mode="r", allow_pickle=False), np.arange(len(rows)), owned=scratch)


def _plan_splits(rows: list[dict], by_split: dict[str, list[int]], files: dict[str, Path],
                 expert_files: dict[str, dict[str, Path | None]], max_frames: int | None) -> dict[str, dict]:
    """Per split: its videos (in layout order), groups, and the frames / size of every feature file from
    the headers alone, every size checked; nothing is read or written yet (so a bad file is named before
    any caption is encoded)."""
    plans = {}
    for name, idx in by_split.items():
        videos = list(dict.fromkeys(rows[i]["video"] for i in idx))
        plan: dict[str, Any] = {"idx": idx, "groups": None}
        if "group" in rows[idx[0]]:  # clips inside long videos (xmodal.data.groups)
            videos, plan["video_to_group"], plan["groups"] = groups.order_clips([rows[i] for i in idx], videos)
        shapes = [_feature_shape(files[v], max_frames) for v in videos]
        _dim_culprits([d for _, d in shapes], videos, [files[v] for v in videos], "--features")
        plan.update(videos=videos, lengths=[f for f, _ in shapes], dim=shapes[0][1], experts={})
        for expert, found in expert_files.items():
            efiles = [found[v] for v in videos]
            eshapes = [None if f is None else _feature_shape(f, max_frames) for f in efiles]
            if all(e is None for e in eshapes):
                raise ValueError(f"--expert {expert}: no video of the split has a feature file")
            _dim_culprits([None if e is None else e[1] for e in eshapes], videos, efiles, f"--expert {expert}")
            plan["experts"][expert] = (efiles, [0 if e is None else e[0] for e in eshapes],
                                       next(e[1] for e in eshapes if e is not None))
        plans[name] = plan
    return plans


def _write_splits(out: Path, rows: list[dict], plans: dict[str, dict], texts: _TableText, files: dict[str, Path],
                  max_frames: int | None, dtype, progress: bool | None = False,
                  kind: str = "videos") -> dict[str, dict[str, Any]]:
    from xmodal.progress import progress as progress_bar

    summary = {}
    for name, plan in plans.items():
        idx, videos, lengths = plan["idx"], plan["videos"], plan["lengths"]
        row_of = {v: j for j, v in enumerate(videos)}
        p = lambda role: out / layout.names(name, role)[0]  # noqa: E731
        with progress_bar(total=len(videos), desc=f"data import {name}: read features", unit="video",
                          show=progress) as bar:
            mask = _write_padded(p("video"), p("video_mask"), [files[v] for v in videos], lengths, plan["dim"],
                                 dtype, max_frames, bar)
        text = _RowWriter(p("text"), (len(idx), texts.dim), dtype)
        order = np.asarray(idx, dtype=np.int64)
        for start in range(0, len(order), TEXT_BLOCK):
            text.write(texts.rows(order[start:start + TEXT_BLOCK]))
        text.close()
        _save(p("text_to_video"), np.array([row_of[rows[i]["video"]] for i in idx], dtype=np.int64))
        p("video_names").write_text("".join(v + "\n" for v in videos), encoding="utf-8")
        if plan["groups"] is not None:
            _save(p("video_to_group"), plan["video_to_group"])
            p("group_names").write_text("".join(g + "\n" for g in plan["groups"]), encoding="utf-8")
        else:
            for role in ("video_to_group", "group_names"):
                p(role).unlink(missing_ok=True)  # stale groups of an earlier import would not match
        item = kind[:-1]  # the collection's word: video / image (the text stays the last column)
        p("text_names").write_text(f"{item}_index\t{item}\ttext\n" + "".join(
            f"{row_of[rows[i]['video']]}\t{rows[i]['video']}\t{rows[i]['caption']}\n" for i in idx), encoding="utf-8")
        summary[name] = {"videos": len(videos), "texts": len(idx), "kind": kind,
                         "max_frames": 1 if mask is None else int(mask.shape[1]),
                         "frames_note": frames_note(lengths, videos), "experts": {},
                         "groups": None if plan["groups"] is None else len(plan["groups"])}
        for expert, (efiles, elengths, dim) in plan["experts"].items():
            _write_padded(out / f"{name}_video_features.{expert}.npy", out / f"{name}_video_mask.{expert}.npy",
                          efiles, elengths, dim, dtype, max_frames, None)
            summary[name]["experts"][expert] = sum(f is not None for f in efiles)
    return summary
