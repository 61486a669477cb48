"""Class-label evaluations of frozen embeddings: linear probe, zero-shot, label retrieval.

* :func:`linear_probe`: Cali-NCE (Zhao et al.) Sec. 5.1 "Video action recognition": a
  linear classifier (the paper: linear SVM) trained on frozen video embeddings.
* :func:`zero_shot`: DN (Zhou et al., NeurIPS 2023) Sec. 4.1 / 4.4: class prompts are
  the gallery, each image is assigned its most similar classes; DN (eq. 7) is applied
  to both sides before the cosine.
* :func:`label_retrieval`: Cali-NCE Sec. 5.1 "Video-to-video retrieval": cosine nearest
  neighbours; a query succeeds at K if a video of its class is among its top K.

Top-k accuracies use the pessimistic tie rule of :func:`xmodal.metrics.retrieval`:
classes scoring exactly as the true class rank ahead of it.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from xmodal._validate import as_tensor, choice, short_repr
from xmodal.metrics._common import block_counts, check_ks, check_ties, similarity, summarize
from xmodal.metrics.ranking import label_retrieval_from_sim

C_GRID = tuple(10.0 ** np.arange(-3, 4))


def _labels(labels: Any, n: int, name: str) -> np.ndarray:
    lab = as_tensor(labels, name).detach().cpu().numpy()
    if lab.ndim != 1 or lab.shape[0] != n:
        raise ValueError(f"{name}: expected {n} labels (one per row), got shape {lab.shape}")
    if lab.dtype.kind == "f" or lab.dtype == bool:
        raise TypeError(f"{name}: expected integer class labels, got dtype {lab.dtype}")
    return lab.astype(np.int64)


def _features(x: Any, name: str) -> np.ndarray:
    return similarity(x, name).detach().cpu().numpy().astype(np.float64)


def _topk_accuracy(scores: np.ndarray, true_col: np.ndarray, ks: tuple[int, ...]) -> dict:
    """Percent of rows whose true column (-1: absent) has pessimistic rank <= k."""
    out = {}
    valid = true_col >= 0
    s_true = np.where(valid, scores[np.arange(len(scores)), np.maximum(true_col, 0)], np.inf)
    rank = (scores >= s_true[:, None]).sum(1)
    for k in ks:
        out[f"top{k}"] = 100.0 * float(np.mean(valid & (rank <= k)))
    return out


def linear_probe(train_features: Any, train_labels: Any, test_features: Any, test_labels: Any, *,
                 classifier: str = "logreg", seed: int = 0, ks: Sequence[int] = (1, 5),
                 c_grid: Sequence[float] = C_GRID, holdout: float = 0.2) -> dict:
    """Top-k accuracy (percent) of a linear classifier on frozen features.

    Features are standardised with the training statistics (``StandardScaler``). The
    inverse regularisation ``C`` is chosen from ``c_grid`` by top-1 accuracy on a seeded,
    stratified ``holdout`` part of the training set, then the classifier is refit on all
    of it. ``"logreg"``: multinomial ``LogisticRegression``; ``"svm"``: ``LinearSVC``
    (one-vs-rest; top-k from its decision function), the paper's choice. A test label
    never seen in training counts as a miss.

    Returns:
        ``{"top1", "top5", "C"}`` (keys ``top{k}`` per ``ks``).

    Shape:
        train_features: [N, D]; train_labels: [N]; test_features: [M, D]; test_labels: [M].

    Examples:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> y = np.repeat(np.arange(3), 20)
        >>> x = rng.normal(size=(60, 4)) + 3 * np.eye(4)[y]
        >>> linear_probe(x, y, x, y)["top1"]
        100.0
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import LinearSVC

    classifier = choice(classifier, "classifier", ("logreg", "svm"))
    ks = check_ks(ks)
    xtr, xte = _features(train_features, "train_features"), _features(test_features, "test_features")
    if xtr.shape[1] != xte.shape[1]:
        raise ValueError(f"test_features: dimension {xte.shape[1]} differs from train_features' {xtr.shape[1]}")
    ytr = _labels(train_labels, len(xtr), "train_labels")
    yte = _labels(test_labels, len(xte), "test_labels")
    if np.unique(ytr).size < 2:
        raise ValueError("train_labels: need at least two classes")
    if not 0.0 < holdout < 1.0:
        raise ValueError(f"holdout: must lie in (0, 1), got {short_repr(holdout)}")

    def make(c: float):
        if classifier == "svm":
            return LinearSVC(C=c, random_state=seed, max_iter=5000)
        return LogisticRegression(C=c, max_iter=2000, random_state=seed)

    def fit(x: np.ndarray, y: np.ndarray, c: float):
        scaler = StandardScaler().fit(x)
        return scaler, make(c).fit(scaler.transform(x), y)

    def scores(model, x: np.ndarray, y: np.ndarray, k: tuple[int, ...]) -> dict:
        scaler, clf = model
        s = clf.decision_function(scaler.transform(x))
        if s.ndim == 1:   # binary: one column for classes_[1]
            s = np.stack([-s, s], axis=1)
        col = {c: i for i, c in enumerate(clf.classes_)}
        return _topk_accuracy(s, np.array([col.get(v, -1) for v in y]), k)

    counts = np.bincount(ytr - ytr.min())
    strat = ytr if counts[counts > 0].min() >= 2 else None
    a, b, ya, yb = train_test_split(xtr, ytr, test_size=holdout, random_state=seed, stratify=strat)
    best_c, best = float(c_grid[0]), -1.0
    for c in c_grid:
        if np.unique(ya).size < 2:
            break
        acc = scores(fit(a, ya, float(c)), b, yb, (1,))["top1"]
        if acc > best:
            best_c, best = float(c), acc
    out = scores(fit(xtr, ytr, best_c), xte, yte, ks)
    out["C"] = best_c
    return out


@torch.no_grad()
def zero_shot(features: Any, class_embeddings: Any, labels: Any, *, ks: Sequence[int] = (1, 5),
              normalizer: Any = None) -> dict:
    """Zero-shot classification accuracy (percent): class embeddings are the gallery.

    DN Sec. 4.1: each image is scored against the embedded class prompts ("a photo of
    {class}") by cosine similarity; with a fitted
    :class:`xmodal.normalize.DistributionNormalization` ``normalizer``, its
    ``transform(features, class_embeddings)`` (eq. 7: subtract ``lam`` times the means)
    is applied before the final L2 normalisation.

    Returns:
        ``{"top1", "top5"}`` (``top{k}`` per ``ks``).

    Shape:
        features: [N, D]; class_embeddings: [C, D]; labels: int [N] in [0, C).

    Examples:
        >>> import numpy as np
        >>> zero_shot(np.array([[1.0, 0.1], [0.2, 1.0]]), np.eye(2), np.array([0, 0]), ks=(1,))
        {'top1': 50.0}
    """
    x = similarity(features, "features")
    c = similarity(class_embeddings, "class_embeddings").to(x.device)
    if x.shape[1] != c.shape[1]:
        raise ValueError(f"class_embeddings: dimension {c.shape[1]} differs from features' {x.shape[1]}")
    y = _labels(labels, x.shape[0], "labels")
    if y.size and (y.min() < 0 or y.max() >= c.shape[0]):
        raise ValueError(f"labels: must lie in [0, {c.shape[0]}) (number of classes)")
    ks = check_ks(ks)
    if normalizer is not None:
        if not hasattr(normalizer, "transform"):
            raise TypeError("normalizer: expected a fitted DistributionNormalization (with .transform)")
        x, c = (torch.as_tensor(t) for t in normalizer.transform(x, c))
    s = F.normalize(x.double(), dim=1) @ F.normalize(c.double(), dim=1).T
    return _topk_accuracy(s.cpu().numpy(), y, ks)


@torch.no_grad()
def label_retrieval(embeddings: Any, labels: Any, ks: Sequence[int] = (1, 5, 10, 20, 50), *,
                    gallery: Any = None, gallery_labels: Any = None,
                    ties: str = "pessimistic") -> dict:
    """Retrieval by class label (Cali-NCE video-to-video retrieval): R@K, MdR, MnR.

    Cosine similarities; a gallery item is correct when it has the query's label.
    Without ``gallery`` every embedding queries all the others (the query itself is
    excluded); queries whose class has no other member are left out. With ``gallery``
    (Cali-NCE: test queries against the training split), queries whose class is absent
    from the gallery are left out. ``num_queries`` says how many were evaluated.

    Returns:
        ``{"R@k", ..., "MdR", "MnR", "num_queries"}`` (percent, 1-based ranks).

    Shape:
        embeddings: [N, D]; labels: [N]; gallery: [G, D]; gallery_labels: [G].

    Examples:
        >>> import numpy as np
        >>> e = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
        >>> label_retrieval(e, np.array([0, 0, 1, 1]), ks=(1,))["R@1"]
        100.0
    """
    q = F.normalize(similarity(embeddings, "embeddings").double(), dim=1)
    yq = torch.from_numpy(_labels(labels, q.shape[0], "labels"))
    ks, ties = check_ks(ks), check_ties(ties)
    if gallery is None:
        if gallery_labels is not None:
            raise ValueError("gallery_labels: given without gallery")
        g, yg = q, yq
    else:
        g = F.normalize(similarity(gallery, "gallery").double(), dim=1).to(q.device)
        if g.shape[1] != q.shape[1]:
            raise ValueError(f"gallery: dimension {g.shape[1]} differs from embeddings' {q.shape[1]}")
        if gallery_labels is None:
            raise ValueError("gallery_labels: required with gallery")
        yg = torch.from_numpy(_labels(gallery_labels, g.shape[0], "gallery_labels"))
    if gallery is None:
        return label_retrieval_from_sim(q @ q.T, yq, ks=ks, ties=ties)
    sim = q @ g.T
    pos = (yq[:, None] == yg[None, :]).to(sim.device)
    rows = pos.any(1)
    if not bool(rows.any()):
        raise ValueError("labels: no query has another item of its class in the gallery")
    sim, pos = sim[rows], pos[rows]
    res = summarize(*block_counts(sim, mask=pos, ties=ties), ks)
    res["num_queries"] = int(rows.sum())
    return res


__all__ = ["linear_probe", "zero_shot", "label_retrieval"]
