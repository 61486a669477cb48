"""The index behind ``xmodal serve``: :class:`Searcher` (one opened index folder and its optional files,
searched in the three directions) and :class:`IndexHolder` (the folder re-checked at every request:
reopened when ``xmodal index --overwrite`` replaced it, :class:`IndexUnavailable` while it is missing
or half-written)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np


class IndexUnavailable(Exception):
    """The index folder is gone or half-written (503)."""


class Searcher:
    """An opened index plus its text encoder and optional files: ``search(q, k)``, ``search_video``,
    ``search_embedding`` -> the API's dict (thread-safe)."""

    def __init__(self, index: Any, *, text_encoder: str | None = None, device: str | None = None) -> None:
        from xmodal.retrieval.search import IndexExtras, SearchIndex

        self.index = index if isinstance(index, SearchIndex) else SearchIndex(index)
        self.device = device  # where an hf: / open_clip: encoder of the queries runs (None: CUDA when present)
        #: the encoder of text queries: {"spec" (None: no text search), "status", "reason", "record"}
        self.text_choice = self.index.text_encoder(text_encoder)  # another encoder than recorded: ValueError
        self.text_encoder = self.text_choice["spec"]
        arch = self.index.model.architecture()  # a clip4clip run has no text features: token ids into its tower
        self.text_dim = int(arch["text"]["in_dim"]) if "text" in arch else None
        self.num_items = int(self.index.index.num_items)
        self.extras = IndexExtras(self.index.path, num_items=self.num_items, dim=int(self.index.shift.shape[0]))
        if self.extras.texts_index is not None:  # a build that measured exact search the fastest keeps it
            self.extras.texts_index.default_exact = _kept_exact(self.meta.get("texts_index"))
        names = self.index.names
        self._items: dict[str, int] = {}
        for i, n in enumerate(names if names is not None else (str(i) for i in range(self.num_items))):
            self._items.setdefault(n, i)
        self._lock = threading.Lock()  # one query at a time through the encoder and FAISS

    @property
    def meta(self) -> dict:
        return self.index.meta

    def name(self, item: int) -> str:
        names = self.index.names
        return names[item] if names is not None and item < len(names) else str(item)

    def item(self, name: str) -> int:
        """The gallery row named ``name``; KeyError naming ``video`` when there is none."""
        if name not in self._items:
            raise KeyError(f"video: no item named {name[:200]!r} in this index")
        return self._items[name]

    def recall(self) -> dict:
        """The FAISS index's measured recall: ``{"recall_at_10", "recall_queries", "search_params", "exact"}``
        (from ``meta.json``; an exact index has recall 1)."""
        meta = self.meta
        exact = meta.get("kind", "flat") == "flat" or _kept_exact(meta)  # flat, or exact kept by the build
        recall = 1.0 if exact else meta.get("recall_at_10")
        return {"recall_at_10": recall if isinstance(recall, (int, float)) else None,
                "recall_queries": meta.get("recall_queries"), "search_params": meta.get("search_params"),
                "exact": exact}

    def _videos(self, scores, indices) -> list[dict]:
        known = self.extras.captions is not None and self.extras.text_to_video is not None
        out = []
        for rank, (s, j) in enumerate(zip(scores, indices), 1):
            if j < 0:
                continue
            r = {"rank": rank, "name": self.name(int(j)), "score": float(s), "item": int(j)}
            if known:
                r["captions"] = self.extras.captions_of(int(j))
            out.append(r)
        return out

    def _texts(self, scores, indices) -> list[dict]:
        ex = self.extras
        return [{"rank": rank, "item": int(t), "score": float(s),
                 "caption": None if ex.captions is None else ex.captions[int(t)],
                 "name": None if ex.text_to_video is None else self.name(int(ex.text_to_video[int(t)]))}
                for rank, (s, t) in enumerate(zip(scores, indices), 1)]

    def _answer(self, direction: str, results: list, k: int, times: tuple, how: dict | None = None,
                **query) -> dict:
        t0, t1, t2 = times
        recall = self.recall() if direction == "t2v" else how or {"recall_at_10": 1.0, "recall_queries": None,
                                                                  "search_params": None, "exact": True}
        return {"direction": direction, "query": query.get("q"), "video": query.get("video"), "results": results,
                "normalizer": self.meta.get("normalizer") if direction == "t2v" else None, "k": k, **recall,
                "latency_ms": {"encode": 1e3 * (t1 - t0), "search": 1e3 * (t2 - t1), "total": 1e3 * (t2 - t0)}}

    def text_off(self, reason: str) -> None:
        """Turn text search off (an encoder that failed to load), saying why."""
        self.text_choice = {**self.text_choice, "spec": None, "status": "off", "reason": reason}
        self.text_encoder = None

    def search(self, q: str, k: int) -> dict[str, Any]:
        """Text -> video: ``{"direction": "t2v", "query", "results": [{"rank", "name", "score", "item"
        (, "captions")}], "normalizer", "k", "recall_at_10", ..., "latency_ms", "text_encoder"}``;
        LookupError naming ``q`` when this index has no usable text encoder."""
        if self.text_encoder is None:
            raise LookupError(f"q: text search is off for this index: {self.text_choice['reason']}")
        with self._lock:
            t0 = time.perf_counter()
            feats = self.index.encode_captions([q], text_encoder=self.text_encoder, device=self.device)
            t1 = time.perf_counter()
            scores, indices = self.index.search(feats, k)
            t2 = time.perf_counter()
        return {**self._answer("t2v", self._videos(scores[0], indices[0]), k, (t0, t1, t2), q=q),
                "text_encoder": self.encoder_info()}

    def encoder_info(self) -> dict:
        """``{"spec", "status", "reason"}`` of the text encoder (``status`` ``assumed``: not recorded)."""
        from xmodal.features.identity import shown_spec

        c = self.text_choice
        return {"spec": shown_spec(c["spec"], c.get("record")), "status": c["status"], "reason": c["reason"]}

    def search_features(self, feats: np.ndarray, k: int) -> dict[str, Any]:
        """Text -> video from raw caption features ``[T, Dt]`` (a POSTed ``.npy``): one answer per row,
        ``{"direction": "t2v", "queries": T, "answers": [...]}`` (each as :meth:`search`'s, query None)."""
        if self.text_dim is None:
            raise ValueError("features: this index's run fine-tuned its CLIP text tower (model.kind clip4clip); "
                             "send captions, not caption features")
        if feats.ndim != 2 or feats.shape[1] != self.text_dim:
            raise ValueError(f"features: expected [T, {self.text_dim}] caption features (this run's text size), "
                             f"got shape {list(feats.shape)}")
        with self._lock:
            t0 = time.perf_counter()
            scores, indices = self.index.search(feats, k)
            t1 = time.perf_counter()
        answers = [self._answer("t2v", self._videos(s, i), k, (t0, t0, t1)) for s, i in zip(scores, indices)]
        return {"direction": "t2v", "queries": int(feats.shape[0]), "answers": answers,
                "text_encoder": self.encoder_info()}

    def search_video(self, name: str, k: int, direction: str = "v2v") -> dict[str, Any]:
        """From the gallery item ``name``: ``v2v`` (more like this) or ``v2t`` (its captions)."""
        item = self.item(name)
        if self.extras.videos is None:
            raise LookupError("video: this index has no videos.npy (rewrite it with 'xmodal index')")
        t0 = time.perf_counter()
        emb = np.asarray(self.extras.videos[item], dtype=np.float32)
        return self.search_embedding(emb, k, direction, video=name, exclude=item, t0=t0)

    def search_embedding(self, emb: np.ndarray, k: int, direction: str, *, video: str | None = None,
                         exclude: int | None = None, t0: float | None = None) -> dict[str, Any]:
        """From a video embedding ``[D]`` (a gallery row or an uploaded video's), through the FAISS indexes:
        ``v2v`` searches the gallery's index without its bias (a DN fold's shifted gallery moves every
        score by one constant), ``v2t`` the captions' own ``texts.faiss``; the found rows are rescored
        exactly from ``videos.npy`` / ``texts.npy``. Folders without them are searched exactly."""
        from xmodal.retrieval.search import top_k

        if direction not in ("v2v", "v2t"):
            raise ValueError(f"direction: expected v2v or v2t, got {str(direction)[:20]!r}")
        t0 = time.perf_counter() if t0 is None else t0
        t1 = time.perf_counter()
        if direction == "v2v":
            if self.extras.videos is None:
                raise LookupError("video: this index has no videos.npy (rewrite it with 'xmodal index')")
            index = self.index.index
            with self._lock:
                found = index.search(emb[None, :], k + (exclude is not None), bias=False)
            # FAISS's scores are the cosines where it stores the vectors as they are (not ivfpq's codes,
            # not a DN fold's shifted gallery); else the found rows are rescored from videos.npy
            exact_scores = index.kind in ("flat", "ivf", "hnsw") and self.meta.get("normalizer") != "dn"
            scores, rows = _found(found, k, exclude) if exact_scores else \
                _rescored(self.extras.videos, emb, found[1][0], k, exclude)
            results = self._videos(scores, rows)
            how = self._how(self.index.index, self.meta.get("search_params"))
        else:
            if self.extras.texts is None:
                raise LookupError("direction: this index has no captions for video -> text (build it with "
                                  "'xmodal index --data DIR' or '--texts FILE')")
            if self.extras.texts_index is not None:
                with self._lock:
                    found = self.extras.texts_index.search(emb[None, :], k)
                scores, rows = _found(found, k, None) if self.extras.texts_index.kind in ("flat", "ivf", "hnsw") else \
                    _rescored(self.extras.texts, emb, found[1][0], k, None)
                how = self._how(self.extras.texts_index, (self.meta.get("texts_index") or {}).get("search_params"))
            else:
                scores, rows = top_k(self.extras.texts, emb, k)
                how = {"exact": True, "recall_at_10": 1.0, "recall_queries": None, "search_params": None}
            results = self._texts(scores, rows)
        return self._answer(direction, results, k, (t0, t1, time.perf_counter()), how=how, video=video)

    def _how(self, index: Any, params: Any) -> dict:
        """The quality of a video-query search through ``index``: exact for flat, else approximate with
        the recall not measured for video queries (the stored recall is the text queries')."""
        exact = index.kind == "flat" or bool(getattr(index, "default_exact", False))
        return {"exact": exact, "recall_at_10": 1.0 if exact else None, "recall_queries": None,
                "search_params": None if exact else params}


def _found(found: tuple, k: int, exclude: int | None) -> tuple[np.ndarray, np.ndarray]:
    """FAISS's ``(scores [1, k'], rows [1, k'])`` without ``-1`` and ``exclude``, at most ``k``."""
    scores, rows = found[0][0], found[1][0]
    keep = (rows >= 0) & (rows != (-2 if exclude is None else exclude))
    return scores[keep][:k], rows[keep][:k]


def _rescored(matrix: np.ndarray, emb: np.ndarray, rows: np.ndarray, k: int, exclude: int | None):
    """``(scores, rows)`` of the found ``rows`` (``-1``: none) by ``matrix[row] . emb`` (float32), best
    first, ties by the lower row; ``exclude`` left out; at most ``k``."""
    rows = np.asarray([int(r) for r in rows if r >= 0 and r != exclude], dtype=np.int64)
    if not rows.size:
        return np.empty(0, np.float32), rows
    scores = np.asarray(matrix[np.sort(rows)], dtype=np.float32) @ emb.astype(np.float32)
    rows = np.sort(rows)
    order = np.lexsort((rows, -scores))[:k]
    return scores[order], rows[order]


class IndexHolder:
    """The index folder, reopened when its files change: :meth:`current` stats every file of the folder
    (inode, mtime, size) and returns the :class:`Searcher` of what is there now, or raises
    :class:`IndexUnavailable` (deleted, or half-written by ``xmodal index --overwrite``)."""

    def __init__(self, index: Any, *, text_encoder: str | None = None, device: str | None = None) -> None:
        from xmodal.retrieval.search import SearchIndex

        self.path = Path(index.path if isinstance(index, SearchIndex) else index)
        self.text_encoder, self.device = text_encoder, device
        self._lock = threading.Lock()
        self.signature = self._signature()
        self.searcher = Searcher(index, text_encoder=text_encoder, device=device)  # a bad folder: ValueError here
        self.reloads = 0
        self._failed: tuple[tuple, str] | None = None

    def _signature(self) -> tuple:
        from xmodal.retrieval.build import INDEX_FILES

        out = []
        for name in INDEX_FILES:
            try:
                st = os.stat(self.path / name)
            except OSError:
                out.append(None)
                continue
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def current(self) -> Searcher:
        sig = self._signature()
        if sig == self.signature:
            return self.searcher
        with self._lock:
            sig = self._signature()
            if sig == self.signature:
                return self.searcher
            if not (self.path / "meta.json").is_file():
                raise IndexUnavailable(f"index: {self.path} has no meta.json: it was deleted, or 'xmodal index "
                                       f"--overwrite' is rewriting it (try again in a moment)")
            if self._failed is not None and self._failed[0] == sig:  # the same broken files: not reopened
                raise IndexUnavailable(self._failed[1])
            try:
                searcher = Searcher(self.path, text_encoder=self.text_encoder, device=self.device)
            except (ValueError, OSError, RuntimeError) as exc:
                message = f"index: {self.path} cannot be opened now ({str(exc)[:300]})"
                self._failed = (sig, message)
                raise IndexUnavailable(message) from None
            if self._signature() != sig:  # changed while being read: a rewrite is under way
                raise IndexUnavailable(f"index: {self.path} is being rewritten (try again in a moment)")
            self.searcher, self.signature = searcher, sig
            self.reloads += 1
            return searcher


def _kept_exact(meta: Any) -> bool:
    """Whether an index's ``meta.json`` record keeps exact search (``search_params == {"exact": true}``)."""
    params = meta.get("search_params") if isinstance(meta, dict) else None
    return isinstance(params, dict) and params.get("exact") is True
