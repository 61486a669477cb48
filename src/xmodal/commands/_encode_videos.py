"""``xmodal encode videos``: one ``FEATS/<stem>.npy`` per video, atomic, resumable, bad files skipped."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np


def _write_atomic(path: Path, array: np.ndarray) -> None:
    """Write through a temporary file removed on any failure (a full disk: one line naming ``path``)."""
    from xmodal.commands.encode import _save_npy
    from xmodal.runs import atomic_write

    atomic_write(path, lambda tmp: _save_npy(tmp, array))


def _remove_stale(out: Path, stems: list[str]) -> None:
    """Remove the temporaries a killed encode left for these videos (``.STEM.npy.tmp*``)."""
    for stem in stems:
        for stale in out.glob(f".{stem}.npy.*tmp*"):
            if stale.is_file() and not stale.is_symlink():
                stale.unlink(missing_ok=True)


def _check_flags(args: argparse.Namespace) -> None:
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


def run_videos(args: argparse.Namespace, progress: bool) -> int:
    from xmodal import encoders

    _check_flags(args)
    start = time.perf_counter()
    paths = encoders.list_videos(args.source)
    if not paths:
        raise ValueError(f"{args.source}: no video files ({', '.join(_exts())})")
    by_stem: dict[str, Path] = {}
    for p in paths:
        if p.stem in by_stem:
            raise ValueError(f"{p.name} and {by_stem[p.stem].name}: same file stem, both would write "
                             f"{p.stem}.npy; rename one")
        by_stem[p.stem] = p
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} is a file; 'xmodal encode videos' writes a folder")
    out.mkdir(parents=True, exist_ok=True)
    todo = [p for p in paths if not (out / f"{p.stem}.npy").is_file()]
    _remove_stale(out, [p.stem for p in todo])
    skipped = len(paths) - len(todo)
    model = args.model or "efficientnet-lite0"
    batch = 32 if args.batch_size is None else args.batch_size
    failed, written, n_frames, dim = 0, 0, 0, None
    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), disable=not progress, desc="videos", unit="video", file=sys.stderr)
    try:
        results = encoders.iter_encode_videos(todo, frames=args.frames, fps=args.fps, model=model,
                                              batch_size=batch)
        for i, result in results:
            bar.update(1)
            if isinstance(result, Exception):
                failed += 1
                bar.write(f"xmodal encode: error: {result}", file=sys.stderr)
                continue
            _write_atomic(out / f"{todo[i].stem}.npy", result)
            written += 1
            n_frames += result.shape[0]
            dim = result.shape[1]
    except ModuleNotFoundError as exc:  # a missing optional extra is a user error, not a bug
        raise ValueError(str(exc)) from None
    finally:
        bar.close()
    size = f", {dim}-d" if dim else ""
    print(f"encoded {written} video(s) ({n_frames} frames{size}) into {out}; {skipped} already there; "
          f"{failed} failed ({time.perf_counter() - start:.1f} s)")
    return 1 if failed else 0


def _exts() -> tuple[str, ...]:
    from xmodal.video import VIDEO_EXTENSIONS

    return VIDEO_EXTENSIONS
