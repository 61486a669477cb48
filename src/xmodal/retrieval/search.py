"""An index folder on disk: :func:`write_index` encodes a gallery with a trained run's video head and writes
``index.faiss`` (the run's DN / NCL bias folded in, :mod:`xmodal.retrieval.index`), ``query_shift.npy``,
a copy of the run's checkpoint (for the text head), ``names.txt`` and ``meta.json``; :class:`SearchIndex`
opens one and searches it with text features or raw captions. ``xmodal index`` / ``xmodal query`` /
``xmodal serve`` are these plus their flags.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "xmodal-index"
VERSION = 1
#: The files of an index folder (what ``build`` writes; nothing else is ever written there).
INDEX_FILES = ("index.faiss", "query_shift.npy", "model.pt", "names.txt", "meta.json")


#: Embedded train texts the recall of an approximate index is measured on (at most).
RECALL_QUERIES = 1000


def write_index(run: str, video_features: Any, out: str | Path, *, normalizer: str = "selected",
                kind: str = "flat", names: list[str] | None = None, text_encoder: str = "minilm",
                overwrite: bool = False, video_mask: Any = None, target_recall: float | None = None,
                recall_queries: int = RECALL_QUERIES, nlist: int | None = None, nprobe: int | None = None,
                ef_search: int | None = None, block_rows: int | None = None, seed: int = 0) -> dict:
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
    """
    from xmodal.models import checkpoint_file
    from xmodal.retrieval.index import BLOCK_ROWS, KINDS, BiasedIndex, fold_run_normalizer
    from xmodal._validate import option, whole_number
    from xmodal.runs import atomic_save_npy, atomic_write

    out = Path(out)
    kind = option(kind, "kind", KINDS)
    recall_queries = whole_number(recall_queries, "recall_queries", minimum=1)
    block_rows = whole_number(block_rows or BLOCK_ROWS, "block_rows", minimum=1)
    check_out(out, run, overwrite=overwrite)
    model = _load(run, "--run")
    n = _num_rows(video_features)
    if names is not None and len(names) != n:
        raise ValueError(f"--names: {len(names)} names but --video-features has {n} rows")
    store = _embed_gallery(model, video_features, video_mask, out, block_rows)
    try:
        folded = fold_run_normalizer(model, store, normalizer, metric=_run_metric(run))
        shift = folded["query_shift"]
        shift = np.zeros(store.dim, np.float32) if shift is None else shift.cpu().numpy().astype(np.float32)
        queries, recall_source = (None, None) if kind == "flat" else _recall_sample(model, recall_queries, seed)
        index = BiasedIndex(folded["gallery"], folded["bias"], kind=kind,
                            queries=None if queries is None else queries - shift[None, :],
                            target_recall=target_recall, nlist=nlist, nprobe=nprobe, ef_search=ef_search,
                            block_rows=block_rows, seed=seed)
    finally:
        store.close()
    out.mkdir(parents=True, exist_ok=True)
    # meta.json goes first and comes back last: a half-rewritten folder is never a valid index
    (out / "meta.json").unlink(missing_ok=True)
    source = checkpoint_file(run)
    atomic_write(out / "index.faiss", index.save)
    atomic_save_npy(out / "query_shift.npy", shift)
    atomic_write(out / "model.pt", lambda tmp: shutil.copyfile(source, tmp))
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
    atomic_write(out / "meta.json", lambda tmp: tmp.write_text(json.dumps(meta, indent=2) + "\n",
                                                                encoding="utf-8"))
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
    import torch

    from xmodal.models import checkpoint_file

    try:
        payload = torch.load(checkpoint_file(run), map_location="cpu", weights_only=True)
        return str(payload["config"]["train"]["metric"])
    except (OSError, KeyError, TypeError, ValueError, RuntimeError):
        return "rsum"


def check_out(out: Path, run: str, *, overwrite: bool) -> None:
    """Refuse, before anything is written: an --out that is a file, the run directory
    itself, a folder holding files that are not an index's, or an index without --overwrite."""
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


class SearchIndex:
    """An ``xmodal index`` directory opened for search."""

    def __init__(self, path: str | Path) -> None:
        from xmodal.retrieval.index import BiasedIndex

        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not meta_path.is_file():
            raise ValueError(f"--index: {path} has no meta.json (write one with 'xmodal index')")
        try:
            self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"--index: {meta_path} is not valid JSON ({exc})") from None
        if not isinstance(self.meta, dict) or self.meta.get("format") != FORMAT:
            raise ValueError(f"--index: {meta_path} was not written by 'xmodal index'")
        dim = self.meta.get("dim")
        try:
            self.index = BiasedIndex.load(self.path / "index.faiss", dim=dim if isinstance(dim, int) else None)
        except ValueError as exc:
            raise ValueError(f"--index: {exc}".replace("path: ", "")) from None
        self.model = _load(str(self.path / "model.pt"), "--index")
        shift_path = self.path / "query_shift.npy"
        try:
            shift = np.load(shift_path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise ValueError(f"--index: {shift_path} is not a readable .npy array ({exc})") from None
        if not isinstance(shift, np.ndarray) or shift.shape != (self.index.dim,):
            raise ValueError(f"--index: {shift_path} must hold one vector of {self.index.dim} values "
                             f"(the index's dimension)")
        self.shift = shift.astype(np.float32)
        names = self.path / "names.txt"
        self.names = None
        if names.exists() and not names.is_file():
            raise ValueError(f"--index: {names} is not a file")
        if names.is_file():
            try:
                self.names = names.read_text(encoding="utf-8").splitlines()
            except UnicodeDecodeError:
                raise ValueError(f"--index: {names} is not UTF-8 text") from None
            if len(self.names) != self.index.num_items:
                raise ValueError(f"--index: {names} has {len(self.names)} names but the index holds "
                                 f"{self.index.num_items} videos (rewrite it with 'xmodal index --names')")

    def encode_captions(self, captions: list[str], *, text_encoder: str | None = None,
                        progress: bool = False) -> Any:
        """Raw caption features ``[T, Dt]`` from the index's text encoder (offline; MiniLM by default);
        for a run whose text tower was trained on token features, ``(tokens [T, L, Dt], mask [T, L])``
        (:func:`xmodal.features.encoders.encode_text_tokens`), which :meth:`search` takes as they are.

        The one place that turns raw text into what :meth:`search` takes ('xmodal query
        --captions' and 'xmodal serve' both come here). A missing encoder package is a
        ValueError naming the encoder.
        """
        from xmodal.features import encoders

        name = text_encoder or self.meta.get("text_encoder", "minilm")
        tokens = bool(getattr(getattr(self.model.text_tower, "spec", None), "tokens", False))
        try:
            if tokens:
                if name not in encoders.TOKEN_ENCODERS:
                    raise ValueError(f"text encoder {name!r} gives no token features, which this run's text "
                                     f"tower takes (token encoders: {', '.join(sorted(encoders.TOKEN_ENCODERS))})")
                return encoders.encode_text_tokens(list(captions), model=name, progress=progress)
            return encoders.encode_text(list(captions), model=name, progress=progress)
        except ModuleNotFoundError as exc:
            raise ValueError(f"text encoder {name!r} is not installed ({exc})") from None

    @property
    def recall_at_10(self) -> float | None:
        """The index's measured recall@10 at its stored search parameter (1.0 for an exact
        ``flat`` index; None when it was not measured)."""
        value = self.meta.get("recall_at_10", 1.0 if self.index.kind == "flat" else None)
        return None if value is None else float(value)

    def quality(self, *, nprobe: int | None = None, ef_search: int | None = None, exact: bool = False) -> dict:
        """What a search with these settings returns: ``{"exact": bool, "recall_at_10": float or
        None, "recall_queries": int, "search_params": dict, "note": str}`` (``recall_at_10`` is
        None for a search parameter other than the measured one)."""
        kind = self.index.kind
        stored = dict(self.meta.get("search_params", self.index.search_params))
        queries = int(self.meta.get("recall_queries", 0) or 0)
        if kind == "flat" or exact:
            how = "flat index" if kind == "flat" else ("--exact: every cell" if kind == "ivf" else
                                                       "--exact: the stored vectors scanned")
            return {"exact": True, "recall_at_10": 1.0, "recall_queries": 0, "search_params": {},
                    "note": f"exact search ({how})"}
        asked = ({"nprobe": min(int(nprobe), self.index.nlist or int(nprobe))} if nprobe is not None
                 else {"efSearch": int(ef_search)} if ef_search is not None else stored)
        setting = ", ".join(f"{k} {v}" for k, v in asked.items())
        recall = self.recall_at_10
        if asked != stored:
            known = "" if recall is None else f"; {recall:.3f} at " + ", ".join(f"{k} {v}" for k, v in stored.items())
            return {"exact": False, "recall_at_10": None, "recall_queries": 0, "search_params": asked,
                    "note": f"approximate ({kind}, {setting}): recall@10 not measured at this setting{known}"}
        if recall is None:
            return {"exact": False, "recall_at_10": None, "recall_queries": 0, "search_params": asked,
                    "note": f"approximate ({kind}, {setting}): recall@10 not measured"}
        return {"exact": False, "recall_at_10": recall, "recall_queries": queries, "search_params": asked,
                "note": f"approximate ({kind}, {setting}): recall@10 {recall:.3f} measured on {queries} "
                        f"held-out queries"}

    def search(self, text_features, k: int, text_mask: Any = None, *, nprobe: int | None = None,
               ef_search: int | None = None, exact: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ``(scores [T, k], video indices [T, k])`` of raw caption features ``[T, Dt]``,
        or token features ``[T, L, Dt]`` with ``text_mask`` (or a ``(tokens, mask)`` pair).

        ``nprobe`` (``ivf``/``ivfpq``) / ``ef_search`` (``hnsw``) override the index's measured
        search parameter; ``exact=True`` searches exactly (not ``ivfpq``). :meth:`quality`
        says what recall the answer comes with."""
        if isinstance(text_features, tuple):
            text_features, text_mask = text_features
        emb = self.model.encode_text(text_features, text_mask).cpu().numpy().astype(np.float32)
        return self.index.search(emb - self.shift[None, :], k, nprobe=nprobe, ef_search=ef_search, exact=exact)


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


__all__ = ["write_index", "SearchIndex", "check_out", "FORMAT", "VERSION", "INDEX_FILES", "RECALL_QUERIES"]
