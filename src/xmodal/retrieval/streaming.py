"""A trained run evaluated at any gallery size: the score matrix is never built.

:func:`run_metrics` gives the numbers of :func:`xmodal.retrieval.evaluate.retrieval_metrics` on
``test_time.similarities(text, video, name)`` (the trainer's ``metrics.json`` protocol: each direction
scored by the normaliser fitted for it) from the embeddings, block by block:

- text -> video: the normaliser is fitted for this gallery as the trainer fits it (Sinkhorn / NCL /
  QB-Norm / IS / DSL statistics from bank x gallery blocks, :mod:`xmodal.normalize`), then every
  block of queries is scored against the gallery with its per-video bias or row-wise transform
  (:func:`xmodal.metrics.streaming_retrieval`); DN shifts the embeddings (the video embeddings in
  place: they are this module's own copy).
- video -> text (only when every video has a caption; else skipped, and the result says so): the
  normaliser fitted for that direction (video bank against the captions), blocks of videos against
  the captions (:func:`xmodal.metrics.streaming_video_text`).

Memory: the embeddings (:func:`embed_rows` fills one preallocated ``[N, D]`` tensor, no second copy)
plus one score block of at most :data:`xmodal.metrics.MAX_BLOCK_SCORES` scores, whatever the gallery
size: 2,000 captions against 1M videos fit where the dense path needed two 2,000 x 1M matrices.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

__all__ = ["embed_rows", "run_metrics", "captioned_everywhere"]


@torch.no_grad()
def embed_rows(encode: Callable, features: Any, mask: Any = None, *, block_rows: int = 8192,
               progress: bool | None = False) -> torch.Tensor:
    """``encode(features[a:b], mask[a:b])`` block by block into one preallocated float32 ``[N, D]`` tensor
    (``model.encode_video`` would hold every block and their concatenation: twice the embeddings).
    ``features`` / ``mask``: arrays or dicts of them (experts), sliced by rows. ``progress``: as
    :func:`xmodal.progress.progress`'s ``show`` (False: silent), counting rows.

    >>> embed_rows(lambda x, m: torch.as_tensor(x) * 2, np.ones((5, 2)), block_rows=2).tolist()[-1]
    [2.0, 2.0]
    """
    from xmodal._validate import positive_int, short_repr

    if not callable(encode):
        raise TypeError(f"encode: expected a callable (features, mask) -> [b, D], got {short_repr(encode)}")
    block_rows = positive_int(block_rows, "block_rows")
    first = next(iter(features.values()), None) if isinstance(features, dict) else features
    if not hasattr(first, "shape") or len(first.shape) < 2:
        raise TypeError(f"features: expected rows [N, ...] (or a dict of them), got {short_repr(features)}")
    n = int(first.shape[0])
    out = None
    from xmodal.progress import progress as reporter

    with reporter(total=n, desc="embed videos", unit="video", show=progress) as bar:
        for start in range(0, n, block_rows):
            sl = slice(start, min(n, start + block_rows))
            emb = encode(_rows(features, sl), _rows(mask, sl))
            if out is None:
                out = torch.empty((n, emb.shape[1]), dtype=torch.float32)
            out[sl] = emb.float()
            bar.update(sl.stop - sl.start)
    if out is None:
        raise ValueError("features: no rows (0)")
    return out


def _rows(x: Any, sl: slice) -> Any:
    if x is None:
        return None
    return {k: v[sl] for k, v in x.items()} if isinstance(x, dict) else x[sl]


def captioned_everywhere(text_to_video: Any, num_videos: int) -> bool:
    """True when every one of ``num_videos`` videos has a caption in ``text_to_video`` (int ``[T]``).

    >>> captioned_everywhere([0, 2, 1, 1], 3), captioned_everywhere([0, 0], 2)
    (True, False)
    """
    from xmodal._validate import positive_int

    num_videos = positive_int(num_videos, "num_videos")
    t2v = np.asarray(text_to_video)
    if t2v.ndim != 1 or not np.issubdtype(t2v.dtype, np.integer):
        raise TypeError(f"text_to_video: expected integer video indices [T], got {t2v.dtype} {list(t2v.shape)}")
    return bool(np.bincount(t2v[(t2v >= 0) & (t2v < num_videos)], minlength=num_videos).all())


def _direction(test_time: Any, name: str, queries: torch.Tensor, gallery: torch.Tensor, direction: str
               ) -> dict:
    """The streaming keywords (``bias`` / ``transform``) of ``name`` for one direction: fitted on
    ``queries`` x ``gallery`` exactly as :meth:`~xmodal.retrieval.testtime.TestTime.similarities` fits it."""
    from xmodal.retrieval.testtime import _METHODS, fit_normalizer

    bank_name = _METHODS[name][1]
    if bank_name == "queries":
        bank = queries
    else:
        if bank_name not in test_time.banks:
            raise ValueError(f"normalizer: {name!r} needs the {bank_name!r} query bank, which this run lacks")
        bank = test_time.banks[bank_name][0 if direction == "t2v" else 1].to(queries)
    if name == "dsl":  # the dual softmax over the test queries themselves, fitted before it streams
        from xmodal.retrieval.testtime import build_normalizer

        norm = build_normalizer("dsl", **test_time._hp()).fit(queries, gallery)
    else:
        norm = fit_normalizer(name, queries, gallery, bank, **test_time._hp())
    return norm.streaming_kwargs()


@torch.no_grad()
def run_metrics(test_time: Any, name: str, text: torch.Tensor, video: torch.Tensor, text_to_video: Any, *,
                ks: tuple[int, ...] = (1, 5, 10, 50), ties: str = "pessimistic", v2t: str = "all-captions",
                block_size: int = 4096, progress: bool = False) -> dict:
    """``{"t2v": {...}, "v2t": {...}}`` as :func:`xmodal.retrieval.evaluate.retrieval_metrics` of
    ``test_time.similarities(text, video, name)``, streamed; ``"v2t"`` is left out when some video has no
    caption (text -> video only: a gallery of uncaptioned videos).

    Args:
        test_time: the run's :class:`~xmodal.retrieval.testtime.TestTime`.
        name: a fitted normaliser name (``selected`` resolved by the caller) or ``none``.
        text, video: L2-normalised embeddings ``[T, D]`` / ``[V, D]`` (float32). ``video`` is shifted in
            place by DN (the caller's own copy, e.g. :func:`embed_rows`).
        text_to_video: int ``[T]``, the video of each caption.
        ks, ties, v2t, block_size, progress: as :func:`xmodal.metrics.streaming_text_video`.

    Shape:
        text ``[T, D]``, video ``[V, D]``, text_to_video ``[T]``.
    """
    from xmodal.metrics import streaming_retrieval
    from xmodal.metrics.streaming import streaming_video_text
    from xmodal.retrieval.testtime import TestTime

    if not isinstance(test_time, TestTime):
        raise TypeError(f"test_time: expected a TestTime, got {type(test_time).__name__}")
    for x, label in ((text, "text"), (video, "video")):
        if not isinstance(x, torch.Tensor) or x.ndim != 2 or x.dtype != torch.float32:
            raise TypeError(f"{label}: expected a float32 tensor [N, D]")
    name = test_time.resolve(name)
    both = captioned_everywhere(text_to_video, int(video.shape[0]))
    t2v = torch.as_tensor(np.asarray(text_to_video, dtype=np.int64))
    opts = {"ks": ks, "ties": ties, "block_size": block_size, "progress": progress}
    if name == "none" or name == "dn":
        if name == "dn":
            if test_time.dn is None:
                raise ValueError("normalizer: 'dn' has no fitted state in this run")
            from xmodal.normalize import DistributionNormalization

            dn = DistributionNormalization.from_state_dict(test_time.dn)
            text = text - dn.lam * dn.mu_queries.to(text)
            video.sub_(dn.lam * dn.mu_gallery.to(video))  # the transform's numbers, without a second copy
        out = {"t2v": streaming_retrieval(text, video, t2v, **opts)}
        if both:
            out["v2t"] = streaming_video_text(video, text, t2v, v2t=v2t, **opts)
        return out
    out = {"t2v": streaming_retrieval(text, video, t2v, **opts, **_direction(test_time, name, text, video, "t2v"))}
    if both:
        out["v2t"] = streaming_video_text(video, text, t2v, v2t=v2t, **opts,
                                          **_direction(test_time, name, video, text, "v2t"))
    return out
