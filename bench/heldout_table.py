"""Dev (pure test) text->image R@1 of runs whose validation split was carved out of train.

    python bench/heldout_table.py runs/f8k_heldout_s0 runs/f8k_heldout_s1 runs/f8k_heldout_s2

Reads each run's ``metrics.json`` (``test`` = the held-back split, ``val`` = the carved one that
picked the epoch and the normaliser) and prints one markdown table: per seed, then mean and
sample standard deviation, for plain cosine and for the normaliser selected on val.

    python bench/heldout_table.py --refit qbnorm runs/f8k_refit_s0 runs/f8k_refit_s1 runs/f8k_refit_s2

``--refit NORMALISER``: runs trained on the whole train split for a fixed number of epochs (the
held-out runs' selected epoch) with ``train.keep: last``, whose ``val`` split is dev. Nothing in
them is selected on dev: the weights are the last epoch's (checked in the run's config) and the
normaliser is the one given (the held-out runs' choice), read beside plain cosine.
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


def mean_std(rows: list[dict], key: str) -> str:
    """``mean ± sample std`` of ``key`` over the rows (two decimals)."""
    v = np.array([r[key] for r in rows])
    return f"{v.mean():.2f} ± {v.std(ddof=1):.2f}"


def refit_row(run: Path, normalizer: str) -> dict:
    import yaml

    m = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    cfg = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    if cfg["train"].get("keep") != "last":
        raise SystemExit(f"{run}: train.keep is not 'last': its weights were selected on dev, not a refit")
    if normalizer not in m["val"]:
        raise SystemExit(f"{run}: no {normalizer!r} in metrics.json (normalisers: {', '.join(m['val'])})")
    return {"run": run.name, "epochs": m["epochs_run"], "ema": cfg["optim"].get("ema", 0.0),
            "plain": m["val"]["none"]["t2v"]["R@1"], "norm": m["val"][normalizer]["t2v"]["R@1"]}


def refit_table(runs: list[Path], normalizer: str) -> str:
    rows = [refit_row(r, normalizer) for r in runs]
    lines = [f"| run | epochs (last kept) | optim.ema | **dev t2i R@1 plain** | **dev t2i R@1 {normalizer}** |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['epochs']} | {r['ema']:g} | {r['plain']:.2f} | {r['norm']:.2f} |")
    if len(rows) > 1:
        lines.append(f"| mean ± std ({len(rows)} seeds) | | | **{mean_std(rows, 'plain')}** "
                     f"| **{mean_std(rows, 'norm')}** |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--refit", metavar="NORMALISER", default=None,
                   help="the runs are refits (train.keep: last, val = dev): read dev plain and with NORMALISER")
    args = p.parse_args(argv)
    if args.refit:
        text = refit_table(args.runs, args.refit)
        print(text)
        return text
    rows = [row(r) for r in args.runs]
    lines = ["| run | best epoch / run | selected on val | val t2i R@1 plain | val t2i R@1 selected "
             "| **dev t2i R@1 plain** | **dev t2i R@1 selected** |", "|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['best_epoch']} / {r['epochs_run']} | {r['selected']} | {r['val_plain']:.2f} "
                     f"| {r['val_sel']:.2f} | {r['test_plain']:.2f} | {r['test_sel']:.2f} |")
    if len(rows) > 1:
        ms = [mean_std(rows, k) for k in ("val_plain", "val_sel", "test_plain", "test_sel")]
        lines.append(f"| mean ± std ({len(rows)} seeds) | | | {ms[0]} | {ms[1]} | **{ms[2]}** | **{ms[3]}** |")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
