"""An IVF index built in shards and merged into inverted lists on disk (autofaiss's way: FAISS's
``OnDiskInvertedLists`` and ``faiss.contrib.ondisk.merge_ondisk``), so no process holds the gallery.

1. :func:`train_empty`: the coarse quantiser (and the product quantiser of ``ivfpq``) trained on a seeded
   sample of the gallery, written as an empty index (``trained.faiss``).
2. :func:`add_shard`: shard ``K`` of ``N`` (the contiguous rows ``[N (K-1) / N, N K / N)``, ids = gallery row
   numbers) added into a copy of the trained index: ``shard-K-of-N.faiss`` and its record
   ``shard-K-of-N.json``. Shards are independent: separate processes or machines
   (:mod:`xmodal.execute.cluster` runs them as tasks).
3. :func:`merge_shards`: every shard's lists joined, in shard order, into ``lists.ivfdata`` beside
   ``index.faiss``; :meth:`xmodal.retrieval.index.BiasedIndex.load` opens such an index with its lists
   memory-mapped (``IO_FLAG_ONDISK_SAME_DIR``): a search reads only the cells it probes. With recall queries,
   the merge measures recall@10 against exact search and keeps the smallest ``nprobe`` reaching the target,
   as a one-process build does.

The vectors are folded as :class:`~xmodal.retrieval.index.BiasedIndex` folds them (a bias is one more
column, Park et al. 2022 sec. 3.4; DN's shift is in the rows given), so every shard holds exactly the codes a
one-process build with the same trained quantiser holds, in the same order within each cell: the merged
index returns the same ids and scores. Kinds: ``ivf`` and ``ivfpq`` (``ivfpqr``'s fast-scan lists and
refine codes and ``hnsw``'s graph do not merge this way).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["train_empty", "add_shard", "merge_shards", "shard_rows", "LISTS_FILE", "ONDISK_KINDS"]

#: The merged index's inverted lists, beside its ``index.faiss``.
LISTS_FILE = "lists.ivfdata"
ONDISK_KINDS = ("ivf", "ivfpq")
SHARD_FORMAT = "xmodal-index-shard"


def shard_rows(n: int, shard: tuple[int, int]) -> tuple[int, int]:
    """Rows ``[start, stop)`` of shard ``(K, N)`` of ``n`` gallery rows (contiguous, in order).

    >>> [shard_rows(10, (k, 3)) for k in (1, 2, 3)]
    [(0, 3), (3, 6), (6, 10)]
    """
    k, m = shard
    return n * (k - 1) // m, n * k // m


def _folded(rows: Any, bias: Any, start: int, stop: int, width: int) -> np.ndarray:
    from xmodal.retrieval.index import _finite, _numpy, _place

    b = np.zeros(stop - start, np.float32) if bias is None else np.asarray(bias[start:stop], np.float32)
    return _finite(_place(_numpy(rows[start:stop]).astype(np.float32, copy=False), b, width), start)


def _folded_blocks(rows: Any, bias: Any, n: int, width: int, block: int = 65536):
    """A callable giving ``(start, stop, folded rows)`` for the blocks of ``rows`` in order (each call anew:
    the exact top 10 and the tuning both read them)."""
    return lambda: ((a, min(n, a + block), _folded(rows, bias, a, min(n, a + block), width))
                    for a in range(0, n, block))


def _check_rows(rows: Any, bias: Any) -> tuple[int, int]:
    shape = getattr(rows, "shape", ())
    if len(shape) != 2 or shape[0] < 1:
        from xmodal._validate import short_repr

        raise ValueError(f"rows: expected gallery embeddings [N, D], got {short_repr(rows)}")
    if bias is not None and tuple(np.shape(bias)) != (shape[0],):
        raise ValueError(f"bias: expected shape ({shape[0]},), got {tuple(np.shape(bias))}")
    return int(shape[0]), int(shape[1])


def _write(index: Any, path: Path) -> None:
    """``faiss.write_index`` through a temporary name: a killed write never leaves a cut-off file."""
    from xmodal.retrieval.index import import_faiss

    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        import_faiss().write_index(index, str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _sha(path: Path) -> str:
    from xmodal.features.hashing import file_sha256

    return file_sha256(path)


def train_empty(rows: Any, out: str | os.PathLike, *, bias: Any = None, kind: str = "ivf", nlist: int | None = None,
                seed: int = 0, train_rows: int | None = None, queries: Any = None,
                target_recall: float | None = None) -> dict:
    """Train ``kind``'s quantisers on a seeded sample of ``rows`` (``[N, D]``; ``bias`` ``[N]``) and write the
    empty index to ``out``; returns ``{"kind", "nlist", "factory", "num_items", "dim", "width", "train_rows"}``.

    The sample and the k-means are those of :class:`~xmodal.retrieval.index.BiasedIndex` (``40 nlist`` rows,
    ``ivfpq`` at least ``256 x 39``; 10 iterations; ``seed``), so an index trained here and one built in one
    process with the same arguments share their quantisers. ``train_rows`` sets the sample's size instead
    (the k-means' time and memory grow with it: at a billion clips ``40 nlist`` rows no longer fit in one
    process); fewer than ``nlist`` rows is refused, fewer than ``39 nlist`` makes FAISS warn.

    With ``queries`` (``[Q, D]`` recall queries, shifted as searches are) and no ``nlist``, the cell count is
    measured as a one-process build measures it (:meth:`~xmodal.retrieval.index.BiasedIndex._choose_nlist`:
    each candidate's coarse quantiser trained, the recall@10 an IVF search reaches at each nprobe counted
    from the cells the exact top 10 fall in, the fewest vectors compared per query reaching
    ``target_recall``, default 0.95); the exact top 10 is one blockwise pass over ``rows``. The table is
    returned as ``"nlist_choice"`` (empty when not measured).
    """
    from xmodal._validate import option, whole_number
    from xmodal.retrieval.index import (PQ_TRAIN_ROWS, BiasedIndex, _default_nlist, _finite, _place, _take, _width,
                                        import_faiss, quantiser_training)
    from xmodal.retrieval.recall import sample_rows

    faiss = import_faiss()
    kind = option(kind, "kind", ONDISK_KINDS)
    n, d = _check_rows(rows, bias)
    width = _width(d, kind, bias is not None)  # a bias column only with a bias
    spec = BiasedIndex.__new__(BiasedIndex)
    spec.kind, spec.width, spec.dim, spec.num_items, spec.biased = kind, width, d, n, bias is not None
    choice: list = []
    centroids = None
    if queries is not None and nlist is None:
        from xmodal.retrieval.index import TARGET_RECALL, _float32, _recall_target

        spec.target_recall = _recall_target(TARGET_RECALL if target_recall is None else target_recall)
        q = spec._fold_queries(_float32(queries, "queries"))
        blocks = _folded_blocks(rows, bias, n, width)
        spec._exact_rows = spec._exact(q, blocks, min(10, n))
        full_bias = np.zeros(n, np.float32) if bias is None else np.asarray(bias, np.float32)
        nlist, centroids, choice = spec._choose_nlist(rows, full_bias, q, seed)
    nlist = _default_nlist(n) if nlist is None else whole_number(nlist, "nlist", minimum=1)
    if nlist > n:
        raise ValueError(f"nlist: must be in [1, {n}], got {nlist}")
    size = max(40 * nlist, PQ_TRAIN_ROWS if kind == "ivfpq" else 0)
    if train_rows is not None:
        size = whole_number(train_rows, "train_rows", minimum=1)
        if min(size, n) < nlist:
            raise ValueError(f"train_rows: {min(size, n)} sampled rows cannot train {nlist} cells (at least one row "
                             f"a cell; FAISS asks for 39)")
    spec.nlist = nlist
    factory = spec._factory_string(n)
    index = faiss.index_factory(width, factory, faiss.METRIC_INNER_PRODUCT)
    ivf = faiss.extract_index_ivf(index)
    ivf.cp.niter, ivf.cp.seed = 10, int(seed)
    if centroids is not None:  # the chosen cell count's quantiser, trained while choosing it
        ivf.quantizer.add(centroids)
    if kind == "ivfpq":
        pq = faiss.downcast_index(ivf).pq
        pq.cp.niter, pq.cp.seed = 10, int(seed)
    train = sample_rows(n, size, seed)
    b = np.zeros(len(train), np.float32) if bias is None else np.asarray(bias, np.float32)[train]
    if centroids is None or kind != "ivf":  # ivf with its cells trained needs no training
        with quantiser_training():
            index.train(_finite(_place(np.asarray(_take(rows, train), np.float32), b, width), train))
    else:
        index.is_trained = True
    faiss.extract_index_ivf(index).nprobe = min(8, nlist)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _write(index, out)
    return {"kind": kind, "nlist": nlist, "factory": factory, "num_items": n, "dim": d, "width": width,
            "train_rows": int(len(train)), "nlist_choice": choice}


def add_shard(trained: str | os.PathLike, rows: Any, shard: tuple[int, int], out_dir: str | os.PathLike, *,
              bias: Any = None, block_rows: int = 65536) -> Path:
    """Add shard ``shard`` = ``(K, N)`` of ``rows`` (:func:`shard_rows`) into a copy of the empty index
    ``trained``; writes ``out_dir/shard-K-of-N.faiss`` and its record ``.json``; returns the index path.
    Memory: the shard's codes plus one block of ``block_rows`` rows."""
    from xmodal._validate import short_repr
    from xmodal.retrieval.index import import_faiss

    faiss = import_faiss()
    if not (isinstance(shard, (tuple, list)) and len(shard) == 2 and all(isinstance(x, int) for x in shard)
            and 1 <= shard[0] <= shard[1]):
        raise ValueError(f"shard: expected (K, N) with 1 <= K <= N, got {short_repr(shard)}")
    k, m = int(shard[0]), int(shard[1])
    n, _ = _check_rows(rows, bias)
    trained = Path(trained)
    index = faiss.read_index(str(trained))
    if faiss.try_extract_index_ivf(index) is None or index.ntotal != 0:
        raise ValueError(f"--trained: {trained} is not an empty trained IVF index ('xmodal index --train-only')")
    start, stop = shard_rows(n, (k, m))
    for a in range(start, stop, block_rows):
        b = min(stop, a + block_rows)
        index.add_with_ids(_folded(rows, bias, a, b, index.d), np.arange(a, b, dtype=np.int64))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"shard-{k}-of-{m}.faiss"
    _write(index, path)
    record = {"format": SHARD_FORMAT, "shard": [k, m], "rows": [start, stop], "num_items": n, "dim": int(rows.shape[1]),
              "trained_sha256": _sha(trained)}
    from xmodal.runs import atomic_write_text

    atomic_write_text(path.with_suffix(".json"), json.dumps(record, indent=1) + "\n")
    return path


def _shard_records(trained: Path, shards: list) -> list[tuple[Path, dict]]:
    """Each shard with its record, in shard order; a shard missing, given twice, of another split or of
    another trained index is refused in one line."""
    want = _sha(trained)
    found: dict[int, Path] = {}
    size = None
    records = {}
    for s in shards:
        p = Path(s)
        side = p.with_suffix(".json")
        if not p.is_file() or not side.is_file():
            raise ValueError(f"shard: {p} is not a shard written by 'xmodal index --shard' (no {side.name} beside it)")
        try:
            rec = json.loads(side.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise ValueError(f"shard: {side} is not valid JSON") from None
        if not isinstance(rec, dict) or rec.get("format") != SHARD_FORMAT or not (
                isinstance(rec.get("shard"), list) and len(rec["shard"]) == 2):
            raise ValueError(f"shard: {side} was not written by 'xmodal index --shard'")
        k, m = rec["shard"]
        if rec.get("trained_sha256") != want:
            raise ValueError(f"shard: {p} was added to another trained index than {trained}")
        if size is not None and m != size:
            raise ValueError(f"shard: {p} is shard {k} of {m}, the others of {size}")
        size = m
        if k in found:
            raise ValueError(f"shard: {k}/{m} given twice ({found[k]} and {p})")
        found[k], records[k] = p, rec
    if not found:
        raise ValueError("shard: none given")
    missing = [k for k in range(1, size + 1) if k not in found]
    if missing:
        raise ValueError(f"shard: missing {', '.join(f'{k}/{size}' for k in missing[:10])}"
                         f"{' ...' if len(missing) > 10 else ''} (each of the {size} shards exactly once)")
    return [(found[k], records[k]) for k in range(1, size + 1)]


def merge_shards(trained: str | os.PathLike, shards: list, out_dir: str | os.PathLike, *, queries: Any = None,
                 rows: Any = None, bias: Any = None, target_recall: float | None = None) -> dict:
    """Join ``shards`` into ``out_dir/index.faiss`` + ``out_dir/lists.ivfdata`` (lists on disk).

    Args:
        trained: the empty trained index the shards were added to.
        shards: every ``shard-K-of-N.faiss`` exactly once (any order).
        queries: ``[Q, D]`` recall queries (shifted as searches are); with ``rows`` (and ``bias``, the gallery
            the shards were made from, read block by block for the exact answers) the recall@10 is measured
            and the smallest ``nprobe`` reaching ``target_recall`` (default 0.95) kept.

    Returns:
        ``{"num_items", "shards", "recall_at_10", "recall_queries", "search_params", "target_met", "curve"}``
        (with ``queries``: also ``"curve_rate"``, how its queries/s were timed, and ``"kind_advice"``).
    """
    from xmodal.retrieval.index import (TARGET_RECALL, BiasedIndex, _float32, _recall_target, import_faiss,
                                        quiet_stdout)
    from faiss.contrib.ondisk import merge_ondisk

    faiss = import_faiss()
    trained = Path(trained)
    ordered = _shard_records(trained, list(shards))
    n = ordered[0][1]["num_items"]
    if any(rec["num_items"] != n for _, rec in ordered) or ordered[-1][1]["rows"][1] != n:
        raise ValueError("shard: the shards were cut from galleries of different sizes")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob(".merge.tmp*"):  # what a killed merge left
        shutil.rmtree(stale, ignore_errors=True)
    stage = out_dir / f".merge.tmp{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        index = faiss.read_index(str(trained))
        with quiet_stdout():  # FAISS prints "resizing ..." from C++
            merge_ondisk(index, [str(p) for p, _ in ordered], str(stage / LISTS_FILE))
        if index.ntotal != n:
            raise ValueError(f"shard: the shards hold {index.ntotal} vectors, the gallery {n}")
        faiss.write_index(index, str(stage / "index.faiss"))
        del index
        merged = BiasedIndex.load(stage / "index.faiss", dim=int(ordered[0][1]["dim"]))
        result = {"num_items": n, "shards": len(ordered), "recall_at_10": None, "recall_queries": 0,
                  "search_params": dict(merged.search_params), "target_met": None, "curve": []}
        if queries is not None:
            if rows is None:
                raise ValueError("rows: the recall is measured against exact search over the gallery rows")
            q = _float32(queries, "queries")
            merged.target_recall = _recall_target(TARGET_RECALL if target_recall is None else target_recall)
            blocks = _folded_blocks(rows, bias, n, merged.width)
            merged._exact_rows = merged._exact(merged._fold_queries(q), blocks, min(10, n))
            merged._tune(q, blocks)
            faiss.write_index(merged.index, str(stage / "index.faiss"))  # the chosen nprobe saved with it
            from xmodal.retrieval.build import _curve_rate

            result.update(recall_at_10=merged.recall_at_10, recall_queries=merged.recall_queries,
                          search_params=dict(merged.search_params), target_met=merged.target_met,
                          curve=list(merged.curve), curve_rate=_curve_rate(merged),
                          kind_advice=getattr(merged, "kind_advice", None))
        del merged
        for name in (LISTS_FILE, "index.faiss"):  # the lists first: index.faiss names them
            os.replace(stage / name, out_dir / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return result


def is_on_disk(path: str | os.PathLike) -> bool:
    """Whether the index file ``path`` has its inverted lists in ``lists.ivfdata`` beside it."""
    return (Path(path).parent / LISTS_FILE).is_file()

