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

CLIP_COLUMNS = ("clip_id", "clip")
GROUP_COLUMNS = ("group", "video_id", "video")


def group_problems(video_to_group: Any, num_videos: int | None, label: str = "video_to_group") -> list[str]:
    """Problems of a ``video_to_group`` array, one message each, naming ``label``.

    >>> group_problems(np.array([0, 0, 1, 0]), 4)[0][:58]
    'video_to_group: groups are not monotone: row 3 has group 0'
    """
    a = np.asarray(video_to_group)
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
    return np.asarray(video_to_group, dtype=np.int64).copy()


def group_rows(video_to_group: np.ndarray) -> list[np.ndarray]:
    """The clip rows of each group, in row order.

    >>> [r.tolist() for r in group_rows(np.array([0, 0, 1, 2, 2]))]
    [[0, 1], [2], [3, 4]]
    """
    g = np.asarray(video_to_group, dtype=np.int64)
    n = int(g.max()) + 1 if g.size else 0
    bounds = np.searchsorted(g, np.arange(n + 1))
    return [np.arange(bounds[i], bounds[i + 1]) for i in range(n)]


def paragraph_texts(text_to_video: np.ndarray, video_to_group: np.ndarray) -> list[np.ndarray]:
    """The text indices of each group's paragraph: its clips' texts in clip order (texts of
    one clip in text order). A group whose clips have no text gets an empty array.

    >>> [p.tolist() for p in paragraph_texts(np.array([1, 0, 2, 0]), np.array([0, 0, 1]))]
    [[1, 3, 0], [2]]
    """
    t2v = np.asarray(text_to_video, dtype=np.int64)
    g = np.asarray(video_to_group, dtype=np.int64)
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
    kept = np.asarray(video_to_group, dtype=np.int64)[rows]
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
    group_of: dict[str, str] = {}
    start: dict[str, float | None] = {}
    for r in rows:
        clip, group = r["video"], r["group"]
        if group_of.setdefault(clip, group) != group:
            raise ValueError(f"pairs: clip {clip!r} appears under two groups ({group_of[clip]!r} and {group!r})")
        try:
            start.setdefault(clip, float(r["start"]) if r.get("start") not in (None, "") else None)
        except ValueError:
            start.setdefault(clip, None)
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
