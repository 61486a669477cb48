"""``xmodal encode videos DIR --out FEATS --cluster local:N|ADDRESS [--cluster-shards N]`` (the command side of
:mod:`xmodal.execute.videos`; ``encode`` checks the other flags and prints the shards' sum)."""

from __future__ import annotations

import argparse
import time


def check_cluster_flags(args: argparse.Namespace) -> None:
    """The flags ``--cluster`` changes or refuses, one line each, before anything is read."""
    if args.cluster is None:
        raise ValueError("--cluster-shards: only with --cluster")
    if args.shard is not None:
        raise ValueError("--shard: --cluster runs every shard itself (--cluster-shards N sets their number)")
    if args.workers != 1:
        raise ValueError("--workers: with --cluster each worker process decodes its own videos; add workers "
                         "to the cluster instead")
    if args.cluster_shards is not None and not 1 <= args.cluster_shards <= 1_000_000:
        raise ValueError(f"--cluster-shards: expected 1..1000000, got {args.cluster_shards}")
    from xmodal.execute.cluster import parse_cluster

    parse_cluster(args.cluster)  # a typo is one line before the folder is scanned


def run_cluster(args: argparse.Namespace, *, frames: int | None, fps: float | None,
                progress: bool | None) -> tuple[str, int, int]:
    """Run the shards on the cluster; ``(summary line, number of shards, failed videos)``."""
    from xmodal.execute.videos import encode_videos_on_cluster

    start = time.perf_counter()
    try:
        s = encode_videos_on_cluster(args.source, args.out, cluster=args.cluster, shards=args.cluster_shards,
                                     frames=frames, fps=fps, model=args.model or "efficientnet-lite0",
                                     batch_size=32 if args.batch_size is None else args.batch_size,
                                     recursive=args.recursive, truncated=args.truncated, max_pixels=args.max_pixels,
                                     threads=getattr(args, "threads", None), progress=progress,
                                     device=getattr(args, "device", None), precision=getattr(args, "precision", None))
    except ModuleNotFoundError as exc:  # the [cluster] extra or an encoder's extra is missing
        raise ValueError(str(exc)) from None
    size = f", {s['dim']}-d" if s["dim"] else ""
    line = (f"looked at {s['looked_at']} file(s): {s['shards']} shards on {args.cluster}: encoded {s['written']} "
            f"video(s) ({s['frames']} frames{size}) into {s['out']}; {s['skipped']} already there; {s['failed']} failed"
            + (f"; {s['truncated']} truncated (kept)" if s["truncated"] else "")
            + (f"; {s['refused']} truncated (skipped)" if s["refused"] else "")
            + f" ({time.perf_counter() - start:.1f} s)")
    return line, s["shards"], s["failed"]
