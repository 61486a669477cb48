"""Dev (pure test) text->image R@1 of runs whose validation split was carved out of train.

    python bench/heldout_table.py runs/f8k_heldout_s0 runs/f8k_heldout_s1 runs/f8k_heldout_s2

Reads each run's ``metrics.json`` (``test`` = the held-back split, ``val`` = the carved one that
picked the epoch and the normaliser) and prints one markdown table: per seed, then mean and
sample standard deviation, for plain cosine and for the normaliser selected on val.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def row(run: Path) -> dict:
    m = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    if "test" not in m:
        raise SystemExit(f"{run}: metrics.json has no test split (was data.test_split set?)")
    sel = m["normalizer"]
    return {"run": run.name, "best_epoch": m["best_epoch"], "epochs_run": m["epochs_run"], "selected": sel,
            "val_plain": m["val"]["none"]["t2v"]["R@1"], "val_sel": m["val"][sel]["t2v"]["R@1"],
            "test_plain": m["test"]["none"]["t2v"]["R@1"], "test_sel": m["test"][sel]["t2v"]["R@1"]}


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    rows = [row(r) for r in p.parse_args(argv).runs]
    lines = ["| run | best epoch / run | selected on val | val t2i R@1 plain | val t2i R@1 selected "
             "| **dev t2i R@1 plain** | **dev t2i R@1 selected** |", "|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['best_epoch']} / {r['epochs_run']} | {r['selected']} | {r['val_plain']:.2f} "
                     f"| {r['val_sel']:.2f} | {r['test_plain']:.2f} | {r['test_sel']:.2f} |")
    if len(rows) > 1:
        def ms(k: str) -> str:
            v = np.array([r[k] for r in rows])
            return f"{v.mean():.2f} ± {v.std(ddof=1):.2f}"
        lines.append(f"| mean ± std ({len(rows)} seeds) | | | {ms('val_plain')} | {ms('val_sel')} "
                     f"| **{ms('test_plain')}** | **{ms('test_sel')}** |")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
