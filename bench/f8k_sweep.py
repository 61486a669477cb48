"""Run named `xmodal train` variants in parallel and tabulate dev t2i R@1 (Flickr8k tuning).

Each variant is a config plus dotted overrides; every run writes its own directory under
``--out``; the table reads each run's ``metrics.json`` (no number is typed by hand).

Usage:
    python bench/f8k_sweep.py --variants bench/f8k_variants.yaml --out runs/sweep --jobs 4 \
        [--only NAME,NAME] [--set data.root=PATH ...] [--device cpu|cuda|auto]

The variants file maps a name to ``{config: PATH, overrides: [section.key=value, ...]}``.
Tune on dev only: Flickr8k's test split is held back.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml


def run_one(name: str, spec: dict, out: Path, extra: list[str], threads: int) -> tuple[str, float, int]:
    run_dir = out / name
    cmd = [sys.executable, "-m", "xmodal", "train", spec["config"], "--out", str(run_dir), "--no-resume",
           "--quiet", "--threads", str(threads), *spec.get("overrides", []), *extra]
    t0 = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    return name, time.perf_counter() - t0, rc


def row(name: str, out: Path, seconds: float, rc: int) -> str:
    path = out / name / "metrics.json"
    if rc != 0 or not path.is_file():
        return f"| {name} | failed (rc {rc}, see {out / name}.log) | | | | | |"
    m = json.loads(path.read_text())
    sel = m["normalizer"]
    none = m["val"]["none"]
    best = m["val"][sel]
    rsum = sum(best[d][f"R@{k}"] for d in ("t2v", "v2t") for k in (1, 5, 10))
    return (f"| {name} | {none['t2v']['R@1']:.2f} | {best['t2v']['R@1']:.2f} ({sel}) | {none['v2t']['R@1']:.2f} | "
            f"{rsum:.1f} | {m['best_epoch']}/{m['epochs_run']} | {seconds:.0f} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variants", required=True, help="YAML: name -> {config, overrides}")
    p.add_argument("--out", default="runs/sweep")
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per run")
    p.add_argument("--only", default="", help="comma-separated variant names")
    p.add_argument("--set", action="append", default=[], help="override added to every run")
    args = p.parse_args(argv)
    variants = yaml.safe_load(Path(args.variants).read_text())
    if args.only:
        keep = args.only.split(",")
        variants = {k: v for k, v in variants.items() if k in keep}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda kv: run_one(kv[0], kv[1], out, args.set, args.threads), variants.items()))
    lines = ["| variant | dev t2i R@1 none | dev t2i R@1 selected | dev i2t R@1 none | dev rsum (selected) | "
             "best/run epochs | wall s |", "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [row(name, out, sec, rc) for name, sec, rc in results]
    table = "\n".join(lines)
    print(table)
    (out / "table.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
