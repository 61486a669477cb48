"""Class distributions for TS++ class-frequency temperatures (TS++ Sec. 4.1.2).

``K_c``, the number of training samples of class ``c``, comes either from labels (e.g.
EPIC-KITCHENS-100 verb/noun classes, :func:`xmodal.data.epic_train_classes`) or, without
labels, from k-means clusters of the training captions' sentence embeddings.
"""

from __future__ import annotations

import logging

import numpy as np

from xmodal._validate import as_tensor, short_repr

logger = logging.getLogger(__name__)
# Exact (Lloyd) k-means up to this many embeddings; MiniBatchKMeans only above (TS++
# sec. 4.1.2 clusters the captions; MiniBatchKMeans is an approximation of it).
EXACT_KMEANS_MAX = 100_000


def class_counts(labels, num_classes: int | None = None) -> np.ndarray:
    """Number of samples per class id.

    Args:
        labels: int ``[N]`` class ids >= 0 (numpy or torch).
        num_classes: length of the result (default ``max(labels) + 1``).

    Returns:
        int64 ``[num_classes]``: ``counts[c] = #{i : labels[i] == c}`` (0 for unseen ids).
    """
    lab = as_tensor(labels, "labels").detach().cpu().numpy()
    if lab.ndim != 1:
        raise ValueError(f"labels: expected a 1-d array, got shape {lab.shape}")
    if lab.size and not np.issubdtype(lab.dtype, np.integer):
        if not np.issubdtype(lab.dtype, np.floating) or not np.all(np.mod(lab, 1) == 0):
            raise TypeError(f"labels: expected integer class ids, got dtype {lab.dtype}")
    lab = lab.astype(np.int64)
    if lab.size and lab.min() < 0:
        raise ValueError(f"labels: class ids must be >= 0, got {lab.min()}")
    n = int(lab.max()) + 1 if lab.size else 0
    if num_classes is not None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < n:
            raise ValueError(f"num_classes: must be an integer >= max(labels) + 1 = {n}, got {short_repr(num_classes)}")
        n = int(num_classes)
    from xmodal.data.npyfile import memory_limit

    if 8 * n > memory_limit():  # one int64 count per class id up to the largest
        raise ValueError(f"labels: class id {n - 1} would need {n} counts ({8 * n / 2**30:.3g} GiB); "
                         f"renumber the classes 0, 1, 2, ...")
    return np.bincount(lab, minlength=n).astype(np.int64)


def kmeans_classes(embeddings, k: int = 200, seed: int = 0, *, normalize: bool = True,
                   minibatch: bool | None = None, threads: int | None = 1) -> np.ndarray:
    """Unsupervised classes: seeded k-means over (sentence) embeddings.

    Args:
        embeddings: float ``[N, D]`` (numpy or torch), e.g. MiniLM caption embeddings.
        k: number of clusters (TS++ default 200); must not exceed ``N``.
        seed: seed of the k-means++ initialisation (results are deterministic per seed).
        normalize: L2-normalise rows first (cosine geometry of sentence embeddings).
        minibatch: use ``MiniBatchKMeans`` (default: only when ``N > 100,000``; exact
            ``KMeans`` up to 100k texts). Which one ran is logged (logger ``xmodal.data.classes``:
            INFO for exact, WARNING for MiniBatchKMeans).
        threads: BLAS/OpenMP threads for the clustering (``None``: the libraries'
            default). Default 1: on a loaded machine scikit-learn's OpenMP threads
            spin-wait (seen: 11 s instead of 0.03 s for 200 points on 2 busy cores).

    Returns:
        int64 ``[N]`` cluster ids in ``[0, k)``; ``class_counts`` of them gives ``K_c``.
    """
    from sklearn.cluster import KMeans, MiniBatchKMeans
    from threadpoolctl import threadpool_limits

    x = as_tensor(embeddings, "embeddings").detach().cpu().numpy()
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"embeddings: expected a non-empty [N, D] array, got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"embeddings: expected floating values, got dtype {x.dtype}")
    x = x.astype(np.float32)  # a copy: the caller's array is never touched
    if not np.isfinite(x).all():
        raise ValueError("embeddings: contains NaN/inf values")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= x.shape[0]:
        raise ValueError(f"k: must be an integer in [1, {x.shape[0]}] (number of embeddings), got {short_repr(k)}")
    if normalize:
        x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    if minibatch is None:
        minibatch = x.shape[0] > EXACT_KMEANS_MAX
    if minibatch:  # the approximate one is a WARNING so it is seen without logging configured
        logger.warning("kmeans_classes: MiniBatchKMeans (approximate) over %d embeddings, k=%d", x.shape[0], int(k))
    else:
        logger.info("kmeans_classes: exact KMeans over %d embeddings, k=%d", x.shape[0], int(k))
    if minibatch:
        km = MiniBatchKMeans(n_clusters=int(k), random_state=int(seed), n_init=1, batch_size=4096)
    else:
        km = KMeans(n_clusters=int(k), random_state=int(seed), n_init=1)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads: expected a positive integer or None, got {short_repr(threads)}")
    with threadpool_limits(limits=threads):
        return km.fit_predict(x).astype(np.int64)
