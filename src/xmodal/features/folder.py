"""A folder (or list) of video files to one ``OUT/<stem>.npy`` of frame features each: atomic, resumable,
one bad file never stops the others (``xmodal encode videos`` is this plus its flags)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from xmodal.runs import atomic_save_npy


def remove_stale(out: Path, stems: list[str]) -> None:
    """Remove the temporaries a killed encode left for these videos (``.STEM.npy.tmp*``)."""
    for stem in stems:
        for stale in out.glob(f".{stem}.npy.*tmp*"):
            if stale.is_file() and not stale.is_symlink():
                stale.unlink(missing_ok=True)


def encode_video_folder(source: str | os.PathLike, out: str | os.PathLike, *, frames: int | None = None,
                        fps: float | None = None, model: str = "efficientnet-lite0", batch_size: int = 32,
                        progress: bool = False, on_error: Callable[[str], None] | None = None) -> dict:
    """Encode every video of ``source`` that ``out`` does not hold yet.

    Args:
        source: a folder of video files or a list file (:func:`xmodal.features.encoders.list_videos`).
        out: the folder of ``<stem>.npy`` float32 ``[F, D]`` files (created).
        frames, fps, model, batch_size: as :func:`xmodal.features.encoders.iter_encode_videos`.
        progress: a progress bar on stderr.
        on_error: called with one line per file that failed (default: printed to stderr).

    Returns:
        ``{"written", "skipped", "failed", "frames", "dim", "out"}``.
    """
    from tqdm.auto import tqdm

    from xmodal.features import encoders
    from xmodal.features.video import VIDEO_EXTENSIONS

    paths = encoders.list_videos(source)
    if not paths:
        raise ValueError(f"{source}: no video files ({', '.join(VIDEO_EXTENSIONS)})")
    by_stem: dict[str, Path] = {}
    for p in paths:
        if p.stem in by_stem:
            raise ValueError(f"{p.name} and {by_stem[p.stem].name}: same file stem, both would write "
                             f"{p.stem}.npy; rename one")
        by_stem[p.stem] = p
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} is a file; 'xmodal encode videos' writes a folder")
    out.mkdir(parents=True, exist_ok=True)
    todo = [p for p in paths if not (out / f"{p.stem}.npy").is_file()]
    remove_stale(out, [p.stem for p in todo])
    report = on_error or (lambda line: tqdm.write(line, file=sys.stderr))
    summary = {"written": 0, "skipped": len(paths) - len(todo), "failed": 0, "frames": 0, "dim": None,
               "out": out}
    bar = tqdm(total=len(todo), disable=not progress, desc="videos", unit="video", file=sys.stderr)
    try:
        for i, result in encoders.iter_encode_videos(todo, frames=frames, fps=fps, model=model,
                                                     batch_size=batch_size):
            bar.update(1)
            if isinstance(result, Exception):
                summary["failed"] += 1
                report(f"xmodal encode: error: {result}")
                continue
            atomic_save_npy(out / f"{todo[i].stem}.npy", result)
            summary["written"] += 1
            summary["frames"] += result.shape[0]
            summary["dim"] = result.shape[1]
    finally:
        bar.close()
    return summary
