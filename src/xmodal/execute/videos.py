"""``xmodal encode videos DIR --out FEATS --cluster local:N|ADDRESS``: the shards of ``--shard K/N`` as tasks
on a Dask cluster (:mod:`xmodal.execute.cluster`), retried when they fail or their worker dies.

Shard ``K`` of ``N`` is the task :func:`encode_shard`: it calls :func:`xmodal.features.folder.encode_video_folder`
with ``shard=(K, N)``, exactly as ``xmodal encode videos --shard K/N`` does in one process, so every
``FEATS/<video id>.npy`` and ``FEATS/encoder.json`` is the file one process writes, and
``FEATS/.encode-shards/`` holds the N shards' summaries that ``--summary`` adds up. The folder's identity
(``encoder.json``) is written here before any task starts, so shards never race to create it. The lines a
shard reports (a failed file, a truncated one) travel back with its result and are printed once, from the
attempt that finished (a killed attempt's lines are dropped with it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from xmodal.execute.cluster import KILL_ONCE_ENV, kill_once

__all__ = ["encode_videos_on_cluster", "encode_shard", "KILL_ONCE_ENV"]


def encode_shard(*, shard: tuple[int, int], topic: str | None, source: str, out: str, threads: int | None,
                 **kwargs) -> dict:
    """One shard's task (runs on a worker): :func:`~xmodal.features.folder.encode_video_folder` of shard
    ``shard`` with its report lines collected; returns its summary (paths as strings) and ``"lines"``."""
    from xmodal.execute.cluster import report_item
    from xmodal.features.folder import encode_video_folder

    from xmodal._validate import positive_int, short_repr

    if (not isinstance(shard, tuple) or len(shard) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                                                  for v in shard) or not 1 <= shard[0] <= shard[1]):
        raise TypeError(f"shard: expected (K, N) with 1 <= K <= N, got {short_repr(shard)}")
    if topic is not None and not isinstance(topic, str):
        raise TypeError(f"topic: expected a Dask topic name or None, got {short_repr(topic)}")
    if not isinstance(source, (str, os.PathLike)) or not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"source, out: expected folder paths, got {short_repr(source)}, {short_repr(out)}")
    if threads is not None:
        import torch

        torch.set_num_threads(positive_int(threads, "threads"))
    lines: list[str] = []

    def on_video(video_id: str) -> None:
        report_item(topic, items=1)
        kill_once()

    summary = encode_video_folder(source, out, progress=False, on_error=lines.append, shard=shard,
                                  on_video=on_video, **kwargs)
    summary = {k: (str(v) if isinstance(v, Path) else v) for k, v in summary.items()}
    return {**summary, "lines": lines}


def encode_videos_on_cluster(source: str | os.PathLike, out: str | os.PathLike, *, cluster: str, shards: int | None,
                             frames: int | None, fps: float | None, model: str, batch_size: int = 32,
                             recursive: bool = False, truncated: str = "keep", max_pixels: int | None = None,
                             threads: int | None = 1, progress: bool | None = None, retries: int | None = None,
                             on_error: Callable[[str], None] | None = None, device: str | None = None,
                             precision: str | None = None) -> dict:
    """Encode ``source`` into ``out`` as ``shards`` tasks on ``cluster`` (:func:`xmodal.execute.cluster.parse_cluster`).

    Args:
        shards: N, the number of shards (None: 4 per worker of the cluster, at least 1).
        threads: torch threads of each task.
        progress: the one progress line across workers (:func:`xmodal.progress.progress`'s ``show``).
        retries: attempts after the first per shard (None: :data:`xmodal.execute.cluster.DEFAULT_RETRIES`).
        on_error: receives each shard's report lines, each distinct line once (default: stderr).
        frames, fps, model, batch_size, recursive, truncated, max_pixels, device, precision: as
            :func:`xmodal.features.folder.encode_video_folder`, on each worker (``device`` ``auto``: each
            worker's own CUDA when it has one, else its CPU).

    Returns:
        ``{"shards": N, "results": {K: shard summary}, "videos", "written", "skipped", "failed", "truncated",
        "refused", "frames", "dim", "looked_at", "ignored"}`` (totals over the shards).
    """
    import sys

    from xmodal.execute import cluster as engine
    from xmodal._validate import whole_number
    from xmodal.features.folder import _folder_identity, feature_file_ok, scan_videos
    from xmodal.progress import progress as progress_bar

    spec = engine.parse_cluster(cluster)
    retries = engine.DEFAULT_RETRIES if retries is None else whole_number(retries, "retries", minimum=0)
    if shards is not None:
        shards = whole_number(shards, "--cluster-shards", minimum=1)
    report = on_error or (lambda line: print(line, file=sys.stderr, flush=True))
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} is a file; 'xmodal encode videos' writes a folder")
    scan = scan_videos(source, recursive=recursive, exclude=out)
    if not scan.videos:
        raise ValueError(f"{source}: no video files")
    out.mkdir(parents=True, exist_ok=True)
    _folder_identity(out, model, frames, fps, report, device, precision)  # once, before the shards (they keep it)
    todo = sum(not feature_file_ok(out / f"{vid}.npy") for vid, _ in scan.videos)
    kwargs = dict(source=str(Path(source).resolve()), out=str(out.resolve()), threads=threads, frames=frames, fps=fps,
                  model=model, batch_size=batch_size, recursive=recursive, truncated=truncated,
                  max_pixels=max_pixels, device=device, precision=precision)
    seen: set[str] = set()

    def on_result(k: int, result: dict) -> None:
        for line in result.get("lines", []):
            if line not in seen:  # a skipped entry every shard saw is named once
                seen.add(line)
                report(line)

    with engine.connect(spec, retries=retries) as client:
        n = shards if shards is not None else max(1, 4 * len(client.scheduler_info().get("workers", {})))
        with progress_bar(total=todo, desc=f"encode videos ({n} shards)", unit="video", show=progress) as bar:
            results = engine.run_shards(client, encode_shard, n, kwargs=kwargs, retries=retries, bar=bar,
                                        on_result=on_result)
    first = results[1].get("runtime")
    if first and "max_abs_diff_vs_float32" in first:  # stated as one process states it: the first batch's
        from xmodal.features.identity import read_sidecar, write_sidecar

        record = read_sidecar(out, "--out")
        if record is not None and record.get("runtime") != first:
            write_sidecar(out, {**record, "runtime": first})
    keys = ("videos", "written", "skipped", "failed", "truncated", "refused", "frames")
    total = {key: sum(r[key] for r in results.values()) for key in keys}
    dims = {r["dim"] for r in results.values() if r["dim"]}
    return {"shards": n, "results": results, **total, "dim": dims.pop() if dims else None,
            "looked_at": scan.looked_at, "ignored": scan.skipped, "out": out}
