"""The documented path at scale (issue 34.6): ``configs/scale/linear_1m.yaml`` trains a layout of that
format as given (bench/scale.py reads the same file), ``xmodal data check`` reads the features in row
blocks (memory independent of their size) and still finds rows two splits share, a warm-up as long as
the run is cut with a note, and a listed normaliser the run cannot fit is named before training."""

from __future__ import annotations

import json
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import yaml

from xmodal.cli import main

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "scale" / "linear_1m.yaml"
pytestmark = pytest.mark.usefixtures("one_thread")


def _scale_layout(root: Path, n: int, seed: int = 0) -> Path:
    """A small layout in the format of bench/scale.py's generator (float16, 512-d video, 384-d text)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import scale
    finally:
        sys.path.remove(str(ROOT / "bench"))
    scale.make_layout(root, n, seed=seed, held=300, gallery=False)
    return root


def test_the_scale_recipe_trains_a_layout_of_its_format(tmp_path, capsys):
    data = _scale_layout(tmp_path / "data", 3000)
    rc = main(["train", str(RECIPE), "--out", str(tmp_path / "run"), f"data.root={data}",
               "test_time.bank_size=200", "train.device=cpu", "--threads", "1", "--no-plots"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "note:" not in out.err and "note:" not in out.out  # nothing listed that it cannot fit
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert set(metrics["val"]) == {"none", "sinkhorn", "protocol"}
    assert metrics["val"]["none"]["t2v"]["R@1"] > 100 * 10 / 300  # far above chance (1 in 300) after one epoch


def test_bench_scale_trains_the_shipped_recipe(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import scale
    finally:
        sys.path.remove(str(ROOT / "bench"))
    scale.write_config(tmp_path / "train.yaml", tmp_path, 128, 1, 0, 100)
    written, shipped = yaml.safe_load((tmp_path / "train.yaml").read_text()), yaml.safe_load(RECIPE.read_text())
    for section in ("model", "loss", "optim"):
        assert written[section] == shipped[section], section
    assert written["test_time"]["normalizers"] == shipped["test_time"]["normalizers"]


def test_data_check_reads_features_in_row_blocks_and_finds_shared_rows(tmp_path, capsys, monkeypatch):
    from xmodal.data import types

    rng = np.random.default_rng(0)
    n, dv, dt = 40000, 256, 128
    root = tmp_path / "data"
    root.mkdir()
    video = rng.standard_normal((n, dv), dtype=np.float32).astype(np.float16)
    np.save(root / "train_video_features.npy", video)
    np.save(root / "train_text_features.npy", rng.standard_normal((n, dt), dtype=np.float32).astype(np.float16))
    np.save(root / "train_text_to_video.npy", np.arange(n, dtype=np.int32))
    val = rng.standard_normal((50, dv), dtype=np.float32)
    val[[7, 30]] = video[[123, 39999]].astype(np.float32)  # the same values, stored as float32: leakage
    np.save(root / "val_video_features.npy", val)
    np.save(root / "val_text_features.npy", rng.standard_normal((50, dt), dtype=np.float32))
    np.save(root / "val_text_to_video.npy", np.arange(50, dtype=np.int32))
    del video
    monkeypatch.setattr(types, "BLOCK_ELEMENTS", 1 << 20)  # 4 MB float32 blocks at this size
    copies = n * (dv + dt) * 4  # what float32 copies of the training features take: 61 MB
    tracemalloc.start()
    try:
        rc = main(["data", "check", str(root)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    out = capsys.readouterr().out
    assert rc == 1
    assert "2 video(s) of 'train' and 'val' have identical features (leakage?): train rows [123, 39999], " \
           "val rows [7, 30]" in out
    assert peak < copies / 4, (peak, copies)


def test_a_warmup_as_long_as_the_run_is_cut_with_a_note(tmp_path, capsys):
    rc = main(["train", str(ROOT / "configs" / "synthetic.yaml"), "--out", str(tmp_path / "run"),
               "data.synthetic={num_train: 600, num_val: 60, num_test: 60, num_concepts: 10}", "train.epochs=1",
               "model.dim=16", "test_time.normalizers=[none]", "test_time.bank_size=50", "--threads", "1",
               "--no-plots"])
    err = capsys.readouterr().err
    assert rc == 0, err
    steps = 1800 // 128  # 3 captions per clip, batch 128 (configs/synthetic.yaml): 14 steps
    assert f"note: optim.warmup_epochs: the warm-up ({steps} steps) would last the whole run ({steps} steps)" in err
    (record,) = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert record["lr"] < 1e-3 * 0.05  # the last step's LR: decayed, not the peak a whole-run warm-up ends on


def test_a_normaliser_the_loss_cannot_fit_is_named_before_training(tmp_path, capsys):
    rc = main(["train", str(ROOT / "configs" / "synthetic.yaml"), "--out", str(tmp_path / "run"),
               "data.synthetic={num_train: 200, num_val: 40, num_test: 40, num_concepts: 6}", "train.epochs=2",
               "model.dim=8", "test_time.bank_size=50", "--threads", "1", "--no-plots"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "xmodal train: note: test_time.normalizers lists ncl, which is fitted on the NCL loss's query queue " \
           "(loss.name: ncl); with loss infonce it is left out" in out.err
