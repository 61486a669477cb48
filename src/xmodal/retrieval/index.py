"""Large-gallery top-k search through FAISS (optional extra ``xmodal[faiss]``).

Per-gallery biases (DN's ``-lam mu_x . y_j``, NCL's Sinkhorn ``b_j``) are folded
into the index: every gallery vector gets one extra coordinate ``b_j`` and every
query a constant ``1``, so ``[x, 1] . [y_j, b_j] = x . y_j + b_j`` and the biased
top-k stays a plain maximum-inner-product search (exact with ``IndexFlatIP``,
approximate with ``IndexIVFFlat``).

A trained run's selected test-time normaliser is folded in by
:func:`fold_run_normalizer`: DN exactly (the gallery is stored as ``y_j - lam mu_y``
and every query is shifted by ``-lam mu_x`` before the search, so the index scores
are eq. 7 of Zhou et al. 2023), NCL/Sinkhorn as the gallery bias ``b_j`` (Park et
al. 2022, sec. 3.4). QB-Norm, IS and DSL depend on each query's scores against
the whole gallery and cannot be folded into an inner product.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xmodal._validate import as_tensor, float_matrix, option, whole_number

__all__ = ["BiasedIndex", "fold_bias", "import_faiss", "fold_run_normalizer", "selected_normalizer", "best_foldable",
           "FOLDABLE"]

#: Run normalisers an inner-product index can hold exactly.
FOLDABLE = ("none", "dn", "sinkhorn", "ncl")


def import_faiss():
    """Import FAISS or raise an ImportError naming the ``[faiss]`` extra."""
    try:
        import faiss  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("xmodal.retrieval.index needs FAISS: pip install 'xmodal[faiss]' "
                          "(or faiss-cpu / faiss-gpu)") from exc
    return faiss


def _float32(x: Any, name: str) -> np.ndarray:
    t = float_matrix(x, name)
    return np.ascontiguousarray(t.detach().cpu().numpy(), dtype=np.float32)


def fold_bias(queries: Any | None, gallery: Any | None, bias: Any | None = None
              ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Append ``1`` to queries ``[Q, D]`` and ``bias`` ``[N]`` to gallery ``[N, D]`` (float32 copies).

    ``bias=None`` appends ``0`` to the gallery (an unbiased index of the same width).
    """
    q = g = None
    if queries is not None:
        q = _float32(queries, "queries")
        q = np.hstack([q, np.ones((q.shape[0], 1), np.float32)])
    if gallery is not None:
        g = _float32(gallery, "gallery")
        if bias is None:
            b = np.zeros(g.shape[0], np.float32)
        else:
            b = float_matrix(bias, "bias", ndim=1).detach().cpu().numpy().astype(np.float32)
            if b.shape[0] != g.shape[0]:
                raise ValueError(f"bias: expected shape ({g.shape[0]},), got {tuple(b.shape)}")
        g = np.hstack([g, b[:, None]])
    return q, g


class BiasedIndex:
    """Top-k maximum-inner-product search over a gallery, with an optional folded bias.

    Args:
        gallery: ``[N, D]`` embeddings (numpy or torch).
        bias: optional ``[N]`` per-gallery bias (e.g. ``SinkhornBias(...).bias`` or
            ``DistributionNormalization.gallery_bias(gallery)``).
        kind: ``"flat"`` (exact ``IndexFlatIP``) or ``"ivf"`` (``IndexIVFFlat``,
            inner product, trained on the gallery itself).
        nlist: IVF cells (default ``~4 sqrt(N)``, at most ``N``).
        nprobe: IVF cells visited per query (default 8).

    ``search(queries, k)`` returns ``(scores [Q, k], indices [Q, k])`` as numpy
    (float32 scores ``x . y_j + b_j``; indices int64, -1 where fewer than ``k`` found).
    """

    def __init__(self, gallery: Any, bias: Any | None = None, *, kind: str = "flat",
                 nlist: int | None = None, nprobe: int = 8) -> None:
        faiss = import_faiss()
        self.kind = option(kind, "kind", ("flat", "ivf"))
        if gallery is None:
            raise TypeError("gallery: expected [N, D] embeddings (numpy or torch), got None")
        _, g = fold_bias(None, gallery, bias)
        self.num_items, self.dim = g.shape[0], g.shape[1] - 1
        if self.kind == "flat":
            self.index = faiss.IndexFlatIP(g.shape[1])
        else:
            nlist = (whole_number(nlist, "nlist", minimum=1) if nlist is not None
                     else max(1, min(g.shape[0], int(4 * np.sqrt(g.shape[0])))))
            if nlist > g.shape[0]:
                raise ValueError(f"nlist: must be in [1, {g.shape[0]}], got {nlist}")
            nprobe = whole_number(nprobe, "nprobe", minimum=1)
            self._quantizer = faiss.IndexFlatIP(g.shape[1])
            self.index = faiss.IndexIVFFlat(self._quantizer, g.shape[1], nlist,
                                            faiss.METRIC_INNER_PRODUCT)
            self.index.train(g)
            self.index.nprobe = min(int(nprobe), nlist)
        self.index.add(g)

    def search(self, queries: Any, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Biased top-``k``.  Shape: queries ``[Q, D]`` -> ``([Q, k], [Q, k])``."""
        k = whole_number(k, "k", minimum=1)
        q, _ = fold_bias(queries, None)
        if q.shape[1] != self.dim + 1:
            raise ValueError(f"queries: embedding size {q.shape[1] - 1} != gallery's {self.dim}")
        scores, indices = self.index.search(q, min(int(k), self.num_items))
        return scores, indices.astype(np.int64)

    def search_torch(self, queries: Any, k: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`search`, returning tensors on the queries' device."""
        device = as_tensor(queries, "queries").device
        scores, indices = self.search(queries, k)
        return torch.from_numpy(scores).to(device), torch.from_numpy(indices).to(device)

    # -- persistence -------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the FAISS index (gallery with the folded bias) to the file ``path``."""
        import_faiss().write_index(self.index, str(path))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "BiasedIndex":
        """Read an index written by :meth:`save`."""
        faiss = import_faiss()
        if not Path(path).is_file():
            raise FileNotFoundError(f"path: no such file: {path}")
        _check_declared_size(Path(path))
        try:
            index = faiss.read_index(str(path))
        except RuntimeError as exc:  # FAISS reports a foreign/corrupt file as RuntimeError
            raise ValueError(f"path: {path} is not a FAISS index ({str(exc).splitlines()[0]})") from None
        obj = cls.__new__(cls)
        obj.index, obj.num_items, obj.dim = index, int(index.ntotal), int(index.d) - 1
        obj.kind = "ivf" if hasattr(index, "nprobe") else "flat"
        return obj


def _check_declared_size(path: Path) -> None:
    """Refuse a flat / IVF-flat FAISS file whose header declares more vectors than the file
    holds, before FAISS allocates them (a tiny file could otherwise ask for a terabyte)."""
    import struct

    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(45)
    if len(head) < 37 or head[:4] not in (b"IxFI", b"IxF2", b"IwFl"):
        return  # other kinds: left to FAISS's own checks
    d, ntotal = struct.unpack("<iq", head[4:16])
    declared = max(0, d) * max(0, ntotal) * 4
    if d < 1 or ntotal < 0 or declared > size:
        raise ValueError(f"path: {path} declares {ntotal} vectors of {d} values, more than its "
                         f"{size} bytes hold (corrupt or not written by xmodal)")
    metric = struct.unpack("<i", head[33:37])[0]
    if head[:4] != b"IwFl" and metric <= 1 and len(head) >= 45:
        count = struct.unpack("<Q", head[37:45])[0]
        if count * 4 > size:
            raise ValueError(f"path: {path} declares {count} stored values, more than its {size} bytes hold")


# ----------------------------------------------------------------------------- trained runs
def _test_time(model: Any):
    """The run's :class:`xmodal.retrieval.testtime.TestTime` (``model.test_time``)."""
    from xmodal.retrieval.testtime import TestTime

    tt = getattr(model, "test_time", None)
    if isinstance(tt, dict):
        tt = TestTime.from_state_dict(tt)
    if not isinstance(tt, TestTime):
        raise ValueError("model: has no test-time record (was it written by 'xmodal train'?)")
    return tt


def selected_normalizer(model: Any, normalizer: str = "selected") -> str:
    """Resolve ``"selected"`` to the name the run chose on val; check other names were fitted."""
    if not isinstance(normalizer, str):
        raise TypeError(f"normalizer: expected a string, got {type(normalizer).__name__}")
    return _test_time(model).resolve(normalizer)


def best_foldable(model: Any, metric: str = "rsum") -> str:
    """The normaliser an index folds for a run whose selected one cannot be folded: the one the
    trainer recorded (``test_time.selection["index_normalizer"]``, the rule of
    :mod:`xmodal.retrieval.selection`, which the run's summary names too); for older runs the
    best on val (by ``metric``) among those an index can hold (:data:`FOLDABLE`), ``"none"``
    when no other was fitted."""
    from xmodal.retrieval.evaluate import score

    tt = _test_time(model)
    recorded = (getattr(tt, "selection", None) or {}).get("index_normalizer")
    if recorded in FOLDABLE and (recorded == "none" or recorded in tt.names):
        return recorded
    val = tt.val or {}
    names = [n for n in dict.fromkeys(["none", *tt.names]) if n in FOLDABLE and n in val]
    if not names:
        return "none"
    # ties prefer none, then the earlier name, as xmodal.retrieval.testtime.select does
    return max(names, key=lambda n: (score(val[n], metric), n == "none", -names.index(n)))


@torch.no_grad()
def fold_run_normalizer(model: Any, video_embeddings: Any, normalizer: str = "selected", *,
                        metric: str = "rsum") -> dict[str, Any]:
    """The index form of a run's text -> video normaliser over a new gallery.

    The one place that reads the run's test-time state for the index (adapt here when
    the state's layout changes). DN and Sinkhorn are fitted on the run's stored query
    banks against ``video_embeddings`` exactly as the trainer fits them at test time.

    Args:
        model: a loaded run (``xmodal.load_model``).
        video_embeddings: ``[N, D]`` L2-normalised gallery embeddings (``model.encode_video``).
        normalizer: ``"selected"``, ``"none"``, ``"dn"``, ``"sinkhorn"`` or ``"ncl"``. When the
            run selected a normaliser that cannot be folded (QB-Norm, IS, DSL), ``"selected"``
            falls back to :func:`best_foldable` and says so in ``fallback_from``.
        metric: the run's selection metric (``train.metric``) for that fallback.

    Returns:
        ``{"normalizer": name, "gallery": [N, D], "bias": [N] or None,
        "query_shift": [D] or None}`` (and ``"fallback_from"`` after a fallback): the biased score of a text embedding ``x`` is
        ``(x - query_shift) . gallery_j + bias_j``.

    Shape:
        video_embeddings ``[N, D]`` -> gallery ``[N, D]``, bias ``[N]``, query_shift ``[D]``.
    """
    name = selected_normalizer(model, normalizer)
    video = float_matrix(video_embeddings, "video_embeddings")
    out: dict[str, Any] = {"normalizer": name, "gallery": video, "bias": None, "query_shift": None}
    if normalizer == "selected" and name not in FOLDABLE:
        out.update(normalizer=best_foldable(model, metric), fallback_from=name)
        name = out["normalizer"]
    if name == "none":
        return out
    if name not in FOLDABLE:
        raise ValueError(f"normalizer: {name!r} depends on each query's scores against the whole "
                         f"gallery and cannot be folded into an index; use one of "
                         f"{', '.join(FOLDABLE)} (or 'xmodal eval --run' for exact metrics)")
    from xmodal.retrieval.testtime import _METHODS, fit_normalizer

    tt = _test_time(model)
    if name == "dn":
        from xmodal.normalize import DistributionNormalization

        dn = DistributionNormalization.from_state_dict(tt.dn)
        out.update(gallery=video - dn.lam * dn.mu_gallery.to(video), query_shift=dn.lam * dn.mu_queries.to(video))
        return out
    bank = _METHODS[name][1]
    if bank not in tt.banks:
        raise ValueError(f"normalizer: {name!r} needs the {bank!r} query bank, which this run lacks")
    sink = fit_normalizer(name, video, video, tt.banks[bank][0].to(video), **tt._hp())
    out["bias"] = sink.bias.to(video)
    return out
