"""``xmodal index --train-only`` / ``--shard K/N`` / ``--merge [SHARD ...]`` / ``--cluster``: an index built in
shards and merged on disk (:mod:`xmodal.retrieval.build_shards`; the command side)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def wanted(args: argparse.Namespace) -> bool:
    """Whether the flags ask for the sharded build."""
    return bool(getattr(args, "train_only", False) or getattr(args, "shard", None) is not None
                or getattr(args, "merge", None) is not None or getattr(args, "cluster", None) is not None
                or getattr(args, "cluster_shards", None) is not None)


def run_ondisk(args: argparse.Namespace, build_trained, recall_line, show=None) -> int:
    """Check the flags and do the step they name; ``build_trained()`` runs ``--train-only`` (the command's
    input handling), ``recall_line(meta)`` words the recall, ``show(meta)`` prints the measured tables (cell
    counts, the curve and how its rates were timed, the kind advice); the exit status."""
    show = show or (lambda meta: None)
    steps = [f for f, v in (("--train-only", args.train_only), ("--shard", args.shard is not None),
                            ("--merge", args.merge is not None), ("--cluster", args.cluster is not None)) if v]
    if args.cluster_shards is not None and args.cluster is None:
        raise ValueError("--cluster-shards: only with --cluster")
    if len(steps) > 1:
        raise ValueError(f"{steps[1]}: one step at a time ({' or '.join(steps)})")
    start = time.perf_counter()
    out = Path(args.out)
    if args.train_only:
        if args.kind not in ("ivf", "ivfpq"):
            raise ValueError(f"--kind: an index built in shards is ivf or ivfpq (its lists merge on disk), got "
                             f"{args.kind}")
        meta = build_trained()
        print(f"wrote {out}: {meta['num_items']} videos x {meta['dim']} folded ({meta['normalizer']}), the "
              f"{meta['factory']} quantisers trained on a sample, no vector added yet "
              f"({time.perf_counter() - start:.1f} s); next: 'xmodal index --run RUN --out {out} --shard K/N' for "
              f"K = 1..N (or --cluster), then --merge")
        show(meta)
        return 0
    _check_run(args, out)
    if args.shard is not None:
        from xmodal.features.shards import parse_shard
        from xmodal.retrieval.build_shards import add_folder_shard

        shard = parse_shard(args.shard)
        path = add_folder_shard(out, shard)
        print(f"wrote {path}: shard {shard[0]}/{shard[1]} ({time.perf_counter() - start:.1f} s)")
        return 0
    if args.cluster is not None:
        from xmodal.execute.index import add_index_shards

        n = args.cluster_shards or 8
        if not 1 <= n <= 100_000:
            raise ValueError(f"--cluster-shards: expected 1..100000, got {n}")
        import shutil

        shutil.rmtree(out / "shards", ignore_errors=True)  # one split at a time
        try:
            add_index_shards(out / "trained.faiss", out / "gallery.npy", out / "shards", shards=n, cluster=args.cluster,
                             bias=out / "gallery_bias.npy", threads=args.threads)
        except ModuleNotFoundError as exc:
            raise ValueError(str(exc)) from None
        print(f"added {n} shards on {args.cluster} ({time.perf_counter() - start:.1f} s)")
    from xmodal.retrieval.build_shards import merge_folder

    meta = merge_folder(out, [Path(p) for p in args.merge or []], recall_queries=args.recall_queries,
                        target_recall=args.target_recall)
    print(f"wrote {out}: {meta['num_items']} videos merged from {meta['ondisk']['shards']} shards into "
          f"{out / 'lists.ivfdata'} (memory-mapped when searched; {time.perf_counter() - start:.1f} s)")
    print(recall_line(meta))
    show(meta)
    return 0


def _check_run(args: argparse.Namespace, out: Path) -> None:
    meta_path = out / "meta.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        raise ValueError(f"--out: {out} is not an index folder written by 'xmodal index --train-only'") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("ondisk"), dict):
        raise ValueError(f"--out: {out} is not an index folder written by 'xmodal index --train-only'")
    if meta.get("run") != str(Path(args.run).resolve()):
        raise ValueError(f"--run: {args.run} is not the run {out} was trained for ({meta.get('run')})")
