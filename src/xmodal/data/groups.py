"""Clips inside long videos (CrossCLR appendix A / COOT): the ``S_video_to_group.npy`` role.

A hierarchical split numbers its clips (the rows of ``S_video_features.npy``) so that the
clips of one long video ("group") are consecutive rows in temporal order, and groups are
numbered ``0, 1, 2, ...`` in row order: ``video_to_group`` is non-decreasing and grows in
steps of 0 or 1 (``[0, 0, 0, 1, 1, 2]``). Texts map to clips through ``text_to_video``;
a group's paragraph is the texts of its clips in clip order (then text order).

Functional helpers only (numpy in, numpy out); :class:`~xmodal.data.PairedSplit` holds the
array, the loader and ``xmodal data check`` report :func:`group_problems`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xmodal._validate import int_array, short_repr, text_label

CLIP_COLUMNS = ("clip_id", "clip")
GROUP_COLUMNS = ("group", "video_id", "video")

__all__ = ["group_problems", "check_groups", "group_rows", "paragraph_texts", "subset_groups", "order_clips",
           "shared_groups"]


def group_problems(video_to_group: Any, num_videos: int | None, label: str = "video_to_group") -> list[str]:
    """Problems of a ``video_to_group`` array, one message each, naming ``label``.

    >>> group_problems(np.array([0, 0, 1, 0]), 4)[0][:58]
    'video_to_group: groups are not monotone: row 3 has group 0'
    """
    label = text_label(label, "label")
    if num_videos is not None and (isinstance(num_videos, (bool, np.bool_)) or not isinstance(num_videos, (int, np.integer))
                                   or num_videos < 0):
        raise TypeError(f"num_videos: expected None or an integer >= 0, got {short_repr(num_videos)}")
    if isinstance(video_to_group, np.ndarray) and video_to_group.dtype == object:
        a = np.asarray([], dtype=object)  # refused below by its dtype, never compared element-wise
    else:
        try:
            a = np.asarray(video_to_group.detach().cpu() if hasattr(video_to_group, "detach") else video_to_group)
        except (ValueError, TypeError):
            a = np.asarray([], dtype=object)
    if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_:
        return [f"{label}: expected a 1-d integer array (the group of each clip row), "
                f"got shape {list(a.shape)} dtype {a.dtype}"]
    out = []
    if num_videos is not None and a.shape[0] != num_videos:
        out.append(f"{label}: {a.shape[0]} entries, expected {num_videos} (one per clip row of the video features)")
    if a.size == 0:
        return out
    if a[0] != 0:
        out.append(f"{label}: groups must be numbered from 0 in row order, the first row has group {a[0]}")
    step = np.diff(a)
    down = np.flatnonzero(step < 0)
    if down.size:
        i = int(down[0]) + 1
        out.append(f"{label}: groups are not monotone: row {i} has group {a[i]} after group {a[i - 1]} "
                   f"(a group's clips must be consecutive rows; {down.size} such place(s))")
    jump = np.flatnonzero(step > 1)
    if jump.size:
        i = int(jump[0]) + 1
        out.append(f"{label}: group numbers skip from {a[i - 1]} to {a[i]} at row {i}; number groups "
                   f"0, 1, 2, ... in row order")
    return out


def check_groups(video_to_group: Any, num_videos: int, label: str = "video_to_group") -> np.ndarray:
    """An int64 copy of a valid ``video_to_group`` (else ``ValueError`` listing every problem)."""
    problems = group_problems(video_to_group, num_videos, label)
    if problems:
        raise ValueError("; ".join(problems))
    return int_array(video_to_group, label)


def group_rows(video_to_group: np.ndarray) -> list[np.ndarray]:
    """The clip rows of each group, in row order.

    >>> [r.tolist() for r in group_rows(np.array([0, 0, 1, 2, 2]))]
    [[0, 1], [2], [3, 4]]
    """
    g = check_groups(video_to_group, None)
    n = int(g.max()) + 1 if g.size else 0
    bounds = np.searchsorted(g, np.arange(n + 1))
    return [np.arange(bounds[i], bounds[i + 1]) for i in range(n)]


def paragraph_texts(text_to_video: np.ndarray, video_to_group: np.ndarray) -> list[np.ndarray]:
    """The text indices of each group's paragraph: its clips' texts in clip order (texts of
    one clip in text order). A group whose clips have no text gets an empty array.

    >>> [p.tolist() for p in paragraph_texts(np.array([1, 0, 2, 0]), np.array([0, 0, 1]))]
    [[1, 3, 0], [2]]
    """
    g = check_groups(video_to_group, None)
    t2v = int_array(text_to_video, "text_to_video")
    if t2v.size and (t2v.min() < 0 or t2v.max() >= g.size):
        raise ValueError(f"text_to_video: clip rows must lie in [0, {g.size}), got {t2v.min()}..{t2v.max()}")
    order = np.lexsort((np.arange(t2v.size), t2v))  # by clip row, then text index
    owner = g[t2v[order]]
    n = int(g.max()) + 1 if g.size else 0
    bounds = np.searchsorted(owner, np.arange(n + 1))
    return [order[bounds[i]:bounds[i + 1]] for i in range(n)]


def subset_groups(video_to_group: np.ndarray | None, rows: np.ndarray) -> np.ndarray | None:
    """``video_to_group`` of the clip rows ``rows`` (renumbered 0, 1, ...), or None when the
    kept rows no longer form consecutive groups (e.g. a shuffled subset)."""
    if video_to_group is None:
        return None
    g = check_groups(video_to_group, None)
    rows = int_array(rows, "rows")
    if rows.size and (rows.min() < -g.size or rows.max() >= g.size):
        raise ValueError(f"rows: must index the {g.size} clip rows, got {rows.min()}..{rows.max()}")
    kept = g[rows]
    if kept.size == 0:
        return None
    new = np.concatenate([[0], np.cumsum(np.diff(kept) != 0)]).astype(np.int64)
    return new if not group_problems(new, kept.size) and np.all(np.diff(kept) >= 0) else None


def order_clips(rows: list[dict[str, Any]], videos: list[str]) -> tuple[list[str], np.ndarray, list[str]]:
    """Clip order and groups for ``xmodal data import`` when the table has a group column.

    ``rows``: table rows with ``"video"`` (the clip id) and ``"group"``, optionally
    ``"start"`` (seconds). Clips are ordered by group (first appearance in the table),
    then by ``start`` when every clip of the group has a numeric one, else by first
    appearance. Returns ``(clips in row order, video_to_group int64, group names)``.

    Raises:
        ValueError: a clip listed under two groups.
    """
    if not isinstance(rows, list) or not all(isinstance(r, dict) and {"video", "group"} <= set(r) for r in rows):
        raise TypeError(f"rows: expected a list of dicts with 'video' and 'group', got {short_repr(rows)}")
    if not isinstance(videos, list) or not all(isinstance(v, str) for v in videos):
        raise TypeError(f"videos: expected a list of clip ids (strings), got {short_repr(videos)}")
    group_of: dict[str, str] = {}
    start: dict[str, float | None] = {}
    for r in rows:
        clip, group = r["video"], r["group"]
        if group_of.setdefault(clip, group) != group:
            raise ValueError(f"pairs: clip {clip!r} appears under two groups ({group_of[clip]!r} and {group!r})")
        try:
            value = float(r["start"]) if r.get("start") not in (None, "") else None
            start.setdefault(clip, value if value is None or np.isfinite(value) else None)
        except (ValueError, TypeError):
            start.setdefault(clip, None)
    missing = [v for v in videos if v not in group_of]
    if missing:
        raise ValueError(f"videos: clip {missing[0]!r} is in no row of the table")
    groups = list(dict.fromkeys(group_of[v] for v in videos))
    members: dict[str, list[str]] = {g: [] for g in groups}
    for v in videos:
        members[group_of[v]].append(v)
    clips, owner = [], []
    for gi, g in enumerate(groups):
        m = members[g]
        if all(start[v] is not None for v in m):
            m = sorted(m, key=lambda v: (start[v], m.index(v)))
        clips += m
        owner += [gi] * len(m)
    return clips, np.asarray(owner, dtype=np.int64), groups


def shared_groups(group_names: dict[str, Any]) -> list[str]:
    """One message per pair of splits holding clips of the same long video (group name): the
    clips of one video in train and in val or test leak it across the split (issue 25.4).

    Args:
        group_names: ``{split: group name of each group (or of each clip row)}``; a split
            whose value is None (no ``S_groups.txt``) is left out.

    >>> shared_groups({"train": ["g1", "g2"], "val": ["g2", "g3"], "test": None})[0][:61]
    "1 long video(s) have clips in both 'train' and 'val' (leakage"
    """
    if not isinstance(group_names, dict):
        raise TypeError(f"group_names: expected {{split: list of group names}}, got {short_repr(group_names)}")
    named = {}
    for split, names in group_names.items():
        if names is None:
            continue
        if not isinstance(names, (list, tuple)) or not all(isinstance(g, str) for g in names):
            raise TypeError(f"group_names[{split!r}]: expected a list of strings, got {short_repr(names)}")
        named[str(split)] = list(dict.fromkeys(names))
    splits, out = list(named), []
    for i, a in enumerate(splits):
        rows_a = {g: r for r, g in enumerate(named[a])}
        for b in splits[i + 1:]:
            rows_b = {g: r for r, g in enumerate(named[b])}
            shared = [g for g in named[a] if g in rows_b]
            if shared:
                out.append(f"{len(shared)} long video(s) have clips in both {a!r} and {b!r} (leakage: a model "
                           f"trained on one split has seen the other's video): {', '.join(map(repr, shared[:5]))}"
                           f"{' ...' if len(shared) > 5 else ''} ({a} groups {[rows_a[g] for g in shared[:5]]}, "
                           f"{b} groups {[rows_b[g] for g in shared[:5]]})")
    return out
