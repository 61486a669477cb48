"""The paired split container shared by loaders, the synthetic generator and the trainer."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xmodal._validate import short_repr
from xmodal.data.groups import check_groups, group_rows, paragraph_texts, subset_groups
from xmodal.data.layout import MAIN_EXPERT, check_expert_name


def _shape(x: Any) -> str:
    return str(getattr(x, "shape", type(x).__name__))


def present_rows(mask: np.ndarray | None, n: int) -> np.ndarray:
    """bool ``[N]``: videos for which an expert with this mask exists (``None``: all;
    ``[N]`` mask: itself; ``[N, F]`` frame mask: at least one real frame)."""
    if mask is None:
        return np.ones(n, dtype=bool)
    return mask if mask.ndim == 1 else mask.any(1)


def rows_text(rows: np.ndarray, names: list[str] | None = None, what: str = "row") -> str:
    """``"rows [3, 17] (videos v3, v17)"``: at most 5 rows, with their names when known.

    >>> rows_text(np.array([3]), ["a", "b", "c", "d"])
    "rows [3]: videos 'd'"
    """
    rows = np.asarray(rows).ravel()
    shown = rows[:5].tolist()
    more = " ..." if rows.size > 5 else ""
    text = f"{what}s {shown}{more}"
    if names is not None and len(names) > int(rows.max(initial=-1)):
        text += f": videos {', '.join(repr(names[r]) for r in shown)}{more}"
    return text


#: Elements per block when a check reads an array (a memory-mapped one never comes in whole).
BLOCK_ELEMENTS = 1 << 24


def row_blocks(x: Any, elements: int | None = None):
    """``slice`` s of about ``elements`` values each (default :data:`BLOCK_ELEMENTS`, read at each call)
    over the rows of ``x`` (at least one row each).

    >>> [(s.start, s.stop) for s in row_blocks(np.zeros((5, 4)), elements=8)]
    [(0, 2), (2, 4), (4, 5)]
    """
    n = int(x.shape[0])
    per_row = max(1, int(np.prod(x.shape[1:], dtype=np.int64)))
    step = max(1, int(BLOCK_ELEMENTS if elements is None else elements) // per_row)
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


def nonfinite_rows(x: np.ndarray, real: np.ndarray | None = None) -> tuple[int, np.ndarray]:
    """``(count, rows)`` of the NaN/inf values of ``x`` (``[N, ...]``) where ``real`` (a bool
    ``[N]`` or ``[N, F]`` mask; None = everywhere) says the value is real, read in row blocks
    (:func:`row_blocks`), so a memory-mapped array is never read into memory whole.

    >>> x = np.ones((3, 2)); x[1, 0] = np.nan
    >>> nonfinite_rows(x)
    (1, array([1]))
    """
    count, rows = 0, []
    for sl in row_blocks(x):
        bad = ~np.isfinite(x[sl])
        if real is not None:
            r = real[sl]
            bad &= r.reshape(r.shape + (1,) * (x.ndim - r.ndim))
        n = int(bad.sum())
        if n:
            count += n
            rows.append(sl.start + np.flatnonzero(bad.reshape(bad.shape[0], -1).any(1)))
    return count, (np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64))


def _feature_problems(x: Any, label: str, n: int | None, mask: Any, mask_label: str,
                      frame_mask_only: bool, names: list[str] | None = None, raw: str = "") -> list[str]:
    """Problems of one video feature array and its mask (``n``: expected rows). ``raw``: the
    non-float input this role may also hold: ``"frames"`` (uint8 ``[N, F, S*S*3]``, a frame store's
    RGB frames) or ``"ids"`` (integer token ids ``[T, L]``); both are what ``model.kind: clip4clip``
    trains on (:mod:`xmodal.models.clip4clip`)."""
    if not isinstance(x, np.ndarray) or x.ndim not in (2, 3):
        return [f"{label}: expected an array [N, D] or [N, F, D], got {_shape(x)}"]
    out = []
    if raw == "frames" and x.dtype == np.uint8 and x.ndim == 3:
        pass
    elif raw == "ids" and x.ndim == 2 and np.issubdtype(x.dtype, np.integer):
        pass
    elif not np.issubdtype(x.dtype, np.floating):
        out.append(f"{label}: expected floating features, got dtype {x.dtype}")
    if 0 in x.shape:
        out.append(f"{label}: empty array, shape {x.shape}")
    if n is not None and x.shape[0] != n:
        out.append(f"{label}: {x.shape[0]} rows, expected {n} (one per video)")
    real = None
    if mask is not None:
        ok_shapes = [x.shape[:2]] if x.ndim == 3 else []
        if not frame_mask_only:
            ok_shapes.append(x.shape[:1])
        if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_:
            out.append(f"{mask_label}: expected a bool array, got {getattr(mask, 'dtype', type(mask).__name__)}")
        elif mask.shape not in ok_shapes:
            want = " or ".join(f"[{', '.join(map(str, s))}]" for s in ok_shapes) or "none (features have no frames)"
            out.append(f"{mask_label}: expected shape {want}, got {list(mask.shape)}")
        else:
            real = mask
    if not out and np.issubdtype(x.dtype, np.floating):
        # Padded frames and missing experts may hold anything: only real values must be finite.
        bad, rows = nonfinite_rows(x, real)
        if bad:
            out.append(f"{label}: contains {bad} NaN/inf value(s)" + (" in real frames" if real is not None else "")
                       + f" in {rows_text(rows, names)}")
    return out


def split_problems(video: Any, text: Any, text_to_video: Any, *, video_mask: Any = None,
                   experts: dict | None = None, expert_masks: dict | None = None,
                   video_labels: Any = None, text_labels: Any = None, labels: dict | None = None,
                   uncaptioned: bool = False, video_names: list[str] | None = None,
                   text_mask: Any = None) -> list[str]:
    """Every problem of a split's arrays, one message each, naming the array.

    ``text`` is ``[T, Dt]`` (sentence features) or ``[T, L, Dt]`` (token features, with
    an optional bool ``text_mask`` ``[T, L]``, True = real token; every text needs one).
    ``labels`` maps role names (``video``, ``video_mask``, ``text``, ``text_mask``, ``text_to_video``,
    ``video_labels``, ``text_labels``, ``video.EXPERT``, ``video_mask.EXPERT``) to the
    names used in messages (file names for the loader, argument names otherwise).
    ``uncaptioned``: also report videos that no text points to. ``video_names``: named
    beside the rows of a problem.
    """
    labels = labels or {}
    lab = lambda role: labels.get(role, role)  # noqa: E731
    experts, expert_masks = experts or {}, expert_masks or {}
    # None (a file that is missing, reported elsewhere): the checks needing it are skipped.
    out = [] if video is None else _feature_problems(video, lab("video"), None, video_mask, lab("video_mask"), True,
                                                     video_names, raw="frames")
    n = video.shape[0] if isinstance(video, np.ndarray) and video.ndim in (2, 3) else None
    for name, feats in experts.items():
        try:
            check_expert_name(name)
        except ValueError as exc:
            out.append(str(exc))
        out += _feature_problems(feats, lab(f"video.{name}"), n, expert_masks.get(name),
                                 lab(f"video_mask.{name}"), False, video_names)
    for name in expert_masks:
        if name not in experts:
            out.append(f"{lab(f'video_mask.{name}')}: a mask for expert {name!r}, which has no features")
    def usable(x: Any, m: Any, frame_only: bool) -> bool:
        if m is None:
            return True
        ok = [x.shape[:2]] if x.ndim == 3 else []
        return isinstance(m, np.ndarray) and m.dtype == np.bool_ and (
            m.shape in ok or (not frame_only and m.shape == x.shape[:1]))

    if n is not None and usable(video, video_mask, True) and all(
            isinstance(v, np.ndarray) and v.ndim in (2, 3) and v.shape[0] == n and usable(v, expert_masks.get(k), False)
            for k, v in experts.items()):
        present = present_rows(video_mask, n).copy()
        for name in experts:
            present |= present_rows(expert_masks.get(name), n)
        empty = np.flatnonzero(~present)
        if empty.size:
            what = "no real frame" if not experts else "no real frame in any expert"
            out.append(f"{lab('video_mask')}: {empty.size} video(s) have {what} ({rows_text(empty, video_names)}); "
                       f"drop them or unmask a frame")
    if text is None:
        t = None
    elif not isinstance(text, np.ndarray) or text.ndim not in (2, 3):
        out.append(f"{lab('text')}: expected an array [T, Dt] (or token features [T, L, Dt]), got {_shape(text)}")
        t = None
    else:
        t = text.shape[0]
        problems = _feature_problems(text, lab("text"), None, text_mask, lab("text_mask"), True, raw="ids")
        out += [p.replace(" in real frames", " in real tokens")
                .replace("(features have no frames)", "(sentence features [T, Dt] have no tokens)") for p in problems]
        if text_mask is not None and usable(text, text_mask, True) and text.ndim == 3:
            empty = np.flatnonzero(~text_mask.any(1))
            if empty.size:
                out.append(f"{lab('text_mask')}: {empty.size} text(s) have no real token ({rows_text(empty)}); "
                           f"drop them or unmask a token")
    t2v = np.asarray(text_to_video)
    if text_to_video is None:
        pass
    elif t2v.ndim != 1 or not np.issubdtype(t2v.dtype, np.integer):
        out.append(f"{lab('text_to_video')}: expected a 1-d integer array, got shape {t2v.shape} dtype {t2v.dtype}")
    else:
        if t is not None and t2v.shape[0] != t:
            out.append(f"{lab('text_to_video')}: {t2v.shape[0]} entries but {lab('text')} has {t} rows")
        if n is not None and t2v.size and (t2v.min() < 0 or t2v.max() >= n):
            bad = int(((t2v < 0) | (t2v >= n)).sum())
            out.append(f"{lab('text_to_video')}: values must lie in [0, {n}) (rows of {lab('video')}), "
                       f"got range [{t2v.min()}, {t2v.max()}] ({bad} out of range)")
        elif n is not None and uncaptioned:
            lonely = np.flatnonzero(np.bincount(t2v, minlength=n) == 0)
            if lonely.size:
                out.append(f"{lab('text_to_video')}: {lonely.size} video(s) have no text "
                           f"({rows_text(lonely, video_names)})")
    for role, arr, count in (("video_labels", video_labels, n), ("text_labels", text_labels, t)):
        if arr is not None and count is not None:
            a = np.asarray(arr)
            if a.shape != (count,) or not np.issubdtype(a.dtype, np.integer):
                out.append(f"{lab(role)}: expected {count} integer labels, got shape {a.shape} dtype {a.dtype}")
    return out


def token_mask(mask: Any, name: str = "text_mask") -> Any:
    """A bool copy of a token mask stored as bool or as 0/1 integers (uint8 ``[T, L]``);
    anything else is returned unchanged for :func:`split_problems` to report.

    >>> token_mask(np.array([[1, 0]], np.uint8)).tolist()
    [[True, False]]
    """
    if isinstance(mask, np.ndarray) and np.issubdtype(mask.dtype, np.integer) and np.isin(mask, (0, 1)).all():
        return mask.astype(bool)
    return np.array(mask, copy=True) if isinstance(mask, np.ndarray) else mask


def check_relevancy(relevancy: Any, num_texts: int, num_videos: int, name: str = "relevancy") -> np.ndarray:
    """A float32 copy of a ``[num_texts, num_videos]`` relevancy with values in ``[0, 1]``."""
    if hasattr(relevancy, "detach"):
        relevancy = relevancy.detach().cpu().numpy()
    r = np.asarray(relevancy)
    if r.dtype == np.bool_ or np.issubdtype(r.dtype, np.integer):
        r = r.astype(np.float32)
    if not np.issubdtype(r.dtype, np.floating):
        raise TypeError(f"{name}: expected a float array, got {r.dtype}")
    if r.shape != (num_texts, num_videos):
        raise ValueError(f"{name}: expected shape [{num_texts}, {num_videos}] (texts x videos), got {list(r.shape)}")
    bad = ~np.isfinite(r) | (r < 0) | (r > 1)
    if bad.any():
        rows, cols = np.nonzero(bad)
        raise ValueError(f"{name}: values must be finite and lie in [0, 1]; {int(bad.sum())} do not, the first "
                         f"at row {rows[0]} (text), column {cols[0]} (video): {float(r[rows[0], cols[0]])}")
    return r.astype(np.float32)


@dataclass
class PairedSplit:
    """One split of a paired video/image <-> text dataset (pre-extracted features).

    Features may be float32 arrays in memory (:meth:`from_arrays`, the synthetic
    generator) or read-only memory-mapped files in their stored dtype (float16 stays
    float16; :func:`~xmodal.data.load_paired_split`): nothing here copies them whole.
    Checks read them in row blocks, :meth:`video_input` / :meth:`text_input` with ``rows``
    gather only those rows, and the trainer upcasts each batch as it is drawn
    (:mod:`xmodal.training.batches`). :meth:`subset` copies the rows it keeps.

    Attributes:
        video: float video/image features, ``[N, Dv]`` or ``[N, F, Dv]`` (frame axis).
        text: float text features ``[M, Dt]`` (sentences) or ``[M, L, Dt]`` (tokens,
            COOT's word level; padded tokens marked by ``text_mask``).
        text_to_video: int64 ``[M]``: row in ``video`` of each text's video.
        video_labels: optional int class id per video ``[N]``.
        text_labels: optional int class id per text ``[M]``.
        captions: optional raw caption strings, ``len == M``.
        name: free-form name, e.g. ``"flickr8k/dev"``.
        video_mask: optional bool ``[N, F]``, True = real frame (padded frames never
            change an embedding).
        experts: optional further experts ``{name: [N, De] or [N, Fe, De]}``.
        expert_masks: optional ``{name: bool [N] or [N, Fe]}``; an all-False row means
            the expert is missing for that video.
        video_names: optional name per video, ``len == N``.
        relevancy: optional float ``[M, N]`` graded relevancy in ``[0, 1]`` of each text
            to each video (EPIC-100 multi-instance retrieval; ``S_relevancy.npy``). Where
            it is absent, :meth:`mir_relevancy` derives one from ``video_labels``.
        video_to_group: optional int64 ``[N]``: the long video (group) of each clip row
            (CrossCLR appendix A / COOT hierarchy; ``S_video_to_group.npy``, rules in
            :mod:`xmodal.data.groups`). A group's paragraph is its clips' texts in clip order.
        group_names: optional name per group (``S_groups.txt``).
        text_mask: optional bool ``[M, L]`` for token features, True = real token
            (``S_text_mask.npy``); padded tokens never change an embedding.

    Shape:
        - video: ``[N, Dv]`` or ``[N, F, Dv]``
        - text: ``[M, Dt]`` or ``[M, L, Dt]``
        - text_to_video: ``[M]`` with values in ``[0, N)``
    """

    video: np.ndarray
    text: np.ndarray
    text_to_video: np.ndarray
    video_labels: np.ndarray | None = None
    text_labels: np.ndarray | None = None
    captions: list[str] | None = None
    name: str = field(default="")
    video_mask: np.ndarray | None = None
    experts: dict[str, np.ndarray] = field(default_factory=dict)
    expert_masks: dict[str, np.ndarray] = field(default_factory=dict)
    video_names: list[str] | None = None
    relevancy: np.ndarray | None = None
    video_to_group: np.ndarray | None = None
    group_names: list[str] | None = None
    text_mask: np.ndarray | None = None

    def __post_init__(self) -> None:
        for attr in ("video", "text"):
            value = getattr(self, attr)
            if not hasattr(value, "shape") or not hasattr(value, "__getitem__") or len(value.shape) < 2:
                raise TypeError(f"{attr}: expected a feature array [N, D] or [N, F, D], got {short_repr(value)}")
        t2v = np.asarray(self.text_to_video)
        if t2v.ndim == 1 and t2v.size and not np.issubdtype(t2v.dtype, np.integer):
            raise TypeError(f"text_to_video: expected integers, got {t2v.dtype}")
        for attr in ("experts", "expert_masks"):
            value = getattr(self, attr)
            if value is not None and not isinstance(value, Mapping):
                raise TypeError(f"{attr}: expected a dict of name -> array, got {short_repr(value)}")
            setattr(self, attr, dict(value or {}))
        problems = split_problems(self.video, self.text, t2v, video_mask=self.video_mask, experts=self.experts,
                                  expert_masks=self.expert_masks, video_labels=self.video_labels,
                                  text_labels=self.text_labels, text_mask=self.text_mask,
                                  labels={f"video.{k}": f"experts[{k!r}]" for k in self.experts}
                                  | {f"video_mask.{k}": f"expert_masks[{k!r}]" for k in self.expert_masks})
        if problems:
            raise ValueError("; ".join(problems))
        self.text_to_video = t2v.astype(np.int64, copy=False)
        if self.video_labels is not None:
            self.video_labels = np.asarray(self.video_labels)
        if self.text_labels is not None:
            self.text_labels = np.asarray(self.text_labels)
        if self.captions is not None and len(self.captions) != self.text.shape[0]:
            raise ValueError(f"captions: expected {self.text.shape[0]} strings, got {len(self.captions)}")
        if self.video_names is not None and len(self.video_names) != self.video.shape[0]:
            raise ValueError(f"video_names: expected {self.video.shape[0]} names, got {len(self.video_names)}")
        if self.relevancy is not None:
            self.relevancy = check_relevancy(self.relevancy, self.text.shape[0], self.video.shape[0])
        if self.video_to_group is not None:
            if hasattr(self.video_to_group, "detach"):
                self.video_to_group = self.video_to_group.detach().cpu().numpy()
            self.video_to_group = check_groups(self.video_to_group, self.video.shape[0])
            if self.group_names is not None and len(self.group_names) != self.num_groups:
                raise ValueError(f"group_names: expected {self.num_groups} names, got {len(self.group_names)}")
        elif self.group_names is not None:
            raise ValueError("group_names: given without video_to_group")

    def save(self, root: str | os.PathLike, split: str) -> list[Path]:
        """Write this split as split ``split`` of the file layout under ``root``
        (:func:`xmodal.data.writer.save_split`); :func:`~xmodal.data.load_paired_split`
        reads back an equal split. Returns the files written.

        >>> import numpy as np, tempfile
        >>> from xmodal.data import load_paired_split
        >>> s = PairedSplit.from_arrays(video=np.ones((2, 4)), text=np.ones((3, 5)), text_to_video=[0, 1, 1])
        >>> root = tempfile.mkdtemp()
        >>> [p.name for p in s.save(root, "train")]
        ['train_text_features.npy', 'train_text_to_video.npy', 'train_video_features.npy']
        >>> load_paired_split(root, "train").text_to_video.tolist()
        [0, 1, 1]
        """
        from xmodal.data.writer import save_split

        return save_split(self, root, split)

    @classmethod
    def from_arrays(cls, *, video: Any, text: Any, text_to_video: Any, video_mask: Any = None,
                    experts: dict | None = None, expert_masks: dict | None = None, **kwargs: Any) -> "PairedSplit":
        """A split from in-memory arrays (numpy or torch, any float dtype); copies them
        (float32 features, bool masks, int64 ``text_to_video``), never keeps the caller's memory.

        Args:
            video: ``[N, Dv]`` or ``[N, F, Dv]``.
            text: ``[T, Dt]``, or token features ``[T, L, Dt]``.
            text_to_video: ``[T]`` integer row of each text's video.
            video_mask: optional bool ``[N, F]``, True = real frame.
            experts, expert_masks: optional further experts (see the class attributes).
            **kwargs: ``video_labels``, ``text_labels``, ``captions``, ``name``, ``video_names``,
                ``relevancy``, ``video_to_group``, ``group_names``, ``text_mask`` (bool or 0/1
                ``[T, L]``, True = real token).

        Raises:
            ValueError: every problem at once (shapes, NaN/inf in real frames, ids out
                of range, videos without any real frame), naming the argument.

        >>> import numpy as np
        >>> s = PairedSplit.from_arrays(video=np.ones((2, 3, 4)), text=np.ones((3, 5)),
        ...                             text_to_video=[0, 1, 1],
        ...                             video_mask=np.array([[1, 1, 0], [1, 0, 0]], bool))
        >>> s.video.dtype, s.video_mask.sum(1).tolist()
        (dtype('float32'), [2, 1])
        """
        def arr(x: Any, name: str, dtype: Any) -> np.ndarray:
            if name == "text_mask":
                return token_mask(x.detach().cpu().numpy() if hasattr(x, "detach") else np.array(x), name)
            if hasattr(x, "detach"):
                x = x.detach().cpu().numpy()
            a = np.array(x)  # always a copy
            if a.dtype == object:
                raise TypeError(f"{name}: expected a numeric array, got objects")
            if dtype is bool and a.dtype != np.bool_:
                raise TypeError(f"{name}: expected a bool mask, got {a.dtype}")
            if dtype is float:
                if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
                    raise TypeError(f"{name}: expected floating features, got {a.dtype}")
                a = a.astype(np.float32)
            return a

        t2v = arr(text_to_video, "text_to_video", None)
        if t2v.size and not np.issubdtype(t2v.dtype, np.integer):
            raise TypeError(f"text_to_video: expected integers, got {t2v.dtype}")
        if kwargs.get("text_mask") is not None:
            kwargs["text_mask"] = arr(kwargs["text_mask"], "text_mask", bool)
        return cls(video=arr(video, "video", float), text=arr(text, "text", float), text_to_video=t2v,
                   video_mask=None if video_mask is None else arr(video_mask, "video_mask", bool),
                   experts={k: arr(v, f"experts[{k!r}]", float) for k, v in (experts or {}).items()},
                   expert_masks={k: arr(v, f"expert_masks[{k!r}]", bool) for k, v in (expert_masks or {}).items()},
                   **kwargs)

    def mir_relevancy(self) -> np.ndarray | None:
        """float32 ``[M, N]`` relevancy for mAP / nDCG (:func:`xmodal.metrics.mir`), or None.

        ``relevancy`` when the split has one; else, with ``video_labels``, 1 where text
        ``i``'s video has the class of video ``j`` and 0 elsewhere (a text's class is its
        own video's label, so its paired video is always relevant; ``text_labels`` are
        not used); else None.

        >>> import numpy as np
        >>> s = PairedSplit.from_arrays(video=np.eye(3), text=np.eye(3), text_to_video=[0, 1, 2],
        ...                             video_labels=np.array([0, 1, 0]))
        >>> s.mir_relevancy().tolist()
        [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 1.0]]
        """
        if self.relevancy is not None:
            return self.relevancy
        if self.video_labels is None:
            return None
        labels = np.asarray(self.video_labels)
        return (labels[self.text_to_video][:, None] == labels[None, :]).astype(np.float32)

    @property
    def num_videos(self) -> int:
        return int(self.video.shape[0])

    @property
    def num_texts(self) -> int:
        return int(self.text.shape[0])

    @property
    def ids(self) -> np.ndarray:
        """Alias of ``text_to_video`` (the ``ids`` keyword of the losses)."""
        return self.text_to_video

    @property
    def has_groups(self) -> bool:
        return self.video_to_group is not None

    @property
    def num_groups(self) -> int:
        """Long videos (groups) of a hierarchical split; 0 without ``video_to_group``."""
        g = self.video_to_group
        return 0 if g is None or not g.size else int(g[-1]) + 1

    def group_rows(self) -> list[np.ndarray]:
        """The clip rows of each group, in temporal (row) order."""
        if self.video_to_group is None:
            raise ValueError(f"{self.name or 'split'}: has no groups (no video_to_group)")
        return group_rows(self.video_to_group)

    def paragraphs(self) -> list[np.ndarray]:
        """The text indices of each group's paragraph (its clips' texts in clip order)."""
        if self.video_to_group is None:
            raise ValueError(f"{self.name or 'split'}: has no groups (no video_to_group)")
        return paragraph_texts(self.text_to_video, self.video_to_group)

    @property
    def has_frames(self) -> bool:
        return self.video.ndim == 3

    @property
    def has_tokens(self) -> bool:
        """Token-level text features ``[M, L, Dt]`` (COOT's word level)."""
        return self.text.ndim == 3

    def text_input(self, rows: Any = None) -> tuple[np.ndarray, np.ndarray | None]:
        """``(features, mask)`` as the model's ``encode_text``/``forward_text`` take them, for
        all texts or ``rows`` (``mask``: ``text_mask``, None for sentence features or all
        tokens real). Views when ``rows`` is None."""
        if rows is None:
            return self.text, self.text_mask
        return self.text[rows], None if self.text_mask is None else self.text_mask[rows]

    def expert_dims(self) -> dict[str, int]:
        """``{expert: input dim}`` of the further experts (empty for one expert)."""
        return {k: int(v.shape[-1]) for k, v in self.experts.items()}

    def video_input(self, rows: Any = None) -> tuple[Any, Any]:
        """``(features, mask)`` as the model's ``encode_video``/``forward_video`` take them,
        for all videos or ``rows``: arrays for one expert, ``{name: array}`` dicts (the main
        features under ``"video"``) with several. Views when ``rows`` is None."""
        def pick(a: np.ndarray | None) -> np.ndarray | None:
            return a if a is None or rows is None else a[rows]

        if not self.experts:
            return pick(self.video), pick(self.video_mask)
        feats = {MAIN_EXPERT: pick(self.video)} | {k: pick(v) for k, v in self.experts.items()}
        masks = {MAIN_EXPERT: pick(self.video_mask)} | {k: pick(self.expert_masks.get(k)) for k in self.experts}
        return feats, {k: m for k, m in masks.items() if m is not None}

    def subset(self, video_rows) -> "PairedSplit":
        """The split restricted to ``video_rows`` (in that order) and all their texts.

        Texts keep their original relative order; ``text_to_video`` is re-indexed
        to the new video rows. Arrays are copies; ``self`` is untouched.
        """
        rows = np.asarray(video_rows)
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        if rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer):
            raise ValueError("video_rows: expected a 1-d integer (or boolean mask) array")
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_videos):
            raise ValueError(f"video_rows: values must lie in [0, {self.num_videos})")
        if np.unique(rows).size != rows.size:
            raise ValueError("video_rows: contains duplicates")
        new_index = np.full(self.num_videos, -1, dtype=np.int64)
        new_index[rows] = np.arange(rows.size)
        keep = np.flatnonzero(new_index[self.text_to_video] >= 0)
        return PairedSplit(
            video=self.video[rows].copy(),
            text=self.text[keep].copy(),
            text_to_video=new_index[self.text_to_video[keep]],
            video_labels=None if self.video_labels is None else self.video_labels[rows].copy(),
            text_labels=None if self.text_labels is None else self.text_labels[keep].copy(),
            captions=None if self.captions is None else [self.captions[i] for i in keep],
            name=self.name,
            video_mask=None if self.video_mask is None else self.video_mask[rows].copy(),
            experts={k: v[rows].copy() for k, v in self.experts.items()},
            expert_masks={k: v[rows].copy() for k, v in self.expert_masks.items()},
            video_names=None if self.video_names is None else [self.video_names[i] for i in rows],
            relevancy=None if self.relevancy is None else self.relevancy[keep][:, rows].copy(),
            video_to_group=subset_groups(self.video_to_group, rows),
            text_mask=None if self.text_mask is None else self.text_mask[keep].copy(),
        )
