"""CI runs the reduced ``xmodal bench --quick`` grid end to end (issue: bench must fit CI)."""
import csv

import pytest

from xmodal.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_bench_quick_grid(tmp_path, capsys):
    assert main(["bench", "--quick", "--out", str(tmp_path), "--quiet"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    objectives = {r["objective"] for r in rows}
    assert objectives == {f"{o}{ts}" for o in ("infonce", "ncl", "crossclr", "calince") for ts in ("", "+TS++")}
    for r in rows:
        assert r["dataset"] == "synthetic" and r["n"] == "2"  # two seeds per cell
        for key in ("t2v R@1 mean", "v2t R@1 mean", "t2v R@10 mean"):
            assert 0.0 <= float(r[key]) <= 100.0
        assert float(r["t2v R@1 mean"]) <= float(r["t2v R@10 mean"])
        # the loss's own query bank exists only for NCL
        assert r["normalizer"] != "ncl" or r["objective"].startswith("ncl")
    assert "| objective | normaliser |" in (tmp_path / "results.md").read_text()
