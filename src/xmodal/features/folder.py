"""A folder (or list) of video files to one ``OUT/<video id>.npy`` of frame features each: atomic,
resumable, one bad file never stops the others (``xmodal encode videos`` is this plus its flags).

A folder is scanned by :func:`scan_videos`: every entry is looked at and either becomes a video or is
skipped for a stated reason, so the summary accounts for every file:

- a name with a video extension (:data:`xmodal.features.video.VIDEO_EXTENSIONS`) is a video (if it
  cannot be decoded, it fails with one line naming it); an image extension is skipped; any other file
  is *probed*: FFmpeg opens it, and it is a video when it holds a video stream (a camcorder's ``.MTS``,
  a file without extension ...), else skipped as "not a video";
- hidden entries (``.name``) and macOS AppleDouble files (``._name``) are skipped; so are FIFOs,
  sockets and devices (never opened), links to folders, and subfolders unless ``recursive``;
- a symbolic link to a video is followed; a broken or looping one with a video extension fails.

The video id (the ``.npy`` name, the ``video_id`` of ``data import``) is the file's path relative to the
folder without its extension: the file stem for files in the folder itself, ``sub/clip`` for
``sub/clip.mp4`` with ``recursive``.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from xmodal.runs import atomic_save_npy

__all__ = ["scan_videos", "encode_video_folder", "feature_file_ok", "remove_stale", "VideoScan"]

#: Reasons a folder entry is not encoded, as the summary names them.
HIDDEN, APPLEDOUBLE, SUBFOLDER, LINKED_FOLDER = ("hidden", "macOS AppleDouble (._*)",
                                                 "subfolder (--recursive reads it)", "link to a folder (not followed)")
SPECIAL, BROKEN, IMAGE, NOT_VIDEO, EMPTY = ("not a regular file (FIFO, socket or device)", "broken or looping link",
                                            "image", "not a video", "empty file")
#: Skips named one per line on stderr (what a user most likely did not mean); the others are counted.
NAMED = (SPECIAL, BROKEN, LINKED_FOLDER)
#: Most decoding processes of ``--workers`` (each holds a decoder and its queued frames; one encoder
#: takes what they decode, so more processes than cores only add memory).
MAX_WORKERS = 64


@dataclass
class VideoScan:
    """What :func:`scan_videos` found: ``videos`` as ``(video id, path)`` in name order, and the
    entries it skipped, ``{reason: [relative names]}``."""

    videos: list[tuple[str, Path]] = field(default_factory=list)
    skipped: dict[str, list[str]] = field(default_factory=dict)

    @property
    def looked_at(self) -> int:
        return len(self.videos) + sum(len(v) for v in self.skipped.values())

    def skip(self, reason: str, rel: str) -> None:
        self.skipped.setdefault(reason, []).append(rel)


def _kind(entry: os.DirEntry) -> tuple[str, os.stat_result | None]:
    """``("dir" | "file" | "special" | "broken", stat)`` following symlinks, without opening anything."""
    try:
        st = entry.stat(follow_symlinks=True)
    except OSError:  # dangling link, link loop, a permission problem
        return "broken", None
    if stat.S_ISDIR(st.st_mode):
        return "dir", st
    if stat.S_ISREG(st.st_mode):
        return "file", st
    return "special", st


def scan_videos(source: str | os.PathLike, *, recursive: bool = False,
                exclude: str | os.PathLike | None = None) -> VideoScan:
    """Every entry of the folder ``source`` (and its subfolders when ``recursive``), each a video or a
    skip with its reason (module doc); a list file gives its lines as videos (id = file stem).

    Args:
        source: a folder, or a text file with one video path per line (relative to the list's folder).
        recursive: descend into subfolders (hidden ones and links to folders excepted).
        exclude: a folder not to descend into (the output folder, when it lies inside ``source``).

    >>> scan_videos("no_such_folder")
    Traceback (most recent call last):
    ...
    ValueError: no_such_folder: no such directory or list file
    """
    from xmodal.features.encoders import IMAGE_EXTENSIONS, list_videos
    from xmodal.features.video import VIDEO_EXTENSIONS, is_video

    if isinstance(source, (bool, np.bool_)) or not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"source: expected a folder or list file, got {type(source).__name__}")
    root = Path(source)
    scan = VideoScan()
    if not root.is_dir():
        scan.videos = [(p.stem, p) for p in list_videos(root)]
        return scan
    skip_dir = Path(exclude).resolve() if exclude is not None else None
    folders = [(root, "")]
    while folders:
        folder, prefix = folders.pop(0)
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            scan.skip(BROKEN, f"{prefix or '.'} ({exc.strerror or exc})")
            continue
        for entry in entries:
            rel = prefix + entry.name
            if entry.name.startswith("._"):
                scan.skip(APPLEDOUBLE, rel)
                continue
            if entry.name.startswith("."):
                scan.skip(HIDDEN, rel)
                continue
            kind, st = _kind(entry)
            suffix = Path(entry.name).suffix.lower()
            if kind == "dir":
                if entry.is_symlink():
                    scan.skip(LINKED_FOLDER, rel)
                elif not recursive:
                    scan.skip(SUBFOLDER, rel)
                elif skip_dir is None or Path(entry.path).resolve() != skip_dir:
                    folders.append((Path(entry.path), rel + "/"))
            elif kind == "special":
                scan.skip(SPECIAL, rel)
            elif suffix in VIDEO_EXTENSIONS:
                scan.videos.append((rel[: len(rel) - len(suffix)], Path(entry.path)))
            elif kind == "broken":
                scan.skip(BROKEN, rel)
            elif suffix in IMAGE_EXTENSIONS:
                scan.skip(IMAGE, rel)
            elif st is not None and st.st_size == 0:
                scan.skip(EMPTY, rel)
            elif is_video(entry.path):
                scan.videos.append((rel[: len(rel) - len(suffix)] if suffix else rel, Path(entry.path)))
            else:
                scan.skip(NOT_VIDEO, rel)
    scan.videos.sort(key=lambda v: v[0])
    return scan


def feature_file_ok(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a finished features file: a ``.npy`` whose header declares a float ``[F, D]``
    array (or a frame store's uint8 frames, ``encode frames``) with ``F, D >= 1`` and whose size matches it
    (a 0-byte or cut-off file is not, and is redone)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            if version not in read:
                return False
            shape, _, dtype = read[version](f)  # the header only, no data
            offset = f.tell()
        size = path.stat().st_size
    except (OSError, ValueError, SyntaxError, TypeError):
        return False
    return (len(shape) == 2 and min(shape) >= 1 and (dtype.kind == "f" or dtype == np.uint8) and not dtype.hasobject
            and size == offset + int(np.prod(shape)) * dtype.itemsize)


def remove_stale(out: Path, stems: list[str]) -> None:
    """Remove the temporaries a killed encode left for these videos (``.STEM.npy.tmp*``)."""
    for stem in stems:
        target = out / f"{stem}.npy"
        for stale in target.parent.glob(f".{target.name}.*tmp*"):
            if stale.is_file() and not stale.is_symlink():
                stale.unlink(missing_ok=True)


def encode_video_folder(source: str | os.PathLike, out: str | os.PathLike, *, frames: int | None = None,
                        fps: float | None = None, model: str = "efficientnet-lite0", batch_size: int = 32,
                        progress: bool | None = False, on_error: Callable[[str], None] | None = None,
                        recursive: bool = False, truncated: str = "keep", max_pixels: int | None = None,
                        on_plan: Callable[[str], None] | None = None, workers: int = 1,
                        shard: tuple[int, int] | None = None, device: str | None = None,
                        precision: str | None = None, on_video: Callable[[str], None] | None = None) -> dict:
    """Encode every video of ``source`` (of its share ``shard``) that ``out`` does not hold yet.

    Args:
        source: a folder of video files (:func:`scan_videos`) or a list file.
        out: the folder of ``<video id>.npy`` float32 ``[F, D]`` files (created).
        frames, fps, model, batch_size, truncated, max_pixels: as
            :func:`xmodal.features.encoders.iter_encode_videos` (neither frames nor fps: every frame).
        device, precision: where and in which dtype an hf: / open_clip: model runs
            (:func:`xmodal.features.encoders.get_encoder`).
        progress: None: a bar on a terminal, else a line every 30 s; True: a bar; False: nothing
            (:func:`xmodal.progress.progress`).
        on_error: called with one line per file that failed, was truncated or was skipped for a
            reason worth naming (default: printed to stderr).
        recursive: read subfolders too.
        on_plan: called once, before encoding, with a line estimating the frames to encode.
        workers: processes decoding the videos for the one encoder in this process (1: decoding here too;
            :mod:`xmodal.features.decoders`); the features are the same either way.
        shard: ``(K, N)``: encode only the videos of shard K of N and write what was done to
            ``out/.encode-shards/shard-K-of-N.json`` (:mod:`xmodal.features.shards`).
        on_video: called with each video's id once it is written, failed or refused (``--cluster``'s
            progress, :mod:`xmodal.execute.videos`).

    Returns:
        ``{"looked_at", "videos", "written", "skipped", "failed", "truncated", "refused", "redone", "ignored",
        "frames", "estimate", "dim", "out"}``: ``videos`` counts the videos of the collection (of the shard:
        ``"shard"``, ``"shard_file"`` and ``"collection"`` then say which, where and of how many),
        ``skipped`` the finished ones already in ``out``, ``changed`` the stored ones decoded again because
        their source video changed or has no recorded hash (a frame store, :mod:`xmodal.features.sources`),
        ``ignored`` is ``{reason: [names]}`` of the
        entries that are not videos (:func:`scan_videos`).
    """
    import time

    from xmodal.features import shards as shards_module

    from xmodal._validate import whole_number

    started = time.perf_counter()
    workers = whole_number(workers, "workers", minimum=1)
    if workers > MAX_WORKERS:
        raise ValueError(f"--workers: at most {MAX_WORKERS} decoding processes, got {workers:,}")
    if shard is not None:
        shard = shards_module._check(shard)
    from xmodal.features import encoders
    from xmodal.features.video import estimate_frames, probe
    from xmodal.progress import progress as progress_bar

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} is a file; 'xmodal encode videos' writes a folder")
    scan = scan_videos(source, recursive=recursive, exclude=out)
    if not scan.videos:
        found = "; ".join(f"{len(v)} {r}" for r, v in scan.skipped.items())
        raise ValueError(f"{source}: no video files" + (f" (looked at {scan.looked_at}: {found})" if found else ""))
    shards_module.check_shard_count(shard, len(scan.videos))  # before any work
    by_id: dict[str, Path] = {}
    for vid, p in scan.videos:
        if vid in by_id:
            raise ValueError(f"{by_id[vid].name} and {p.name}: same file stem ({vid!r}, the video id), both "
                             f"would write {vid}.npy; rename one")
        by_id[vid] = p
    out.mkdir(parents=True, exist_ok=True)
    encoders.reset_runtime(model, "video", device=device, precision=precision)  # this run's first batch
    record = _folder_identity(out, model, frames, fps, on_error, device, precision)
    mine = scan.videos if shard is None else [(vid, p) for vid, p in scan.videos if shards_module.in_shard(vid, shard)]
    redone = [vid for vid, _ in mine if (out / f"{vid}.npy").exists() and not feature_file_ok(out / f"{vid}.npy")]
    report = on_error or (lambda line: print(line, file=sys.stderr, flush=True))
    hashed = str(model).startswith("frames:")  # a frame store records and checks its source videos (.sources)
    changed: list[str] = []
    if hashed:
        from xmodal.features.sources import stale_sources

        lines, changed = stale_sources(out, [(vid, p) for vid, p in mine if feature_file_ok(out / f"{vid}.npy")])
        for line in lines:
            report(line)
    again = set(changed)
    todo = [(vid, p) for vid, p in mine if vid in again or not feature_file_ok(out / f"{vid}.npy")]
    remove_stale(out, [vid for vid, _ in todo])
    for reason in NAMED:
        for rel in scan.skipped.get(reason, []):
            report(f"xmodal encode: note: skipped {rel}: {reason}")
    estimate, unknown = 0, 0
    if on_plan is not None and todo:
        for _, p in todo:
            try:
                n = estimate_frames(probe(p, max_pixels=2**62), frames=frames, fps=fps)
            except (ValueError, TypeError, ModuleNotFoundError):
                n = None
            estimate += n or 0
            unknown += n is None
        on_plan(f"{estimate:,} frame{'' if estimate == 1 else 's'}"
                + (f" (+ {unknown} video(s) that declare no length)" if unknown else ""))
    summary = {"looked_at": scan.looked_at, "videos": len(mine), "written": 0, "skipped": len(mine) - len(todo),
               "failed": 0,
               "truncated": 0, "refused": 0, "redone": redone, "changed": changed, "ignored": scan.skipped, "frames": 0,
               "estimate": estimate if on_plan is not None else None, "dim": None, "out": out}
    # progress counts frames (a single long video says where it is too), against the estimate when it is whole
    bar = progress_bar(total=estimate if on_plan is not None and not unknown else None, desc="encode videos",
                       unit="frame", show=progress)

    def kept(line: str) -> None:
        summary["truncated"] += 1
        report(f"xmodal encode: warning: {line}")

    done, failed = 0, []
    with bar:
        for i, result in encoders.iter_encode_videos([p for _, p in todo], frames=frames, fps=fps, model=model,
                                                     batch_size=batch_size, truncated=truncated,
                                                     max_pixels=max_pixels, on_note=kept, on_frames=bar.update,
                                                     workers=workers, device=device, precision=precision):
            done += 1
            bar.set_postfix_str(f"{done}/{len(todo)} videos")
            if isinstance(result, Exception):
                from xmodal.features.video import TruncatedVideo

                refused = isinstance(result, TruncatedVideo)
                summary["refused" if refused else "failed"] += 1
                if not refused:
                    failed.append(todo[i][0])
                report(f"xmodal encode: {'warning' if refused else 'error'}: {result}")
                if on_video is not None:
                    on_video(todo[i][0])
                continue
            target = out / f"{todo[i][0]}.npy"
            if hashed:
                digest = _source_hash(todo[i][1])
                if digest is None:  # the file went away after it was decoded: nothing to vouch for its frames
                    summary["failed"] += 1
                    failed.append(todo[i][0])
                    report(f"xmodal encode: error: {todo[i][1].name}: cannot be read again to hash it")
                    if on_video is not None:
                        on_video(todo[i][0])
                    continue
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_save_npy(target, result)
            if hashed:  # after the frames: a stop between them leaves the video unrecorded, so decoded again
                from xmodal.features.sources import write_source

                write_source(out, todo[i][0], digest, _source_name(source, todo[i][1]))
            summary["written"] += 1
            summary["frames"] += result.shape[0]
            summary["dim"] = result.shape[1]
            if on_video is not None:
                on_video(todo[i][0])
    after = encoders.identity_of(model, "video", device=device, precision=precision).get("runtime")
    summary["runtime"] = after
    if shard is not None and shard[0] != 1 and record.get("runtime"):
        after = record["runtime"]  # the collection's first batch is shard 1's: its measurement is the one stated
    if (record.get("dim") is None and summary["dim"]) or after != record.get("runtime"):
        # a registered encoder's size, and a reduced precision's difference to float32, are known once it ran
        from xmodal.features.identity import write_sidecar

        record = {**record, "dim": record.get("dim") or (int(summary["dim"]) if summary["dim"] else None)}
        if after is not None:
            record["runtime"] = after
        write_sidecar(out, record)
    if shard is not None:
        summary.update(shard=shard, collection=len(scan.videos), shard_file=shards_module.write_summary(
            out, shard, summary, collection=[vid for vid, _ in scan.videos], seconds=time.perf_counter() - started,
            failed_names=failed))
    return summary


def _source_hash(path: Path) -> str | None:
    """A video file's SHA-256 (:func:`xmodal.features.hashing.file_sha256`), None when it cannot be read."""
    from xmodal.features.hashing import file_sha256

    try:
        return file_sha256(path)
    except OSError:
        return None


def _source_name(source: str | os.PathLike, path: Path) -> str:
    """The video's path relative to the folder encoded (a list file's folder), as ``sha256sum`` names it there."""
    root = Path(source)
    return Path(os.path.relpath(path, root if root.is_dir() else root.parent)).as_posix()


def _folder_identity(out: Path, model: str, frames: int | None, fps: float | None,
                     on_error: Callable[[str], None] | None, device: str | None = None,
                     precision: str | None = None) -> dict:
    """Write ``out/encoder.json`` (the encoder and sampling of the folder's features) before encoding;
    a folder whose features came from another encoder or sampling is refused (its videos would mix)."""
    from xmodal.features import encoders
    from xmodal.features.identity import mismatch, read_sidecar, write_sidecar

    record = encoders.identity_of(model, "video", device=device, precision=precision)
    record["level"] = "clip" if record["kind"] == "video" else "frame"
    record["sampling"] = {"frames": frames, "fps": fps}
    old = read_sidecar(out, "--out")
    if old is not None:
        why = mismatch(old, record)
        if why is None and old.get("sampling") not in (None, record["sampling"]):
            why = f"its features were sampled with {old['sampling']}, not {record['sampling']}"
        if why is not None:
            raise ValueError(f"--out: {out} holds features of another encoder: {why}; encode into a new folder")
        if record.get("dim") is None:
            record["dim"] = old.get("dim")
        if old == {k: v for k, v in record.items() if v is not None or k in old}:
            return record  # the same encoder and sampling: the file stays as it is
    elif any(p.suffix == ".npy" for p in out.iterdir()):
        line = (f"xmodal encode: note: {out} holds feature files but no {out / 'encoder.json'} (written before xmodal "
                f"recorded encoders): they are taken to come from {record['spec']} with this sampling")
        (on_error or (lambda text: print(text, file=sys.stderr, flush=True)))(line)
    write_sidecar(out, record)
    return record
