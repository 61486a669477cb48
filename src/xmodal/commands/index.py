"""``xmodal index``: export a trained run's video gallery as a FAISS index (bias folded in)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

NAME = "index"
HELP = "export a FAISS index of videos encoded by a run, with its DN / NCL normaliser folded in"
DESCRIPTION = """Encode raw video/image features with a trained run's video head and write a
self-contained search index to --out (searched by 'xmodal query'):

  xmodal index --run RUN --data DIR --split test --out IDX [--normalizer selected]
  xmodal index --run RUN --video-features V.npy [--video-mask M.npy] [--expert NAME=NPY ...]
               --out IDX

Frame masks and experts: --data reads them from the data layout (names from S_videos.txt);
with --video-features give --video-mask / --expert / --expert-mask (features whose rows end
in all-zero frames are refused without a mask, unless --no-mask).

The run's test-time normaliser is folded into the index so that FAISS's inner
product is the normalised score: DN exactly (gallery y - lam mu_y, queries shifted
by -lam mu_x), NCL / Sinkhorn as the per-video bias b_j fitted on the run's stored
query bank against this gallery. QB-Norm, IS and DSL depend on each query's scores
against the whole gallery and cannot be folded: choose --normalizer none, dn,
sinkhorn or ncl for such runs; with --normalizer selected on such a run the
best foldable one on val is used, and a note says so. DIR holds index.faiss, query_shift.npy, meta.json
and a copy of the run's checkpoint (for the text head)."""

FORMAT = "xmodal-index"
VERSION = 1
#: The files of an index folder (what ``build`` writes; nothing else is ever written there).
INDEX_FILES = ("index.faiss", "query_shift.npy", "model.pt", "names.txt", "meta.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from xmodal.cli import add_common_args

    parser.add_argument("--run", required=True, metavar="RUN",
                        help="run directory or checkpoint written by 'xmodal train'")
    parser.add_argument("--video-features", metavar="NPY",
                        help="raw video/image features [V, Dv] or [V, F, Dv] (or --data DIR --split S)")
    from xmodal.commands import _video_inputs

    _video_inputs.add_arguments(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="index directory to write")
    parser.add_argument("--normalizer", default="selected", metavar="NAME",
                        help="selected (default: the run's choice on val), none, dn, sinkhorn or ncl")
    parser.add_argument("--names", metavar="TXT", default=None,
                        help="optional video names, one per line (printed by 'xmodal query')")
    parser.add_argument("--kind", default="flat", choices=("flat", "ivf"),
                        help="flat: exact search (default); ivf: IndexIVFFlat, approximate")
    parser.add_argument("--text-encoder", default="minilm", metavar="NAME",
                        help="encoder 'xmodal query --captions' uses (default minilm, the one "
                             "that made the shared caption features)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing index in --out")
    add_common_args(parser, threads=None, progress=False)


def build(run: str, video_features: Any, out: str | Path, *, normalizer: str = "selected",
          kind: str = "flat", names: list[str] | None = None, text_encoder: str = "minilm",
          overwrite: bool = False, video_mask: Any = None) -> dict:
    """Write the index directory; returns its ``meta.json`` content.

    ``video_features`` / ``video_mask`` as ``model.encode_video`` takes them (dicts with experts)."""
    from xmodal.commands._runs import checkpoint_file, load_run
    from xmodal.index import BiasedIndex, fold_run_normalizer
    from xmodal.runs import atomic_write

    out = Path(out)
    check_out(out, run, overwrite=overwrite)
    model = load_run(run)
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
    atomic_write(out / "query_shift.npy", lambda tmp: _save_npy(tmp, shift))
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

    from xmodal.commands._runs import checkpoint_file

    try:
        payload = torch.load(checkpoint_file(run), map_location="cpu", weights_only=True)
        return str(payload["config"]["train"]["metric"])
    except (OSError, KeyError, TypeError, ValueError, RuntimeError):
        return "rsum"


def _save_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:  # a file object: np.save appends no second .npy
        np.save(f, array)


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


def run(args: argparse.Namespace) -> int:
    from xmodal.commands.eval import load_npy

    start = time.perf_counter()
    names = None
    if args.names:
        from xmodal.data.loaders import read_captions

        names = read_captions(args.names)
    from xmodal.commands import _video_inputs
    from xmodal.commands._runs import load_run

    model = load_run(args.run)
    if args.data is not None:
        _video_inputs.check_no_flags(args)
        from xmodal.data import load_paired_split

        split = load_paired_split(args.data, args.split)
        feats, mask = _video_inputs.from_split(split, model)
        if names is None and split.video_names is not None:
            names = list(split.video_names)
    elif args.video_features is None:
        raise ValueError("--video-features: required (or --data DIR --split S)")
    else:
        feats, mask = _video_inputs.from_flags(args, model, load_npy)
    try:
        meta = build(args.run, feats, args.out, normalizer=args.normalizer, kind=args.kind, names=names,
                     text_encoder=args.text_encoder, overwrite=args.overwrite, video_mask=mask)
    except (ValueError, TypeError) as exc:
        name, sep, rest = str(exc).partition(":")
        flags = {"normalizer": "--normalizer", "features": "--video-features"}
        if sep and name in flags:
            raise type(exc)(f"{flags[name]}:{rest}") from None
        raise
    if "fallback_from" in meta:
        print(f"note: the run selected {meta['fallback_from']}, which depends on each query's scores against "
              f"the whole gallery and cannot be folded into an index; using {meta['normalizer']}, the best "
              f"foldable normaliser on val (--normalizer NAME to choose another)", file=sys.stderr)
    print(f"wrote {args.out}: {meta['num_items']} videos x {meta['dim']} ({meta['kind']} index, "
          f"normaliser {meta['normalizer']} folded in; {time.perf_counter() - start:.1f} s)")
    return 0
