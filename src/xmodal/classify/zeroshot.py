"""Zero-shot classification of frozen image / video embeddings: class prompts are the gallery.

* :func:`class_embeddings`: CLIP's prompt ensembling (Radford et al. 2021, Sec. 3.1.4; OpenAI's
  ImageNet notebook): each prompt embedding L2-normalised, averaged over a class's templates, the mean
  L2-normalised again.
* :func:`class_ranks`: each item's 1-based rank of its true class among all classes by cosine,
  pessimistic ties (classes scoring exactly as the true one rank ahead of it), the rule of
  :func:`xmodal.metrics.zero_shot`; top-k accuracy is the percent of ranks <= k.
* :func:`dn_normalizers`: DN's zero-shot classification protocol (Zhou et al. 2023, Sec. 4.1 / 4.4,
  Table 2): ``mu_x`` from ``num_samples`` random unlabeled validation items, ``mu_y`` from the class
  embeddings (all of them, as the authors' code takes the mean of every caption embedding), ``lam``
  0.25, one normaliser per sampling seed (accuracies averaged, with their spread), plus the one
  normaliser whose ``mu_x`` is the average of the seeds' sample means (the per-query results).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from xmodal._validate import integer
from xmodal.normalize import DistributionNormalization

__all__ = ["class_embeddings", "class_ranks", "dn_normalizers", "topk"]

#: Items scored per block in :func:`class_ranks`.
BLOCK = 4096


def class_embeddings(prompt_features: Any, num_classes: int) -> np.ndarray:
    """Average each class's prompt embeddings as CLIP does: normalise each, mean, renormalise.

    Shape:
        prompt_features: ``[C * T, D]`` in class-major order (:func:`xmodal.classify.templates.prompts`)
        -> float32 ``[C, D]``.

    >>> class_embeddings(np.array([[2.0, 0.0], [0.0, 1.0], [0.0, 3.0], [0.0, 1.0]]), 2).astype(float).round(4).tolist()
    [[0.7071, 0.7071], [0.0, 1.0]]
    """
    x = torch.as_tensor(np.asarray(prompt_features), dtype=torch.float64)
    num_classes = integer(num_classes, "num_classes", minimum=1)
    if x.ndim != 2 or x.shape[0] % num_classes or x.shape[0] == 0:
        raise ValueError(f"prompt_features: expected [classes x templates, D] for {num_classes} classes, got "
                         f"shape {list(x.shape)}")
    if not bool(torch.isfinite(x).all()) or bool((x.norm(dim=1) == 0).any()):
        raise ValueError("prompt_features: NaN/inf or an all-zero prompt embedding")
    per = F.normalize(x, dim=1).reshape(num_classes, -1, x.shape[1]).mean(1)
    return F.normalize(per, dim=1).numpy().astype(np.float32)


def class_ranks(features: Any, class_emb: Any, labels: Any, normalizer: Any = None) -> np.ndarray:
    """1-based rank of each item's true class by cosine (pessimistic ties); with a fitted
    :class:`~xmodal.normalize.DistributionNormalization`, its ``transform`` (DN eq. 7) comes first,
    as in :func:`xmodal.metrics.zero_shot`.

    Shape:
        features: ``[N, D]``; class_emb: ``[C, D]``; labels: int ``[N]`` -> int32 ``[N]``.

    >>> class_ranks(np.array([[1.0, 0.1], [0.2, 1.0]]), np.eye(2), np.array([0, 0])).tolist()
    [1, 2]
    """
    x = torch.as_tensor(np.asarray(features), dtype=torch.float64)
    c = torch.as_tensor(np.asarray(class_emb), dtype=torch.float64)
    y = np.asarray(labels).astype(np.int64)
    if normalizer is not None:
        x, c = (torch.as_tensor(t).double() for t in normalizer.transform(x.float(), c.float()))
    x, c = F.normalize(x, dim=1), F.normalize(c, dim=1)
    out = np.empty(len(x), np.int32)
    for start in range(0, len(x), BLOCK):  # block by block: never the whole [N, C] score matrix
        s = (x[start:start + BLOCK] @ c.T).numpy()
        true = s[np.arange(len(s)), y[start:start + BLOCK]]
        out[start:start + BLOCK] = (s >= true[:, None]).sum(1)
    return out


def topk(ranks: np.ndarray, ks: tuple[int, ...] = (1, 5)) -> dict[str, float]:
    """``{"top1": %, "top5": %, ...}`` from 1-based ranks.

    >>> topk(np.array([1, 2, 7, 1]))
    {'top1': 50.0, 'top5': 75.0}
    """
    return {f"top{k}": 100.0 * float(np.mean(np.asarray(ranks) <= k)) for k in ks}


def dn_normalizers(val_features: Any, class_emb: Any, *, lam: float = 0.25, num_samples: int | None = 100,
                   seeds: int = 5, seed: int = 0) -> tuple[list[DistributionNormalization], DistributionNormalization]:
    """DN's Table 2 protocol: one fitted DN per sampling seed ``seed .. seed + seeds - 1`` (``mu_x``: the
    mean of ``num_samples`` validation rows drawn by :meth:`DistributionNormalization.sample_rows`,
    ``mu_y``: the mean of every class embedding), and the DN whose ``mu_x`` averages the seeds' means.

    Shape:
        val_features: ``[K, D]`` unlabeled validation items; class_emb: ``[C, D]``.
    """
    val = torch.as_tensor(np.asarray(val_features), dtype=torch.float32)
    c = torch.as_tensor(np.asarray(class_emb), dtype=torch.float32)
    seeds = integer(seeds, "seeds", minimum=1)
    sampler = DistributionNormalization(lam=lam, num_samples=num_samples, seed=seed)
    samples = []
    for k in range(seeds):
        rows = sampler.sample_rows(val.shape[0], k, 0)
        samples.append(val if rows is None else val[torch.from_numpy(rows)])
    per_seed = [DistributionNormalization(lam=lam, num_samples=None).fit(q, c) for q in samples]
    # equal sample sizes: the mean of the concatenated samples is the mean of the seeds' means
    pooled = DistributionNormalization(lam=lam, num_samples=None).fit(torch.cat(samples), c)
    return per_seed, pooled
