"""The paired split container shared by loaders, the synthetic generator and the trainer."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class PairedSplit:
    """One split of a paired video/image <-> text dataset (pre-extracted features).

    Attributes:
        video: float32 video/image features, ``[N, Dv]`` or ``[N, F, Dv]`` (frame axis).
        text: float32 text features ``[M, Dt]``.
        text_to_video: int64 ``[M]``: row in ``video`` of each text's video.
        video_labels: optional int class id per video ``[N]``.
        text_labels: optional int class id per text ``[M]``.
        captions: optional raw caption strings, ``len == M``.
        name: free-form name, e.g. ``"flickr8k/dev"``.

    Shape:
        - video: ``[N, Dv]`` or ``[N, F, Dv]``
        - text: ``[M, Dt]``
        - text_to_video: ``[M]`` with values in ``[0, N)``
    """

    video: np.ndarray
    text: np.ndarray
    text_to_video: np.ndarray
    video_labels: np.ndarray | None = None
    text_labels: np.ndarray | None = None
    captions: list[str] | None = None
    name: str = field(default="")

    def __post_init__(self) -> None:
        if not isinstance(self.video, np.ndarray) or self.video.ndim not in (2, 3):
            raise ValueError(f"video: expected an array [N, Dv] or [N, F, Dv], got "
                             f"{getattr(self.video, 'shape', type(self.video).__name__)}")
        if not isinstance(self.text, np.ndarray) or self.text.ndim != 2:
            raise ValueError(f"text: expected an array [M, Dt], got "
                             f"{getattr(self.text, 'shape', type(self.text).__name__)}")
        t2v = np.asarray(self.text_to_video)
        if t2v.ndim != 1 or t2v.shape[0] != self.text.shape[0]:
            raise ValueError(f"text_to_video: expected shape [{self.text.shape[0]}], got {t2v.shape}")
        if not np.issubdtype(t2v.dtype, np.integer):
            raise TypeError(f"text_to_video: expected integers, got {t2v.dtype}")
        if t2v.size and (t2v.min() < 0 or t2v.max() >= self.video.shape[0]):
            raise ValueError(f"text_to_video: values must lie in [0, {self.video.shape[0]}), "
                             f"got range [{t2v.min()}, {t2v.max()}]")
        self.text_to_video = t2v.astype(np.int64, copy=False)
        if self.video_labels is not None:
            self.video_labels = np.asarray(self.video_labels)
            if self.video_labels.shape != (self.video.shape[0],):
                raise ValueError(f"video_labels: expected shape [{self.video.shape[0]}], "
                                 f"got {self.video_labels.shape}")
        if self.text_labels is not None:
            self.text_labels = np.asarray(self.text_labels)
            if self.text_labels.shape != (self.text.shape[0],):
                raise ValueError(f"text_labels: expected shape [{self.text.shape[0]}], "
                                 f"got {self.text_labels.shape}")
        if self.captions is not None and len(self.captions) != self.text.shape[0]:
            raise ValueError(f"captions: expected {self.text.shape[0]} strings, got {len(self.captions)}")

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
    def has_frames(self) -> bool:
        return self.video.ndim == 3

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
        )
