"""`xmodal compare` on large seed groups and on a per_query.npz with a huge unused entry (issue 36.6).

Builds, under ``--work`` (never the repository), runs of ``--queries`` t2v / ``--queries // 5`` v2t
per-query ranks (random, 1-based, gallery-sized) and times ``xmodal compare`` in subprocesses,
reporting wall seconds and peak RSS (``ru_maxrss`` of the child) as ratios against a reference
compare of one run against one run measured in the same process:

* ``--seeds K``: K + K seed groups (default 14 + 14: C(28, 14) = 4e7 labellings, which the
  exact enumeration before issue 36.6 walked in > 16 min and > 1.3 GB);
* an unused entry of ``--unused-gb`` GB of zeros (deflated to a few MB) in one run's
  per_query.npz, which compare must never decompress.

Usage:
    python bench/compare_bounds.py --work /tmp/claims-bounds [--seeds 14] [--queries 5000] [--unused-gb 1.5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np


def card(q: int, v: int) -> dict:
    return {"num_queries": {"t2v": q, "v2t": v}, "gallery_size": {"t2v": v, "v2t": q},
            "chance_r1": {"t2v": 100 / v, "v2t": 100 * 5 / q}, "caption_policy": "all", "captions_per_video": 5.0,
            "v2t": "all-captions", "tie_rule": "pessimistic", "normalizer": "none", "bank_source": "none",
            "uses_test_queries": False, "normalizers": {"none": {"bank_source": "none", "uses_test_queries": False}},
            "split_sha256": "ab" * 32, "git_revision": None, "git_dirty": None}


def make_run(path: Path, q: int, seed: int, shift: int) -> Path:
    from xmodal.retrieval.perquery import write_per_query

    g = np.random.default_rng(seed)
    v = q // 5
    ranks = {"t2v": np.maximum(1, g.integers(1, v // 4, q) - shift), "v2t": np.maximum(1, g.integers(1, q // 4, v) - shift)}
    path.mkdir(parents=True, exist_ok=True)
    write_per_query(path / "per_query.npz", {"test": {"none": {d: {"rank": r} for d, r in ranks.items()}}},
                    {"test": card(q, v)})
    m = {"normalizer": "none", "test": {"none": {d: {"R@1": 100.0 * float(np.mean(r <= 1))} for d, r in ranks.items()},
                                        "protocol": card(q, v)}}
    (path / "metrics.json").write_text(json.dumps(m))
    return path


def add_unused_zeros(npz: Path, gigabytes: float) -> None:
    """Append an entry of ``gigabytes`` GB of float64 zeros (another normaliser's AP, which a comparison of
    ``none`` never reads), streamed (never held in memory)."""
    n = int(gigabytes * 1e9 / 8)
    header = np.lib.format.magic(1, 0)
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": (n,)})
    block = bytes(1 << 24)
    with zipfile.ZipFile(npz, "a", zipfile.ZIP_DEFLATED) as z:
        with z.open("test/sinkhorn/t2v/ap.npy", "w", force_zip64=True) as f:  # a normaliser not compared
            f.write(header + buf.getvalue())
            left = n * 8
            while left:
                f.write(block[:min(left, len(block))])
                left -= min(left, len(block))


def peak(argv: list[str], log: Path) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    with open(log, "w") as err:
        rc = subprocess.call([sys.executable, "-c", "import resource, sys; from xmodal.cli import main\n"
                              "try:\n    code = main(sys.argv[1:])\nfinally:\n"
                              "    print('RSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
                              "sys.exit(code)", *argv], stdout=subprocess.DEVNULL, stderr=err)
    wall = time.perf_counter() - t0
    rss = next((int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith("RSS_KB")), 0)
    return wall, rss / 1024, rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", required=True)
    p.add_argument("--seeds", type=int, default=14)
    p.add_argument("--queries", type=int, default=5000)
    p.add_argument("--unused-gb", type=float, default=1.5)
    args = p.parse_args(argv)
    work = Path(args.work)
    q = args.queries
    a = [make_run(work / f"a_s{s}", q, s, 0) for s in range(args.seeds)]
    for s in range(args.seeds):
        make_run(work / f"b_s{s}", q, 1000 + s, 1)
    hostile = make_run(work / "hostile", q, 0, 0)
    add_unused_zeros(hostile / "per_query.npz", args.unused_gb)
    rows = []
    ref = peak(["compare", str(a[0]), str(work / "b_s0")], work / "ref.log")
    rows.append(("reference: 1 run vs 1 run", ref))
    rows.append((f"{args.seeds} + {args.seeds} seeds (default: 2 directions x 5 metrics)",
                 peak(["compare", "--a", str(work / "a_s*"), "--b", str(work / "b_s*")], work / "seeds.log")))
    rows.append((f"1 run vs a run whose per_query.npz holds an unused {args.unused_gb:g} GB entry",
                 peak(["compare", str(work / "b_s0"), str(hostile)], work / "unused.log")))
    size = (hostile / "per_query.npz").stat().st_size / 1e6
    print(f"{q} t2v / {q // 5} v2t queries per run; the hostile per_query.npz is {size:.1f} MB on disk\n")
    print("| compare | exit | wall s | x reference | peak RSS MB | x reference |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (wall, rss, rc) in rows:
        print(f"| {name} | {rc} | {wall:.1f} | {wall / ref[0]:.2f} | {rss:.0f} | {rss / ref[1]:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
