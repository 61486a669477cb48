"""Run named `xmodal train` variants (x seeds) in parallel and tabulate dev metrics (Flickr8k).

Each variant is a config plus dotted overrides; every run writes its own directory under
``--out``; the tables read each run's ``metrics.json`` (no number is typed by hand).

Usage:
    python bench/f8k_sweep.py --variants bench/f8k_variants.yaml --out runs/sweep --jobs 4 \
        [--only NAME,NAME] [--seeds 0,1,2] [--normalizers none,sinkhorn,ncl] [--set data.root=PATH ...]
    python bench/f8k_sweep.py ... --table-only     # the same tables from the runs already under --out

With several seeds, cells are mean +- std (population std over the seeds) and a second table
gives t2v R@1 under each normaliser named in ``--normalizers`` (when the run evaluated it).

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


def seed_table(names: list[str], seeds: list[int], out: Path, normalizers: list[str]) -> str:
    """mean +- std over seeds of t2v / v2t R@1 per normaliser, and of the selected normaliser."""
    import numpy as np

    head = "| variant | " + " | ".join(f"t2v R@1 {n}" for n in normalizers) + \
        " | t2v R@1 selected | v2t R@1 none | v2t R@1 selected | selected (per seed) |"
    lines = [head, "|---|" + "---:|" * (len(normalizers) + 3) + "---|"]
    for name in names:
        ms = []
        for s in seeds:
            path = out / f"{name}_s{s}" / "metrics.json"
            if path.is_file():
                ms.append(json.loads(path.read_text()))
        if not ms:
            lines.append(f"| {name} | failed |")
            continue

        def cell(values):
            v = np.asarray(values, dtype=float)
            return f"{v.mean():.2f} ± {v.std():.2f}" if len(v) > 1 else f"{v[0]:.2f}"

        cells = []
        def val_of(m, n):  # oracle normalisers are reported beside the selectable ones
            return m["val"].get(n) or m.get("oracle", {}).get("val", {}).get(n)

        for n in normalizers:
            vals = [val_of(m, n)["t2v"]["R@1"] for m in ms if val_of(m, n)]
            cells.append(cell(vals) if len(vals) == len(ms) else "-")
        sel = [m["val"][m["normalizer"]] for m in ms]
        cells += [cell([x["t2v"]["R@1"] for x in sel]), cell([m["val"]["none"]["v2t"]["R@1"] for m in ms]),
                  cell([x["v2t"]["R@1"] for x in sel]), ", ".join(m["normalizer"] for m in ms)]
        lines.append(f"| {name} ({len(ms)} seeds) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
            f"{rsum:.1f} | {m['best_epoch']}/{m['epochs_run']} | {'-' if seconds is None else f'{seconds:.0f}'} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variants", required=True, help="YAML: name -> {config, overrides}")
    p.add_argument("--out", default="runs/sweep")
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per run")
    p.add_argument("--only", default="", help="comma-separated variant names")
    p.add_argument("--set", action="append", default=[], help="override added to every run")
    p.add_argument("--seeds", default="", help="comma-separated train.seed values (each variant x seed)")
    p.add_argument("--normalizers", default="none,dn,sinkhorn,qbnorm", help="columns of the seed table")
    p.add_argument("--table-only", action="store_true",
                   help="train nothing: tabulate the runs already under --out (wall s shown as '-')")
    args = p.parse_args(argv)
    variants = yaml.safe_load(Path(args.variants).read_text())
    if args.only:
        keep = args.only.split(",")
        variants = {k: v for k, v in variants.items() if k in keep}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    names = list(variants)
    if seeds:
        variants = {f"{k}_s{s}": {**v, "overrides": [*v.get("overrides", []), f"train.seed={s}"]}
                    for k, v in variants.items() for s in seeds}
    if args.table_only:
        results = [(name, None, 0) for name in variants]
    else:
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda kv: run_one(kv[0], kv[1], out, args.set, args.threads),
                                    variants.items()))
    lines = ["| variant | dev t2i R@1 none | dev t2i R@1 selected | dev i2t R@1 none | dev rsum (selected) | "
             "best/run epochs | wall s |", "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [row(name, out, sec, rc) for name, sec, rc in results]
    table = "\n".join(lines)
    if seeds:
        table += "\n\n" + seed_table(names, seeds, out, args.normalizers.split(","))
    print(table)
    if not args.table_only:
        (out / "table.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
