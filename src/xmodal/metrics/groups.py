"""Per-group retrieval metrics: head vs tail classes and any other query grouping.

TS++ (Sheludzko 2025, Ch. 4-5) targets long-tail data: its class-frequency temperatures
help rare ("tail") semantics, which an average over all queries hides. These helpers
split the queries by a group label and evaluate each group on the full gallery.
Classes come from dataset labels (EPIC-100 verb/noun classes, with the official tail
lists ``EPIC_100_tail_{verbs,nouns}.csv``) or, without labels, from k-means clusters of
the caption embeddings (:func:`xmodal.data.kmeans_classes`, TS++ Sec. 4.1.2).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from xmodal._validate import as_tensor, option, short_repr
from xmodal.metrics._common import positives_of, similarity
from xmodal.metrics.multi_instance import mir
from xmodal.metrics.ranking import retrieval


def _groups(groups: Any, num_queries: int) -> np.ndarray:
    g = groups.detach().cpu().numpy() if isinstance(groups, torch.Tensor) else np.asarray(groups)
    if g.ndim != 1 or g.shape[0] != num_queries:
        raise ValueError(f"groups: expected one label per query ({num_queries}), got shape {g.shape}")
    if g.dtype.kind == "f":
        raise TypeError("groups: expected integer or string labels, got floats")
    return g


def _key(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def retrieval_by_group(sim: Any, positives: Any, groups: Any, ks: Sequence[int] = (1, 5, 10, 50),
                       ties: str = "pessimistic") -> dict[Any, dict]:
    """R@K / MdR / MnR of each group of queries (the gallery stays whole).

    Args:
        sim: similarities ``[Q, G]``.
        positives: int ``[Q]`` or bool ``[Q, G]`` as in :func:`xmodal.metrics.retrieval`.
        groups: one label (int or str) per query, e.g. from :func:`head_tail_groups`.
        ks, ties: as in :func:`xmodal.metrics.retrieval`.

    Returns:
        ``{group: {"R@k", ..., "MdR", "MnR", "num_queries"}}``, groups in sorted order.

    Shape:
        sim: [Q, G]; positives: [Q] or [Q, G]; groups: [Q].

    Examples:
        >>> import numpy as np
        >>> sim = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]])
        >>> r = retrieval_by_group(sim, np.array([0, 1, 1]), ["head", "tail", "tail"], ks=(1,))
        >>> r["head"]["R@1"], r["tail"]["R@1"], r["tail"]["num_queries"]
        (100.0, 50.0, 2)
    """
    s = similarity(sim, "sim")
    pos = positives_of(positives, s.shape[0], s.shape[1], s.device)
    g = _groups(groups, s.shape[0])
    out = {}
    for label in np.unique(g):
        rows = torch.from_numpy(np.flatnonzero(g == label)).to(s.device)
        res = retrieval(s[rows], pos[rows], ks=ks, ties=ties)
        res["num_queries"] = int(rows.numel())
        out[_key(label)] = res
    return out


def mir_by_group(sim: Any, relevancy: Any, groups: Any, *, ties: str = "pessimistic",
                 empty: str = "skip") -> dict[Any, dict]:
    """EPIC-100 MIR mAP / nDCG (percent) of each group of query rows.

    Rows are the queries (e.g. text -> video with sentence classes as groups); see
    :func:`xmodal.metrics.mir` for the definitions, ``ties`` and ``empty``.

    Returns:
        ``{group: {"mAP", "nDCG", "num_queries"}}``.

    Shape:
        sim: [Q, G]; relevancy: [Q, G]; groups: [Q].

    Examples:
        >>> import numpy as np
        >>> sim = np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]])
        >>> rel = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
        >>> r = mir_by_group(sim, rel, [0, 1, 1])
        >>> r[0]["mAP"], r[1]["mAP"]
        (100.0, 75.0)
    """
    s = similarity(sim, "sim")
    r = as_tensor(relevancy, "relevancy")
    if tuple(r.shape) != tuple(s.shape):
        raise ValueError(f"relevancy: expected shape {tuple(s.shape)} (same as sim), got {tuple(r.shape)}")
    g = _groups(groups, s.shape[0])
    out = {}
    for label in np.unique(g):
        rows = torch.from_numpy(np.flatnonzero(g == label))
        res = mir(s[rows.to(s.device)], r[rows.to(r.device)], ties=ties, empty=empty)
        res["num_queries"] = int(rows.numel())
        out[_key(label)] = res
    return out


def _class_id(c: Any, given: Any) -> int:
    """One class id of ``tail_classes``: an integer (or a whole float) that fits int64."""
    if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer, float, np.floating)):
        raise TypeError(f"tail_classes: expected integer class ids, got {short_repr(given)}")
    if isinstance(c, (float, np.floating)) and not (np.isfinite(c) and float(c).is_integer()):
        raise ValueError(f"tail_classes: expected integer class ids, got {short_repr(given)}")
    if not -(2 ** 63) <= int(c) < 2 ** 63:
        raise ValueError(f"tail_classes: class id {int(c)} does not fit 64 bits")
    return int(c)


def head_tail_groups(class_ids: Any, *, class_counts: Any = None, tail_classes: Any = None,
                     head_mass: float = 0.8) -> np.ndarray:
    """``"head"`` / ``"tail"`` label of each sample from the frequency of its class.

    Either ``tail_classes`` is given (e.g. the official EPIC-100 lists, see
    :func:`epic_tail_classes`) or the head is the smallest set of the most frequent
    classes that together hold at least ``head_mass`` of the samples (counts from
    ``class_counts``, typically the training split's, else from ``class_ids``); all other
    classes are tail. Ties in frequency are broken by class id.

    Args:
        class_ids: int ``[N]`` class of each evaluated sample (ids < 0: no class, "tail").
        class_counts: optional int ``[C]`` training samples per class.
        tail_classes: optional iterable of tail class ids.
        head_mass: fraction of samples covered by the head classes, in (0, 1].

    Returns:
        str array ``[N]`` of ``"head"`` / ``"tail"``.

    Examples:
        >>> head_tail_groups([0, 0, 0, 1, 2], head_mass=0.5).tolist()
        ['head', 'head', 'head', 'tail', 'tail']
    """
    ids = as_tensor(class_ids, "class_ids").detach().cpu().numpy()
    if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
        raise TypeError(f"class_ids: expected a 1-d integer array, got {ids.dtype} {ids.shape}")
    ids = ids.astype(np.int64)
    if tail_classes is not None:
        if isinstance(tail_classes, (str, bytes, dict)) or not hasattr(tail_classes, "__iter__"):
            raise TypeError(f"tail_classes: expected an iterable of class ids, got {short_repr(tail_classes)}")
        try:
            listed = [c.item() if hasattr(c, "item") and getattr(c, "ndim", 0) == 0 else c
                      for c in (tail_classes.reshape(-1) if hasattr(tail_classes, "reshape") else tail_classes)]
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"tail_classes: expected an iterable of class ids, got {short_repr(tail_classes)}") from None
        listed = [_class_id(c, tail_classes) for c in listed]  # inf, 1.5, 1e30: refused
        tail = np.isin(ids, np.asarray(listed, dtype=np.int64)) | (ids < 0)
        return np.where(tail, "tail", "head")
    if not 0.0 < float(head_mass) <= 1.0:
        raise ValueError(f"head_mass: must lie in (0, 1], got {short_repr(head_mass)}")
    if class_counts is None:
        counts = np.bincount(ids[ids >= 0], minlength=int(ids.max(initial=-1)) + 1)
    else:
        counts = as_tensor(class_counts, "class_counts").detach().cpu().numpy().astype(np.int64)
        if counts.ndim != 1 or (counts < 0).any():
            raise ValueError("class_counts: expected a 1-d array of non-negative counts")
        if ids.size and ids.max() >= counts.size:
            raise ValueError(f"class_ids: id {int(ids.max())} >= len(class_counts) = {counts.size}")
    order = np.lexsort((np.arange(counts.size), -counts))
    cum = np.cumsum(counts[order])
    total = cum[-1] if cum.size else 0
    n_head = int(np.searchsorted(cum, head_mass * total - 1e-9 * total) + 1) if total else 0
    head = np.zeros(counts.size, bool)
    head[order[:n_head]] = True
    is_head = np.zeros(ids.shape, bool)
    ok = ids >= 0
    is_head[ok] = head[ids[ok]]
    return np.where(is_head, "head", "tail")


def epic_tail_classes(root: str | os.PathLike, kind: str = "verb") -> set[int]:
    """The official EPIC-KITCHENS-100 tail class ids (``EPIC_100_tail_{verbs,nouns}.csv``).

    Args:
        root: folder holding the CSVs (e.g. ``../shared/data/epic100``).
        kind: ``"verb"`` or ``"noun"``.
    """
    kind = option(kind, "kind", ("verb", "noun"))
    path = Path(root) / f"EPIC_100_tail_{kind}s.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or kind not in rows[0]:
        raise ValueError(f"{path}: expected a '{kind}' column")
    return {int(r[kind]) for r in rows}


__all__ = ["retrieval_by_group", "mir_by_group", "head_tail_groups", "epic_tail_classes"]
