"""An index built in shards by the executor and merged on disk (issue 46.3).

    .venv/bin/python bench/ondisk.py --videos 1000000 --root /tmp/xmodal_ondisk --json out.json

One run, on one seeded gallery:

1. **Gallery** (``ROOT/rows.npy``, float16 ``[N, D]``, reused when present): ``N / 200`` topics (latent
   centres), a clip is its topic's centre plus noise, L2-normalised; a bias column ``b_j`` (a folded
   normaliser's, ``0.01 N(0, 1)``, ``ROOT/bias.npy``); queries: noisy views of sampled clips.
2. **Train** (a child process): :func:`xmodal.retrieval.ondisk.train_empty` on the seeded sample
   (``ivf``: ``40 nlist`` rows).
3. **Shards**: :func:`xmodal.execute.index.add_index_shards` on ``--cluster local:2`` (2 worker processes),
   ``--shards`` tasks; each task's peak RssAnon (sampled every 20 ms in the worker).
4. **Merge** (a child process): :func:`~xmodal.retrieval.ondisk.merge_shards` with ``--queries`` recall
   queries: recall@10 against exact search (blockwise brute force over ``rows.npy``), the smallest
   nprobe reaching 0.95 kept.
5. **Search** (child processes): ``search-disk``, the merged index alone (lists memory-mapped from
   ``lists.ivfdata``: the peak RssAnon of a searching process); ``search-both``, the merged index and the same
   lists copied into memory (``ArrayInvertedLists``; skipped above ``--max-anon-gb``) in one process, searched
   alternately so that the machine's load hits both alike, at the stored nprobe and at 16 and 64 cells:
   queries/s (one batch of ``--queries``, one FAISS thread, the best of ``--repeats``); "cold": before each
   of its searches the on-disk index is closed, its file's pages dropped from the page cache
   (``posix_fadvise(DONTNEED)``, no root needed) and the index opened again.

Every process's peak RssAnon is sampled from ``/proc/self/status`` every 20 ms (pages of memory-mapped
files are page cache and do not count). Timings are wall-clock on whatever else the machine runs: compare
the ratios measured in the same run. Nothing is asserted; ``tests/test_index_ondisk.py`` checks correctness.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT_SRC = Path(__file__).resolve().parents[1] / "src"


def make_gallery(root: Path, n: int, dim: int, seed: int, chunk: int = 262144) -> None:
    """``rows.npy`` (float16) and ``bias.npy`` written chunk by chunk (memory: one chunk)."""
    if (root / "rows.npy").is_file() and np.load(root / "rows.npy", mmap_mode="r").shape == (n, dim):
        return
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    topics = max(1, n // 200)
    centres = rng.standard_normal((topics, dim)).astype(np.float32)
    out = np.lib.format.open_memmap(root / ".rows.npy.tmp", mode="w+", dtype=np.float16, shape=(n, dim))
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        r = np.random.default_rng([seed, start])
        x = centres[r.integers(0, topics, stop - start)] + 0.6 * r.standard_normal((stop - start, dim), np.float32)
        out[start:stop] = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)
    out.flush()
    del out
    os.replace(root / ".rows.npy.tmp", root / "rows.npy")
    np.save(root / "bias.npy", (0.01 * rng.standard_normal(n)).astype(np.float32))


def queries_of(root: Path, q: int, seed: int) -> np.ndarray:
    rows = np.load(root / "rows.npy", mmap_mode="r")
    r = np.random.default_rng([seed, 7])
    pick = np.sort(r.choice(rows.shape[0], q, replace=False))
    x = rows[pick].astype(np.float32) + 0.3 * r.standard_normal((q, rows.shape[1]), np.float32) / np.sqrt(rows.shape[1])
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def child(stage: str, args: argparse.Namespace) -> dict:
    """Run ``stage`` in a fresh process (its own peak memory); its JSON result."""
    cmd = [sys.executable, __file__, "--stage", stage, "--root", str(args.root), "--videos", str(args.videos),
           "--dim", str(args.dim), "--queries", str(args.queries), "--seed", str(args.seed),
           "--nlist", str(args.nlist or 0), "--kind", args.kind, "--repeats", str(args.repeats)]
    env = dict(os.environ, PYTHONPATH=f"{ROOT_SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               OMP_NUM_THREADS="1")
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise SystemExit(f"stage {stage} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def stage(name: str, args: argparse.Namespace) -> dict:
    from xmodal.execute.index import PeakAnon
    from xmodal.retrieval.index import import_faiss

    faiss = import_faiss()
    faiss.omp_set_num_threads(1)
    root = Path(args.root)
    rows = np.load(root / "rows.npy", mmap_mode="r")
    bias = np.load(root / "bias.npy", mmap_mode="r")
    out: dict = {}
    with PeakAnon() as peak:
        t0, c0 = time.perf_counter(), time.process_time()
        if name == "train":
            from xmodal.retrieval.ondisk import train_empty

            out.update(train_empty(rows, root / "trained.faiss", bias=bias, kind=args.kind,
                                   nlist=args.nlist or None, seed=args.seed))
        elif name == "merge":
            from xmodal.retrieval.ondisk import merge_shards

            shards = sorted((root / "shards").glob("shard-*.faiss"))
            meta = merge_shards(root / "trained.faiss", shards, root / "idx", queries=queries_of(root, args.queries,
                                                                                                  args.seed),
                                rows=rows, bias=bias)
            out.update({k: meta[k] for k in ("num_items", "shards", "recall_at_10", "recall_queries",
                                             "search_params", "target_met")})
        elif name in ("search-disk", "search-both"):
            out.update(search(root, name, args))
        out["wall_s"], out["cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    out["peak_anon_mb"] = peak.peak_kb / 1024
    return out


def _drop_cache(path: Path) -> None:
    """The file's pages dropped from the page cache (``posix_fadvise(DONTNEED)``; no root needed; pages a
    process still maps stay, so the index is closed first)."""
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def search(root: Path, name: str, args: argparse.Namespace) -> dict:
    """``search-disk``: the merged index alone (this process's peak RssAnon with the lists on disk);
    ``search-both``: the merged index and the same lists copied into memory (``ArrayInvertedLists``) in one
    process, searched alternately (the machine's load hits both alike), at the stored nprobe and at 16 and 64
    cells: queries/s, the best of ``--repeats``; "cold": the on-disk index closed, its file's pages dropped,
    the index opened again before each of its searches."""
    from xmodal.retrieval.index import BiasedIndex, import_faiss
    from xmodal.retrieval.ondisk import LISTS_FILE

    faiss = import_faiss()
    q = queries_of(root, args.queries, args.seed + 1)  # queries the merge's tuning never saw
    path = root / "idx" / "index.faiss"
    disk = BiasedIndex.load(path, dim=args.dim)
    stored = disk.search_params["nprobe"]
    memory = None
    if name == "search-both":
        memory = BiasedIndex.load(path, dim=args.dim)
        ivf = faiss.extract_index_ivf(memory.index)
        lists = faiss.ArrayInvertedLists(ivf.nlist, ivf.code_size)
        lists.merge_from(ivf.invlists, 0)
        ivf.replace_invlists(lists, True)
        lists.this.disown()

    def qps(index, nprobe):
        t = time.perf_counter()
        ids = index.search(q, 10, nprobe=nprobe)[1]
        return len(q) / (time.perf_counter() - t), ids

    res: dict = {"stored_nprobe": stored, "runs": []}
    for nprobe in sorted({stored, 16, 64}):
        row = {"nprobe": nprobe, "disk_cold": 0.0, "disk_warm": 0.0, "memory": 0.0}
        for _ in range(args.repeats):
            del disk
            _drop_cache(root / "idx" / LISTS_FILE)
            disk = BiasedIndex.load(path, dim=args.dim)
            row["disk_cold"] = max(row["disk_cold"], qps(disk, nprobe)[0])
        for _ in range(args.repeats):
            v, ids = qps(disk, nprobe)
            row["disk_warm"] = max(row["disk_warm"], v)
            if memory is not None:
                v, mids = qps(memory, nprobe)
                row["memory"] = max(row["memory"], v)
                row["same_ids"] = bool(np.array_equal(ids, mids))
        if memory is None:
            del row["memory"]
        else:
            row["cold_over_memory"] = row["disk_cold"] / row["memory"]
            row["warm_over_memory"] = row["disk_warm"] / row["memory"]
        res["runs"].append(row)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--videos", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--kind", default="ivf", choices=("ivf", "ivfpq"))
    p.add_argument("--nlist", type=int, default=0, help="IVF cells (0: 4 sqrt(N))")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--cluster", default="local:2")
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3, help="searches per setting and state (the best is kept)")
    p.add_argument("--root", default="/tmp/xmodal_ondisk")
    p.add_argument("--max-anon-gb", type=float, default=2.0, help="skip the in-memory reference above this")
    p.add_argument("--only", default="gallery,train,shards,merge,search",
                   help="stages to run (the others' files are reused from --root)")
    p.add_argument("--json", default=None)
    p.add_argument("--stage", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.stage:
        print(json.dumps(stage(args.stage, args)))
        return 0
    sys.path.insert(0, str(ROOT_SRC))
    root = Path(args.root)
    results: dict = {"videos": args.videos, "dim": args.dim, "kind": args.kind, "shards": args.shards,
                     "cluster": args.cluster}
    only = set(args.only.split(","))
    t = time.perf_counter()
    make_gallery(root, args.videos, args.dim, args.seed)
    results["gallery_s"] = time.perf_counter() - t
    if "train" in only:
        results["train"] = child("train", args)
        print("train", results["train"], flush=True)
    import shutil

    from xmodal.execute.index import add_index_shards

    from xmodal.execute.index import PeakAnon

    if "shards" in only:
        shutil.rmtree(root / "shards", ignore_errors=True)
        t, c = time.perf_counter(), time.process_time()
        with PeakAnon() as driver:  # this process: the client and the local cluster's scheduler
            done = add_index_shards(root / "trained.faiss", root / "rows.npy", root / "shards", shards=args.shards,
                                    cluster=args.cluster, bias=root / "bias.npy", progress=False)
        results["shards_stage"] = {"wall_s": time.perf_counter() - t, "driver_cpu_s": time.process_time() - c,
                                   "driver_peak_anon_mb": driver.peak_kb / 1024,
                                   "peak_anon_mb_per_task": [done[k]["peak_anon_kb"] / 1024 for k in sorted(done)],
                                   "worker_pids": sorted({done[k]["pid"] for k in done})}
        print("shards", results["shards_stage"], flush=True)
    if "merge" in only:
        results["merge"] = child("merge", args)
        print("merge", results["merge"], flush=True)
    if "search" not in only:
        return 0
    results["lists_bytes"] = (root / "idx" / "lists.ivfdata").stat().st_size
    results["search_disk"] = child("search-disk", args)
    print("search (lists on disk)", results["search_disk"], flush=True)
    per_vector = results["lists_bytes"] / args.videos
    if per_vector * args.videos / 2**30 <= args.max_anon_gb:
        results["search_both"] = child("search-both", args)
        print("search (lists on disk and in memory, one process, alternately)", results["search_both"], flush=True)
    else:
        results["search_both"] = None
        print(f"in-memory reference skipped: its lists ({per_vector * args.videos / 2**30:.1f} GB) exceed "
              f"--max-anon-gb {args.max_anon_gb}", flush=True)
    peaks = [results[k]["peak_anon_mb"] for k in ("train", "merge", "search_disk") if results.get(k)]
    if "shards_stage" in results:
        peaks += [results["shards_stage"]["driver_peak_anon_mb"], *results["shards_stage"]["peak_anon_mb_per_task"]]
    results["peak_anon_mb_max"] = max(peaks)
    print("peak RssAnon of any process building or searching with the lists on disk (MB):",
          round(results["peak_anon_mb_max"], 1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
