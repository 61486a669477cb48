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
VERSION = 1
#: Optional files of an index folder for the search page's video -> video and video -> text searches.
EXTRA_FILES = ("videos.npy", "texts.npy", "texts.json")
#: The files of an index folder (what ``build`` writes; nothing else is ever written there).
INDEX_FILES = ("index.faiss", "query_shift.npy", "model.pt", "names.txt", "meta.json",
               "model.safetensors", "config.json") + EXTRA_FILES  # a run's model.pt, or an export's two files


#: Embedded train texts the recall of an approximate index is measured on (at most).
RECALL_QUERIES = 1000


def write_index(run: str, video_features: Any, out: str | Path, *, normalizer: str = "selected",
                kind: str = "flat", names: list[str] | None = None, text_encoder: str = "minilm",
                overwrite: bool = False, video_mask: Any = None, target_recall: float | None = None,
                recall_queries: int = RECALL_QUERIES, nlist: int | None = None, nprobe: int | None = None,
                ef_search: int | None = None, block_rows: int | None = None, seed: int = 0,
                log: Any = None, texts: Any = None, model: Any = None) -> dict:
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
    ``{}``), ``target_recall``, ``target_met``, ``recall_source``, ``factory`` and ``exact``.

    ``log(line)``, when given, hears where the build is (``xmodal index``'s progress lines);
    ``texts`` (:func:`caption_texts`) adds the search page's video -> text files (:func:`write_extras`);
    ``model``: the run already loaded from ``run`` (``xmodal.load_model(run)``; loaded here when None).
    """
    if log is not None and not callable(log):
        raise TypeError(f"log: expected a callable or None, got {type(log).__name__}")
    say = log if log is not None else (lambda line: None)
    from xmodal.models.io import model_files
    from xmodal.retrieval.index import BLOCK_ROWS, KINDS, BiasedIndex, fold_run_normalizer
    from xmodal._validate import option, whole_number
    from xmodal.runs import atomic_save_npy, atomic_write, remove_stale_temporaries

    out = Path(out)
    kind = option(kind, "kind", KINDS)
    recall_queries = whole_number(recall_queries, "recall_queries", minimum=1)
    block_rows = BLOCK_ROWS if block_rows is None else whole_number(block_rows, "block_rows", minimum=1)
    check_out(out, run, overwrite=overwrite)
    if out.is_dir():  # what a killed build left (the next build would not overwrite a name with its PID)
        remove_stale_temporaries(out, INDEX_FILES)
    if model is None:
        from xmodal.retrieval.search import _load

        model = _load(run, "--run")
    n = _num_rows(video_features)
    if names is not None and len(names) != n:
        raise ValueError(f"--names: {len(names)} names but --video-features has {n} rows")
    say(f"index: encoding {n} gallery videos with the run's video head")
    store = _embed_gallery(model, video_features, video_mask, out, block_rows)
    try:
        say(f"index: folding the normaliser into {n} gallery embeddings")
        folded = fold_run_normalizer(model, store, normalizer, metric=_run_metric(run))
        shift = folded["query_shift"]
        shift = np.zeros(store.dim, np.float32) if shift is None else shift.cpu().numpy().astype(np.float32)
        queries, recall_source = (None, None) if kind == "flat" else _recall_sample(model, recall_queries, seed)
        say(f"index: building the {kind} index ({folded['normalizer']} folded in"
            + ("; measuring its recall@10)" if kind != "flat" else ")"))
        index = BiasedIndex(folded["gallery"], folded["bias"], kind=kind,
                            queries=None if queries is None else queries - shift[None, :],
                            target_recall=target_recall, nlist=nlist, nprobe=nprobe, ef_search=ef_search,
                            block_rows=block_rows, seed=seed)
        out.mkdir(parents=True, exist_ok=True)
        # meta.json goes first and comes back last: a half-rewritten folder is never a valid index
        (out / "meta.json").unlink(missing_ok=True)
        sources = model_files(run)  # the text head: model.pt, or an export's model.safetensors + config.json
        atomic_write(out / "index.faiss", index.save)
        atomic_save_npy(out / "query_shift.npy", shift)
        for name in ("model.pt", "model.safetensors", "config.json"):
            if name in sources:
                atomic_write(out / name, lambda tmp, src=sources[name]: shutil.copyfile(src, tmp))
            else:  # the previous index's head never answers for this one
                (out / name).unlink(missing_ok=True)
        if names is not None:
            atomic_write(out / "names.txt", lambda tmp: tmp.write_text("".join(n + "\n" for n in names),
                                                                      encoding="utf-8"))
        else:  # the previous gallery's names never label this one
            (out / "names.txt").unlink(missing_ok=True)
        meta = {"format": FORMAT, "version": VERSION, "run": str(Path(run).resolve()),
                "normalizer": folded["normalizer"], "kind": kind, "num_items": int(n),
                "dim": int(store.dim), "text_dim": _text_dim(model),
                "text_encoder": text_encoder, "names": names is not None,
                "factory": index.factory, "exact": kind == "flat",
                "recall_at_10": index.recall_at_10, "recall_queries": int(index.recall_queries),
                "search_params": dict(index.search_params), "target_recall": index.target_recall,
                "target_met": index.target_met, "recall_source": recall_source}
        if "fallback_from" in folded:
            meta["fallback_from"] = folded["fallback_from"]
        say("index: writing the search page's embeddings (videos.npy" + (", texts.npy)" if texts is not None else ")"))
        meta.update(write_extras(out, model, video_features, video_mask, texts, videos=store))  # encoded once
        atomic_write(out / "meta.json", lambda tmp: tmp.write_text(json.dumps(meta, indent=2) + "\n",
                                                                    encoding="utf-8"))
    finally:
        store.close()
    return meta


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


def _embed_gallery(model: Any, features: Any, mask: Any, out: Path, block_rows: int):
    """The gallery's embeddings ``[N, D]`` in a :class:`~xmodal.retrieval.rowstore.RowStore`,
    encoded ``block_rows`` videos at a time (a large store is a temporary file beside ``out``;
    stale ones of a killed build are removed first)."""
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
    try:
        for start in range(0, n, block_rows):
            sl = slice(start, min(n, start + block_rows))
            # batches of 8192 as model.encode_video(features) takes them: the same numbers
            emb = model.encode_video(_rows(features, sl), _rows(mask, sl), batch_size=min(block_rows, 8192))
            if store is None:
                store = RowStore(n, emb.shape[1], directory=directory, prefix=prefix)
            store.append(emb)
    except BaseException:
        if store is not None:
            store.close()
        raise
    return store


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
                     if e.is_symlink() or not (e.name in INDEX_FILES or e.name.startswith(".")
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


def write_extras(out: str | Path, model: Any, video_features: Any, video_mask: Any = None,
                 texts: dict | None = None, *, block_rows: int = 8192, videos: Any = None) -> dict:
    """Write an index folder's optional files (the search page's video -> video and video -> text):
    ``videos.npy``, the gallery's embeddings ``[V, D]`` (``model.encode_video`` of ``video_features`` /
    ``video_mask``, ``block_rows`` videos at a time into a memory-mapped file: never the whole gallery
    in memory); with ``texts`` (:func:`caption_texts`) ``texts.npy``, the captions' text embeddings
    ``[T, D]``, and ``texts.json``, ``{"captions": [...] | null, "video": [row, ...] | null}``; without,
    a previous index's text files are removed. Returns the ``meta.json`` keys ``"texts"`` (how many,
    0 for none) and ``"captions"`` (whether their strings are known). ``videos``: the gallery's
    embeddings already computed (``[V, D]`` sliced by rows, e.g. :func:`write_index`'s row store),
    copied instead of encoded again."""
    from xmodal._validate import duck, positive_int, short_repr
    from xmodal.runs import atomic_save_npy, atomic_write

    if not isinstance(out, (str, os.PathLike)) or not Path(out).is_dir():
        raise ValueError(f"out: expected an existing index folder, got {str(out)[:80]!r}")
    out = Path(out)
    duck(model, "model", "a loaded model", ("encode_video", "encode_text"))
    block_rows = positive_int(block_rows, "block_rows")
    first = next(iter(video_features.values()), None) if isinstance(video_features, dict) else video_features
    if not hasattr(first, "shape") or len(first.shape) not in (2, 3) or not first.shape[0]:
        raise TypeError(f"video_features: expected features [V, D] or [V, F, D] (or a dict of them), "
                        f"got {type(first).__name__}")
    if texts is not None and (not isinstance(texts, dict) or "features" not in texts):
        raise TypeError("texts: expected caption_texts(...) or None")
    n = int(first.shape[0])
    if videos is not None and tuple(getattr(videos, "shape", ()))[:1] != (n,):
        raise ValueError(f"videos: expected the {n} gallery embeddings, got {short_repr(videos)}")

    def rows(x, start):
        if x is None:
            return None
        return {k: v[start:start + block_rows] for k, v in x.items()} if isinstance(x, dict) else \
            x[start:start + block_rows]

    def write_videos(tmp):
        arr = None
        for start in range(0, n, block_rows):
            emb = videos[start:start + block_rows] if videos is not None else \
                model.encode_video(rows(video_features, start), rows(video_mask, start))
            emb = emb.detach().cpu().numpy().astype(np.float32) if hasattr(emb, "detach") else np.asarray(emb)
            if arr is None:
                arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, emb.shape[1]))
            arr[start:start + emb.shape[0]] = emb
        arr.flush()
        del arr

    if texts is None:
        for name in ("texts.npy", "texts.json"):
            (out / name).unlink(missing_ok=True)
        atomic_write(out / "videos.npy", write_videos)
        return {"texts": 0, "captions": False}
    captions, t2v = texts.get("captions"), texts.get("text_to_video")
    emb = model.encode_text(texts["features"], texts.get("mask")).cpu().numpy().astype(np.float32)
    if captions is not None and len(captions) != emb.shape[0]:
        raise ValueError(f"texts: {len(captions)} captions but {emb.shape[0]} text feature rows")
    if t2v is not None:
        t2v = np.asarray(t2v)
        if t2v.shape != (emb.shape[0],) or not np.issubdtype(t2v.dtype, np.integer) or \
                (t2v.size and not (0 <= t2v.min() and t2v.max() < n)):
            raise ValueError(f"texts: text_to_video must hold {emb.shape[0]} gallery rows in [0, {n})")
        t2v = [int(j) for j in t2v]
    body = json.dumps({"captions": captions, "video": t2v}, ensure_ascii=False) + "\n"
    atomic_write(out / "videos.npy", write_videos)
    atomic_save_npy(out / "texts.npy", emb)
    atomic_write(out / "texts.json", lambda tmp: tmp.write_text(body, encoding="utf-8"))
    return {"texts": int(emb.shape[0]), "captions": captions is not None}


__all__ = ["write_index", "check_out", "caption_texts", "write_extras", "FORMAT", "VERSION", "INDEX_FILES",
           "EXTRA_FILES", "RECALL_QUERIES"]
