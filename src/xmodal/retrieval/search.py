"""An index folder on disk: :func:`write_index` encodes a gallery with a trained run's video head and writes
``index.faiss`` (the run's DN / NCL bias folded in, :mod:`xmodal.retrieval.index`), ``query_shift.npy``,
a copy of the run's checkpoint (for the text head: ``model.pt``, or an export's ``model.safetensors`` +
``config.json``), ``names.txt`` and ``meta.json``; :class:`SearchIndex`
opens one and searches it with text features or raw captions. ``xmodal index`` / ``xmodal query`` /
``xmodal serve`` are these plus their flags.

The search page's other directions read optional files (:func:`write_extras` / :class:`IndexExtras`):
``videos.npy`` (the gallery's video embeddings, for "more like this"), and, for an index built with
``--data`` or ``--texts``, ``texts.npy`` (the captions' text embeddings, for video -> text) and
``texts.json`` (the captions and, from a layout, the video of each).
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
                kind: str = "flat", names: list[str] | None = None, text_encoder: str | None = None,
                overwrite: bool = False, video_mask: Any = None, target_recall: float | None = None,
                recall_queries: int = RECALL_QUERIES, nlist: int | None = None, nprobe: int | None = None,
                ef_search: int | None = None, block_rows: int | None = None, seed: int = 0,
                log: Any = None, texts: Any = None) -> dict:
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
    ``texts`` (:func:`caption_texts`) adds the search page's video -> text files (:func:`write_extras`).
    ``text_encoder``: the run's recorded encoder is kept (``meta.json`` ``text_encoder`` / ``encoders``,
    :func:`xmodal.features.identity.index_encoders`); given, it states the encoder of a run that
    records none or names a local copy of the recorded one (another encoder is refused); None and
    nothing recorded: ``text_encoder`` is null (never a silent default).
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
    model = _load(run, "--run")
    from xmodal.features.identity import index_encoders

    encoders = index_encoders(run, text_encoder, _text_dim(model))  # a mismatch is refused before any work
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
                **encoders, "names": names is not None,
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
        self.model = _load(str(self.path if (self.path / "config.json").is_file() else self.path / "model.pt"),
                           "--index")
        shift_path = self.path / "query_shift.npy"
        try:
            shift = np.load(shift_path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise ValueError(f"--index: {shift_path} is not a readable .npy array ({exc})") from None
        if not isinstance(shift, np.ndarray) or shift.shape != (self.index.dim,):
            raise ValueError(f"--index: {shift_path} must hold one vector of {self.index.dim} values "
                             f"(the index's dimension)")
        self.shift = shift.astype(np.float32)
        self._text_choices: dict = {}
        names = self.path / "names.txt"
        self.names = None
        if names.exists() and not names.is_file():
            raise ValueError(f"--index: {names} is not a file")
        if names.is_file():
            try:
                self.names = _lines(names.read_text(encoding="utf-8"))
            except UnicodeDecodeError:
                raise ValueError(f"--index: {names} is not UTF-8 text") from None
            if len(self.names) != self.index.num_items:
                raise ValueError(f"--index: {names} has {len(self.names)} names but the index holds "
                                 f"{self.index.num_items} videos (rewrite it with 'xmodal index --names')")

    def encode_captions(self, captions: list[str], *, text_encoder: str | None = None,
                        progress: bool = False) -> Any:
        """Raw caption features ``[T, Dt]`` from the index's text encoder (offline; the recorded one, else
        the built-in its text size matches, shown as assumed by :meth:`text_encoder`; none: ValueError);
        for a run whose text tower was trained on token features, ``(tokens [T, L, Dt], mask [T, L])``
        (:func:`xmodal.features.encoders.encode_text_tokens`), which :meth:`search` takes as they are.

        The one place that turns raw text into what :meth:`search` takes ('xmodal query
        --captions' and 'xmodal serve' both come here). A missing encoder package is a
        ValueError naming the encoder.
        """
        choice = self.text_encoder(text_encoder)
        if choice["spec"] is None:
            raise ValueError(f"text encoder: none for this index: {choice['reason']}")
        return encode_captions(self.model, captions, choice["spec"], progress=progress)

    def text_encoder(self, given: str | None = None) -> dict:
        """The encoder raw captions go through (:func:`xmodal.features.identity.resolve_text`):
        ``{"spec", "status" (recorded / stated / assumed / off), "reason", "record"}``; ``given``
        (``--text-encoder``) must be the recorded one (ValueError otherwise)."""
        from xmodal.features.identity import recorded_text, resolve_text

        key = given
        if key not in self._text_choices:
            self._text_choices[key] = resolve_text(recorded_text(self.meta), _text_dim(self.model), given)
        return self._text_choices[key]

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

def encode_captions(model: Any, captions: list[str], text_encoder: str, *, progress: bool = False) -> Any:
    """Raw features of ``captions`` as ``model``'s text tower takes them: ``[T, Dt]`` from
    ``text_encoder``, or ``(tokens [T, L, Dt], mask [T, L])`` for a run trained on token features."""
    from xmodal._validate import duck
    from xmodal.features import encoders

    duck(model, "model", "a loaded model", ("encode_text",), ("text_tower",))
    if not isinstance(text_encoder, str):
        raise TypeError(f"text_encoder: expected an encoder name, got {type(text_encoder).__name__}")
    if isinstance(captions, str) or not isinstance(captions, (list, tuple)) or \
            not all(isinstance(c, str) for c in captions):
        raise TypeError("captions: expected a list of strings")
    tokens = bool(getattr(getattr(model.text_tower, "spec", None), "tokens", False))
    try:
        if tokens:
            if text_encoder not in encoders.TOKEN_ENCODERS:
                raise ValueError(f"text encoder {text_encoder!r} gives no token features, which this run's text "
                                 f"tower takes (token encoders: {', '.join(sorted(encoders.TOKEN_ENCODERS))})")
            return encoders.encode_text_tokens(list(captions), model=text_encoder, progress=progress)
        return encoders.encode_text(list(captions), model=text_encoder, progress=progress)
    except ModuleNotFoundError as exc:
        raise ValueError(f"text encoder {text_encoder!r} is not installed ({exc})") from None


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


class IndexExtras:
    """The optional files of an index folder, opened (arrays memory-mapped): ``videos`` ``[V, D]`` or
    None, ``texts`` ``[T, D]`` or None, ``captions`` (T strings or None), ``text_to_video`` (T gallery
    rows or None) and :meth:`captions_of` a gallery item."""

    def __init__(self, path: str | Path, *, num_items: int, dim: int) -> None:
        from xmodal._validate import positive_int

        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path: expected an index folder, got {type(path).__name__}")
        num_items, dim = positive_int(num_items, "num_items"), positive_int(dim, "dim")
        path = Path(path)
        self.videos = _embeddings(path / "videos.npy", num_items, dim)
        self.texts = _embeddings(path / "texts.npy", None, dim)
        self.captions: list[str] | None = None
        self.text_to_video: np.ndarray | None = None
        self._by_video: dict[int, list[int]] | None = None
        info = path / "texts.json"
        if self.texts is None:
            return
        try:
            body = json.loads(info.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"--index: {info} is not readable JSON ({exc})") from None
        n = self.texts.shape[0]
        captions, t2v = (body.get("captions"), body.get("video")) if isinstance(body, dict) else (0, 0)
        if captions is not None and (not isinstance(captions, list) or len(captions) != n
                                     or not all(isinstance(c, str) for c in captions)):
            raise ValueError(f"--index: {info}: 'captions' must be {n} strings (texts.npy has {n} rows)")
        if t2v is not None and (not isinstance(t2v, list) or len(t2v) != n or not all(
                isinstance(j, int) and not isinstance(j, bool) and 0 <= j < num_items for j in t2v)):
            raise ValueError(f"--index: {info}: 'video' must be {n} gallery rows in [0, {num_items})")
        self.captions = captions
        self.text_to_video = None if t2v is None else np.asarray(t2v, dtype=np.int64)

    def captions_of(self, item: int) -> list[str]:
        """The captions whose video is gallery row ``item`` (empty when unknown)."""
        if self.captions is None or self.text_to_video is None:
            return []
        if self._by_video is None:
            by: dict[int, list[int]] = {}
            for t, j in enumerate(self.text_to_video.tolist()):
                by.setdefault(j, []).append(t)
            self._by_video = by
        return [self.captions[t] for t in self._by_video.get(int(item), [])]


def _embeddings(path: Path, rows: int | None, dim: int) -> np.ndarray | None:
    if not path.exists():
        return None
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise ValueError(f"--index: {path} is not a readable .npy array ({exc})") from None
    if arr.ndim != 2 or arr.dtype != np.float32 or (rows is not None and arr.shape[0] != rows) or \
            (dim is not None and arr.shape[1] != dim):
        want = f"[{rows if rows is not None else 'T'}, {dim}]"
        raise ValueError(f"--index: {path} must be float32 {want}, got {arr.dtype} {list(arr.shape)}")
    return arr


def top_k(matrix: np.ndarray, query: np.ndarray, k: int, *, exclude: int | None = None,
          block: int = 65536) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` ``(scores, rows)`` of ``matrix @ query``, block by block (a memory-mapped
    ``matrix`` is read once, never held whole); ties by the lower row; ``exclude``: a row left out.

    >>> m = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], np.float32)
    >>> top_k(m, np.array([0.0, 1.0], np.float32), 2)[1].tolist()
    [1, 2]
    """
    from xmodal._validate import positive_int

    k, block = positive_int(k, "k"), positive_int(block, "block")
    if not isinstance(matrix, np.ndarray) or matrix.ndim != 2 or matrix.dtype.kind != "f":
        raise TypeError("matrix: expected a float numpy array [N, D] (a memmap is one)")
    q = np.asarray(query.detach().cpu() if hasattr(query, "detach") else query)
    if q.shape != (matrix.shape[1],) or q.dtype.kind not in "fiub":
        raise ValueError(f"query: expected {matrix.shape[1]} numbers, got shape {list(q.shape)}")
    if exclude is not None and (isinstance(exclude, bool) or not isinstance(exclude, (int, np.integer))):
        raise TypeError("exclude: expected a row number or None")
    q = q.astype(np.float32)
    best_s, best_i = np.empty(0, np.float32), np.empty(0, np.int64)
    for start in range(0, matrix.shape[0], block):
        s = np.asarray(matrix[start:start + block], dtype=np.float32) @ q
        idx = np.arange(start, start + s.shape[0])
        if exclude is not None and start <= exclude < start + s.shape[0]:
            keep = idx != exclude
            s, idx = s[keep], idx[keep]
        if s.shape[0] > k:  # the block's k best, ties at the k-th score kept for the tie rule
            keep = s >= np.partition(s, s.shape[0] - k)[s.shape[0] - k]
            s, idx = s[keep], idx[keep]
        s, idx = np.concatenate([best_s, s]), np.concatenate([best_i, idx])
        order = np.lexsort((idx, -s))[:k]
        best_s, best_i = s[order], idx[order]
    return best_s, best_i



def _lines(text: str) -> list[str]:
    r"""One name per ``\n`` line as :func:`write_index` writes them (``str.splitlines`` would also
    split a name at U+2028, U+0085 or a form feed, and the count would no longer match).

    >>> _lines("a\u2028b\nc\r\n")
    ['a\u2028b', 'c']
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


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


__all__ = ["write_index", "SearchIndex", "check_out", "FORMAT", "VERSION", "INDEX_FILES", "EXTRA_FILES",
           "caption_texts", "write_extras", "IndexExtras", "encode_captions", "top_k",
           "RECALL_QUERIES"]
