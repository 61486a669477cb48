"""``xmodal data import|check``: build and check the paired-split layout."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

NAME = "data"
HELP = "import a table of (video, caption) pairs into the data layout, or check a data directory"
DESCRIPTION = """Your own data in the layout xmodal train reads (README.md, "Your data"):

  xmodal data import pairs.csv --features feats/ --out mydata [--split train] [--text-features T.npy]
                     [--expert audio=audio_feats/ --expert flow='flow/*.npy' ...]
  xmodal data check mydata [--split train ...]

import: pairs.csv (header: video_id,caption[,split]) or pairs.jsonl; per-video features
(clips inside long videos: header video_id,clip_id[,start,end],caption: the clips are the
rows, features per clip feats/<clip_id>.npy, and {split}_video_to_group.npy + {split}_groups.txt
hold the long videos; clips ordered by start within their video)
feats/<video_id>.npy or .npz ([D] or [F, D], any number of frames: padded + mask), or a
glob ('feats/*.npy'); captions encoded with MiniLM unless --text-features gives a .npy
with one row per pair.
check: lists every problem at once (missing files, shapes, dtypes, NaN, ids out of range,
videos without captions) and a summary per split; exit code 1 if there are problems."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    imp = sub.add_parser("import", help="pairs table + per-video feature files -> data layout")
    imp.add_argument("pairs", help=".csv (header row) or .jsonl of (video_id, caption[, split])")
    imp.add_argument("--features", required=True, help="directory of <video_id>.npy/.npz, or a glob")
    imp.add_argument("--out", required=True, help="output data directory")
    imp.add_argument("--split", default="train", help="split of rows without a split column (default: train)")
    imp.add_argument("--text-features", default=None,
                     help=".npy [rows, Dt] aligned with the table (default: encode captions with MiniLM)")
    imp.add_argument("--text-model", default="minilm", help="registered text encoder (xmodal.encoders)")
    imp.add_argument("--expert", action="append", default=[], metavar="NAME=DIR_OR_GLOB",
                     help="a further expert's per-video files (repeatable) -> {split}_video_features.NAME.npy; "
                          "videos without a file are masked in {split}_video_mask.NAME.npy")
    chk = sub.add_parser("check", help="list every problem of a data directory and summarise it")
    chk.add_argument("root", help="data directory")
    chk.add_argument("--split", action="append", default=None, help="split(s) to check (default: all found)")


def _stats(values: np.ndarray) -> str:
    if values.size == 0:
        return "-"
    return f"min {values.min()}, median {float(np.median(values)):g}, max {values.max()}"


def summarize(arrays: dict) -> list[str]:
    """Counts, frames per video and captions per video of one inspected split."""
    from xmodal.data.types import present_rows

    video, text, t2v = arrays.get("video"), arrays.get("text"), arrays.get("text_to_video")
    lines = []
    if isinstance(video, np.ndarray) and video.ndim in (2, 3):
        n = video.shape[0]
        mask = arrays.get("video_mask")
        if video.ndim == 2:
            frames = "1 (no frame axis)"
        elif isinstance(mask, np.ndarray) and mask.shape == video.shape[:2]:
            frames = _stats(mask.sum(1)) + f" (padded to {video.shape[1]})"
        else:
            frames = f"{video.shape[1]} (no mask)"
        lines.append(f"videos {n}, feature dim {video.shape[-1]}, frames per video: {frames}")
        for name, feats in arrays.get("experts", {}).items():
            m = arrays.get("expert_masks", {}).get(name)
            ok = isinstance(m, np.ndarray) and m.shape in (feats.shape[:1], feats.shape[:2]) and m.dtype == bool
            here = int(present_rows(m, feats.shape[0]).sum()) if ok or m is None else "?"
            lines.append(f"expert {name}: shape {list(feats.shape)}, present for {here} of {feats.shape[0]} videos")
        if isinstance(t2v, np.ndarray) and t2v.ndim == 1 and np.issubdtype(t2v.dtype, np.integer) and (
                t2v.size == 0 or (t2v.min() >= 0 and t2v.max() < n)):
            lines.append(f"captions per video: {_stats(np.bincount(t2v, minlength=n))}")
    if isinstance(text, np.ndarray) and text.ndim == 2:
        lines.append(f"texts {text.shape[0]}, feature dim {text.shape[1]}")
    g = arrays.get("video_to_group")
    if isinstance(g, np.ndarray) and g.ndim == 1 and g.size and np.issubdtype(g.dtype, np.integer) and g.min() >= 0:
        sizes = np.bincount(g)
        lines.append(f"groups (long videos) {int(g.max()) + 1}, clips per group: {_stats(sizes[sizes > 0])}")
    return lines


def check(root: str, splits: list[str] | None = None) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """``({split: problems}, {split: summary lines})`` for every split of ``root``."""
    from xmodal.data import layout
    from xmodal.data.loaders import inspect_split

    if not Path(root).is_dir():
        raise ValueError(f"root: data directory {root} not found")
    splits = splits or layout.splits_in(root)
    if not splits:
        raise ValueError(f"root: no split in {root} (no *_text_to_video.npy or alias; see the README section 'Your data')")
    problems, summaries = {}, {}
    for split in splits:
        arrays, problems[split] = inspect_split(root, split, uncaptioned=True)
        summaries[split] = summarize(arrays)
    return problems, summaries


def run(args: argparse.Namespace) -> int:
    if args.action == "import":
        from xmodal.data.importer import import_pairs, parse_experts

        encode = None
        if args.text_features is None:
            from xmodal.encoders import encode_text

            def encode(captions):
                try:
                    return encode_text(captions, model=args.text_model, progress=False)
                except ModuleNotFoundError as exc:  # a missing optional extra is a user error
                    raise ValueError(f"--text-model: {exc}") from None
        experts = parse_experts(args.expert)
        summary = import_pairs(args.pairs, features=args.features, out=args.out, split=args.split,
                               text_features=args.text_features, encode=encode, experts=experts)
        for split, s in summary.items():
            print(f"{split}: {s['videos']} videos, {s['texts']} texts, up to {s['max_frames']} frames per video")
            for expert, n in s["experts"].items():
                print(f"  expert {expert}: {n} of {s['videos']} videos")
        print(f"wrote {args.out} (check it with: xmodal data check {args.out})")
        return 0
    problems, summaries = check(args.root, args.split)
    total = 0
    for split in summaries:
        print(f"[{split}]")
        for line in summaries[split]:
            print(f"  {line}")
        for p in problems[split]:
            print(f"  PROBLEM: {p}")
        total += len(problems[split])
    print(f"{total} problem(s)" if total else "ok: no problems")
    return 1 if total else 0
