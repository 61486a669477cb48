"""Large-gallery top-k search through FAISS (optional extra ``xmodal[faiss]``), exact or
approximate, with the approximation's measured recall.

Per-gallery biases (DN's ``-lam mu_x . y_j``, NCL's Sinkhorn ``b_j``) are folded
into the index: every gallery vector gets one extra coordinate ``b_j`` and every
query a constant ``1``, so ``[x, 1] . [y_j, b_j] = x . y_j + b_j`` and the biased
top-k stays a plain maximum-inner-product search, for every kind of index. The column
exists only when a bias is folded (``bias`` given): an unbiased index stores the
embeddings as they are (width ``D``, or ``D`` zero-padded to a multiple of ``PQ_DSUB``
for ``ivfpq`` / ``ivfpqr``) and its queries get no ``1``. Indexes written before this
(width ``D + 1`` with a zero bias column) still load and search: :meth:`BiasedIndex.load`
tells the two apart from the embedding size ``dim``.

Kinds (built with ``faiss.index_factory``, inner-product metric):

| kind | factory string | search parameter / what is stored |
|---|---|---|
| ``flat`` | ``Flat`` | none: exact (every vector, float32) |
| ``ivf`` | ``IVF{nlist},Flat`` | ``nprobe`` of ``nlist`` cells (k-means); float32 vectors |
| ``ivfpq`` | ``IVF{nlist},PQ{m}x8`` | ``nprobe``; each vector as ``m`` bytes (product quantiser) |
| ``ivfpqr`` | ``IVF{nlist},PQ{m}x4fsr,Refine(SQ8)`` | ``nprobe``; 4-bit fast-scan codes shortlist ``8 k`` candidates, re-ranked by 8-bit scalar codes |
| ``hnsw`` | ``HNSW32`` | ``efSearch``; float32 vectors + a 32-neighbour graph |
| ``opq`` | ``OPQ{m}_{d'},IVF{nlist},PQ{m}x8`` | ``nprobe``; a learned rotation to ``d'`` values (OPQ, Ge et al. 2013), then ``m`` bytes per vector |
| ``rabitq`` | ``IVF{nlist},RaBitQ{b}`` | ``nprobe``; each residual to its cell as ``b`` bits a value plus a few float factors (RaBitQ, Gao & Long 2024; extended to ``b`` bits, Gao et al. 2025), queries quantised to :data:`RABITQ_QUERY_BITS` bits |

``opq`` is the compressed index autofaiss builds under a memory budget (its ``get_optimal_quantization``:
``OPQ{m}_{d'},IVF{nlist}[_HNSW32],PQ{m}x8``); here ``d'`` is the smallest multiple of ``m`` at least the
stored width (an orthonormal rotation of the zero-padded vector, so the cells and inner products of the
unrotated vectors carry over) and the cells are searched exactly (a flat coarse quantiser). ``pq_m`` sets
``m`` (default: :func:`default_pq_m`, a quarter of the width's bytes as ``ivfpq``);
:mod:`xmodal.retrieval.budget` chooses it, and the kind, for a file-size budget.

``rabitq`` stores FAISS's ``IndexIVFRaBitQ``: a random rotation, then each coordinate of the residual to
its cell as ``bits`` bits (:data:`RABITQ_BITS`; default :data:`RABITQ_DEFAULT_BITS`) with per-vector factors
that make the inner-product estimate unbiased. It needs no codebook training (the build trains only the
cells); a memory budget measures it beside the product quantisers (docs/benchmarks.md: where it wins).

An approximate index states its quality: given a sample of queries (``queries=``; the
trained run's stored text embeddings in ``xmodal index``) and ``target_recall`` (0.95
by default), the build searches them exactly (:func:`xmodal.retrieval.recall.exact_topk`,
blockwise brute force over the same folded vectors) and approximately, and keeps the
cheapest ``nprobe`` / ``efSearch`` whose recall@10 reaches the target
(:func:`~xmodal.retrieval.recall.smallest_reaching`) that no other measured row, the exact scan included,
beats (:mod:`xmodal.retrieval.curve`; when the exact scan wins, exact search); ``recall_at_10``,
``recall_queries`` and ``search_params`` record it. ``search(..., nprobe=, ef_search=)``
overrides the parameter, ``exact=True`` searches exactly (``ivf``: every cell; ``hnsw``:
its flat storage; not ``ivfpq``, which keeps no exact vectors).

Product quantisation and the bias: ``ivfpq`` cuts the folded vector into ``m``
sub-vectors of ``PQ_DSUB`` (4) values, each stored as one byte (the nearest of 256
centroids fitted on the gallery, residuals to the IVF cell). The embedding is zero-padded
to a multiple of ``PQ_DSUB`` and the bias coordinate gets a sub-vector of its own (it and
``PQ_DSUB - 1`` zeros), so the bias is stored to 8 bits, one of 256 levels fitted to the
residual biases, instead of being mixed into a sub-vector of embedding values; the
scores, bias included, are approximate (the recall above measures the effect).

The build streams the gallery: ``gallery`` may be a :class:`~xmodal.retrieval.rowstore.RowStore`
(embeddings on disk) read in blocks of ``block_rows``; peak memory is the index plus one
block (plus the IVF training sample of ``40 * nlist`` rows).

A trained run's selected test-time normaliser is folded in by
:func:`fold_run_normalizer`: DN exactly (the gallery is stored as ``y_j - lam mu_y``
and every query is shifted by ``-lam mu_x`` before the search, so the index scores
are eq. 7 of Zhou et al. 2023), NCL/Sinkhorn as the gallery bias ``b_j`` (Park et
al. 2022, sec. 3.4), fitted in gallery blocks (:func:`gallery_bias`). QB-Norm, IS and DSL depend on each query's scores against
the whole gallery and cannot be folded into an inner product.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xmodal._validate import as_tensor, float_matrix, option, short_repr, whole_number

__all__ = ["BiasedIndex", "fold_bias", "import_faiss", "fold_run_normalizer", "selected_normalizer", "best_foldable",
           "FOLDABLE", "KINDS", "gallery_bias"]

#: Run normalisers an inner-product index can hold exactly.
FOLDABLE = ("none", "dn", "sinkhorn", "ncl")
#: Index kinds (see the module docstring).
KINDS = ("flat", "ivf", "ivfpq", "ivfpqr", "hnsw", "opq", "rabitq")
#: Kinds with IVF cells (an ``nprobe``), and kinds that keep only compressed vectors (no exact search).
IVF_KINDS = ("ivf", "ivfpq", "ivfpqr", "opq", "rabitq")
COMPRESSED_KINDS = ("ivfpq", "ivfpqr", "opq", "rabitq")
#: The kinds with a product quantiser (trained sub-quantisers).
PQ_KINDS = ("ivfpq", "ivfpqr", "opq")
#: Bits per stored value ``rabitq`` takes (FAISS's ``RaBitQ{b}``), and its default.
RABITQ_BITS = (1, 2, 3, 4, 5, 6, 7, 8)
RABITQ_DEFAULT_BITS = 4
#: Bits a query is quantised to in a ``rabitq`` search (FAISS's ``qb``; its default 4 lost recall, 0, float
#: queries, searched at a few queries/s).
RABITQ_QUERY_BITS = 8
#: Kinds whose stored width is padded to a multiple of :data:`PQ_DSUB` (the bias a sub-vector of its own).
PADDED_KINDS = ("ivfpq", "ivfpqr")
#: ``ivfpqr``: candidates re-ranked by the SQ8 refine stage, per result asked for.
REFINE_K_FACTOR = 8
#: Values per product-quantiser sub-vector (``ivfpq``).
PQ_DSUB = 4
#: HNSW neighbours per node.
HNSW_M = 32
#: Default target recall@10 of the approximate kinds.
TARGET_RECALL = 0.95
#: When no setting reaches the target: the cheapest setting within this of the best recall measured is kept.
RECALL_TOLERANCE = 0.005
#: Two consecutive doublings of nprobe / efSearch each gaining less recall@10 than this end the search
#: for a setting (:func:`~xmodal.retrieval.recall.smallest_reaching`'s ``plateau``).
PLATEAU_GAIN = 0.001
#: ``target_recall="best"`` (a memory budget's candidates): the cheapest setting within this of the best recall
#: measured is kept, the plateau's own step (the budget asks for the best recall, not a trade for speed: at
#: RECALL_TOLERANCE the flickr8k bench's 30% index was kept 0.005 below the best it reached, which put it just
#: under autofaiss's recall at a hundred times its queries/s, bench/ann_peer.py).
BEST_TOLERANCE = PLATEAU_GAIN
#: Gallery rows per block when building.
BLOCK_ROWS = 16384
#: FAISS's minimum training points per centroid: an ivfpq gallery needs two per code of its
#: smallest (1-bit) sub-quantisers.
MIN_POINTS_PER_CENTROID = 39
MIN_PQ_ROWS = 2 * MIN_POINTS_PER_CENTROID
#: Rows the compressed kinds' sub-quantisers train on at least (all of a smaller gallery): 100 a centroid of
#: 256. FAISS's floor, 39 a centroid (9,984 rows), left OPQ48 codes of the synthetic 50k bench at recall@10
#: 0.841 with every cell probed; 25,000 rows gave 0.875 (autofaiss's index of the same bytes: 0.849), for
#: about 3x the training time.
PQ_TRAIN_ROWS = 256 * 100
#: Cell counts an ivf / ivfpq build with recall queries chooses among, as multiples of sqrt(N).
NLIST_FACTORS = (1, 2, 4)
#: Largest efSearch (hnsw) a search takes: HNSW keeps efSearch candidates per query (1e9 asked for 7.9 GB).
MAX_EF_SEARCH = 1 << 16
#: Largest nprobe a search takes (FAISS's C int; any value above nlist visits every cell).
MAX_NPROBE = (1 << 31) - 1


def import_faiss():
    """Import FAISS or raise an ImportError naming the ``[faiss]`` extra."""
    try:
        import faiss  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("xmodal.retrieval.index needs FAISS: pip install 'xmodal[faiss]' "
                          "(or faiss-cpu / faiss-gpu)") from exc
    return faiss


#: FAISS's ``distance_compute_blas_threshold`` before 1.15 (see :func:`quantiser_training`).
BLAS_THRESHOLD = 20


@contextlib.contextmanager
def quantiser_training():
    """FAISS's BLAS threshold at its pre-1.15 value while quantisers train, restored after.

    FAISS 1.15 raised ``distance_compute_blas_threshold`` from 20 to 128,000 queries: a product
    quantiser's k-means (4 values a sub-vector here, :data:`PQ_DSUB`) then assigns its training points
    with the scalar path, which is many times slower at 4 dimensions (``python bench/faiss_train.py``
    times both in one process). The cells' k-means and every search are as fast either way at the widths
    an index stores, so only training is changed."""
    faiss = import_faiss()
    cvar = getattr(faiss, "cvar", None)
    old = getattr(cvar, "distance_compute_blas_threshold", None)
    if old is None:  # another build of FAISS
        yield
        return
    cvar.distance_compute_blas_threshold = min(int(old), BLAS_THRESHOLD)
    try:
        yield
    finally:
        cvar.distance_compute_blas_threshold = old


def _float32(x: Any, name: str) -> np.ndarray:
    t = float_matrix(x, name)
    return np.ascontiguousarray(t.detach().cpu().numpy(), dtype=np.float32)


def fold_bias(queries: Any | None, gallery: Any | None, bias: Any | None = None
              ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Append ``1`` to queries ``[Q, D]`` and ``bias`` ``[N]`` to gallery ``[N, D]`` (float32 copies).

    ``bias=None`` appends ``0`` to the gallery (the layout of an index with a bias column, as written before
    unbiased indexes dropped it; a :class:`BiasedIndex` without a bias stores no column).

    >>> q, g = fold_bias(np.ones((1, 2)), np.zeros((2, 2)), [0.5, -1.0])
    >>> (q @ g.T).tolist()
    [[0.5, -1.0]]
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


def _width(dim: int, kind: str, biased: bool = True) -> int:
    """Width of the stored vectors: ``dim`` (``+ 1`` with a bias column), or for ``ivfpq`` /
    ``ivfpqr`` the embedding padded to a multiple of :data:`PQ_DSUB` (plus one sub-vector for the bias).

    >>> _width(128, "flat", biased=False), _width(128, "flat"), _width(127, "ivfpq", False), _width(127, "ivfpq")
    (128, 129, 128, 132)
    """
    if kind not in PADDED_KINDS:
        return dim + int(biased)
    return -(-dim // PQ_DSUB) * PQ_DSUB + PQ_DSUB * int(biased)


def _bias_column(dim: int, width: int) -> int | None:
    """The column of the folded bias in a stored width, None when the width has none: ``dim`` for a
    width ``dim + 1``, the start of the final sub-vector for a padded width of ``dim + PQ_DSUB`` or more.
    (An unbiased padded width of ``dim + 1`` is read as biased: its gallery column holds zeros, so
    writing the zero bias there changes nothing; queries of an unbiased index pass no ``last``.)"""
    if width == dim + 1:
        return dim
    if width - dim >= PQ_DSUB:
        return width - PQ_DSUB
    return None


def _place(x: np.ndarray, last: np.ndarray | None, width: int) -> np.ndarray:
    """``[x, 0..., last, 0...]``: ``x`` first, ``last`` in the bias column (:func:`_bias_column`);
    ``last`` None, or a width with no bias column (``last`` then all zero): ``x`` zero-padded."""
    out = np.zeros((x.shape[0], width), np.float32)
    out[:, :x.shape[1]] = x
    col = _bias_column(x.shape[1], width)
    if last is not None and col is not None:
        out[:, col] = last
    elif last is not None and np.any(np.asarray(last) != 0):
        raise ValueError(f"bias: an index of width {width} for {x.shape[1]}-d embeddings has no bias column")
    return out


#: The code sizes (bytes per vector, one per sub-quantiser) ``opq`` takes: autofaiss's list.
OPQ_CODE_SIZES = (4, 8, 16, 24, 32, 48, 64, 96, 128, 256)


def default_pq_m(width: int) -> int:
    """``opq``'s default sub-quantisers: the largest of :data:`OPQ_CODE_SIZES` at most ``width / 4``
    (``ivfpq``'s bytes per vector).

    >>> default_pq_m(129), default_pq_m(768)
    (32, 128)
    """
    return max([m for m in OPQ_CODE_SIZES if m <= max(4, width // PQ_DSUB)])


def opq_dim(width: int, m: int) -> int:
    """``d'`` of ``OPQ{m}_{d'}``: the smallest multiple of ``m`` at least ``width``."""
    return -(-width // m) * m


def _default_nlist(n: int) -> int:
    """``4 sqrt(N)`` cells, at most ``N / 39`` (FAISS's minimum of 39 training points per cell)."""
    return max(1, min(int(4 * np.sqrt(n)), n // 39))


def nlist_candidates(n: int, max_nlist: int | None = None) -> list[int]:
    """The cell counts a build with recall queries measures (:data:`NLIST_FACTORS` x sqrt(N), at most N / 39),
    ascending; with ``max_nlist`` those at most it (``--max-memory``: the cells' centroids must fit too), or
    ``[max_nlist]`` when none is.

    >>> nlist_candidates(50000), nlist_candidates(50000, max_nlist=500), nlist_candidates(50000, max_nlist=100)
    ([223, 447, 894], [223, 447], [100])
    """
    out = sorted({max(1, min(int(f * np.sqrt(n)), n // MIN_POINTS_PER_CENTROID)) for f in NLIST_FACTORS})
    if max_nlist is None:
        return out
    return [c for c in out if c <= max_nlist] or [int(max_nlist)]


class BiasedIndex:
    """Top-k maximum-inner-product search over a gallery, with an optional folded bias.

    Args:
        gallery: ``[N, D]`` embeddings (numpy or torch), or a row source read in blocks
            (:class:`~xmodal.retrieval.rowstore.RowStore`: ``shape``, ``[a:b]``, ``take``).
        bias: optional ``[N]`` per-gallery bias (e.g. ``SinkhornBias(...).bias`` or
            ``DistributionNormalization.gallery_bias(gallery)``).
        kind: ``"flat"`` (exact), ``"ivf"``, ``"ivfpq"``, ``"ivfpqr"``, ``"hnsw"``, ``"opq"`` or ``"rabitq"``
            (module docstring).
        queries: ``[Q, D]`` sample queries (already shifted as searches will be) on which the
            recall@10 is measured and the search parameter chosen; None: not measured.
        target_recall: the recall@10 the search parameter must reach (default 0.95 for the
            approximate kinds when ``queries`` are given); ignored by ``flat``. ``"best"``: no target;
            the setting is doubled until the recall stops growing (:data:`PLATEAU_GAIN`) and the cheapest
            within :data:`BEST_TOLERANCE` of the best measured is kept (a memory budget's choice,
            :mod:`xmodal.retrieval.budget`: the most accurate index within the budget, at the setting
            that reaches what it can); the cells are still chosen for the default target
            (``tuned_to == "best"``, ``target_met`` None).
        nlist: IVF cells (default ``4 sqrt(N)``, at most ``N / 39``).
        pq_m: ``opq``'s bytes per vector (:func:`default_pq_m`). bits: ``rabitq``'s bits per value
            (:data:`RABITQ_BITS`, default :data:`RABITQ_DEFAULT_BITS`).
        max_nlist: the most cells a build that chooses its cell count may choose (a memory budget's bound:
            :func:`nlist_candidates`); ignored when ``nlist`` is given.
        nprobe / ef_search: a fixed search parameter instead of one chosen by recall
            (``nprobe`` default 8 without queries; ``ef_search`` default 64).
        block_rows: gallery rows per block while building.
        seed: of the training sample and the k-means.
        progress: the long steps' progress (the exact top-10, the cell counts, adding, the settings
            measured) as :func:`xmodal.progress.progress`'s ``show``: False (silent, the default), None (a
            bar on a terminal, else a line every 30 s) or True.

    Attributes:
        recall_at_10: measured recall@10 at ``search_params`` (1.0 for ``flat``; None when
            not measured), ``recall_queries`` (queries it was measured on), ``search_params``
            (``{"nprobe": p}`` / ``{"efSearch": e}`` / ``{}``), ``target_met``; ``curve``: every
            setting measured, ``[{"nprobe" | "efSearch": value, "recall_at_10", "queries_per_s"}, ...]``
            (hnsw also an exact scan of its vectors, ``{"efSearch": None, "exact": True, ...}``).
            When no setting reaches the target, the smallest (the fastest) within
            :data:`RECALL_TOLERANCE` of the best recall measured is kept.

    ``search(queries, k)`` returns ``(scores [Q, k], indices [Q, k])`` as numpy
    (float32 scores ``x . y_j + b_j``; indices int64, -1 where fewer than ``k`` found).
    """

    def __init__(self, gallery: Any, bias: Any | None = None, *, kind: str = "flat", queries: Any = None,
                 target_recall: float | None = None, nlist: int | None = None, nprobe: int | None = None,
                 ef_search: int | None = None, block_rows: int = BLOCK_ROWS, seed: int = 0,
                 pq_m: int | None = None, max_nlist: int | None = None, progress: bool | None = False,
                 bits: int | None = None) -> None:
        faiss = import_faiss()
        self._show = progress
        self.kind = option(kind, "kind", KINDS)
        if gallery is None:
            raise TypeError("gallery: expected [N, D] embeddings (numpy or torch), got None")
        rows = gallery if _is_source(gallery) else float_matrix(gallery, "gallery").detach().cpu().float()
        n, d = int(rows.shape[0]), int(rows.shape[1])
        if n == 0:
            raise ValueError("gallery: empty input, shape (0, D)")
        b = np.zeros(n, np.float32)
        if bias is not None:
            b = float_matrix(bias, "bias", ndim=1).detach().cpu().numpy().astype(np.float32)
            if b.shape[0] != n:
                raise ValueError(f"bias: expected shape ({n},), got {tuple(b.shape)}")
        block_rows = whole_number(block_rows, "block_rows", minimum=1)
        self.biased = bias is not None
        self.num_items, self.dim, self.width = n, d, _width(d, self.kind, self.biased)
        self.pq_m = None
        if max_nlist is not None and self.kind not in IVF_KINDS:
            raise ValueError(f"max_nlist: only the IVF kinds ({', '.join(IVF_KINDS)}) have cells; this index is "
                             f"{self.kind}")
        if pq_m is not None and self.kind != "opq":
            raise ValueError(f"pq_m: only the opq kind takes a code size; this index is {self.kind}")
        self.bits = None
        if bits is not None and self.kind != "rabitq":
            raise ValueError(f"bits: only the rabitq kind takes bits per value; this index is {self.kind}")
        if self.kind == "rabitq":
            self.bits = RABITQ_DEFAULT_BITS if bits is None else whole_number(bits, "bits", minimum=1)
            if self.bits not in RABITQ_BITS:
                raise ValueError(f"bits: expected one of {RABITQ_BITS[0]}..{RABITQ_BITS[-1]}, got {self.bits}")
        if self.kind == "opq":
            self.pq_m = default_pq_m(self.width) if pq_m is None else whole_number(pq_m, "pq_m", minimum=1)
            if self.pq_m > self.width:
                raise ValueError(f"pq_m: at most the stored width {self.width}, got {self.pq_m}")
        self.nlist = None
        self.nlist_choice: list[dict] = []
        if self.kind in IVF_KINDS:
            self._max_nlist = None if max_nlist is None or nlist is not None else whole_number(max_nlist, "max_nlist",
                                                                                               minimum=1)
            self.nlist = (whole_number(nlist, "nlist", minimum=1) if nlist is not None
                          else min(_default_nlist(n), self._max_nlist or n))
            if self.nlist > n:
                raise ValueError(f"nlist: must be in [1, {n}], got {self.nlist}")
        if nprobe is not None:
            nprobe = _bounded(nprobe, "nprobe", MAX_NPROBE)
        if ef_search is not None:
            ef_search = _bounded(ef_search, "ef_search", MAX_EF_SEARCH)
        if self.kind in COMPRESSED_KINDS and n < MIN_PQ_ROWS:
            raise ValueError(f"gallery: {self.kind} needs at least {MIN_PQ_ROWS} rows to train its quantisers "
                             f"({MIN_POINTS_PER_CENTROID} per centroid), got {n}; use kind flat")

        def blocks():  # folded gallery blocks, in order
            for start in range(0, n, block_rows):
                stop = min(n, start + block_rows)
                yield start, stop, _finite(_place(_numpy(rows[start:stop]), b[start:stop], self.width), start)

        tuning = queries is not None and nprobe is None and ef_search is None and self.kind != "flat"
        if tuning:
            if isinstance(target_recall, str) and target_recall != "best":
                raise ValueError(f"target_recall: expected a recall in (0, 1] or 'best', got {target_recall[:20]!r}")
            self.tuned_to = "best" if target_recall == "best" else "target"
            self.target_recall = _recall_target(TARGET_RECALL if target_recall is None or self.tuned_to == "best"
                                                else target_recall)
            q_folded = self._fold_queries(_float32(queries, "queries"))
            self._exact_rows = self._exact(q_folded, blocks, min(10, n))
        centroids = None
        if self.kind in IVF_KINDS and nlist is None and tuning:
            self.nlist, centroids, self.nlist_choice = self._choose_nlist(rows, b, q_folded, seed)
        self.factory = self._factory_string(n)
        self.index = faiss.index_factory(self.width, self.factory, faiss.METRIC_INNER_PRODUCT)
        if self.kind in IVF_KINDS:
            ivf = faiss.extract_index_ivf(self.index)
            ivf.cp.niter, ivf.cp.seed = 10, int(seed)
            if centroids is not None and self.kind != "opq":  # the chosen cell count's quantiser, trained while choosing it
                # (opq's cells live in the rotated space: trained again there)
                ivf.quantizer.add(centroids)
            if self.kind in PQ_KINDS:
                pq = faiss.downcast_index(ivf).pq  # the sub-quantisers' k-means
                pq.cp.niter, pq.cp.seed = 10, int(seed)
            from xmodal.retrieval.recall import sample_rows

            pq_rows = PQ_TRAIN_ROWS if self.kind in COMPRESSED_KINDS else 0
            train_rows = sample_rows(n, max(40 * self.nlist, pq_rows), seed)
            if centroids is None or self.kind != "ivf":  # ivf with trained cells needs no training
                with quantiser_training():
                    self.index.train(_finite(_place(_take(rows, train_rows), b[train_rows], self.width), train_rows))
            else:
                self.index.is_trained = True
            _release_freed_memory()  # the training sample's pages, before the index grows
            if self.kind == "rabitq":
                faiss.downcast_index(ivf).qb = RABITQ_QUERY_BITS  # saved with the index: every search quantises its queries so
            if self.kind in ("ivfpqr", "opq", "rabitq"):  # refine codes / the rotation / RaBitQ's factors: FAISS's
                # own add, block by block
                if self.kind == "ivfpqr":
                    self.index.k_factor = REFINE_K_FACTOR
                for _, _, block in _counted(blocks, n, "index: adding", progress)():
                    self.index.add(block)
            else:
                _add_presized(ivf, blocks, n, progress)
        else:
            for _, _, block in _counted(blocks, n, "index: adding", progress)():
                self.index.add(block)
        _release_freed_memory()
        self.recall_at_10: float | None = 1.0 if self.kind == "flat" else None
        self.recall_queries = 0
        self.target_met: bool | None = None
        self.recall_tried: dict[int, float] = {}
        self.curve: list[dict] = []
        if not tuning:
            self.target_recall, self.tuned_to = None, None
        if self.kind == "flat":
            self.search_params: dict = {}
        elif tuning:
            self._tune(_float32(queries, "queries"), blocks)
        else:
            self._set_params((ef_search or 64) if self.kind == "hnsw" else (nprobe or 8))
            if queries is not None:
                self._measure_fixed(_float32(queries, "queries"), blocks)

    def _choose_nlist(self, rows: Any, b: np.ndarray, q: np.ndarray, seed: int) -> tuple[int, np.ndarray, list]:
        """The cell count, chosen by measurement: for each candidate (:data:`NLIST_FACTORS` x sqrt(N), at
        most N / 39) the coarse quantiser is trained as the index trains it, and for every nprobe the
        recall@10 an IVF search would reach is counted from the cells the exact top 10 of each recall
        query fall in (an IVF search returns a true neighbour exactly when it visits its cell), its cost
        as the vectors compared per query (centroids + the probed cells' rows, cell sizes from the
        training sample). The cheapest (cells, nprobe) reaching the target wins; none reaching it: the
        largest candidate. Returns ``(nlist, its centroids, [{"nlist", "nprobe", "recall_at_10",
        "compared", "reaches_target", "chosen"}, ...])`` (each candidate's cheapest setting reaching the
        target, or its best; ``xmodal index`` prints it and stores it as ``meta.json["nlist_choice"]``)."""
        faiss = import_faiss()
        from xmodal.retrieval.recall import sample_rows

        n = self.num_items
        candidates = nlist_candidates(n, getattr(self, "_max_nlist", None))
        tops = self._exact_rows
        top_rows = np.unique(tops[tops >= 0])
        top_vecs = _place(_take(rows, top_rows), b[top_rows], self.width)
        where = {int(r): i for i, r in enumerate(top_rows)}
        best, table, centroids = None, [], {}
        from xmodal.progress import progress

        bar = progress(total=len(candidates), desc="index: training the cell quantisers", unit="cell count",
                       show=getattr(self, "_show", False))
        for c in candidates:
            ivf = faiss.index_factory(self.width, f"IVF{c},Flat", faiss.METRIC_INNER_PRODUCT)
            ivf.cp.niter, ivf.cp.seed = 10, int(seed)
            sample = sample_rows(n, 40 * c, seed)
            x = _finite(_place(_take(rows, sample), b[sample], self.width), sample)
            ivf.train(x)
            quant = ivf.quantizer
            sizes = np.bincount(quant.search(x, 1)[1][:, 0], minlength=c) * (n / len(sample))
            probes = min(c, 256)
            order = quant.search(q, probes)[1]                      # [Q, probes] cells, nearest first
            cell_of = quant.search(top_vecs, 1)[1][:, 0]            # cell of each true neighbour
            rank = np.full((q.shape[0], c), probes, np.int64)       # position of each cell in the query's order
            np.put_along_axis(rank, order, np.arange(probes)[None, :], axis=1)
            item_cells = np.vectorize(lambda r: cell_of[where[int(r)]] if r >= 0 else -1)(tops)
            found = np.where(item_cells >= 0, np.take_along_axis(rank, np.maximum(item_cells, 0), 1), probes)
            recall = np.array([(found < p).sum() / tops.size for p in range(1, probes + 1)])
            scanned = np.cumsum(sizes[order], axis=1).mean(0)       # [probes]: rows compared per query
            cost = c + scanned
            ok = np.flatnonzero(recall >= self.target_recall)
            p = int(ok[np.argmin(cost[ok])]) if ok.size else int(np.argmax(recall))
            row = {"nlist": c, "nprobe": p + 1, "recall_at_10": float(recall[p]), "compared": float(cost[p]),
                   "reaches_target": bool(ok.size)}
            table.append(row)
            centroids[c] = quant.reconstruct_n(0, c)
            del ivf, x
            if row["reaches_target"] and (best is None or row["compared"] < best["compared"]):
                best = row
            bar.update(1)
        bar.close()
        chosen = best["nlist"] if best is not None else candidates[-1]
        for row in table:
            row["chosen"] = row["nlist"] == chosen
        _release_freed_memory()
        return chosen, centroids[chosen], table

    def _factory_string(self, n: int) -> str:
        if self.kind == "flat":
            return "Flat"
        if self.kind == "hnsw":
            return f"HNSW{HNSW_M}"
        if self.kind == "ivf":
            return f"IVF{self.nlist},Flat"
        if self.kind == "ivfpqr":  # 4-bit fast-scan codes shortlist, 8-bit scalar codes re-rank
            return f"IVF{self.nlist},PQ{self.width // PQ_DSUB}x4fsr,Refine(SQ8)"
        if self.kind == "rabitq":
            return f"IVF{self.nlist},RaBitQ" + (str(self.bits) if self.bits > 1 else "")
        nbits = 8 if n >= 256 * 39 else max(1, min(8, int(np.log2(max(2, n // 39)))))
        if self.kind == "opq":
            m = self.pq_m
            return f"OPQ{m}_{opq_dim(self.width, m)},IVF{self.nlist},PQ{m}x{nbits}" + ("np" if nbits == 8 else "")
        # "np": no polysemous training (index_factory's default for IVF-PQ; minutes of annealing for
        # a code order only the polysemous filter uses)
        return f"IVF{self.nlist},PQ{self.width // PQ_DSUB}x{nbits}" + ("np" if nbits == 8 else "")

    # -- search parameters ----------------------------------------------------------------
    @property
    def _param_name(self) -> str | None:
        return "efSearch" if self.kind == "hnsw" else "nprobe" if self.kind in IVF_KINDS else None

    def _set_params(self, value: int) -> None:
        """Make ``value`` the index's own default (saved with it)."""
        faiss = import_faiss()
        if self.kind == "hnsw":
            self.index.hnsw.efSearch = int(value)
        else:
            faiss.extract_index_ivf(self.index).nprobe = min(int(value), self.nlist)
            value = min(int(value), self.nlist)
        self.search_params = {self._param_name: int(value)}

    def _params(self, nprobe: int | None = None, ef_search: int | None = None):
        faiss = import_faiss()
        if nprobe is not None:
            if self.kind not in IVF_KINDS:
                raise ValueError(f"nprobe: only the ivf and ivfpq kinds have cells to probe; this index is "
                                 f"{self.kind}" + (" (use ef_search)" if self.kind == "hnsw" else ""))
            nprobe = min(_bounded(nprobe, "nprobe", MAX_NPROBE), self.nlist)
            if self.kind == "rabitq":  # the index's own query bits (a plain IVF parameter object would use 4)
                params = faiss.IVFRaBitQSearchParameters()
                params.nprobe, params.qb = nprobe, int(faiss.downcast_index(faiss.extract_index_ivf(self.index)).qb)
                return params
            params = faiss.SearchParametersIVF(nprobe=nprobe)
            if self.kind == "ivfpqr":
                return faiss.IndexRefineSearchParameters(k_factor=float(self.index.k_factor),
                                                         base_index_params=params)
            return params
        if ef_search is not None:
            if self.kind != "hnsw":
                raise ValueError(f"ef_search: only the hnsw kind has it; this index is {self.kind}"
                                 + (" (use nprobe)" if self.kind != "flat" else ""))
            return faiss.SearchParametersHNSW(efSearch=_bounded(ef_search, "ef_search", MAX_EF_SEARCH))
        return None

    def _candidates(self, k: int) -> list[int]:
        if self.kind == "hnsw":
            top = max(k, 4096)
            return sorted({max(k, 2 ** i) for i in range(3, 13)} | {top})
        return sorted({2 ** i for i in range(0, 20) if 2 ** i < self.nlist} | {self.nlist})

    def _search_with(self, q: np.ndarray, k: int, value: int) -> np.ndarray:
        params = self._params(**({"ef_search": value} if self.kind == "hnsw" else {"nprobe": value}))
        return self.index.search(q, k, params=params)[1]

    def _exact(self, q: np.ndarray, blocks, k: int) -> np.ndarray:
        from xmodal.retrieval.recall import exact_topk

        return exact_topk(q, _counted(blocks, self.num_items, f"index: exact top-{k} of {q.shape[0]} recall queries",
                                      getattr(self, "_show", False))(), k)[1]

    def _tune(self, queries: np.ndarray, blocks) -> None:
        """Measure the curve and keep a setting no row of it dominates (:func:`xmodal.retrieval.curve.keep`).

        The settings tried are those :func:`~xmodal.retrieval.recall.smallest_reaching` visits on its way
        to the target (when none reaches it, also on its way to the best recall less
        :data:`RECALL_TOLERANCE`; the scan stops where two doublings each gain less than
        :data:`PLATEAU_GAIN`); ``ivf`` and ``hnsw`` also time an exact scan (``ivf``: every cell;
        ``hnsw``: its flat storage). Each row's queries/s is the best of
        :data:`~xmodal.retrieval.curve.RATE_PASSES` passes. Among the rows reaching the target (else the
        best recall less the tolerance) the cheapest within the timing noise of the fastest is kept: on a
        small gallery that is often the exact scan, and then the index keeps exact search
        (``search_params == {"exact": True}``, :meth:`search`'s default) and :attr:`kind_advice` says
        the kind is the wrong one for this gallery."""
        from xmodal.retrieval import curve as curves
        from xmodal.retrieval.recall import recall_at_k, smallest_reaching

        q = self._fold_queries(queries)
        k = min(10, self.num_items)
        exact = self._exact_rows  # computed before the build (the cell count was chosen on it)
        speed: dict[int, float] = {}
        name = self._param_name
        from xmodal.progress import progress

        bar = progress(desc=f"index: measuring recall@10 and queries/s ({name})", unit="setting",
                       show=getattr(self, "_show", False))

        def measure(v: int) -> float:
            got = {}

            def run() -> None:
                got.setdefault("rows", self._search_with(q, k, v))

            speed[v] = curves.timed_rate(run, q.shape[0], {name: int(v)})
            bar.set_postfix_str(f"{name} {v}")
            bar.update(1)
            return recall_at_k(got["rows"], exact, k)

        candidates = self._candidates(k)
        best_mode = self.tuned_to == "best"  # no target: every doubling until the recall stops growing
        _, _, met, tried = smallest_reaching(measure, candidates, 2.0 if best_mode else self.target_recall,
                                             plateau=PLATEAU_GAIN)
        tol = BEST_TOLERANCE if best_mode else RECALL_TOLERANCE
        if not met:  # nothing reaches the target: the cheap settings near the best recall are measured too
            top = max(tried.values())
            cached = lambda v: tried[v] if v in tried else measure(v)  # noqa: E731
            tried.update(smallest_reaching(cached, [c for c in candidates if c <= max(tried)], top - tol)[3])
        self.recall_tried = tried
        self.curve = [{name: int(v), "recall_at_10": float(tried[v]), "queries_per_s": float(speed[v])}
                      for v in sorted(tried)]
        if self.kind in ("ivf", "hnsw"):  # an exact scan of the stored vectors: the point every setting competes with
            got = {}

            def scan() -> None:
                got.setdefault("rows", self._exact_search(q, k))

            rate = curves.timed_rate(scan, q.shape[0], {name: None, "exact": True})
            self.curve.append({name: None, "exact": True, "recall_at_10": float(recall_at_k(got["rows"], exact, k)),
                               "queries_per_s": float(rate)})
        bar.close()
        best = max(p["recall_at_10"] for p in self.curve)
        met = None if best_mode else best >= self.target_recall
        kept = curves.keep(self.curve, self.target_recall if met else best - tol)
        self.kind_advice = None
        if kept.get("exact"):
            self._keep_exact()
            reach = (f"within {BEST_TOLERANCE} of its best recall@10" if best_mode
                     else f"reaching recall@10 {self.target_recall:.3f}")
            self.kind_advice = (f"an exact scan ({kept['queries_per_s']:,.0f} queries/s) is as fast as every {self.kind} "
                                f"setting {reach} on this gallery, so the index "
                                f"keeps exact search: --kind flat is the index for this gallery")
        else:
            self._set_params(kept[name])
        self.recall_at_10, self.recall_queries, self.target_met = kept["recall_at_10"], int(q.shape[0]), met

    def _exact_search(self, q: np.ndarray, k: int) -> np.ndarray:
        """Exact top-``k`` rows through the index's own vectors (``ivf``: every cell; ``hnsw``: its storage)."""
        if self.kind == "hnsw":
            return import_faiss().downcast_index(self.index.storage).search(q, k)[1]
        return self._search_with(q, k, self.nlist)

    def _keep_exact(self) -> None:
        """Exact search as the index's default (``ivf``: the saved nprobe is every cell, exact by itself)."""
        if self.kind == "ivf":
            import_faiss().extract_index_ivf(self.index).nprobe = self.nlist
        self.search_params = {"exact": True}
        self.default_exact = True

    def _measure_fixed(self, queries: np.ndarray, blocks) -> None:
        from xmodal.retrieval.recall import recall_at_k

        q = self._fold_queries(queries)
        k = min(10, self.num_items)
        from xmodal.retrieval import curve as curves

        got = {}
        (name, value), = self.search_params.items()
        qps = curves.timed_rate(lambda: got.setdefault("rows", self.index.search(q, k)[1]), q.shape[0],
                                {name: int(value)})
        self.recall_at_10 = recall_at_k(got["rows"], self._exact(q, blocks, k), k)
        self.recall_queries = int(q.shape[0])
        self.curve = [{name: int(value), "recall_at_10": float(self.recall_at_10), "queries_per_s": float(qps)}]

    # -- search ---------------------------------------------------------------------------
    def _fold_queries(self, q: np.ndarray, bias: bool = True) -> np.ndarray:
        if q.shape[1] != self.dim:
            raise ValueError(f"queries: embedding size {q.shape[1]} != gallery's {self.dim}")
        if not getattr(self, "biased", True):  # no bias column: the queries as they are (padded for PQ)
            return q if q.shape[1] == self.width else _place(q, None, self.width)
        return _place(q, np.full(q.shape[0], 1.0 if bias else 0.0, np.float32), self.width)

    def search(self, queries: Any, k: int = 10, *, nprobe: int | None = None, ef_search: int | None = None,
               exact: bool = False, bias: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Biased top-``k``.  Shape: queries ``[Q, D]`` -> ``([Q, k], [Q, k])``.

        Args:
            bias: add the folded per-item bias (the normalised text -> video score); ``False`` ranks
                by the inner product alone (a video as the query: "more like this"; with a DN fold
                the gallery is stored shifted, which moves each query's scores by one constant).
            nprobe: IVF cells to visit (``ivf``/``ivfpq``) instead of the stored parameter.
            ef_search: HNSW's ``efSearch`` instead of the stored one.
            exact: exact search (``flat``; ``ivf`` visiting every cell; ``hnsw`` scanning its
                stored vectors); ``ivfpq`` keeps no exact vectors and refuses.
        """
        k = whole_number(k, "k", minimum=1)
        if not isinstance(bias, bool):
            raise TypeError(f"bias: expected True or False, got {short_repr(bias)}")
        q = self._fold_queries(_float32(queries, "queries"), bias)
        k = min(int(k), self.num_items)
        if not exact and nprobe is None and ef_search is None and getattr(self, "default_exact", False):
            exact = True  # the build measured exact search as fast as every setting reaching the target
        if exact:
            if nprobe is not None or ef_search is not None:
                raise ValueError("exact: give exact or a search parameter (nprobe / ef_search), not both")
            if self.kind in COMPRESSED_KINDS:
                raise ValueError(f"exact: {'a' if self.kind == 'rabitq' else 'an'} {self.kind} index stores compressed vectors, so no search over it is exact "
                                 "(nprobe = nlist scans every code); build a flat, ivf or hnsw index for exact "
                                 "answers")
            if self.kind == "hnsw":
                scores, indices = import_faiss().downcast_index(self.index.storage).search(q, k)
                return scores, indices.astype(np.int64)
            if self.kind in ("ivf",):
                nprobe = self.nlist
        scores, indices = self.index.search(q, k, params=self._params(nprobe, ef_search))
        return scores, indices.astype(np.int64)

    def search_torch(self, queries: Any, k: int = 10, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`search`, returning tensors on the queries' device."""
        device = as_tensor(queries, "queries").device
        scores, indices = self.search(queries, k, **kwargs)
        return torch.from_numpy(scores).to(device), torch.from_numpy(indices).to(device)

    # -- persistence -------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the FAISS index (gallery with the folded bias, tuned search parameter) to ``path``."""
        import_faiss().write_index(self.index, str(path))

    @classmethod
    def load(cls, path: str | os.PathLike, *, dim: int | None = None, biased: bool | None = None) -> "BiasedIndex":
        """Read an index written by :meth:`save`.

        Args:
            dim: the embedding size (``meta.json["dim"]``). Given, it tells whether the file has a bias
                column (width ``dim + 1``, or ``dim`` padded plus a sub-vector for ``ivfpq`` / ``ivfpqr``: an
                index with a folded bias, or any index written before unbiased indexes dropped the column)
                or not (width ``dim``, or ``dim`` padded). Needed for ``ivfpq`` / ``ivfpqr`` (padded widths).
            biased: without ``dim``: whether the file has a bias column (``dim`` = width - 1) or not
                (the default: ``dim`` = width).
        """
        faiss = import_faiss()
        if not Path(path).is_file():
            raise FileNotFoundError(f"path: no such file: {path}")
        # an index merged on disk (xmodal.retrieval.ondisk): its lists are memory-mapped from the file beside it
        on_disk = (Path(path).parent / "lists.ivfdata").is_file()
        _check_declared_size(Path(path), (Path(path).parent / "lists.ivfdata").stat().st_size if on_disk else 0)
        try:
            with quiet_stdout() if on_disk else contextlib.nullcontext():  # FAISS prints where it found the lists
                index = faiss.read_index(str(path), faiss.IO_FLAG_ONDISK_SAME_DIR if on_disk else 0)
        except RuntimeError as exc:  # FAISS reports a foreign/corrupt file as RuntimeError
            raise ValueError(f"path: {path} is not a FAISS index ({str(exc).splitlines()[0]})") from None
        obj = cls.__new__(cls)
        obj.index, obj.num_items, obj.width = index, int(index.ntotal), int(index.d)
        ivf = faiss.try_extract_index_ivf(index)  # read_index returns the index as its own class
        obj.pq_m = obj.bits = None
        if ivf is not None:
            obj.kind = "opq" if isinstance(index, faiss.IndexPreTransform) else \
                "rabitq" if isinstance(index, faiss.IndexIVFRaBitQ) else \
                "ivfpqr" if isinstance(index, faiss.IndexRefine) else \
                "ivfpq" if isinstance(index, faiss.IndexIVFPQ) else "ivf"
            if obj.kind == "opq":
                obj.pq_m = int(faiss.downcast_index(ivf).pq.M)
            if obj.kind == "rabitq":
                obj.bits = int(index.rabitq.nb_bits)
            obj.nlist = int(ivf.nlist)
            obj.search_params = {"nprobe": int(ivf.nprobe)}
        elif isinstance(index, faiss.IndexHNSW):
            obj.kind, obj.nlist = "hnsw", None
            obj.search_params = {"efSearch": int(index.hnsw.efSearch)}
        else:
            obj.kind, obj.nlist, obj.search_params = "flat", None, {}
        if biased is not None and not isinstance(biased, bool):
            raise TypeError(f"biased: expected True, False or None, got {short_repr(biased)}")
        if dim is None:
            if obj.kind in PADDED_KINDS:
                raise ValueError(f"dim: an {obj.kind} index pads its vectors; give the embedding size (dim=)")
            obj.biased = bool(biased)
            obj.dim = obj.width - int(obj.biased)
        else:
            obj.dim = whole_number(dim, "dim", minimum=1)
            fits = [b for b in (True, False) if _width(obj.dim, obj.kind, b) == obj.width and biased in (None, b)]
            if not fits:
                raise ValueError(f"path: {path} holds {obj.kind} vectors of width {obj.width}, which does not fit "
                                 f"embeddings of size {obj.dim}")
            obj.biased = fits[0]
        obj.recall_at_10 = 1.0 if obj.kind == "flat" else None
        obj.recall_queries, obj.target_met, obj.target_recall, obj.recall_tried = 0, None, None, {}
        obj.tuned_to = None
        obj.curve, obj.nlist_choice = [], []
        return obj


@contextlib.contextmanager
def quiet_stdout():
    """File descriptor 1 sent to /dev/null (C++ prints bypass ``sys.stdout``)."""
    import sys

    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):  # no descriptor 1 (a daemon): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _release_freed_memory() -> None:
    """Hand memory freed inside the process back to the system (glibc ``malloc_trim``), so
    the k-means training's freed buffers do not stay resident under the index built next."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _add_presized(ivf: Any, blocks: Any, n: int, progress: bool | None = False) -> None:
    """Fill an IVF index in two passes over the blocks: assign every vector to its cell, give
    each cell's list exactly that capacity, then add with the assignments. A list growing by
    doubling would hold up to twice the index at its peak. ``progress``: each pass's (:func:`_counted`)."""
    faiss = import_faiss()
    assign = np.empty(n, np.int64)
    for start, stop, block in _counted(blocks, n, "index: assigning cells", progress)():
        assign[start:stop] = ivf.quantizer.search(block, 1)[1][:, 0]
    lists = faiss.downcast_InvertedLists(ivf.invlists)
    for cell, count in enumerate(np.bincount(assign, minlength=ivf.nlist).tolist()):
        if count:
            lists.resize(cell, count)  # allocates exactly count entries ...
            lists.resize(cell, 0)      # ... and keeps them while empty
    for start, stop, block in _counted(blocks, n, "index: adding", progress)():
        block = np.ascontiguousarray(block, dtype=np.float32)
        ids = np.arange(start, stop, dtype=np.int64)
        ivf.add_core(stop - start, faiss.swig_ptr(block), faiss.swig_ptr(ids), faiss.swig_ptr(assign[start:stop]))


def _counted(blocks: Any, n: int, desc: str, show: bool | None) -> Any:
    """``blocks`` (a function yielding ``(start, stop, rows)``) reporting the rows done through
    :func:`xmodal.progress.progress` (count, fraction, rate and time left); ``show`` False: ``blocks`` itself."""
    if show is False:
        return blocks

    def counted():
        from xmodal.progress import progress

        with progress(total=int(n), desc=desc, unit="video", show=show) as bar:
            for item in blocks():
                yield item
                bar.update(int(item[1]) - int(item[0]))
    return counted


def _is_source(x: Any) -> bool:
    """A row source read in blocks (RowStore, ShiftedRows), not an array."""
    return hasattr(x, "take") and len(getattr(x, "shape", ())) == 2 and \
        not isinstance(x, (np.ndarray, np.generic, torch.Tensor))


def _numpy(block: Any) -> np.ndarray:
    return block.detach().cpu().numpy() if isinstance(block, torch.Tensor) else np.asarray(block)


def _take(rows: Any, idx: np.ndarray) -> np.ndarray:
    from xmodal.retrieval.rowstore import take_rows

    return take_rows(rows, idx)


def _finite(block: np.ndarray, rows: Any) -> np.ndarray:
    """``block`` (gallery rows ``rows``: a first row number or the rows themselves), refused when a row
    is not finite: FAISS would index a NaN no search finds, or fail in its k-means."""
    ok = np.isfinite(block).all(axis=1)
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise ValueError(f"gallery: row {rows + i if isinstance(rows, int) else int(rows[i])} is not finite")
    return block


def _bounded(value: Any, name: str, maximum: int) -> int:
    """A search parameter: an integer in ``[1, maximum]``."""
    v = whole_number(value, name, minimum=1)
    if v > maximum:
        raise ValueError(f"{name}: must be at most {maximum}, got {short_repr(value)}")
    return v


def _recall_target(value: Any) -> float:
    from xmodal._validate import finite_number

    v = finite_number(value, "target_recall")
    if not 0 < v <= 1:
        raise ValueError(f"target_recall: must lie in (0, 1], got {v}")
    return float(v)


def _check_declared_size(path: Path, lists_bytes: int = 0) -> None:
    """Refuse a flat / IVF-flat FAISS file whose header declares more vectors than the file
    holds (with ``lists_bytes``, the size of its on-disk lists), before FAISS allocates them (a tiny
    file could otherwise ask for a terabyte)."""
    import struct

    size = path.stat().st_size + int(lists_bytes)
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
                        metric: str = "rsum", extra: Any = None) -> dict[str, Any]:
    """The index form of a run's text -> video normaliser over a new gallery.

    The one place that reads the run's test-time state for the index (adapt here when
    the state's layout changes). DN and Sinkhorn are fitted on the run's stored query
    banks against ``video_embeddings`` exactly as the trainer fits them at test time.

    Args:
        model: a loaded run (``xmodal.load_model``).
        video_embeddings: ``[N, D]`` L2-normalised gallery embeddings (``model.encode_video``),
            or a row source read in blocks (:class:`~xmodal.retrieval.rowstore.RowStore`).
        normalizer: ``"selected"``, ``"none"``, ``"dn"``, ``"sinkhorn"`` or ``"ncl"``. When the
            run selected a normaliser that cannot be folded (QB-Norm, IS, DSL), ``"selected"``
            falls back to :func:`best_foldable` and says so in ``fallback_from``.
        metric: the run's selection metric (``train.metric``) for that fallback.
        extra: ``[U, D]`` further videos, not part of the fit: also returned in the index's form
            (``"extra_gallery"`` ``[U, D]``, ``"extra_bias"`` ``[U]`` or None), as if they were in the
            gallery but without refitting it (:func:`gallery_bias`'s ``extra``); the build measures a
            fold on held-out captions whose videos it adds this way.

    Returns:
        ``{"normalizer": name, "gallery": [N, D], "bias": [N] or None,
        "query_shift": [D] or None}`` (and ``"fallback_from"`` after a fallback): the biased score of a text embedding ``x`` is
        ``(x - query_shift) . gallery_j + bias_j``. For a row source, ``gallery`` is a row
        source too (:class:`~xmodal.retrieval.rowstore.ShiftedRows` for DN).

    Shape:
        video_embeddings ``[N, D]`` -> gallery ``[N, D]``, bias ``[N]``, query_shift ``[D]``.
    """
    name = selected_normalizer(model, normalizer)
    video = video_embeddings if _is_source(video_embeddings) else float_matrix(video_embeddings, "video_embeddings")
    x = None if extra is None else float_matrix(extra, "extra").detach().float().cpu()
    out: dict[str, Any] = {"normalizer": name, "gallery": video, "bias": None, "query_shift": None}
    if x is not None:
        out.update(extra_gallery=x, extra_bias=None)
    if normalizer == "selected" and name not in FOLDABLE:
        out.update(normalizer=best_foldable(model, metric), fallback_from=name)
        name = out["normalizer"]
    if name == "none":
        return out
    if name not in FOLDABLE:
        raise ValueError(f"normalizer: {name!r} depends on each query's scores against the whole "
                         f"gallery and cannot be folded into an index; use one of "
                         f"{', '.join(FOLDABLE)} (or 'xmodal eval --run' for exact metrics)")
    from xmodal.retrieval.testtime import _METHODS

    tt = _test_time(model)
    if name == "dn":
        from xmodal.normalize import DistributionNormalization
        from xmodal.retrieval.rowstore import ShiftedRows

        dn = DistributionNormalization.from_state_dict(tt.dn)
        mu_g, mu_q = dn.mu_gallery.float().cpu(), dn.mu_queries.float().cpu()
        gallery = ShiftedRows(video, dn.lam * mu_g) if _is_source(video) else video - dn.lam * mu_g.to(video)
        out.update(gallery=gallery, query_shift=dn.lam * mu_q)
        if x is not None:
            out["extra_gallery"] = x - dn.lam * mu_g
        return out
    bank = _METHODS[name][1]
    if bank not in tt.banks:
        raise ValueError(f"normalizer: {name!r} needs the {bank!r} query bank, which this run lacks")
    if x is None:
        out["bias"] = gallery_bias(name, video, tt.banks[bank][0], **tt._hp())
    else:
        out["bias"], out["extra_bias"] = gallery_bias(name, video, tt.banks[bank][0], extra=x, **tt._hp())
    return out


@torch.no_grad()
def gallery_bias(name: str, gallery: Any, bank: Any, *, extra: Any = None, **hparams: Any) -> Any:
    """The Sinkhorn / NCL gallery bias ``[N]`` of ``gallery`` against the query ``bank``, as
    :func:`xmodal.retrieval.testtime.fit_normalizer` computes it, reading a row source in
    gallery blocks (:func:`xmodal.normalize.sinkhorn.gallery_block_log_sinkhorn`, ``iters + 1``
    passes; the same blocks, hence the same numbers, as the gallery held in memory).

    ``extra`` (``[U, D]`` further videos, not part of the fit): also return the bias each would get
    from the fitted row scaling (one more column update, ``log beta_u = log c - logsumexp_i(S_iu /
    gamma + log alpha_i)`` with ``c = 1 / N``), on the same scale as the gallery's; ``(bias, extra_bias)``.
    A copy of a gallery row gets that row's bias. The index build measures a fold on held-out captions
    whose videos are added to the gallery this way, without refitting the gallery's bias.

    Shape:
        gallery ``[N, D]`` (tensor or row source), bank ``[K, D]`` -> ``[N]`` (and extra ``[U, D]`` -> ``[U]``).
    """
    import math

    from xmodal.retrieval.testtime import _canonical, _METHODS, build_normalizer, fit_normalizer

    if _METHODS[_canonical(name, "name")][0] != "sinkhorn":
        raise ValueError(f"name: {name!r} has no gallery bias; expected sinkhorn or ncl")
    bank_t = float_matrix(bank, "bank").detach().float().cpu()
    if not _is_source(gallery):
        gallery = float_matrix(gallery, "gallery")
    n = int(gallery.shape[0])
    norm = build_normalizer(name, **hparams)  # a SinkhornBias with the run's temperature / iterations
    if not _is_source(gallery) or bank_t.shape[0] > n:
        g = gallery if not _is_source(gallery) else gallery[0:n]
        fitted = fit_normalizer(name, g, g, bank_t.to(g), **hparams)
        bias, log_alpha, log_beta = fitted.bias.to(g), fitted._log_alpha, fitted._log_beta
    else:
        from xmodal.normalize._base import default_block_rows
        from xmodal.normalize.sinkhorn import gallery_block_log_sinkhorn

        k = bank_t.shape[0]
        if bank_t.shape[1] != gallery.shape[1]:
            raise ValueError(f"bank and gallery: embedding sizes differ ({bank_t.shape[1]} vs {gallery.shape[1]})")
        log_r = torch.full((k,), -math.log(k))
        log_c = torch.full((n,), -math.log(n))
        log_alpha, log_beta, _ = gallery_block_log_sinkhorn(bank_t, gallery, gamma=norm.temperature,
                                                            iters=norm.iters, log_r=log_r, log_c=log_c,
                                                            block_cols=default_block_rows(k, norm.block_size),
                                                            track_error=norm.track_error)
        bias = norm.temperature * (log_beta - torch.logsumexp(log_beta, dim=0))
    if extra is None:
        return bias
    x = float_matrix(extra, "extra").detach().float().cpu()
    if x.shape[1] != bank_t.shape[1]:
        raise ValueError(f"extra: embedding size {x.shape[1]} != the bank's {bank_t.shape[1]}")
    la = log_alpha.detach().float().cpu()
    # logsumexp_i(S_iu / gamma + log alpha_i) in column blocks, log alpha as one more column of the GEMM and
    # the column sums a matrix-vector product (0.03-0.04 s against torch.logsumexp's 0.08-0.14 s for 4,200 videos
    # and a 2,000-query bank, 1 thread)
    qa = torch.cat([bank_t / norm.temperature, la[:, None]], 1)
    cols = torch.empty(x.shape[0])
    ones = torch.ones(qa.shape[0])
    step = max(1, (1 << 22) // max(1, qa.shape[0]))
    for start in range(0, x.shape[0], step):
        xb = x[start:start + step]
        s = qa @ torch.cat([xb, torch.ones(xb.shape[0], 1)], 1).T  # [K, b]
        top = s.amax(0)
        cols[start:start + xb.shape[0]] = top + (ones @ s.sub_(top).exp_()).log()
    log_beta_x = -math.log(n) - cols
    extra_bias = norm.temperature * (log_beta_x - torch.logsumexp(log_beta.detach().float().cpu(), dim=0))
    return bias, extra_bias.to(bias)
