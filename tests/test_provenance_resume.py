"""Resuming over changed data (issue 25.5): refused naming the file, or accepted with both sets of
hashes in ``provenance.json`` (the run directory never claims data it was not trained on)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from xmodal.cli import main
from xmodal.config import from_dict
from xmodal.training import provenance
from xmodal.training.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")


def _split(root: Path, split: str, n: int, rng: np.random.Generator) -> None:
    np.save(root / f"{split}_video_features.npy", rng.standard_normal((n, 8)).astype(np.float32))
    np.save(root / f"{split}_text_features.npy", rng.standard_normal((2 * n, 6)).astype(np.float32))
    np.save(root / f"{split}_text_to_video.npy", np.repeat(np.arange(n), 2))


def _config(data: Path) -> dict:
    return {"data": {"name": "paired", "root": str(data), "test_split": ""},
            "model": {"kind": "linear", "dim": 8}, "loss": {"name": "infonce", "temperature": 0.1},
            "test_time": {"normalizers": ["none"], "bank_size": 20},
            "train": {"seed": 0, "epochs": 3, "batch_size": 16, "patience": 0, "device": "cpu", "progress": False}}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def killed_run(tmp_path):
    """A run killed after 1 of 3 epochs, then one of its data files rewritten."""
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    _split(data, "train", 40, rng)
    _split(data, "val", 20, rng)
    cfg = from_dict(_config(data))
    run = tmp_path / "run"
    train(cfg, run, stop_after_epochs=1, verbose=False)
    changed = data / "train_video_features.npy"
    old_hash = _sha(changed)
    np.save(changed, rng.standard_normal((40, 8)).astype(np.float32))
    return cfg, run, changed, old_hash


def test_resume_over_changed_data_is_refused_naming_the_file(killed_run):
    cfg, run, changed, old_hash = killed_run
    before = {name: (run / name).read_bytes() for name in ("provenance.json", "config.yaml", "checkpoint.pt",
                                                             "log.jsonl")}
    with pytest.raises(ValueError) as exc:
        train(cfg, run, verbose=False)
    msg = str(exc.value)
    assert "\n" not in msg and str(changed.resolve()) in msg and "--accept-changed-data" in msg
    assert old_hash[:12] in msg
    # nothing of the run was touched: its record still says what epoch 1 was trained on
    assert {name: (run / name).read_bytes() for name in before} == before
    assert json.loads((run / "provenance.json").read_text())["data"][str(changed.resolve())] == old_hash


def test_accepting_changed_data_records_both_sets_of_hashes(killed_run):
    cfg, run, changed, old_hash = killed_run
    summary = train(cfg, run, verbose=False, accept_changed_data=True)
    assert summary["epochs_run"] == 3
    p = json.loads((run / "provenance.json").read_text())
    key = str(changed.resolve())
    assert p["data"][key] == _sha(changed) != old_hash  # what the later epochs read
    (entry,) = p["data_history"]
    assert entry["data"][key] == old_hash and entry["until_epoch"] == 1  # what epoch 1 read
    assert set(entry["data"]) == set(p["data"])
    assert entry["changes"] == [f"{key} changed (sha256 {old_hash[:12]}... -> {_sha(changed)[:12]}...)"]
    assert p["finished"] is not None and len(p["resumed"]) == 1


def test_resume_over_unchanged_data_goes_on_without_a_history(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(1)
    _split(data, "train", 40, rng)
    _split(data, "val", 20, rng)
    cfg = from_dict(_config(data))
    train(cfg, tmp_path / "run", stop_after_epochs=1, verbose=False)
    train(cfg, tmp_path / "run", verbose=False)
    p = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert "data_history" not in p and len(p["resumed"]) == 1 and p["finished"] is not None


def test_cli_refuses_in_one_line_and_accepts_with_the_flag(killed_run, tmp_path, capsys):
    cfg, run, changed, _ = killed_run
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(_config(changed.parent)))  # JSON is YAML
    assert main(["train", str(config), "--out", str(run), "--no-plots", "--threads", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("xmodal train: error: resume: the data changed") and "\n" not in err
    assert changed.name in err
    assert main(["train", str(config), "--out", str(run), "--no-plots", "--threads", "1",
                 "--accept-changed-data"]) == 0
    assert json.loads((run / "provenance.json").read_text())["data_history"][0]["until_epoch"] == 1


def test_data_changes_lists_changed_new_and_dropped_files():
    before = {"a": "1" * 64, "b": "2" * 64}
    after = {"a": "3" * 64, "c": "4" * 64}
    assert provenance.data_changes(before, after) == [
        f"a changed (sha256 {'1' * 12}... -> {'3' * 12}...)", "b is no longer read", "c is new"]
    assert provenance.data_changes(before, dict(before)) == []
