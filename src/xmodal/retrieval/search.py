"""An index folder on disk: :func:`write_index` encodes a gallery with a trained run's video head and writes
``index.faiss`` (the run's DN / NCL bias folded in, :mod:`xmodal.retrieval.index`), ``query_shift.npy``,
a copy of the run's checkpoint (for the text head), ``names.txt`` and ``meta.json``; :class:`SearchIndex`
opens one and searches it with text features or raw captions. ``xmodal index`` / ``xmodal query`` /
``xmodal serve`` are these plus their flags.
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
#: The files of an index folder (what ``build`` writes; nothing else is ever written there).
INDEX_FILES = ("index.faiss", "query_shift.npy", "model.pt", "names.txt", "meta.json")


def write_index(run: str, video_features: Any, out: str | Path, *, normalizer: str = "selected",
          kind: str = "flat", names: list[str] | None = None, text_encoder: str = "minilm",
          overwrite: bool = False, video_mask: Any = None) -> dict:
    """Write the index directory; returns its ``meta.json`` content.

    ``video_features`` / ``video_mask`` as ``model.encode_video`` takes them (dicts with experts)."""
    from xmodal.models import checkpoint_file
    from xmodal.retrieval.index import BiasedIndex, fold_run_normalizer
    from xmodal.runs import atomic_save_npy, atomic_write

    out = Path(out)
    check_out(out, run, overwrite=overwrite)
    model = _load(run, "--run")
    video = model.encode_video(video_features, video_mask)
    folded = fold_run_normalizer(model, video, normalizer, metric=_run_metric(run))
    if names is not None and len(names) != video.shape[0]:
        raise ValueError(f"--names: {len(names)} names but --video-features has {video.shape[0]} rows")
    index = BiasedIndex(folded["gallery"], folded["bias"], kind=kind)
    shift = folded["query_shift"]
    shift = np.zeros(video.shape[1], np.float32) if shift is None else shift.cpu().numpy().astype(np.float32)
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
            "normalizer": folded["normalizer"], "kind": kind, "num_items": int(video.shape[0]),
            "dim": int(video.shape[1]), "text_dim": _text_dim(model),
            "text_encoder": text_encoder, "names": names is not None}
    if "fallback_from" in folded:
        meta["fallback_from"] = folded["fallback_from"]
    atomic_write(out / "meta.json", lambda tmp: tmp.write_text(json.dumps(meta, indent=2) + "\n",
                                                                encoding="utf-8"))
    return meta


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
    for value, name in ((out, "out"), (run, "run")):
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"{name}: expected a path, got {type(value).__name__}")
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
        self.index = BiasedIndex.load(self.path / "index.faiss")
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
                self.names = _lines(names.read_text(encoding="utf-8"))
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

    def search(self, text_features, k: int, text_mask: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ``(scores [T, k], video indices [T, k])`` of raw caption features ``[T, Dt]``,
        or token features ``[T, L, Dt]`` with ``text_mask`` (or a ``(tokens, mask)`` pair)."""
        if isinstance(text_features, tuple):
            text_features, text_mask = text_features
        emb = self.model.encode_text(text_features, text_mask).cpu().numpy().astype(np.float32)
        return self.index.search(emb - self.shift[None, :], k)




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


__all__ = ["write_index", "SearchIndex", "check_out", "FORMAT", "VERSION", "INDEX_FILES"]
