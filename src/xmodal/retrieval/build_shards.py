"""An index folder built in shards and merged on disk: ``xmodal index --train-only``, ``--shard K/N``,
``--merge`` (:mod:`xmodal.retrieval.ondisk` on an index folder).

- :func:`write_trained` (``--train-only``): the gallery embedded with the run's video head and its
  normaliser folded exactly as :func:`xmodal.retrieval.build.write_index` does (DN's shift in the rows, a
  bias as a column), the folded rows written to ``gallery.npy`` (float32) and ``gallery_bias.npy``, the
  quantisers trained on a seeded sample into ``trained.faiss`` (empty), with ``query_shift.npy``, the
  run's text head, ``names.txt``, ``videos.npy`` and ``meta.json`` (``"ondisk": {"stage": "trained"}``).
- :func:`add_folder_shard` (``--shard K/N``): rows ``[N (K-1) / N, N K / N)`` of ``gallery.npy`` added to a
  copy of ``trained.faiss``: ``shards/shard-K-of-N.faiss`` (any process or machine that sees the folder;
  :mod:`xmodal.execute.index` runs them as tasks).
- :func:`merge_folder` (``--merge``): the shards joined into ``index.faiss`` + ``lists.ivfdata`` (FAISS
  on-disk lists, memory-mapped when searched), the recall@10 measured on the run's held-out texts as a
  one-process build measures it, ``meta.json`` completed (``"stage": "merged"``); the merged shard files
  are removed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["write_trained", "add_folder_shard", "merge_folder", "TRAINED", "MERGED"]

TRAINED, MERGED = "trained", "merged"


def _meta(out: Path) -> dict:
    path = out / "meta.json"
    if not path.is_file():
        raise ValueError(f"--out: {out} has no meta.json (start with 'xmodal index --train-only')")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"--out: {path} is not valid JSON") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("ondisk"), dict):
        raise ValueError(f"--out: {out} is not an index trained with 'xmodal index --train-only'")
    return meta


def write_trained(run: str, video_features: Any, out: str | Path, *, normalizer: str = "auto", kind: str = "ivf",
                  nlist: int | None = None, names: list[str] | None = None, text_encoder: str | None = None,
                  overwrite: bool = False, video_mask: Any = None, block_rows: int | None = None, seed: int = 0,
                  log: Any = None, model: Any = None, store: str = "float16", select_on: dict | None = None,
                  train_rows: int | None = None, recall_queries: int | None = None,
                  target_recall: float | None = None) -> dict:
    """``xmodal index --train-only``: the folder of a trained, empty on-disk index (module doc); its meta
    (``train_rows``: the training sample's size, :func:`xmodal.retrieval.ondisk.train_empty`). Without
    ``nlist`` the cell count is measured on the run's recall queries (``recall_queries`` of them, the ones
    ``--merge`` measures the recall on) as a one-process build measures it: ``meta.json["nlist_choice"]``."""
    from xmodal._validate import option, whole_number
    from xmodal.features.identity import index_encoders
    from xmodal.models.io import model_files
    from xmodal.retrieval import build
    from xmodal.retrieval.index import BLOCK_ROWS
    from xmodal.retrieval.ondisk import ONDISK_KINDS, train_empty
    from xmodal.runs import StagedFiles, remove_stale_temporaries

    say = log if log is not None else (lambda line: None)
    out = Path(out)
    kind = option(kind, "kind", ONDISK_KINDS)
    block_rows = BLOCK_ROWS if block_rows is None else whole_number(block_rows, "block_rows", minimum=1)
    build.check_out(out, run, overwrite=overwrite)
    if out.is_dir():
        remove_stale_temporaries(out, build.INDEX_FILES)
    if model is None:
        model = build._load(run, "--run")
    encoders = index_encoders(run, text_encoder, build._text_dim(model))
    n = build._num_rows(video_features)
    if names is not None and len(names) != n:
        raise ValueError(f"--names: {len(names)} names but --video-features has {n} rows")
    say(f"index: encoding {n} gallery videos with the run's video head")
    rows = build._embed_gallery(model, video_features, video_mask, out, block_rows, names=names)
    try:
        folded, choice = build._fold(model, rows, normalizer, build._run_metric(run), select_on, say, seed)
        shift = folded["query_shift"]
        shift = np.zeros(rows.dim, np.float32) if shift is None else shift.cpu().numpy().astype(np.float32)
        bias = folded["bias"]
        biased = bias is not None  # no bias column in the index without one (gallery_bias.npy then zeros)
        bias = np.zeros(n, np.float32) if bias is None else np.asarray(
            bias.detach().cpu().numpy() if hasattr(bias, "detach") else bias, np.float32)
        gallery = folded["gallery"]
        queries = None
        if nlist is None:
            queries, _ = build._recall_sample(model, recall_queries or build.RECALL_QUERIES, seed)
            if queries is not None:
                queries = queries - shift[None, :]
                say(f"index: measuring the cell count on {len(queries)} recall queries (exact top 10: one pass)")
        meta = {"format": build.FORMAT, "version": build.VERSION, "run": str(Path(run).resolve()),
                "normalizer": folded["normalizer"], "kind": kind, "num_items": int(n), "dim": int(rows.dim),
                "text_dim": build._text_dim(model), **encoders, "names": names is not None, "exact": False,
                "recall_at_10": None, "recall_queries": 0, "search_params": {}, "target_recall": None,
                "target_met": None, "recall_source": None, "curve": [], "normalizer_choice": choice,
                "ondisk": {"stage": TRAINED, "seed": int(seed)}}
        out.mkdir(parents=True, exist_ok=True)
        with StagedFiles(out, owned=build.INDEX_FILES, last="meta.json") as stage:
            say(f"index: writing the folded gallery and training the {kind} quantisers on a sample")
            stage.write("gallery.npy", lambda tmp: build.write_rows_npy(tmp, gallery, dtype=np.float32))
            stage.write("gallery_bias.npy", lambda tmp: build._save_npy(tmp, bias))
            def trained(tmp: Path) -> None:
                made = train_empty(gallery, tmp, bias=bias if biased else None, kind=kind, nlist=nlist, seed=seed,
                                   train_rows=train_rows, queries=queries, target_recall=target_recall)
                meta.update(factory=made["factory"], nlist=made["nlist"], nlist_choice=made["nlist_choice"])

            stage.write("trained.faiss", trained)
            stage.write("query_shift.npy", lambda tmp: build._save_npy(tmp, shift))
            sources = model_files(run)
            for name in ("model.pt", "model.safetensors", "config.json"):
                if name in sources:
                    import shutil

                    stage.write(name, lambda tmp, src=sources[name]: shutil.copyfile(src, tmp))
            if names is not None:
                stage.write("names.txt", lambda tmp: tmp.write_text("".join(x + "\n" for x in names), encoding="utf-8"))
            meta.update(build._write_extras(stage, model, rows, None, option(store, "store", build.STORES)))
            stage.write("meta.json", lambda tmp: tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8"))
    finally:
        rows.close()
    return meta


def add_folder_shard(out: str | Path, shard: tuple[int, int]) -> Path:
    """``xmodal index --out IDX --shard K/N``: shard K of N of the trained folder's gallery; its file."""
    from xmodal.retrieval.ondisk import add_shard

    out = Path(out)
    meta = _meta(out)
    rows = np.load(out / "gallery.npy", mmap_mode="r", allow_pickle=False)
    bias = np.load(out / "gallery_bias.npy", mmap_mode="r", allow_pickle=False)
    if rows.shape != (meta["num_items"], meta["dim"]):
        raise ValueError(f"--out: {out / 'gallery.npy'} is not the gallery meta.json describes")
    return add_shard(out / "trained.faiss", rows, shard, out / "shards", bias=bias)


def merge_folder(out: str | Path, shards: list | None = None, *, recall_queries: int | None = None,
                 target_recall: float | None = None, model: Any = None) -> dict:
    """``xmodal index --out IDX --merge [SHARD ...]``: join the shards (default: every file in ``IDX/shards``)
    into ``index.faiss`` + ``lists.ivfdata``, measure the recall, complete ``meta.json``; returns it."""
    from xmodal.retrieval import build
    from xmodal.retrieval.ondisk import merge_shards
    from xmodal.runs import atomic_write_text

    out = Path(out)
    meta = _meta(out)
    if shards is None or not shards:
        shards = sorted((out / "shards").glob("shard-*-of-*.faiss"))
        if not shards:
            raise ValueError(f"--merge: no shard in {out / 'shards'} (add them with 'xmodal index --shard K/N')")
    if model is None:
        model = build._load(str(out / ("config.json" if (out / "config.json").is_file() else "model.pt")), "--out")
    seed = int(meta["ondisk"].get("seed", 0))
    queries, source = build._recall_sample(model, recall_queries or build.RECALL_QUERIES, seed)
    shift = np.load(out / "query_shift.npy", allow_pickle=False)
    rows = np.load(out / "gallery.npy", mmap_mode="r", allow_pickle=False)
    bias = np.load(out / "gallery_bias.npy", mmap_mode="r", allow_pickle=False)
    result = merge_shards(out / "trained.faiss", shards, out, rows=rows, bias=bias, target_recall=target_recall,
                          queries=None if queries is None else queries - shift[None, :])
    meta.update(recall_at_10=result["recall_at_10"], recall_queries=result["recall_queries"],
                search_params=result["search_params"], target_met=result["target_met"], curve=result["curve"],
                curve_rate=result.get("curve_rate"), kind_advice=result.get("kind_advice"),
                exact=result["search_params"].get("exact") is True,  # exact search kept: it beat every nprobe
                recall_source=source, target_recall=None if queries is None else (target_recall or 0.95))
    meta["ondisk"] = {**meta["ondisk"], "stage": MERGED, "shards": result["shards"], "lists": "lists.ivfdata"}
    atomic_write_text(out / "meta.json", json.dumps(meta, indent=2) + "\n")
    for p in shards:  # their codes are in lists.ivfdata now
        Path(p).unlink(missing_ok=True)
        Path(p).with_suffix(".json").unlink(missing_ok=True)
    return meta
