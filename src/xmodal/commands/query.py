"""``xmodal query``: search an index written by ``xmodal index`` with texts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


NAME = "query"
HELP = "search an 'xmodal index' with caption features or raw captions; prints the top-k videos"
DESCRIPTION = """Search an index written by 'xmodal index' with text:

  xmodal query --index DIR --text-features T.npy --k 10
  xmodal query --index DIR --captions "a dog runs on grass" "two people cook" --k 5

Caption features go through the run's text head (copied into DIR); raw captions are
first encoded offline with the index's text encoder (default MiniLM, extra
[encoders]). Scores are the run's normalised text -> video scores (the normaliser
folded into the index), so the top-k equals brute force over all videos."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from xmodal.commands import add_common_args

    parser.add_argument("--index", required=True, metavar="DIR", help="directory written by 'xmodal index'")
    parser.add_argument("--text-features", metavar="NPY", help="raw caption features [T, Dt] or tokens [T, L, Dt]")
    parser.add_argument("--text-mask", metavar="NPY", help="bool or 0/1 [T, L], True = real token, of token "
                        "features (written by 'xmodal encode text --tokens')")
    parser.add_argument("--captions", nargs="+", metavar="TEXT", help="raw captions to encode and search")
    parser.add_argument("--k", type=int, default=10, help="results per query (default 10)")
    parser.add_argument("--text-encoder", default=None, metavar="NAME",
                        help="override the index's text encoder for --captions")
    parser.add_argument("--out", metavar="NPY", default=None,
                        help="also save the indices [T, k] (int64); scores go to OUT with .scores.npy")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    add_common_args(parser, threads=None, progress=True)


def _outputs(out: str) -> tuple[Path, Path]:
    """The files ``--out`` names (indices, then scores), refused before any work if one is a folder or a link."""
    path = Path(out if out.endswith(".npy") else out + ".npy")  # np.save's naming, kept
    paths = (path, Path(str(Path(out).with_suffix("")) + ".scores.npy"))
    for p in paths:
        if p.is_dir() or p.is_symlink():
            raise ValueError(f"--out: {p} is a {'directory' if p.is_dir() else 'symbolic link'}; "
                             f"give the .npy file to write")
    return paths


def run(args: argparse.Namespace) -> int:
    from xmodal.commands import progress_enabled
    from xmodal.commands import load_npy

    if (args.text_features is None) == (args.captions is None):
        raise ValueError("--text-features: give exactly one of --text-features or --captions")
    if args.k < 1:
        raise ValueError(f"--k: must be >= 1, got {args.k}")
    if getattr(args, "text_mask", None) and args.text_features is None:
        raise ValueError("--text-mask: only with --text-features")
    outputs = _outputs(args.out) if args.out else None
    from xmodal.retrieval.search import SearchIndex

    idx = SearchIndex(args.index)
    if args.captions is not None:
        try:
            feats = idx.encode_captions(args.captions, text_encoder=args.text_encoder,
                                        progress=progress_enabled(args))
        except ValueError as exc:
            if str(exc).startswith("text encoder"):
                raise ValueError(f"--captions: {exc}") from None
            raise
        labels = list(args.captions)
    else:
        feats = load_npy(args.text_features, "--text-features")
        labels = [f"text {i}" for i in range(len(feats))]
        if getattr(args, "text_mask", None):
            from xmodal.data.types import token_mask

            feats = (feats, token_mask(load_npy(args.text_mask, "--text-mask")))
    try:
        scores, indices = idx.search(feats, args.k)
    except (ValueError, TypeError) as exc:
        msg = str(exc)
        if msg.startswith("features:"):
            msg = ("--captions: " if args.captions else "--text-features: ") + msg[len("features:"):].strip()
        elif msg.startswith("text_mask:"):
            msg = ("--captions: " if args.captions else "--text-mask: ") + msg[len("text_mask:"):].strip()
        raise type(exc)(msg) from None
    if outputs is not None:
        from xmodal.runs import atomic_save_npy

        for path, array in zip(outputs, (indices, scores)):
            atomic_save_npy(path, array)
    if args.json:
        print(json.dumps({"normalizer": idx.meta.get("normalizer"), "k": args.k,
                          "indices": indices.tolist(), "scores": scores.tolist()}, indent=2))
        return 0
    from xmodal.commands import markdown_table

    rows = []
    for label, row_s, row_i in zip(labels, scores, indices):
        for rank, (s, j) in enumerate(zip(row_s, row_i), 1):
            name = idx.names[j] if idx.names is not None and j >= 0 else str(j)
            rows.append([label if rank == 1 else "", rank, name, f"{s:.4f}"])
    print(markdown_table(["query", "rank", "video", "score"], rows))
    print(f"({len(labels)} queries against {idx.index.num_items} videos; normaliser "
          f"{idx.meta.get('normalizer')} folded in)")
    return 0
