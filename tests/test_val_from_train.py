"""data.val_from_train: validation carved out of the training split (issue 18 item 7)."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import xmodal.data as xdata
from xmodal.config import Config, validate
from xmodal.training.loop import carve_validation, load_splits


def _split(n=20, k=3, seed=0):
    rng = np.random.default_rng(seed)
    return xdata.PairedSplit.from_arrays(video=rng.standard_normal((n, 4)).astype(np.float32),
                                         text=rng.standard_normal((n * k, 5)).astype(np.float32),
                                         text_to_video=np.repeat(np.arange(n), k))


def test_carve_is_a_partition_with_every_text_following_its_video():
    split = _split()
    train, val = carve_validation(split, 6)
    assert (train.num_videos, val.num_videos) == (14, 6)
    assert (train.num_texts, val.num_texts) == (42, 18)
    # Naive check: every original video row lands in exactly one side, with its own texts.
    rows = {tuple(v): i for i, v in enumerate(split.video.tolist())}
    seen = []
    for part in (train, val):
        for j, v in enumerate(part.video.tolist()):
            i = rows[tuple(v)]
            seen.append(i)
            mine = part.text[part.text_to_video == j]
            np.testing.assert_array_equal(mine, split.text[split.text_to_video == i])
    assert sorted(seen) == list(range(split.num_videos))


def test_carve_is_fixed_across_training_seeds_and_bad_sizes_are_named():
    a = carve_validation(_split(), 5)[1].video
    b = carve_validation(_split(), 5)[1].video
    np.testing.assert_array_equal(a, b)
    for bad in (0, 20, 25):
        with pytest.raises(ValueError, match="data.val_from_train"):
            carve_validation(_split(), bad)


def test_load_splits_uses_the_carved_split_and_leaves_test_alone():
    cfg = Config()
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, val_from_train=10))
    splits = load_splits(cfg)
    full = load_splits(Config())
    assert splits["val"].num_videos == 10
    assert splits["train"].num_videos == full["train"].num_videos - 10
    np.testing.assert_array_equal(splits["test"].video, full["test"].video)
    with pytest.raises(ValueError, match="data.val_from_train"):
        validate(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, name="paired", root=".",
                                                                   val_from_train=-1)))


def test_cli_trains_a_file_dataset_with_no_val_split_on_disk(tmp_path):
    """``val_split: ''`` with ``val_from_train`` (the best_heldout.yaml preset's shape): the
    trainer, its size checks and the provenance record must not look for a val split (the
    provenance hash once asked the layout for split '' and every such run died before epoch 1)."""
    import json

    from xmodal.cli import main

    root = tmp_path / "data"
    _split(40, 2, seed=1).save(root, "train")
    _split(10, 2, seed=2).save(root, "dev")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"data: {{name: paired, root: {root}, train_split: train, val_split: '', "
                   "val_from_train: 8, test_split: dev}\nmodel: {kind: linear, dim: 8}\n"
                   "train: {epochs: 1, batch_size: 16}\ntest_time: {normalizers: [none]}\n")
    assert main(["train", str(cfg), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert "test" in metrics
    files = json.loads((tmp_path / "run" / "provenance.json").read_text())["data"]
    assert not any("val_" in Path(f).name or Path(f).name.startswith("_") for f in files)


def test_report_names_the_carved_rows_and_fit_needs_no_val(tmp_path):
    """The report of a carved run names the held-out training rows (carved_rows), and the
    in-memory ``fit`` accepts ``{"train", "test"}`` when val_from_train carves val."""
    from xmodal.cli import main
    from xmodal.config import from_dict
    from xmodal.training import fit
    from xmodal.training.loop import carved_rows

    root = tmp_path / "data"
    _split(30, 2, seed=1).save(root, "train")
    (root / "train_images.txt").write_text("".join(f"img{i:03d}.jpg\n" for i in range(30)))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"data: {{name: paired, root: {root}, val_split: '', val_from_train: 6, test_split: ''}}\n"
                   "model: {kind: linear, dim: 8}\ntrain: {epochs: 1, batch_size: 16}\n"
                   "test_time: {normalizers: [none]}\n")
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run), "--quiet"]) == 0
    assert main(["report", str(run), "--out", str(tmp_path / "r.html")]) == 0
    html = (tmp_path / "r.html").read_text()
    held = carved_rows(30, 6)[1]
    kept = carved_rows(30, 6)[0]
    assert any(f"img{i:03d}.jpg" in html for i in held)
    assert not any(f"img{i:03d}.jpg" in html for i in kept)
    config = from_dict({"data": {"val_from_train": 5}, "model": {"kind": "linear", "dim": 8},
                        "train": {"epochs": 1, "batch_size": 16}, "test_time": {"normalizers": ["none"]}})
    model, summary = fit(config, {"train": _split(30, 2), "test": _split(8, 2, seed=3)}, verbose=False,
                         progress=False)
    assert summary["test"]["none"]["t2v"]["R@1"] >= 0 and model.encode_text(np.ones((1, 5))).shape == (1, 8)
    with pytest.raises(ValueError, match="'train' and 'val'"):
        fit(from_dict({"model": {"kind": "linear", "dim": 8}}), {"train": _split(30, 2)}, verbose=False)
