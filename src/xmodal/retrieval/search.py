"""How an index folder is searched: :class:`SearchIndex` opens a folder written by
:func:`xmodal.retrieval.build.write_index` and searches it with text features or raw captions;
:class:`IndexExtras` opens its optional files (``videos.npy``, ``texts.npy``, ``texts.json``) for the
search page's video -> video and video -> text searches. ``xmodal query`` / ``xmodal serve`` are these
plus their flags.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from xmodal.retrieval.build import FORMAT, RUN_TEXT_TOWER, _load, _text_dim

#: The text encoder of an index built from a clip4clip run: the run's own fine-tuned CLIP text tower.


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
        if (self.meta.get("ondisk") or {}).get("stage") == "trained":  # xmodal.retrieval.build_shards
            raise ValueError(f"--index: {path} is trained but holds no video yet: add its shards ('xmodal index "
                             f"--out {path} --shard K/N' or --cluster) and merge them (--merge)")
        if isinstance(self.meta.get("encoders"), dict):  # folder specs are stored relative to the index
            from xmodal.features.identity import spec_from_file

            self.meta["encoders"] = {k: spec_from_file(v, self.path) for k, v in self.meta["encoders"].items()}
        dim = self.meta.get("dim")
        try:
            self.index = BiasedIndex.load(self.path / "index.faiss", dim=dim if isinstance(dim, int) else None)
        except ValueError as exc:
            raise ValueError(f"--index: {exc}".replace("path: ", "")) from None
        params = self.meta.get("search_params")
        # the build measured an exact scan as fast as every setting reaching the target: searches default to it
        self.index.default_exact = isinstance(params, dict) and params.get("exact") is True
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
                        progress: bool = False, device: str | None = None) -> Any:
        """Raw caption features ``[T, Dt]`` from the index's text encoder (offline; the recorded one, else
        the built-in its text size matches, shown as assumed by :meth:`text_encoder`; none: ValueError);
        for a run whose text tower was trained on token features, ``(tokens [T, L, Dt], mask [T, L])``
        (:func:`xmodal.features.encoders.encode_text_tokens`), which :meth:`search` takes as they are.

        The one place that turns raw text into what :meth:`search` takes ('xmodal query
        --captions' and 'xmodal serve' both come here). A missing encoder package is a
        ValueError naming the encoder. ``device`` places an ``hf:`` / ``open_clip:`` encoder (``xmodal query
        --device``; None / ``auto``: CUDA when present); other encoders run as they are built.
        """
        choice = self.text_encoder(text_encoder)
        if choice["spec"] is None:
            raise ValueError(f"text encoder: none for this index: {choice['reason']}")
        if choice["spec"] == RUN_TEXT_TOWER:  # a clip4clip run: its own tokenizer, ids into its fine-tuned tower
            from xmodal.models.clip4clip import run_tokenizer, tokenize

            return tokenize(list(captions), run_tokenizer(self.model, self.path), self.model.spec.max_words)
        return encode_captions(self.model, captions, choice["spec"], progress=progress, device=device)

    def text_encoder(self, given: str | None = None) -> dict:
        """The encoder raw captions go through (:func:`xmodal.features.identity.resolve_text`):
        ``{"spec", "status" (recorded / stated / assumed / off), "reason", "record"}``; ``given``
        (``--text-encoder``) must be the recorded one (ValueError otherwise)."""
        from xmodal.features.identity import recorded_text, resolve_text
        from xmodal.models.clip4clip import Clip4Clip

        if isinstance(self.model, Clip4Clip):  # the encoder was fine-tuned: queries never go through the base model
            if given is not None and given != RUN_TEXT_TOWER:
                raise ValueError(f"--text-encoder: this index's run fine-tuned its CLIP text tower end to end "
                                 f"(model.kind clip4clip); queries go through that tower, not {given}")
            return {"spec": RUN_TEXT_TOWER, "status": "recorded", "record": None,
                    "reason": "the run's own fine-tuned text tower (model.kind clip4clip)"}
        key = given
        if key not in self._text_choices:
            if given is None and self.meta.get("text_encoder_source") == "none":
                self._text_choices[key] = {
                    "spec": None, "status": "off", "record": None,
                    "reason": "the index was built with --text-encoder none (name an encoder with --text-encoder SPEC "
                              "to search by text)"}
            else:
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
        default = nprobe is None and ef_search is None and stored.get("exact") is True
        if kind == "flat" or exact or default:
            how = "flat index" if kind == "flat" else ("--exact: every cell" if kind == "ivf" and exact else
                                                       "--exact: the stored vectors scanned" if exact else
                                                       "the build measured it as fast as every setting")
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

def encode_captions(model: Any, captions: list[str], text_encoder: str, *, progress: bool = False,
                    device: str | None = None) -> Any:
    """Raw features of ``captions`` as ``model``'s text tower takes them: ``[T, Dt]`` from
    ``text_encoder``, or ``(tokens [T, L, Dt], mask [T, L])`` for a run trained on token features;
    ``device``: where an ``hf:`` / ``open_clip:`` encoder runs (:func:`placed`)."""
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
        return encoders.encode_text(list(captions), model=text_encoder, progress=progress,
                                    device=placed(text_encoder, device))
    except ModuleNotFoundError as exc:
        raise ValueError(f"text encoder {text_encoder!r} is not installed ({exc})") from None


def placed(spec: str | None, device: str | None) -> str | None:
    """The device an encoder of queries runs on: ``device`` for an ``hf:`` / ``open_clip:`` model (which
    ``get_encoder`` places), None (as built) for the others, which take no device.

    >>> placed("hf:clip", "cpu"), placed("minilm", "cpu")
    ('cpu', None)
    """
    return device if isinstance(spec, str) and spec.startswith(("hf:", "open_clip:")) else None


class IndexExtras:
    """The optional files of an index folder, opened (arrays memory-mapped): ``videos`` ``[V, D]`` or
    None, ``texts`` ``[T, D]`` or None (float16 or float32), ``texts_index`` (the captions' own FAISS
    index, ``texts.faiss``, or None: then searched exactly), ``captions`` (T strings or None),
    ``text_to_video`` (T gallery rows or None) and :meth:`captions_of` a gallery item."""

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
        self.texts_index = None
        info = path / "texts.json"
        if self.texts is None:
            return
        if (path / "texts.faiss").is_file():
            from xmodal.retrieval.index import BiasedIndex

            try:
                self.texts_index = BiasedIndex.load(path / "texts.faiss", dim=dim)
            except ValueError as exc:
                raise ValueError(f"--index: {exc}".replace("path: ", "")) from None
            if self.texts_index.num_items != self.texts.shape[0]:
                raise ValueError(f"--index: {path / 'texts.faiss'} holds {self.texts_index.num_items} captions but "
                                 f"texts.npy has {self.texts.shape[0]}")
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
    if arr.ndim != 2 or arr.dtype not in (np.float16, np.float32) or (rows is not None and arr.shape[0] != rows) or \
            (dim is not None and arr.shape[1] != dim):
        want = f"[{rows if rows is not None else 'T'}, {dim}]"
        raise ValueError(f"--index: {path} must be float16 or float32 {want}, got {arr.dtype} {list(arr.shape)}")
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


__all__ = ["SearchIndex", "IndexExtras", "encode_captions", "placed", "top_k"]
