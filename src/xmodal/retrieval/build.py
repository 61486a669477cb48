"""How an index folder is made: :func:`write_index` encodes a gallery with a trained run's video head and
writes ``index.faiss`` (the run's DN / NCL bias folded in, :mod:`xmodal.retrieval.index`),
``query_shift.npy``, a copy of the run's checkpoint (for the text head: ``model.pt``, or an export's
``model.safetensors`` + ``config.json``), ``names.txt`` and ``meta.json``. ``xmodal index`` is this plus
its flags; :mod:`xmodal.retrieval.search` opens and searches what it writes.

The search page's other directions get optional files (:func:`write_extras`): ``videos.npy`` (the
gallery's video embeddings, for "more like this"), and, for an index built with ``--data`` or
``--texts``, ``texts.npy`` (the captions' text embeddings, for video -> text) and ``texts.json``
(the captions and, from a layout, the video of each).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "xmodal-index"
#: The text encoder of a clip4clip run's index: the run's own fine-tuned tower (never a spec).
RUN_TEXT_TOWER = "run"
VERSION = 1
#: Optional files of an index folder for the search page's video -> video and video -> text searches.
EXTRA_FILES = ("videos.npy", "texts.npy", "texts.json", "texts.faiss")
#: The files of an index folder (what ``build`` writes; nothing else is ever written there).
INDEX_FILES = ("index.faiss", "query_shift.npy", "model.pt", "names.txt", "meta.json",
               "model.safetensors", "config.json") + EXTRA_FILES  # a run's model.pt, or an export's two files
#: The files of an index built in shards (xmodal.retrieval.build_shards): the folded gallery, the trained empty
#: index, the merged on-disk lists; its shards/ folder holds the shards until they are merged.
ONDISK_FILES = ("gallery.npy", "gallery_bias.npy", "trained.faiss", "lists.ivfdata")
INDEX_FILES = INDEX_FILES + ONDISK_FILES


#: dtypes of the stored embeddings (``videos.npy``, ``texts.npy``): float16 halves the folder.
STORES = ("float16", "float32")
#: Embedded train texts the recall of an approximate index is measured on (at most).
RECALL_QUERIES = 1000


def write_index(run: str, video_features: Any, out: str | Path, *, normalizer: str = "auto",
                kind: str = "flat", names: list[str] | None = None, text_encoder: str | None = None,
                overwrite: bool = False, video_mask: Any = None, target_recall: float | None = None,
                recall_queries: int = RECALL_QUERIES, nlist: int | None = None, nprobe: int | None = None,
                ef_search: int | None = None, block_rows: int | None = None, seed: int = 0,
                log: Any = None, texts: Any = None, model: Any = None, store: str = "float16",
                select_on: dict | None = None, max_bytes: int | None = None, bits: int | None = None) -> dict:
    """Write the index directory; returns its ``meta.json`` content.

    ``video_features`` / ``video_mask`` as ``model.encode_video`` takes them (dicts with experts;
    memory-mapped arrays are read one block at a time). The gallery is embedded block by
    block into a :class:`~xmodal.retrieval.rowstore.RowStore` (a temporary file beside ``out``
    when large), the run's normaliser is fitted on it blockwise and the index is built from
    its blocks (:class:`~xmodal.retrieval.index.BiasedIndex`), so the peak memory is the index
    plus one block. Approximate kinds measure their recall@10 on up to ``recall_queries``
    of the run's stored text embeddings (seeded sample of the held-out train texts no
    normaliser was fitted on; older runs: the train text bank), shifted as searches are, and keep the smallest search parameter reaching ``target_recall``
    (default 0.95); ``nprobe`` / ``ef_search`` fix it instead (the recall is still measured).

    ``meta.json`` holds ``recall_at_10`` (1.0 for flat; None when the run has no stored text
    embeddings), ``recall_queries``, ``search_params`` (``{"nprobe": p}``, ``{"efSearch": e}``,
    ``{}``), ``target_recall``, ``target_met``, ``recall_source``, ``factory``, ``exact`` and
    ``curve`` (every setting measured: ``[{"nprobe": p, "recall_at_10": r, "queries_per_s": q}, ...]``, with
    the exact scan for ivf / hnsw; the kept row is one no other row beats, :mod:`xmodal.retrieval.curve`;
    when no setting reaches the target the fastest within 0.005 of the best recall is kept), ``curve_rate``
    (how queries/s was timed), ``kind_advice`` (the exact scan won: exact search kept, ``search_params``
    ``{"exact": true}``) and ``nlist_choice`` (the cell counts measured, ``BiasedIndex.nlist_choice``).

    ``log(line)``, when given, hears where the build is (``xmodal index``'s progress lines);
    ``texts`` (:func:`caption_texts`) adds the search page's video -> text files (:func:`write_extras`);
    ``model``: the run already loaded from ``run`` (``xmodal.load_model(run)``; loaded here when None);
    ``store``: the dtype of ``videos.npy`` / ``texts.npy`` (``float16``, half the size, or ``float32``).
    ``text_encoder``: the run's recorded encoder is kept (``meta.json`` ``text_encoder`` / ``encoders``,
    :func:`xmodal.features.identity.index_encoders`); given, it states the encoder of a run that
    records none or names a local copy of the recorded one (another encoder is refused); None and
    nothing recorded: ``text_encoder`` is null (never a silent default).

    ``normalizer="auto"`` (the default) folds the run's choice among the foldable normalisers only
    when it serves text -> video on this gallery (:mod:`xmodal.retrieval.foldcheck`): measured on the
    run's held-out train captions with their videos added to the gallery, or on ``select_on``
    (``{"text": [H, D] embeddings, "text_to_video": [H], "video": [U, D] embeddings or None (then
    ``text_to_video`` are gallery rows), "source": str}``), and kept when clear of ``none`` by the
    paired rule, else ``none``. ``meta.json["normalizer_choice"]`` holds both measurements.
    ``"selected"`` folds the run's own selection (its foldable fallback), a name that normaliser.

    ``max_bytes`` (``--max-memory``): the kind, factory and search setting are chosen for that file size by
    :func:`xmodal.retrieval.budget.choose_index` (``kind`` other than ``"flat"``: among that kind only); the
    choice is ``meta.json["budget"]`` and the written ``index.faiss`` is checked against it. ``bits``: ``rabitq``'s
    bits per value (:class:`~xmodal.retrieval.index.BiasedIndex`; not with ``max_bytes``, which chooses them).

    Every file is written beside the previous index's (``.NAME.tmpPID``) and all are swapped in at the
    end, ``meta.json`` last (:class:`xmodal.runs.StagedFiles`): a failed or killed ``--overwrite``
    (a full disk) leaves the last good index as it was.
    """
    if log is not None and not callable(log):
        raise TypeError(f"log: expected a callable or None, got {type(log).__name__}")
    say = log if log is not None else (lambda line: None)
    from xmodal.models.io import model_files
    from xmodal.retrieval.index import (BLOCK_ROWS, KINDS, MIN_POINTS_PER_CENTROID, MIN_PQ_ROWS, BiasedIndex)
    from xmodal._validate import option, whole_number
    from xmodal.runs import StagedFiles, remove_stale_temporaries

    out = Path(out)
    kind = option(kind, "kind", KINDS)
    if bits is not None and (kind != "rabitq" or max_bytes is not None):
        raise ValueError("bits: only for kind rabitq without max_bytes (a memory budget chooses the bits)")
    store_dtype = option(store, "store", STORES)
    recall_queries = whole_number(recall_queries, "recall_queries", minimum=1)
    block_rows = BLOCK_ROWS if block_rows is None else whole_number(block_rows, "block_rows", minimum=1)
    check_out(out, run, overwrite=overwrite)
    if out.is_dir():  # what a killed build left (the next build would not overwrite a name with its PID)
        remove_stale_temporaries(out, INDEX_FILES)
    if model is None:
        model = _load(run, "--run")
    from xmodal.features.identity import index_encoders
    from xmodal.models.clip4clip import Clip4Clip

    if isinstance(model, Clip4Clip) and text_encoder not in (None, "run"):
        raise ValueError(f"--text-encoder: the run fine-tuned its CLIP text tower end to end (model.kind clip4clip); "
                         f"queries go through that tower, never {text_encoder}")
    encoders = index_encoders(run, text_encoder, _text_dim(model))  # a mismatch is refused before any work
    if isinstance(model, Clip4Clip):  # never the layout's caption encoder: queries go through the run's own tower
        encoders = {**encoders, "text_encoder": RUN_TEXT_TOWER, "text_encoder_source": "run",
                    "encoders": {**encoders["encoders"],
                                 "text": {"spec": RUN_TEXT_TOWER, "kind": "text", "family": "clip4clip",
                                          "note": "the run's fine-tuned CLIP text tower and tokenizer"}}}
    n = _num_rows(video_features)
    if names is not None and len(names) != n:
        raise ValueError(f"--names: {len(names)} names but --video-features has {n} rows")
    if kind in ("ivfpq", "ivfpqr") and n < MIN_PQ_ROWS:
        raise ValueError(f"kind: {kind} needs at least {MIN_PQ_ROWS} videos to train its quantisers "
                         f"({MIN_POINTS_PER_CENTROID} per centroid); this gallery has {n} video{'s' * (n != 1)}: "
                         f"use kind flat (exact, and as fast at this size)")
    say(f"index: encoding {n} gallery videos with the run's video head")
    show = getattr(log, "show", False) if log is not None else False  # the stage reporter's choice (Stages.show)
    if show is not False and hasattr(log, "clear"):
        log.clear()  # the counted lines below say where the encoding is
    first = _first_stage(model, n, normalizer, _run_metric(run), select_on, seed)
    rows = _embed_gallery(model, video_features, video_mask, out, block_rows, names=names, progress=show,
                          visit=None if first is None else first.add)
    from xmodal.retrieval.index import _release_freed_memory

    _release_freed_memory()  # the encoder's freed block buffers, before the index grows (issue 43 item 7)
    created = not out.exists()
    try:
        folded, choice = _fold(model, rows, normalizer, _run_metric(run), select_on, say, seed, first=first)
        shift = folded["query_shift"]
        shift = np.zeros(rows.dim, np.float32) if shift is None else shift.cpu().numpy().astype(np.float32)
        queries, recall_source = ((None, None) if kind == "flat" and max_bytes is None
                                  else _recall_sample(model, recall_queries, seed))
        budget = None
        if max_bytes is not None:  # xmodal.retrieval.budget: the kind and factory chosen for the file size
            from xmodal.retrieval.budget import choose_index

            say(f"index: choosing the index for {max_bytes} bytes ({folded['normalizer']} folded in)")
            scratch = f".{out.name}.budget-"
            if out.parent.is_dir():  # candidates a killed build left beside --out
                for stale in out.parent.glob(scratch + "*"):
                    shutil.rmtree(stale, ignore_errors=True)
            index, budget = choose_index(folded["gallery"], folded["bias"], max_bytes=max_bytes,
                                         queries=None if queries is None else queries - shift[None, :],
                                         target_recall=target_recall, kinds=None if kind == "flat" else (kind,),
                                         nlist=nlist, seed=seed, block_rows=block_rows, log=say,
                                         workdir=out.parent if out.parent.is_dir() else None,
                                         scratch_prefix=scratch, progress=show)
            kind = index.kind
        else:
            say(f"index: building the {kind} index ({folded['normalizer']} folded in"
                + ("; measuring its recall@10)" if kind != "flat" else ")"))
            index = BiasedIndex(folded["gallery"], folded["bias"], kind=kind,
                                queries=None if queries is None else queries - shift[None, :],
                                target_recall=target_recall, nlist=nlist, nprobe=nprobe, ef_search=ef_search,
                                block_rows=block_rows, seed=seed, progress=show, bits=bits)
        from xmodal.features.identity import spec_to_file

        here = Path(out).resolve()  # folders named relative to the index: no absolute path of this machine
        encoders = {**encoders, "encoders": {k: spec_to_file(v, here) for k, v in encoders["encoders"].items()}}
        if encoders.get("text_encoder") is not None:
            encoders["text_encoder"] = spec_to_file({"spec": encoders["text_encoder"]}, here)["spec"]
        meta = {"format": FORMAT, "version": VERSION, "run": os.path.relpath(Path(run).resolve(), here),
                "normalizer": folded["normalizer"], "kind": kind, "num_items": int(n),
                "dim": int(rows.dim), "text_dim": _text_dim(model),
                **encoders, "names": names is not None,
                "factory": index.factory, "exact": kind == "flat" or index.search_params.get("exact") is True,
                "recall_at_10": index.recall_at_10, "recall_queries": int(index.recall_queries),
                "search_params": dict(index.search_params), "target_recall": index.target_recall,
                "tuned_to": index.tuned_to, "target_met": index.target_met,
                "recall_source": recall_source, "curve": list(index.curve),
                "curve_rate": _curve_rate(index), "kind_advice": getattr(index, "kind_advice", None),
                "nlist_choice": list(index.nlist_choice)}
        if "fallback_from" in folded:
            meta["fallback_from"] = folded["fallback_from"]
        meta["normalizer_choice"] = choice
        if budget is not None:
            meta["budget"] = budget
        out.mkdir(parents=True, exist_ok=True)
        # every file is written beside the previous index's and swapped in at the end (meta.json last):
        # a failed or killed rebuild leaves the last good index as it was
        with StagedFiles(out, owned=INDEX_FILES, last="meta.json") as stage:
            sources = model_files(run)  # the text head: model.pt, or an export's model.safetensors + config.json
            stage.write("index.faiss", lambda tmp: _save_within(index, tmp, max_bytes))
            stage.write("query_shift.npy", lambda tmp: _save_npy(tmp, shift))
            for name in ("model.pt", "model.safetensors", "config.json"):
                if name in sources:
                    stage.write(name, lambda tmp, src=sources[name]: shutil.copyfile(src, tmp))
            if names is not None:
                stage.write("names.txt", lambda tmp: tmp.write_text("".join(n + "\n" for n in names),
                                                                   encoding="utf-8"))
            say("index: writing the search page's embeddings (videos.npy"
                + (", texts.npy)" if texts is not None else ")"))
            meta.update(_write_extras(stage, model, rows, texts, store_dtype, kind=kind,  # the gallery encoded once
                                      target_recall=target_recall, seed=seed))
            stage.write("meta.json", lambda tmp: tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8"))
    except BaseException:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # the folder this build made, left empty by its failure
        raise
    finally:
        rows.close()
    return meta


def _save_within(index: Any, path: Path, max_bytes: int | None) -> None:
    """``index.save(path)``, refused when the written file exceeds ``max_bytes`` (``--max-memory``)."""
    index.save(path)
    size = Path(path).stat().st_size
    if max_bytes is not None and size > max_bytes:
        raise ValueError(f"--max-memory: the index file came to {size} bytes, over the budget of {max_bytes}")


def _first_stage(model: Any, n: int, normalizer: Any, metric: str, select_on: dict | None, seed: int) -> Any:
    """A :class:`~xmodal.retrieval.foldcheck.FirstStage` for ``--normalizer auto`` on a gallery of ``n`` rows
    larger than the sample (it sees the rows as they are embedded), or None where :func:`_fold` measures
    nothing or measures no earlier stage (it then reports any bad input itself)."""
    from xmodal.retrieval import foldcheck
    from xmodal.retrieval.index import best_foldable

    if normalizer != "auto" or n <= foldcheck.SAMPLE_ROWS:
        return None
    try:
        if best_foldable(model, metric) == "none":
            return None
        pairs = select_on if select_on is not None else foldcheck.heldout_pairs(model)
        if pairs is None:
            return None
        added = pairs.get("video") is not None
        t2v = np.asarray(pairs["text_to_video"], dtype=np.int64) + (n if added else 0)
        first = foldcheck.FirstStage(n, pairs["text"], t2v, added=added, size=foldcheck.SAMPLE_ROWS,
                                     neighbours=foldcheck.NEIGHBOURS, seed=seed)
    except (TypeError, ValueError, KeyError):
        return None  # _fold says what is wrong, after the gallery is embedded as before
    return first if first.active else None


def _fold(model: Any, rows: Any, normalizer: str, metric: str, select_on: dict | None, say: Any, seed: int,
          first: Any = None) -> tuple[dict, dict]:
    """``(folded, choice)``: the index form of the normaliser (``fold_run_normalizer``) and how it was
    chosen (``meta.json["normalizer_choice"]``); ``first``: :func:`_first_stage`'s rows, gathered while the
    gallery was embedded."""
    from xmodal.retrieval import foldcheck
    from xmodal.retrieval.index import best_foldable, fold_run_normalizer
    from xmodal.retrieval.testtime import _METHODS

    if not isinstance(normalizer, str):
        raise TypeError(f"normalizer: expected a string, got {type(normalizer).__name__}")
    n = int(rows.shape[0])
    tt = getattr(model, "test_time", None)

    def note(name: str) -> str | None:
        bank = _METHODS.get(name, (None, None))[1]
        rows_k = len(tt.banks[bank][0]) if tt is not None and bank in getattr(tt, "banks", {}) else 0
        return foldcheck.bank_note(name, rows_k, n)

    if normalizer != "auto":
        say(f"index: folding the normaliser into {n} gallery embeddings")
        folded = fold_run_normalizer(model, rows, normalizer, metric=metric)
        return folded, {"given": normalizer, "chosen": folded["normalizer"], "bank_note": note(folded["normalizer"]),
                        "why": f"--normalizer {normalizer}"}
    candidate = best_foldable(model, metric)
    none = fold_run_normalizer(model, rows, "none")
    if candidate == "none":
        return none, {"given": "auto", "candidate": "none", "chosen": "none", "bank_note": None,
                      "why": "the run's choice among the normalisers an index can fold is none"}
    pairs = select_on if select_on is not None else foldcheck.heldout_pairs(model)
    if pairs is None:
        return none, {"given": "auto", "candidate": candidate, "chosen": "none", "bank_note": note(candidate),
                      "why": f"nothing to measure {candidate} on (the run stores no held-out captions with their "
                             f"videos: trained before this check), so none is folded; --normalizer selected "
                             f"folds the run's choice, --select-split measures it on a split"}
    extra = pairs.get("video")
    t2v = np.asarray(pairs["text_to_video"], dtype=np.int64) + (n if extra is not None else 0)
    size = foldcheck.SAMPLE_ROWS
    early = [st for st in foldcheck.STAGES if foldcheck.MIN_FOLD_QUERIES <= st[0] < len(t2v) and st[1] < size]
    say(f"index: fitting {candidate} on {min(n, size):,} of the {n:,} gallery embeddings (a seeded sample, "
        f"with the captions' videos) and measuring it on {len(t2v):,} captions"
        + (f", in stages from {early[0][0]:,} captions on {early[0][1]:,} rows (stopped where {candidate} is "
           f"clearly worse than none)" if early and n > size else ""))
    fit = lambda g, x: fold_run_normalizer(model, g, candidate, metric=metric, extra=x)  # noqa: E731
    record, folded = foldcheck.choose_on_sample(rows, fit, pairs["text"], t2v, extra=extra, size=size,
                                                neighbours=foldcheck.NEIGHBOURS, seed=seed, first=first)
    record.update(given="auto", source=pairs.get("source", "held-out train captions of the run"),
                  gallery=n, added_videos=0 if extra is None else int(len(extra)), bank_note=note(candidate))
    record["why"] = foldcheck.describe_choice(record)
    if record["chosen"] == "none":
        return none, record
    if folded is None:  # measured on a sample: the fold is fitted on the whole gallery only now it is kept
        say(f"index: {candidate} is clear of none on the sample: fitting it on the {n:,} gallery embeddings")
        folded = fold_run_normalizer(model, rows, candidate, metric=metric)
    return {k: v for k, v in folded.items() if not k.startswith("extra")}, record


def _curve_rate(index: Any) -> str | None:
    """How the curve's queries/s column was measured (``meta.json["curve_rate"]``)."""
    from xmodal.retrieval.curve import LONG_PASS_S, RATE_PASSES

    if not index.curve:
        return None
    return (f"best of {RATE_PASSES} timed passes over {index.recall_queries} queries (one pass where a pass takes "
            f"over {LONG_PASS_S:g} s), one thread pool, this machine")


def _save_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)


def write_rows_npy(path: str | os.PathLike, rows: Any, *, dtype: Any = np.float32, block_rows: int = 16384) -> None:
    """Write ``rows`` (``[N, D]``: an array, a tensor, or a row source sliced as ``rows[a:b]``) to a ``.npy``
    file of ``dtype`` one block at a time, with plain writes: never through a memory map, on which a
    full disk is a SIGBUS instead of an ``OSError``. Memory: one block.

    >>> import tempfile; p = Path(tempfile.mkdtemp()) / "x.npy"
    >>> write_rows_npy(p, np.arange(6, dtype=np.float32).reshape(3, 2), dtype=np.float16, block_rows=2)
    >>> np.load(p).tolist()
    [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    """
    from xmodal._validate import positive_int, short_repr

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a file path, got {short_repr(path)}")
    block_rows = positive_int(block_rows, "block_rows")
    try:  # numpy's own message quotes the object's repr, several lines for an array or a tensor
        dtype = np.dtype(dtype)
    except (TypeError, ValueError):
        raise TypeError(f"dtype: expected a float dtype, got {short_repr(dtype)}") from None
    if dtype.kind != "f":
        raise TypeError(f"dtype: expected a float dtype, got {dtype}")
    shape = tuple(getattr(rows, "shape", ()))
    if len(shape) != 2:
        raise TypeError(f"rows: expected [N, D] rows, got {short_repr(rows)}")
    n, d = int(shape[0]), int(shape[1])
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n, d)}
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        for start in range(0, n, block_rows):
            block = rows[start:start + block_rows]
            block = block.detach().cpu().numpy() if hasattr(block, "detach") else np.asarray(block)
            f.write(np.ascontiguousarray(block, dtype=dtype).data)  # the array's own buffer: no bytes copy


def _num_rows(features: Any) -> int:
    first = next(iter(features.values())) if isinstance(features, dict) else features
    shape = getattr(first, "shape", None)
    if not shape:
        raise TypeError(f"features: expected an array [N, D] or [N, F, D] (or a dict of them), got "
                        f"{type(first).__name__}")
    return int(shape[0])


def _rows(x: Any, sl: slice) -> Any:
    if x is None:
        return None
    return {k: v[sl] for k, v in x.items()} if isinstance(x, dict) else x[sl]


def _embed_gallery(model: Any, features: Any, mask: Any, out: Path, block_rows: int, *,
                   names: list[str] | None = None, progress: bool | None = False, visit: Any = None):
    """The gallery's embeddings ``[N, D]`` in a :class:`~xmodal.retrieval.rowstore.RowStore`,
    encoded ``block_rows`` videos at a time (a large store is a temporary file beside ``out``;
    stale ones of a killed build are removed first). A row whose embedding is not finite (finite
    features the video head overflows, e.g. 3e38) is refused by row number and name: indexed, it
    would be a NaN no search can find. ``visit(start, block)`` sees each block as it is embedded (the
    fold check's first stage, :class:`~xmodal.retrieval.foldcheck.FirstStage`)."""
    from xmodal.retrieval.rowstore import RowStore

    n = _num_rows(features)
    if n == 0:
        raise ValueError("features: no videos to index (0 rows)")
    directory = out.parent if out.parent.is_dir() else None
    prefix = f".{out.name}.embeddings.tmp-"
    if directory is not None:
        for stale in directory.glob(prefix + "*"):
            stale.unlink(missing_ok=True)
    store = None
    from xmodal.progress import progress as reporter

    try:
        with reporter(total=n, desc="index: encoding the gallery", unit="video", show=progress) as bar:
            for start in range(0, n, block_rows):
                sl = slice(start, min(n, start + block_rows))
                # batches of 8192 as model.encode_video(features) takes them: the same numbers
                emb = model.encode_video(_rows(features, sl), _rows(mask, sl), batch_size=min(block_rows, 8192))
                _check_finite_rows(emb, start, names, features)
                if store is None:
                    store = RowStore(n, emb.shape[1], directory=directory, prefix=prefix)
                store.append(emb)
                if visit is not None:
                    visit(start, emb)
                bar.update(sl.stop - sl.start)
    except BaseException:
        if store is not None:
            store.close()
        raise
    return store


def _check_finite_rows(emb: Any, start: int, names: list[str] | None, features: Any) -> None:
    """Refuse the first row of the block ``emb`` (gallery rows from ``start``) that is not finite."""
    import torch

    bad = (~torch.isfinite(emb).all(dim=1)).nonzero()
    if not len(bad):
        return
    row = start + int(bad[0, 0])
    name = f" ({names[row]!r})" if names is not None else ""
    more = f" (and {len(bad) - 1} more rows of its block)" if len(bad) > 1 else ""
    raw = _rows(features, slice(row, row + 1))
    largest = max(float(np.abs(np.asarray(a, dtype=np.float64)).max(initial=0.0))
                  for a in (raw.values() if isinstance(raw, dict) else [raw]))
    raise ValueError(f"features: row {row}{name}{more} embeds to non-finite values: the video head overflows its "
                     f"features (largest |value| {largest:.3g}); fix or drop that row")


def _recall_sample(model: Any, size: int, seed: int) -> tuple[np.ndarray | None, str | None]:
    """``(queries, source)``: up to ``size`` of the run's stored text embeddings (seeded sample)
    an approximate index measures its recall on: the held-out train texts no normaliser was
    fitted on (``banks["heldout"]``, runs since issue 24), else the train text bank of the
    Sinkhorn / DN fits (older runs); ``(None, None)`` when the run stores none."""
    from xmodal.retrieval.recall import sample_rows

    tt = getattr(model, "test_time", None)
    banks = getattr(tt, "banks", None) or {}
    for name, source in (("heldout", "held-out train texts"), ("train", "the train text bank")):
        if name in banks and len(banks[name][0]):
            bank = banks[name][0].detach().float().cpu().numpy()
            return bank[sample_rows(bank.shape[0], size, seed)], source
    return None, None


def _run_metric(run: str) -> str:
    """The run's selection metric (``train.metric`` of its saved config; ``rsum`` if unknown)."""
    from xmodal.models.io import run_config

    try:
        return str(run_config(run)["train"]["metric"])
    except (KeyError, TypeError):
        return "rsum"


def check_out(out: Path, run: str, *, overwrite: bool) -> None:
    """Refuse, before anything is written: an --out that is a file, the run directory
    itself, a folder holding files that are not an index's, or an index without --overwrite."""
    for value, flag in ((out, "--out"), (run, "--run")):
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"{flag}: expected a path, got {type(value).__name__}")
    out = Path(out)
    run_dir = Path(run) if Path(run).is_dir() else Path(run).parent
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} exists and is not a directory")
    if out.resolve() == run_dir.resolve():
        raise ValueError(f"--out: {out} is the run directory of --run; write the index into another folder")
    if not out.is_dir():
        return
    entries = list(out.iterdir())
    foreign = sorted(e.name for e in entries
                     if e.is_symlink() or not (e.name in INDEX_FILES or e.name == "shards" and e.is_dir()
                                               or e.name.startswith(".")
                                               and ".tmp" in e.name and e.name[1:].split(".tmp")[0] in INDEX_FILES))
    if foreign:
        raise ValueError(f"--out: {out} holds files that are not an xmodal index's ({', '.join(foreign[:3])}); "
                         f"write the index into a new or empty folder")
    if any(e.name in INDEX_FILES for e in entries) and not overwrite:
        raise ValueError(f"--out: {out} already holds an index (pass --overwrite to replace it)")


def _text_dim(model) -> int | None:
    spec = getattr(getattr(model, "text_tower", None), "spec", None)
    return int(spec.in_dim) if spec is not None else None


def caption_texts(captions: list[str] | None, features: Any, *, mask: Any = None,
                  text_to_video: Any = None) -> dict:
    """The ``texts`` argument of :func:`write_index`: caption strings (or None: shown as ``text #N``),
    their raw features ``[T, Dt]`` (or tokens ``[T, L, Dt]`` with ``mask``) and optionally the gallery
    row of each caption's video (a layout's ``S_text_to_video.npy``)."""
    if captions is not None and (isinstance(captions, str) or not isinstance(captions, (list, tuple))
                                 or not all(isinstance(c, str) for c in captions)):
        raise TypeError("captions: expected a list of strings or None")
    if not hasattr(features, "shape") or len(features.shape) not in (2, 3):
        raise TypeError(f"features: expected text features [T, Dt] or [T, L, Dt], got {type(features).__name__}")
    return {"captions": None if captions is None else list(captions), "features": features,
            "mask": mask, "text_to_video": text_to_video}


#: Captions below this many are searched exactly (a flat texts.faiss) whatever the videos' kind.
TEXTS_APPROXIMATE_FROM = 10000


def _texts_index(emb: np.ndarray, videos: Any, kind: str, target_recall: float | None, seed: int) -> tuple:
    """The captions' own FAISS index for video -> text (no normaliser: cosine scores): of the videos' kind
    from :data:`TEXTS_APPROXIMATE_FROM` captions on (its recall measured on a seeded sample of up to 1,000
    gallery videos as queries), flat (exact) below; ``(BiasedIndex, meta.json "texts_index")``."""
    from xmodal.retrieval.index import BiasedIndex
    from xmodal.retrieval.recall import sample_rows
    from xmodal.retrieval.rowstore import take_rows

    kind = kind if kind != "flat" and emb.shape[0] >= TEXTS_APPROXIMATE_FROM else "flat"
    queries = None
    if kind != "flat":
        queries = take_rows(videos, sample_rows(int(videos.shape[0]), RECALL_QUERIES, seed))
    index = BiasedIndex(emb, kind=kind, queries=queries, target_recall=target_recall, seed=seed)
    info = {"kind": kind, "factory": index.factory, "exact": kind == "flat" or index.search_params.get("exact") is True, "recall_at_10": index.recall_at_10,
            "recall_queries": int(index.recall_queries), "search_params": dict(index.search_params),
            "target_met": index.target_met, "curve": list(index.curve)}
    return index, info


def write_extras(out: str | Path, model: Any, video_features: Any, video_mask: Any = None,
                 texts: dict | None = None, *, block_rows: int = 8192, videos: Any = None,
                 store: str = "float16") -> dict:
    """Write an index folder's optional files (the search page's video -> video and video -> text):
    ``videos.npy``, the gallery's embeddings ``[V, D]`` as ``store`` (``model.encode_video`` of
    ``video_features`` / ``video_mask``, ``block_rows`` videos at a time, written block by block:
    never the whole gallery in memory); with ``texts`` (:func:`caption_texts`) ``texts.npy``, the
    captions' text embeddings ``[T, D]``, and ``texts.json``, ``{"captions": [...] | null, "video":
    [row, ...] | null}``; without, a previous index's text files are removed. Returns the
    ``meta.json`` keys ``"texts"`` (how many, 0 for none), ``"captions"`` (whether their strings are
    known) and ``"store"``. ``videos``: the gallery's embeddings already computed (``[V, D]`` sliced
    by rows, e.g. :func:`write_index`'s row store), copied instead of encoded again. The files are
    swapped in together at the end (:class:`xmodal.runs.StagedFiles`)."""
    from xmodal._validate import duck, option, positive_int, short_repr
    from xmodal.runs import StagedFiles

    if not isinstance(out, (str, os.PathLike)) or not Path(out).is_dir():
        raise ValueError(f"out: expected an existing index folder, got {str(out)[:80]!r}")
    out = Path(out)
    duck(model, "model", "a loaded model", ("encode_video", "encode_text"))
    block_rows = positive_int(block_rows, "block_rows")
    store = option(store, "store", STORES)
    first = next(iter(video_features.values()), None) if isinstance(video_features, dict) else video_features
    if not hasattr(first, "shape") or len(first.shape) not in (2, 3) or not first.shape[0]:
        raise TypeError(f"video_features: expected features [V, D] or [V, F, D] (or a dict of them), "
                        f"got {type(first).__name__}")
    if texts is not None and (not isinstance(texts, dict) or "features" not in texts):
        raise TypeError("texts: expected caption_texts(...) or None")
    n = int(first.shape[0])
    if videos is not None and (len(getattr(videos, "shape", ())) != 2 or int(videos.shape[0]) != n):
        raise ValueError(f"videos: expected the {n} gallery embeddings [V, D], got {short_repr(videos)}")
    rows = videos if videos is not None else _embed_gallery(model, video_features, video_mask, out / "videos",
                                                            block_rows)
    try:
        with StagedFiles(out, owned=EXTRA_FILES) as stage:
            return _write_extras(stage, model, rows, texts, store)
    finally:
        if videos is None:
            rows.close()


def _write_extras(stage: Any, model: Any, videos: Any, texts: dict | None, store: str, *, kind: str = "flat",
                  target_recall: float | None = None, seed: int = 0) -> dict:
    """``videos.npy`` of the gallery embeddings ``videos`` (row slices), and with ``texts`` ``texts.npy`` +
    ``texts.json`` + ``texts.faiss`` (the captions' own index, :func:`_texts_index`), written through
    ``stage`` (:class:`xmodal.runs.StagedFiles`) as ``store``."""
    n = int(videos.shape[0])
    meta = {"texts": 0, "captions": False, "store": store}
    if texts is not None:
        captions, t2v = texts.get("captions"), texts.get("text_to_video")
        emb = model.encode_text(texts["features"], texts.get("mask")).cpu().numpy().astype(np.float32)
        if captions is not None and len(captions) != emb.shape[0]:
            raise ValueError(f"texts: {len(captions)} captions but {emb.shape[0]} text feature rows")
        bad = np.flatnonzero(~np.isfinite(emb).all(axis=1))
        if bad.size:
            raise ValueError(f"texts: caption {int(bad[0])} embeds to non-finite values (its features overflow "
                             f"the text head); fix or drop it")
        if t2v is not None:
            t2v = np.asarray(t2v)
            if t2v.shape != (emb.shape[0],) or not np.issubdtype(t2v.dtype, np.integer) or \
                    (t2v.size and not (0 <= t2v.min() and t2v.max() < n)):
                raise ValueError(f"texts: text_to_video must hold {emb.shape[0]} gallery rows in [0, {n})")
            t2v = [int(j) for j in t2v]
        body = json.dumps({"captions": captions, "video": t2v}, ensure_ascii=False) + "\n"
        stage.write("texts.npy", lambda tmp: write_rows_npy(tmp, emb, dtype=store))
        stage.write("texts.json", lambda tmp: tmp.write_text(body, encoding="utf-8"))
        index, info = _texts_index(emb, videos, kind, target_recall, seed)
        stage.write("texts.faiss", index.save)
        meta.update(texts=int(emb.shape[0]), captions=captions is not None, texts_index=info)
    stage.write("videos.npy", lambda tmp: write_rows_npy(tmp, videos, dtype=store))
    return meta


def _load(path: str, flag: str):
    """``xmodal.load_model(path)``; a missing/corrupt/foreign run is a ValueError naming ``flag``."""
    from xmodal.models import load_model

    try:
        return load_model(path)
    except (FileNotFoundError, ValueError, TypeError) as exc:
        msg = str(exc)
        if msg.startswith("path: "):
            msg = msg[len("path: "):]
        raise ValueError(f"{flag}: {msg}") from None


__all__ = ["write_index", "check_out", "caption_texts", "write_extras", "write_rows_npy", "FORMAT", "VERSION",
           "INDEX_FILES", "EXTRA_FILES", "RECALL_QUERIES", "STORES"]
