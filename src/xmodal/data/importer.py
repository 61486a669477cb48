"""Build the paired-split layout from a table of (video, caption[, split]) pairs and
per-video feature files (``xmodal data import``).

Table: a ``.csv`` (header row) or ``.jsonl`` (one object per line) with a video id
column (``video``, ``video_id`` or ``image``), a caption column (``caption`` or
``text``) and optionally ``split``. Feature files: ``DIR/<video id>.npy`` / ``.npz``
or the files a glob matches (stem = video id); each holds ``[D]`` (one vector) or
``[F, D]`` (frames, any ``F``); an ``.npz`` its only array or the one named
``features``. Variable-length videos are zero-padded to the longest and a frame mask
``{split}_video_mask.npy`` is written. Videos are numbered in order of first
appearance in the table; texts keep the table order.

Clips inside long videos (CrossCLR / COOT): a table with a clip column (``clip_id`` or
``clip``) beside ``video_id`` (or ``group``), e.g. ``video_id,clip_id,start,end,caption``,
makes each clip a row of the layout (features ``DIR/<clip id>.npy``) and writes
``{split}_video_to_group.npy`` / ``{split}_groups.txt`` (:mod:`xmodal.data.groups`): clips
grouped by video in order of first appearance, by ``start`` within a video when given.
"""

from __future__ import annotations

import csv
import glob
import json
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from xmodal.data import groups, layout

VIDEO_COLUMNS = ("video", "video_id", "image")
TEXT_COLUMNS = ("caption", "text")


def read_pairs(path: str | os.PathLike) -> list[dict[str, str]]:
    """Rows ``{"video", "caption", "split"?}`` of a ``.csv`` or ``.jsonl`` pairs table.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "pairs.csv"
    >>> _ = p.write_text("video_id,caption\\nv1,a dog runs\\n")
    >>> read_pairs(p)
    [{'video': 'v1', 'caption': 'a dog runs'}]
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"pairs: {path} not found")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with open(path, encoding="utf-8", newline="") as f:
            raw = list(csv.DictReader(f))
    elif suffix in (".jsonl", ".ndjson"):
        raw = []
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"pairs: {path} line {i} is not JSON ({exc.msg})") from None
                if not isinstance(obj, dict):
                    raise ValueError(f"pairs: {path} line {i} is not a JSON object")
                raw.append(obj)
    else:
        raise ValueError(f"pairs: expected a .csv or .jsonl file, got {path.name}")
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
        if video in (None, "") or caption is None or not str(caption).strip():
            bad.append(i + (2 if suffix == ".csv" else 1))
            continue
        row = {"video": str(video), "caption": " ".join(str(caption).split())}  # no tabs/newlines in the TSV
        if r.get("split"):
            row["split"] = str(r["split"])
        if gcol is not None:
            if r.get(gcol) in (None, ""):
                bad.append(i + (2 if suffix == ".csv" else 1))
                continue
            row.update(group=str(r[gcol]), start=str(r.get("start") or ""))
        rows.append(row)
    if bad:
        raise ValueError(f"pairs: {path}: {len(bad)} row(s) without a video id or caption (lines {bad[:5]})")
    return rows


def feature_files(features: str | os.PathLike, videos: list[str], *, flag: str = "--features",
                  allow_missing: bool = False) -> dict[str, Path | None]:
    """``{video id: feature file}`` from a directory or a glob; every missing id is named
    (``allow_missing``: missing ids map to ``None``, e.g. an expert some videos lack)."""
    spec = str(features)
    if Path(spec).is_dir():
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
                         f"{' ...' if len(missing) > 5 else ''} (looked in {spec})")
    return found  # type: ignore[return-value]


def read_features(path: Path) -> np.ndarray:
    """One video's features, float32 ``[F, D]`` (a ``[D]`` vector becomes one frame)."""
    try:
        data = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"{path}: not a readable .npy/.npz ({exc})") from None
    if isinstance(data, np.lib.npyio.NpzFile):
        with data:
            keys = list(data.keys())
            if "features" in keys:
                arr = data["features"]
            elif len(keys) == 1:
                arr = data[keys[0]]
            else:
                raise ValueError(f"{path}: several arrays {keys}; name the features one 'features'")
    else:
        arr = data
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim != 2 or 0 in arr.shape or not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{path}: expected float features [D] or [F, D], got shape {arr.shape} dtype {arr.dtype}")
    return arr.astype(np.float32)


def pad_frames(per_video: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    """Stack ``[F_i, D]`` arrays into ``[N, max F, D]`` (zero padding) and a bool mask
    ``[N, max F]``; all single-frame -> ``([N, D], None)``.

    >>> v, m = pad_frames([np.ones((2, 3)), np.ones((1, 3))])
    >>> v.shape, m.tolist()
    ((2, 2, 3), [[True, True], [True, False]])
    """
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


def pad_expert(per_video: list[np.ndarray | None], name: str = "expert"
               ) -> tuple[np.ndarray, np.ndarray | None]:
    """Stack one expert's ``[F_i, D]`` arrays (``None``: the video lacks the expert).

    Returns ``([N, D], None)`` when every video has one vector; ``([N, D], bool [N])``
    (True = present) when some lack it; ``([N, max F, D], bool [N, max F])`` (True = real
    frame, an all-False row = missing) when any has several frames. Missing rows are zeros.

    >>> v, m = pad_expert([np.ones((1, 2)), None])
    >>> v.tolist(), m.tolist()
    ([[1.0, 1.0], [0.0, 0.0]], [True, False])
    """
    present = [a for a in per_video if a is not None]
    if not present:
        raise ValueError(f"--expert {name}: no video of the split has a feature file")
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
    out: dict[str, str] = {}
    for spec in specs or []:
        name, sep, where = str(spec).partition("=")
        if not sep or not name or not where:
            raise ValueError(f"--expert: expected NAME=DIR_OR_GLOB, got {spec!r}")
        try:
            layout.check_expert_name(name)
        except ValueError as exc:
            raise ValueError(f"--expert: {exc}") from None
        if name in out:
            raise ValueError(f"--expert: expert {name!r} given twice")
        out[name] = where
    return out


def _save(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, arr)
    tmp.replace(path)


def import_pairs(pairs: str | os.PathLike, *, features: str | os.PathLike, out: str | os.PathLike,
                 split: str = "train", text_features: str | os.PathLike | None = None,
                 encode: Callable[[list[str]], np.ndarray] | None = None,
                 experts: dict[str, str | os.PathLike] | None = None) -> dict[str, dict[str, Any]]:
    """Write the layout of :mod:`xmodal.data.layout` under ``out``, one split per
    ``split`` value of the table (rows without one go to ``split``).

    Args:
        pairs: the ``.csv`` / ``.jsonl`` table.
        features: directory or glob of per-video ``.npy`` / ``.npz`` files.
        out: output directory (created).
        split: split name of rows with no ``split`` column value.
        text_features: a ``.npy`` ``[rows, Dt]`` aligned with the table rows; else
            ``encode(captions)`` (default: the MiniLM encoder of :mod:`xmodal.encoders`).
        experts: further experts ``{name: directory or glob}`` (same file rules as
            ``features``), written as ``{split}_video_features.NAME.npy``; videos without a
            file for an expert get zeros and ``{split}_video_mask.NAME.npy`` marks them
            (see :func:`pad_expert`).

    Returns:
        ``{split: {"videos", "texts", "max_frames", "experts": {name: videos with it}}}``.
    """
    rows = read_pairs(pairs)
    if text_features is not None:
        tf = np.load(text_features, allow_pickle=False)
        if tf.ndim != 2 or tf.shape[0] != len(rows) or not np.issubdtype(tf.dtype, np.floating):
            raise ValueError(f"--text-features: expected float [{len(rows)}, Dt] (one row per pair), "
                             f"got shape {tf.shape} dtype {tf.dtype}")
    else:
        if encode is None:
            from xmodal.encoders import encode_text

            encode = lambda caps: encode_text(caps, progress=False)  # noqa: E731
        tf = np.asarray(encode([r["caption"] for r in rows]), dtype=np.float32)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    by_split: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_split.setdefault(r.get("split", split), []).append(i)
    all_videos = list(dict.fromkeys(r["video"] for r in rows))
    files = feature_files(features, all_videos)
    expert_files = {}
    for name, spec in (experts or {}).items():
        layout.check_expert_name(name)
        expert_files[name] = feature_files(spec, all_videos, flag=f"--expert {name}", allow_missing=True)
    summary = {}
    for name, idx in by_split.items():
        layout.names(name, "video")  # validates the split name
        videos = list(dict.fromkeys(rows[i]["video"] for i in idx))
        hier = "group" in rows[idx[0]]
        if hier:  # clips inside long videos (xmodal.data.groups)
            videos, video_to_group, group_names = groups.order_clips([rows[i] for i in idx], videos)
        row_of = {v: j for j, v in enumerate(videos)}
        video, mask = pad_frames([read_features(files[v]) for v in videos])
        p = lambda role: out / layout.names(name, role)[0]  # noqa: E731
        _save(p("video"), video)
        if mask is not None:
            _save(p("video_mask"), mask)
        elif p("video_mask").exists():
            p("video_mask").unlink()  # a stale mask from an earlier import would not match
        _save(p("text"), tf[idx].astype(np.float32))
        _save(p("text_to_video"), np.array([row_of[rows[i]["video"]] for i in idx], dtype=np.int64))
        p("video_names").write_text("".join(v + "\n" for v in videos), encoding="utf-8")
        if hier:
            _save(p("video_to_group"), video_to_group)
            p("group_names").write_text("".join(g + "\n" for g in group_names), encoding="utf-8")
        else:
            for role in ("video_to_group", "group_names"):
                p(role).unlink(missing_ok=True)  # stale groups of an earlier import would not match
        p("text_names").write_text("video_index\tvideo\ttext\n" + "".join(
            f"{row_of[rows[i]['video']]}\t{rows[i]['video']}\t{rows[i]['caption']}\n" for i in idx), encoding="utf-8")
        summary[name] = {"videos": len(videos), "texts": len(idx),
                         "max_frames": 1 if mask is None else int(mask.shape[1]), "experts": {}}
        for expert, found in expert_files.items():
            feats, emask = pad_expert([None if found[v] is None else read_features(found[v]) for v in videos],
                                      expert)
            fpath, mpath = out / f"{name}_video_features.{expert}.npy", out / f"{name}_video_mask.{expert}.npy"
            _save(fpath, feats)
            if emask is not None:
                _save(mpath, emask)
            elif mpath.exists():
                mpath.unlink()  # stale
            summary[name]["experts"][expert] = sum(found[v] is not None for v in videos)
    return summary
