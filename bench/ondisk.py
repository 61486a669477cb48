"""An index built in shards by the executor and merged on disk (issue 46.3).

    .venv/bin/python bench/ondisk.py --videos 1000000 --root /tmp/xmodal_ondisk --json out.json
    .venv/bin/python bench/ondisk.py --videos 10000000 --kind ivfpq --nlist 4096 --root /tmp/scale46/od10m \
        --write docs/results/data/ondisk_10m.json

One run, on one seeded gallery:

1. **Gallery** (``ROOT/rows.npy``, float16 ``[N, D]``, reused when present): ``N / 200`` topics (latent
   centres), a clip is its topic's centre plus noise, L2-normalised; a bias column ``b_j`` (a folded
   normaliser's, ``0.01 N(0, 1)``, ``ROOT/bias.npy``); queries: noisy views of sampled clips.
2. **Train** (a child process): :func:`xmodal.retrieval.ondisk.train_empty` on the seeded sample
   (``40 nlist`` rows, or ``--train-rows``).
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

``--write FILE.json`` writes the results as a result file (``bench/resultfile.py``: provenance beside the
numbers) with three tables the docs render (``docs/scale.md``): the stages, the queries/s, and a projection
to 100M and 1B clips computed from this run's measured rates (:func:`projection`; arithmetic, not a
measurement).
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


def make_gallery(root: Path, n: int, dim: int, seed: int, chunk: int = 262144) -> bool:
    """``rows.npy`` (float16) and ``bias.npy`` written chunk by chunk (memory: one chunk); False when they
    were there already."""
    if (root / "rows.npy").is_file() and np.load(root / "rows.npy", mmap_mode="r").shape == (n, dim):
        return False
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
    return True


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
           "--nlist", str(args.nlist or 0), "--kind", args.kind, "--repeats", str(args.repeats),
           "--train-rows", str(args.train_rows or 0)]
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
                                   nlist=args.nlist or None, seed=args.seed, train_rows=args.train_rows or None))
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


#: The projection's sizes (clips).
PROJECT_TO = (100_000_000, 1_000_000_000)
#: Memory a shard's task may hold (the issue's goal), MB.
TASK_MB = 2048


def projection(results: dict) -> dict:
    """Sizes and build hours at :data:`PROJECT_TO` clips from this run's measured rates (arithmetic, not a
    measurement): cells grow as ``sqrt(N)`` from this run's (the same ``cells / sqrt(N)``); a clip's add CPU
    grows with the cells (the coarse assignment is a brute-force scan of the cells); the training CPU with
    sample x cells, the sample keeping this run's rows a cell; lists bytes a clip as measured; a shard holds
    at most the rows that keep its task under :data:`TASK_MB` (the measured peak less its lists' bytes is the
    task's fixed part)."""
    n, shards = results["videos"], results["shards_stage"]
    nlist, sample = results["train"]["nlist"], results["train"]["train_rows"]
    add_cpu = sum(shards["cpu_s_per_task"]) / n  # a clip's add CPU at `nlist` cells
    per_clip = results["lists_bytes"] / n
    task_rows = n / len(shards["cpu_s_per_task"])
    fixed_mb = max(shards["peak_anon_mb_per_task"]) - task_rows * per_clip / 2**20
    max_rows = int((TASK_MB - fixed_mb) * 2**20 / per_clip)
    merge_cpu = results["merge"]["cpu_s"] / n
    rows = []
    for big in (n, *PROJECT_TO):
        cells = int(round(nlist * (big / n) ** 0.5))
        train_h = results["train"]["cpu_s"] * (cells / nlist) ** 2 / 3600
        add_h = add_cpu * big * cells / nlist / 3600
        rows.append({"clips": big, "cells": cells, "sample_rows": int(round(sample * cells / nlist)),
                     "lists_gb": per_clip * big / 1e9, "gallery_gb": 2 * results["dim"] * big / 1e9,
                     "train_cpu_h": train_h, "add_cpu_h": add_h, "merge_cpu_h": merge_cpu * big / 3600,
                     "shards": -(-big // max_rows), "measured": big == n})
    return {"lists_bytes_per_clip": per_clip, "gallery_bytes_per_clip": 2 * results["dim"],
            "ivf_float32_bytes_per_clip": 4 * (results["dim"] + 1) + 8, "add_cpu_us_per_clip": add_cpu * 1e6,
            "task_fixed_mb": fixed_mb, "max_rows_per_task": max_rows, "rows": rows}


def _table(columns: list[str], formats: list, rows: list[list]) -> dict:
    return {"columns": columns, "align": ["---"] + ["--:"] * (len(columns) - 1), "formats": formats, "rows": rows}


def tables(results: dict) -> dict:
    """The stages, the queries/s and the projection as tables for ``docs/hooks/numbers.py``."""
    dash = "–"
    stages = []
    if "gallery" in results:
        g = results["gallery"]
        stages.append(["generate the float16 gallery (seeded)", 1, g["wall_s"], g["cpu_s"], g["peak_anon_mb"]])
    if "train" in results:
        tr = results["train"]
        stages.append([f"train {tr['factory']} on {tr['train_rows']:,} sampled rows", 1, tr["wall_s"], tr["cpu_s"],
                       tr["peak_anon_mb"]])
    if "shards_stage" in results:
        sh = results["shards_stage"]
        stages += [[f"{len(sh['cpu_s_per_task'])} shards added as tasks on {results['cluster']} (per task: max)",
                    len(sh["worker_pids"]), sh["wall_s"], sum(sh["cpu_s_per_task"]), max(sh["peak_anon_mb_per_task"])],
                   ["the same, the driver (client and scheduler)", 1, dash, sh["driver_cpu_s"],
                    sh["driver_peak_anon_mb"]]]
    if "merge" in results:
        me = results["merge"]
        stages.append([f"merge + recall ({me['recall_queries']:,} queries, exact search)", 1, me["wall_s"],
                       me["cpu_s"], me["peak_anon_mb"]])
    if "search_disk" in results:
        stages.append(["search, lists on disk (memory-mapped)", 1, dash, dash, results["search_disk"]["peak_anon_mb"]])
    if results.get("search_both"):
        stages.append(["search, on disk and the same lists in memory (one process)", 1, dash, dash,
                       results["search_both"]["peak_anon_mb"]])
    out = {"stages": _table(["stage", "processes", "wall s", "CPU s", "peak RssAnon MB"],
                            [None, None, ".0f", ".0f", ".0f"], stages)}
    if not {"shards_stage", "merge", "search_disk"} <= set(results):
        return out  # a run cut short (--from-log): its finished stages only
    both = results.get("search_both") or {"runs": []}
    out["search"] = _table(["nprobe", "on disk, cold", "on disk, warm", "in memory", "cold / memory",
                            "warm / memory"], [None, ".0f", ".0f", ".0f", ".2f", ".2f"],
                           [[r["nprobe"], r["disk_cold"], r["disk_warm"], r["memory"], r["cold_over_memory"],
                             r["warm_over_memory"]] for r in both["runs"]])
    proj = projection(results)
    results["projection"] = proj
    out["projection"] = _table(
        ["clips", "", "cells", "sample rows", "lists GB", "float16 gallery GB", "train CPU h", "add CPU h (all tasks)",
         "merge + recall CPU h", "shards (<= 2 GB a task)"],
        [None, None, None, None, ".1f", ".1f", ".2f", ".1f", ".2f", None],
        [[f"{r['clips']:,}", "measured" if r["measured"] else "projection", f"{r['cells']:,}",
          f"{r['sample_rows']:,}", r["lists_gb"], r["gallery_gb"], r["train_cpu_h"], r["add_cpu_h"],
          r["merge_cpu_h"], f"{r['shards']:,}"] for r in proj["rows"]])
    return out


def from_log(args: argparse.Namespace, argv: list[str] | None) -> int:
    """``--from-log LOG --write FILE``: the stage lines (``NAME {...}``) a run printed, as a result file whose
    ``command`` is that run's (these flags without ``--from-log``) and whose ``stages_done`` names what it had
    finished; its tables hold those stages only."""
    import ast

    sys.path.insert(0, str(ROOT_SRC))
    from resultfile import provenance, write_json

    if not args.write:
        raise SystemExit("--from-log: give --write FILE.json")
    names = {"gallery": "gallery", "train": "train", "shards": "shards_stage", "merge": "merge"}
    results: dict = {"videos": args.videos, "dim": args.dim, "kind": args.kind, "shards": args.shards,
                     "cluster": args.cluster}
    for line in Path(args.from_log).read_text().splitlines():
        name, _, rest = line.partition(" ")
        if name in names and rest.startswith("{"):
            results[names[name]] = ast.literal_eval(rest)
    results["stages_done"] = [k for k in names.values() if k in results]
    results["tables"] = tables(results)
    argv = list(sys.argv[1:] if argv is None else argv)
    run_argv = [a for i, a in enumerate(argv) if a not in ("--from-log", "--log-commit")
                and (i == 0 or argv[i - 1] not in ("--from-log", "--log-commit"))]

    data = provenance("bench/ondisk.py", run_argv, f"bench/ondisk.py --from-log: the stages this run had printed "
                      f"to its log ({', '.join(results['stages_done'])}) when the file was written; the run's "
                      f"later stages are not in it")
    if args.log_commit:  # the numbers are the logged run's: its commit, this checkout's as the parser's
        data.update(commit=args.log_commit, dirty=False, parsed_at_commit=data["commit"])
    write_json(args.write, {**data, **results})
    print(f"wrote {args.write}: {', '.join(results['stages_done'])}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--videos", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--kind", default="ivf", choices=("ivf", "ivfpq"))
    p.add_argument("--nlist", type=int, default=0, help="IVF cells (0: 4 sqrt(N))")
    p.add_argument("--train-rows", type=int, default=0, help="rows of the training sample (0: 40 nlist)")
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
    p.add_argument("--write", default=None, help="a result file (docs/results/data/NAME.json) with the tables")
    p.add_argument("--from-log", default=None, metavar="LOG", help="with --write: the result file of the stages a "
                   "run (given the same other flags) printed to LOG so far (a run cut short or still running)")
    p.add_argument("--log-commit", default=None, help="--from-log: the commit the logged run ran at (a clean checkout)")
    p.add_argument("--stage", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.from_log:
        return from_log(args, argv)
    if args.stage:
        print(json.dumps(stage(args.stage, args)))
        return 0
    sys.path.insert(0, str(ROOT_SRC))
    root = Path(args.root)
    results: dict = {"videos": args.videos, "dim": args.dim, "kind": args.kind, "shards": args.shards,
                     "cluster": args.cluster}
    only = set(args.only.split(","))
    from xmodal.execute.index import PeakAnon

    t, c = time.perf_counter(), time.process_time()
    with PeakAnon() as gen:
        made = make_gallery(root, args.videos, args.dim, args.seed)
    results["gallery_s"] = time.perf_counter() - t
    results["gallery"] = {"wall_s": results["gallery_s"], "cpu_s": time.process_time() - c,
                          "peak_anon_mb": gen.peak_kb / 1024, "generated": made,
                          "bytes": (root / "rows.npy").stat().st_size}
    print("gallery", results["gallery"], flush=True)
    if "train" in only:
        results["train"] = child("train", args)
        print("train", results["train"], flush=True)
    import shutil

    from xmodal.execute.index import add_index_shards

    if "shards" in only:
        shutil.rmtree(root / "shards", ignore_errors=True)
        t, c = time.perf_counter(), time.process_time()
        with PeakAnon() as driver:  # this process: the client and the local cluster's scheduler
            done = add_index_shards(root / "trained.faiss", root / "rows.npy", root / "shards", shards=args.shards,
                                    cluster=args.cluster, bias=root / "bias.npy", progress=False)
        results["shards_stage"] = {"wall_s": time.perf_counter() - t, "driver_cpu_s": time.process_time() - c,
                                   "driver_peak_anon_mb": driver.peak_kb / 1024,
                                   "peak_anon_mb_per_task": [done[k]["peak_anon_kb"] / 1024 for k in sorted(done)],
                                   "cpu_s_per_task": [done[k]["cpu_s"] for k in sorted(done)],
                                   "shard_bytes": sum((root / "shards" / f"shard-{k}-of-{args.shards}.faiss")
                                                      .stat().st_size for k in done),
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
    if args.write:
        from resultfile import provenance, write_json

        results["tables"] = tables(results)
        write_json(args.write, {**provenance("bench/ondisk.py", argv, "bench/ondisk.py --write: this run's "
                                             "measurements and the projection computed from them"), **results})
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
