"""Large-gallery top-k search through FAISS (optional extra ``xmodal[faiss]``).

Per-gallery biases (DN's ``-lam mu_x . y_j``, NCL's Sinkhorn ``b_j``) are folded
into the index: every gallery vector gets one extra coordinate ``b_j`` and every
query a constant ``1``, so ``[x, 1] . [y_j, b_j] = x . y_j + b_j`` and the biased
top-k stays a plain maximum-inner-product search (exact with ``IndexFlatIP``,
approximate with ``IndexIVFFlat``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xmodal._validate import as_tensor, choice, float_matrix

__all__ = ["BiasedIndex", "fold_bias", "import_faiss"]


def import_faiss():
    """Import FAISS or raise an ImportError naming the ``[faiss]`` extra."""
    try:
        import faiss  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("xmodal.index needs FAISS: pip install 'xmodal[faiss]' "
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
        self.kind = choice(kind, "kind", ("flat", "ivf"))
        _, g = fold_bias(None, gallery, bias)
        self.num_items, self.dim = g.shape[0], g.shape[1] - 1
        if self.kind == "flat":
            self.index = faiss.IndexFlatIP(g.shape[1])
        else:
            nlist = int(nlist) if nlist is not None else max(1, min(g.shape[0], int(4 * np.sqrt(g.shape[0]))))
            if nlist < 1 or nlist > g.shape[0]:
                raise ValueError(f"nlist: must be in [1, {g.shape[0]}], got {nlist}")
            if int(nprobe) < 1:
                raise ValueError(f"nprobe: must be >= 1, got {nprobe}")
            self._quantizer = faiss.IndexFlatIP(g.shape[1])
            self.index = faiss.IndexIVFFlat(self._quantizer, g.shape[1], nlist,
                                            faiss.METRIC_INNER_PRODUCT)
            self.index.train(g)
            self.index.nprobe = min(int(nprobe), nlist)
        self.index.add(g)

    def search(self, queries: Any, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Biased top-``k``.  Shape: queries ``[Q, D]`` -> ``([Q, k], [Q, k])``."""
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise ValueError(f"k: must be a positive integer, got {k!r}")
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
