"""``xmodal eval``: exact retrieval metrics from embeddings or a similarity matrix."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

NAME = "eval"
HELP = "evaluate retrieval (R@K, MdR, MnR, mAP, nDCG) from embeddings or a similarity matrix"
DESCRIPTION = """Evaluate retrieval exactly (ties handled by --ties; no full sort; big
galleries are streamed block by block from the embeddings, never materialising the
score matrix). Inputs are .npy files:

  embeddings, one correct item per query (int [Q]) or several (bool [Q, G]):
    xmodal eval --queries q.npy --gallery g.npy --positives p.npy [--bias b.npy]
  text <-> video with several captions per video (int caption -> video map):
    xmodal eval --text t.npy --video v.npy --text-to-video t2v.npy [--v2t max-over-captions]
  a precomputed similarity matrix [Q, G]:
    xmodal eval --sim sim.npy --positives p.npy
    xmodal eval --sim sim.npy --text-to-video t2v.npy
    xmodal eval --sim sim.npy --relevancy rel.npy      (EPIC-KITCHENS-100 mAP / nDCG)

Scores are dot products (add --normalize for cosine similarity). Recall, mAP and nDCG
are percentages, ranks are 1-based. --json prints machine-readable results."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("embeddings")
    g.add_argument("--queries", metavar="NPY", help="query embeddings [Q, D]")
    g.add_argument("--gallery", metavar="NPY", help="gallery embeddings [G, D]")
    g.add_argument("--text", metavar="NPY", help="caption embeddings [T, D]")
    g.add_argument("--video", metavar="NPY", help="video/image embeddings [V, D]")
    g.add_argument("--normalize", action="store_true", help="L2-normalise embeddings first (cosine)")
    g.add_argument("--bias", metavar="NPY", help="per-gallery-item bias [G] added to every score "
                   "(with --queries/--gallery; e.g. NCL test-time biases)")
    s = parser.add_argument_group("similarity matrix")
    s.add_argument("--sim", metavar="NPY", help="similarity matrix [Q, G] (higher = more similar)")
    s.add_argument("--relevancy", metavar="NPY", help="graded relevancy [Q, G] -> mAP and nDCG "
                   "(EPIC-KITCHENS-100 definitions; both directions and their mean)")
    t = parser.add_argument_group("ground truth")
    t.add_argument("--positives", metavar="NPY", help="int [Q] correct gallery index per query, "
                   "or bool [Q, G] (any of several correct items)")
    t.add_argument("--text-to-video", metavar="NPY", help="int [T]: the video of each caption")
    o = parser.add_argument_group("options")
    o.add_argument("--ks", default="1,5,10,50", help="recall cut-offs, comma separated (default 1,5,10,50)")
    o.add_argument("--ties", default="pessimistic", choices=("pessimistic", "optimistic", "average"),
                   help="where items tied with the correct score rank (default pessimistic; "
                   "mAP/nDCG accept pessimistic/optimistic)")
    o.add_argument("--v2t", default="all-captions", choices=("all-captions", "max-over-captions"),
                   help="video->text protocol (default all-captions)")
    o.add_argument("--block-size", type=int, default=4096, help="query rows per block (default 4096)")
    o.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    o.add_argument("--json", action="store_true", help="print results as JSON")


def load_npy(path: str | None, flag: str) -> np.ndarray:
    if path is None:
        raise ValueError(f"{flag}: required")
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{flag}: no such file: {path}")
    try:
        arr = np.load(p, allow_pickle=False)
    except Exception as exc:  # numpy raises ValueError/OSError/EOFError for broken files
        why = "no valid .npy header" if "pickle" in str(exc) else str(exc)
        raise ValueError(f"{flag}: {path} is not a readable .npy array ({why})") from None
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"{flag}: {path} holds several arrays (.npz); give a single .npy")
    return arr


def _l2(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


def _parse_ks(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(k) for k in text.replace(" ", "").split(",") if k)
    except ValueError:
        raise ValueError(f"--ks: expected comma-separated integers, got {text!r}") from None


def _mode(args: argparse.Namespace) -> str:
    given = {name for name in ("queries", "gallery", "text", "video", "sim")
             if getattr(args, name) is not None}
    modes = {"embeddings": {"queries", "gallery"}, "text-video": {"text", "video"}, "sim": {"sim"}}
    for mode, need in modes.items():
        if given == need:
            return mode
    raise ValueError("give exactly one input: --queries and --gallery, --text and --video, "
                     "or --sim (see 'xmodal eval --help')")


def evaluate(args: argparse.Namespace) -> tuple[dict, str]:
    """Run the evaluation the flags describe; returns (results, kind)."""
    from xmodal import metrics

    ks = _parse_ks(args.ks)
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    mode = _mode(args)
    if mode == "embeddings":
        q, g = load_npy(args.queries, "--queries"), load_npy(args.gallery, "--gallery")
        if args.normalize:
            q, g = _l2(q), _l2(g)
        bias = load_npy(args.bias, "--bias") if args.bias else None
        pos = load_npy(args.positives, "--positives")
        return {"queries": metrics.streaming_retrieval(
            q, g, pos, ks=ks, ties=args.ties, bias=bias, block_size=args.block_size,
            progress=progress)}, "retrieval"
    if args.bias:
        raise ValueError("--bias: only with --queries/--gallery")
    if mode == "text-video":
        t, v = load_npy(args.text, "--text"), load_npy(args.video, "--video")
        if args.normalize:
            t, v = _l2(t), _l2(v)
        t2v = load_npy(args.text_to_video, "--text-to-video")
        return metrics.streaming_text_video(t, v, t2v, ks=ks, ties=args.ties, v2t=args.v2t,
                                            block_size=args.block_size, progress=progress), "retrieval"
    sim = load_npy(args.sim, "--sim")
    if args.normalize:
        raise ValueError("--normalize: applies to embeddings, not to --sim")
    given = [f for f in ("positives", "text_to_video", "relevancy") if getattr(args, f)]
    if len(given) != 1:
        raise ValueError("--sim: give exactly one of --positives, --text-to-video, --relevancy")
    if args.relevancy:
        if args.ties == "average":
            raise ValueError("--ties: mAP/nDCG support pessimistic or optimistic")
        rel = load_npy(args.relevancy, "--relevancy")
        return metrics.mir(sim, rel, ties=args.ties, directions="both"), "mir"
    if args.text_to_video:
        t2v = load_npy(args.text_to_video, "--text-to-video")
        return metrics.text_video(sim, t2v, ks=ks, ties=args.ties, v2t=args.v2t,
                                  block_size=args.block_size), "retrieval"
    pos = load_npy(args.positives, "--positives")
    return {"queries": metrics.retrieval(sim, pos, ks=ks, ties=args.ties,
                                         block_size=args.block_size)}, "retrieval"


def format_table(results: dict, kind: str) -> str:
    if kind == "mir":
        rows = [("rows as queries", results["mAP_rows"], results["nDCG_rows"]),
                ("columns as queries", results["mAP_cols"], results["nDCG_cols"]),
                ("mean (EPIC-100)", results["mAP"], results["nDCG"])]
        lines = [f"{'direction':<20}{'mAP':>9}{'nDCG':>9}"]
        lines += [f"{name:<20}{m:>9.2f}{n:>9.2f}" for name, m, n in rows]
        return "\n".join(lines)
    names = list(next(iter(results.values())))
    lines = [f"{'direction':<10}" + "".join(f"{n:>9}" for n in names)]
    for direction, vals in results.items():
        lines.append(f"{direction:<10}" + "".join(f"{vals[n]:>9.2f}" for n in names))
    return "\n".join(lines)


_FLAGS = {"sim": "--sim", "sim_tv": "--sim", "positives": "--positives", "queries": "--queries",
          "gallery": "--gallery", "text": "--text", "video": "--video", "bias": "--bias",
          "text_to_video": "--text-to-video", "relevancy": "--relevancy", "ks": "--ks",
          "block_size": "--block-size"}


def run(args: argparse.Namespace) -> int:
    import xmodal.metrics  # noqa: F401  (import time is not evaluation time)

    start = time.perf_counter()
    try:
        results, kind = evaluate(args)
    except (ValueError, TypeError) as exc:
        # library messages name the argument; say which flag that is
        msg = str(exc)
        name, sep, rest = msg.partition(":")
        if sep and name in _FLAGS:
            raise type(exc)(f"{_FLAGS[name]}:{rest}") from None
        raise
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps({**results, "ties": args.ties, "seconds": round(seconds, 3)}, indent=2))
    else:
        print(format_table(results, kind))
        print(f"(ties: {args.ties}; {seconds:.2f} s)")
    return 0
