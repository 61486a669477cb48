"""``xmodal.progress``: a bar on a terminal, plain lines (no carriage returns) in a log file, nothing when
silenced (issue 26.4); ``--quiet`` prints only the results (26.7)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from xmodal.cli import main
from xmodal.progress import Lines, interval, progress

REPO = Path(__file__).resolve().parents[1]


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_lines_every_interval_and_a_last_one(monkeypatch):
    clock = Clock()
    monkeypatch.setattr("xmodal.progress.time.monotonic", clock)
    out = io.StringIO()
    bar = progress(total=10, desc="encode videos", unit="video", file=out, every=30)
    assert isinstance(bar, Lines)
    for i in range(10):
        clock.t += 10  # one video every 10 s: a line at 30, 60, 90 s and the last one at close
        bar.update(1)
    bar.set_postfix_str("1,234 frames")
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines == [
        "encode videos: 3/10 videos (30%), 10 s per video, 30 s elapsed, about 1 min 10 s left",
        "encode videos: 6/10 videos (60%), 10 s per video, 1 min 00 s elapsed, about 40 s left",
        "encode videos: 9/10 videos (90%), 10 s per video, 1 min 30 s elapsed, about 10 s left",
        "encode videos: 10/10 videos (100%), 10 s per video, 1 min 40 s elapsed; 1,234 frames"]
    bar.close()  # closing twice prints nothing more
    assert len(out.getvalue().splitlines()) == 4


def test_silent_and_terminal_choices(monkeypatch):
    out = io.StringIO()
    for _ in progress(range(5), desc="x", file=out, show=False, every=0):
        pass
    assert out.getvalue() == ""

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    bar = progress(range(3), desc="bar", file=tty)
    assert not isinstance(bar, Lines) and list(bar) == [0, 1, 2]
    bar.close()
    assert "\r" in tty.getvalue()  # a real bar on a terminal


@pytest.mark.parametrize("value, want", [("5", 5.0), ("0", 0.0), ("-1", 30.0), ("nan", 30.0), ("x", 30.0)])
def test_interval_from_the_environment(monkeypatch, value, want):
    monkeypatch.setenv("XMODAL_PROGRESS_SECONDS", value)
    assert interval() == want


@pytest.mark.usefixtures("one_thread")
def test_train_quiet_prints_only_the_summary(tmp_path, capsys):
    tiny = ["data.synthetic={num_train: 80, num_val: 40, num_test: 40, num_concepts: 6}", "train.epochs=2",
            "train.batch_size=32", "model.dim=8", "test_time.bank_size=50", "--no-plots"]
    cfg = str(REPO / "configs/synthetic.yaml")
    assert main(["train", cfg, "--out", str(tmp_path / "a"), *tiny]) == 0
    out = capsys.readouterr().out
    assert "epoch   1/2" in out
    # 26.7: the config lists ncl among the normalisers; an InfoNCE run has no NCL queue and said nothing
    assert "note: test_time.normalizers lists ncl, left out: needs the NCL loss's query queue" in out
    assert main(["train", cfg, "--out", str(tmp_path / "b"), *tiny, "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "epoch   1/2" not in out and "selected normaliser" in out and err == ""


@pytest.mark.parametrize("module", ["xmodal.progress", "xmodal.features.video", "xmodal.features.folder"])
def test_doctests(module, tmp_path, monkeypatch):
    import doctest
    import importlib

    monkeypatch.chdir(tmp_path)  # the examples name files that do not exist
    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0, result
