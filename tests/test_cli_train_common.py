"""``xmodal train``: the common --threads / --progress flags (bars only on a terminal)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
import torch

from xmodal.cli import main
from xmodal.commands.train import _progress
from xmodal.config import Config, from_dict

REPO = Path(__file__).resolve().parents[1]
TINY = ["data.synthetic={num_train: 80, num_val: 40, num_test: 40, num_concepts: 6}",
        "train.epochs=2", "train.batch_size=32", "model.dim=8", "test_time.bank_size=50", "--no-plots"]

pytestmark = pytest.mark.usefixtures("one_thread")


def _train(tmp_path, *flags):
    return main(["train", str(REPO / "configs/synthetic.yaml"), "--out", str(tmp_path / "run"), *TINY, *flags])


def test_no_bars_when_stderr_is_not_a_terminal(tmp_path, capsys):
    assert _train(tmp_path) == 0
    err = capsys.readouterr().err
    assert "epoch 1/2" not in err and "it/s" not in err


def test_progress_flag_forces_bars_and_quiet_is_an_alias(tmp_path, capsys):
    assert _train(tmp_path, "--progress", "--no-resume") == 0
    assert "epoch 1/2" in capsys.readouterr().err
    assert _train(tmp_path, "--quiet", "--no-resume") == 0
    assert "epoch 1/2" not in capsys.readouterr().err


@pytest.mark.parametrize("flag, tty, cfg_progress, expected", [
    (None, False, True, "lines"), (None, True, True, "bar"), (None, True, False, "lines"),
    (True, False, False, "bar"), (False, True, True, None)])
def test_progress_rule(monkeypatch, flag, tty, cfg_progress, expected):
    """Bars on a terminal (when train.progress allows them), a line every 30 s otherwise (a log file),
    nothing with --no-progress / --quiet."""
    from xmodal.training.loop import _progress_mode

    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    cfg = from_dict({"train": {"progress": cfg_progress}})
    assert isinstance(cfg, Config)
    assert _progress_mode(_progress(argparse.Namespace(progress=flag), cfg), cfg.train.progress, True) == expected
    assert _progress_mode(_progress(argparse.Namespace(progress=flag), cfg), cfg.train.progress, False) is None


def test_threads_after_config_are_applied(tmp_path):
    try:
        assert _train(tmp_path, "--threads", "2") == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)


@pytest.mark.parametrize("value", ["0", "x"])
def test_bad_threads_is_a_one_line_error(tmp_path, capsys, value):
    assert _train(tmp_path, "--threads", value) == 2
    err = capsys.readouterr().err
    assert err.startswith("xmodal train: error:") and "--threads" in err and err.count("\n") == 1


def test_help_lists_the_common_options(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    assert "--threads N" in text and "--progress" in text and "--quiet" in text
