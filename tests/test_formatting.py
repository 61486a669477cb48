"""One number format for metrics in every output (issue 23): the trainer's table, ``eval``, ``demo``,
``normalize``, the bench grid and the report print the same value the same way."""

from __future__ import annotations

import re

import pytest

from xmodal.metrics import format_metric, metric_digits

ROW = {"R@1": 15.4812, "R@5": 40.0, "R@10": 55.25, "MdR": 4.5, "MnR": 12.3456}


def _numbers(text: str) -> set[str]:
    return set(re.findall(r"\d+\.\d+|\d+", text))


def test_format_metric_rules():
    assert [format_metric(k, v) for k, v in ROW.items()] == ["15.48", "40.00", "55.25", "4.5", "12.3"]
    assert format_metric("t2v MdR", 4.0) == "4.0" and metric_digits("v2t MnR") == 1
    assert format_metric("mAP", 33.3333) == "33.33" and format_metric("nDCG", 1) == "1"
    assert format_metric("R@1", float("nan")) == "–" and format_metric("R@1", None) == "–"
    assert format_metric("R@1", 1.0, 0.256) == "1.00 ± 0.26"
    assert format_metric("R@1", 1.0, float("nan")) == "1.00"


def test_every_table_prints_mdr_the_same_way():
    from xmodal.commands.demo import format_table as demo_table
    from xmodal.commands.eval import format_table as eval_table
    from xmodal.commands.train import format_summary
    from xmodal.reporting.benchgrid import markdown
    from xmodal.reporting.report import results_tables

    m = {"t2v": dict(ROW), "v2t": dict(ROW)}
    summary = {"best_epoch": 1, "epochs_run": 2, "train_time_s": 1.0, "temperature": 0.05, "normalizer": "none",
               "val": {"none": m}, "test": {"none": m}}
    row = {"dataset": "synthetic", "noise": 0.0, "objective": "infonce", "normalizer": "none", "split": "test",
           "n": 1, "selected": "none", "train s": (3.0, float("nan")),
           **{f"{d} {k}": (v, float("nan")) for d in ("t2v", "v2t") for k, v in ROW.items()}}
    outputs = {
        "train": format_summary(summary),
        "eval": eval_table(m, "text_video"),
        "demo": demo_table({"infonce": summary}),
        "bench": markdown([row]),
        "report": "\n".join(results_tables({"val": {"none": m}, "normalizer": "none"})),
    }
    for name, text in outputs.items():
        nums = _numbers(text)
        assert {"15.48", "4.5", "12.3"} <= nums, (name, text)
        assert not {"4.50", "12.35", "15.5"} & nums, (name, text)


def test_normalize_table_uses_the_same_format():
    from xmodal.commands.normalize import _table

    result = {"before": dict(ROW), "after": dict(ROW), "normalization_error": None}
    text = _table(result, "dn", (1, 5, 10))
    assert {"15.48", "4.5", "12.3"} <= _numbers(text) and "4.50" not in text


def test_epoch_line_uses_the_same_format():
    from xmodal.training.runlog import epoch_line

    record = {"epoch": 1, "train_loss": 1.0, "epoch_time": 1.0, "val_rsum": 123.456,
              "val": {"t2v": dict(ROW), "v2t": dict(ROW)}}
    line = epoch_line(record, epochs=2, metric="rsum", improved=True, history=[record])
    assert "R@1 15.48" in line and "rsum 123.46" in line


@pytest.mark.parametrize("value", [4.0, 4.5, 101.5])
def test_mdr_in_the_trainer_table_keeps_its_half(value):
    from xmodal.commands.train import format_summary

    m = {"t2v": {**ROW, "MdR": value}, "v2t": dict(ROW)}
    text = format_summary({"best_epoch": 1, "epochs_run": 1, "train_time_s": 1.0, "temperature": 0.05,
                           "normalizer": "none", "val": {"none": m}})
    assert f"{value:.1f}" in text.split()
