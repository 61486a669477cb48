"""Which training pairs form each batch (seeded per epoch, so a resumed run sees the same batches).

Three samplers, all returning the text indices of every global batch of one epoch;
the video of text ``i`` is ``text_to_video[i]``, which the trainer passes to the
losses as ``ids`` (equal ids are positives, never negatives):

- ``captions``: every caption once, shuffled.
- ``videos``: every video once, with one of its captions drawn at random.
- ``k_captions``: every video once with ``captions_per_video = K`` of its captions
  (MIL-NCE sec. 3.2: a clip's ``K`` candidate narrations form its positive bag); a
  batch of ``B`` texts holds ``B / K`` videos, each video's ``K`` texts contiguous.
  A video with fewer than ``K`` captions gets all of them plus repeats drawn at random.

The last incomplete batch is dropped (a few pairs make a degenerate contrastive batch).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from xmodal._validate import short_repr

SAMPLINGS = ("captions", "videos", "k_captions")


def _by_video(text_to_video: np.ndarray) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for i, v in enumerate(np.asarray(text_to_video).tolist()):
        groups.setdefault(v, []).append(i)
    return groups


def epoch_batches(epoch: int, *, seed: int, text_to_video: np.ndarray, batch_size: int,
                  sampling: str = "captions", captions_per_video: int = 1) -> list[np.ndarray]:
    """Text indices of every (global) batch of one epoch, seeded by ``(seed, epoch)``.

    Args:
        epoch: 0-based epoch.
        seed: the run's seed.
        text_to_video: int ``[T]``, the video of each text.
        batch_size: texts per batch (a multiple of ``captions_per_video`` for ``k_captions``).
        sampling: ``captions`` | ``videos`` | ``k_captions``.
        captions_per_video: ``K`` of ``k_captions``.

    Shape:
        a list of int64 ``[batch_size]`` arrays.

    >>> t2v = np.repeat(np.arange(4), 3)          # 4 videos x 3 captions
    >>> b = epoch_batches(0, seed=0, text_to_video=t2v, batch_size=4, sampling="k_captions",
    ...                   captions_per_video=2)
    >>> [t2v[x].tolist()[0::2] == t2v[x].tolist()[1::2] for x in b]
    [True, True]
    """
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling: unknown option {sampling!r}; expected one of {', '.join(SAMPLINGS)}")
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size: must be a positive integer, got {short_repr(batch_size)}")
    g = np.random.default_rng([seed, epoch, 1])
    if sampling == "captions":
        order = g.permutation(len(text_to_video))
    else:
        groups = _by_video(text_to_video)
        videos = g.permutation(sorted(groups)).tolist()
        if sampling == "videos":
            order = np.array([groups[v][g.integers(len(groups[v]))] for v in videos], dtype=np.int64)
        else:
            k = int(captions_per_video)
            if k < 1 or batch_size % k:
                raise ValueError(f"captions_per_video: must be >= 1 and divide the batch size {batch_size}, "
                                 f"got {short_repr(captions_per_video)}")
            order = np.concatenate([_k_of(groups[v], k, g) for v in videos]) if videos else np.zeros(0, np.int64)
    order = np.asarray(order, dtype=np.int64)
    n = len(order) // batch_size
    return [order[i * batch_size:(i + 1) * batch_size] for i in range(n)]


def _k_of(texts: list[int], k: int, g: np.random.Generator) -> np.ndarray:
    """``k`` distinct texts of one video (all of them plus random repeats when fewer)."""
    texts_arr = np.asarray(texts, dtype=np.int64)
    if len(texts_arr) >= k:
        return texts_arr[np.sort(g.choice(len(texts_arr), k, replace=False))]
    extra = texts_arr[g.integers(len(texts_arr), size=k - len(texts_arr))]
    return np.concatenate([texts_arr, extra])


def shuffle_pairs(split, fraction: float, *, seed: int):
    """A copy of ``split`` where a ``fraction`` of the texts are re-assigned to the videos
    of other texts of that fraction (a random permutation among them): mismatched pairs
    (Cali-NCE Table 7). The caller's split is not modified."""
    rng = np.random.default_rng([seed, 7919])
    m = split.num_texts
    idx = rng.choice(m, int(round(fraction * m)), replace=False)
    t2v = split.text_to_video.copy()
    t2v[idx] = split.text_to_video[rng.permutation(idx)]
    return dataclasses.replace(split, text_to_video=t2v)
