"""``xmodal bench --ncl-queue-sizes`` (NCL Fig. 5) and bench's CLI conventions."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from xmodal.reporting.benchgrid import Cell, run_cell
from xmodal.cli import main

TINY = {"num_train": 100, "num_val": 50, "num_test": 50, "num_concepts": 8}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("seed", [0, 3])
def test_small_queue_is_the_newest_rows_of_a_large_one(tmp_path, seed):
    """The premise of the one-run sweep: the queue never enters the loss, so a run with
    queue_size=K keeps exactly the first K rows (newest first) of the same run's larger queue."""
    from xmodal.models import load_model

    banks = {}
    for k in (40, 300):
        run_cell(Cell("synthetic", "ncl", False, seed, queue_size=k), tmp_path, epochs=2, synthetic=TINY)
        banks[k] = load_model(tmp_path / "runs" / f"synthetic/ncl-queue{k}/seed{seed}").test_time.banks["ncl"]
    for small, large in zip(banks[40], banks[300]):
        assert small.shape[0] == 40 and large.shape[0] == 300
        torch.testing.assert_close(small, large[:40], rtol=0, atol=0)


def test_queue_sweep_cli_table_matches_manual_evaluation(tmp_path, capsys, monkeypatch):
    import xmodal.reporting.benchgrid as bg
    from xmodal.config import load_config
    from xmodal.metrics import retrieval
    from xmodal.models import load_model
    from xmodal.normalize import SinkhornBias
    from xmodal.training.loop import load_splits

    monkeypatch.setitem(bg.DATASETS["synthetic"]["data"], "synthetic", TINY)
    rc = main(["bench", "--datasets", "synthetic", "--ncl-queue-sizes", "256,32", "--seeds", "0,1",
               "--epochs", "2", "--out", str(tmp_path), "--no-progress", "--threads", "1"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "NCL Fig. 5" in out and "| 32 | 32 |" in out
    assert (tmp_path / "report.html").is_file() and "ncl queue=32" in (tmp_path / "report.html").read_text()
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert {(r["objective"], r["normalizer"]) for r in rows} == {
        (f"ncl queue={k}", n) for k in (32, 256) for n in ("none", "ncl")}
    cell = {(r["objective"], r["normalizer"]): float(r["t2v R@1 mean"]) for r in rows}
    assert cell[("ncl queue=32", "none")] == cell[("ncl queue=256", "none")]  # no normaliser: size-free
    # independent recomputation of the K=32 ncl cell: cut the bank by hand, fit the biases, rank
    manual = []
    for seed in (0, 1):
        run = tmp_path / "runs" / f"synthetic/ncl-queue256/seed{seed}"
        model = load_model(run)
        test = load_splits(load_config(run / "config.yaml"))["test"]
        text = model.encode_text(test.text)
        video = model.encode_video(*test.video_input())
        bank = model.test_time.banks["ncl"][0][:32]
        sim = text @ video.T
        bias = SinkhornBias(model.temperature, iters=model.test_time.hparams["iters"]).fit(bank, video)
        manual.append(retrieval(bias(sim), test.text_to_video)["R@1"])
    assert cell[("ncl queue=32", "ncl")] == pytest.approx(np.mean(manual), abs=1e-3)


def test_bench_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["bench", "--ncl-queue-sizes", "0,16", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--ncl-queue-sizes" in err and err.count("\n") == 1
    assert main(["bench", "--threads", "0", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("xmodal bench: error:") and "--threads" in err and err.count("\n") == 1
