"""CLI: ``xmodal train`` / ``xmodal demo`` end to end on tiny synthetic data."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from xmodal.cli import main

REPO = Path(__file__).resolve().parents[1]
TINY = ["data.synthetic={num_train: 120, num_val: 60, num_test: 60, num_concepts: 10}",
        "train.epochs=2", "train.batch_size=32", "model.dim=16", "test_time.bank_size=100"]

pytestmark = pytest.mark.usefixtures("one_thread")


def test_train_cli_writes_run_and_plots(tmp_path, capsys):
    rc = main(["train", str(REPO / "configs/synthetic.yaml"), "--out", str(tmp_path / "run"), "--quiet",
               *TINY, "--set", "optim.lr=3e-3", "--optim.weight_decay", "0.01", "--train.seed=2"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "selected normaliser" in out and "t2v R@1" in out
    run = tmp_path / "run"
    for name in ("model.pt", "log.jsonl", "config.yaml", "curves.png", "retrieval_mass.png"):
        assert (run / name).is_file(), name
    saved = (run / "config.yaml").read_text()
    assert "lr: 0.003" in saved and "weight_decay: 0.01" in saved and "seed: 2" in saved


def test_train_cli_schedule_plot(tmp_path):
    rc = main(["train", str(REPO / "configs/synthetic.yaml"), "--out", str(tmp_path / "run"), "--quiet", *TINY,
               "schedule.kind=cosine", "schedule.period_epochs=1", "schedule.class_temperature=true",
               "schedule.classes=labels"])
    assert rc == 0
    assert (tmp_path / "run" / "schedule.png").is_file()


@pytest.mark.parametrize("override, field", [
    ("loss.name=nope", "loss.name"),
    ("loss.temperature=-1", "loss.temperature"),
    ("data.name=paired", "data.root"),
    ("train.colour=1", "train.colour"),
])
def test_train_cli_bad_config_is_one_line_error(tmp_path, capsys, override, field):
    rc = main(["train", str(REPO / "configs/synthetic.yaml"), "--out", str(tmp_path / "run"), override])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert field in err and len(err.splitlines()) == 1


def test_demo_small_end_to_end(capsys):
    rc = main(["demo", "--losses", "infonce,maxmargin", "--epochs", "2", "--num-train", "150", "--num-eval", "100", "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| objective | normaliser | t2v R@1" in out
    rows = [line for line in out.splitlines() if line.startswith("| infonce") or line.startswith("| maxmargin")]
    assert len(rows) == 2 * 4  # none, dn, sinkhorn, qbnorm (no NCL bank without the NCL loss)
    assert sum(" *" in r for r in rows) == 2  # one selected normaliser per objective
