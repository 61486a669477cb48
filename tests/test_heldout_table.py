"""bench/heldout_table.py: the held-out and refit tables read the right numbers, and a "refit"
whose weights were selected on dev (train.keep: best) is refused."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("heldout_table", ROOT / "bench" / "heldout_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _r1(x):
    return {"t2v": {"R@1": x}}


def _run(tmp_path, name, *, keep, plain, qb, ema=0.0, test=None):
    run = tmp_path / name
    run.mkdir()
    m = {"best_epoch": 4, "epochs_run": 6, "normalizer": "qbnorm", "val": {"none": _r1(plain), "qbnorm": _r1(qb)}}
    if test:
        m["test"] = {"none": _r1(test[0]), "qbnorm": _r1(test[1])}
    (run / "metrics.json").write_text(json.dumps(m))
    (run / "config.yaml").write_text(yaml.safe_dump({"train": {"keep": keep}, "optim": {"ema": ema}}))
    return run


def test_refit_table_reads_dev_plain_and_the_named_normaliser(tmp_path):
    runs = [_run(tmp_path, f"s{i}", keep="last", plain=20.0 + i, qb=21.0 + 2 * i, ema=0.998) for i in range(3)]
    text = _module().main(["--refit", "qbnorm", *map(str, runs)])
    assert "| s1 | 6 | 0.998 | 21.00 | 23.00 |" in text
    assert "**21.00 ± 1.00** | **23.00 ± 2.00**" in text


def test_refit_selected_on_dev_is_refused(tmp_path):
    run = _run(tmp_path, "s0", keep="best", plain=20.0, qb=21.0)
    with pytest.raises(SystemExit, match="keep is not 'last'"):
        _module().main(["--refit", "qbnorm", str(run)])
    with pytest.raises(SystemExit, match="no 'dsl'"):
        _module().main(["--refit", "dsl", str(_run(tmp_path, "s1", keep="last", plain=1.0, qb=2.0))])


def test_heldout_table_reads_test_with_the_val_selection(tmp_path):
    runs = [_run(tmp_path, f"h{i}", keep="best", plain=19.0, qb=20.0, test=(21.0 + i, 22.0 + i)) for i in range(2)]
    text = _module().main([str(r) for r in runs])
    assert "| h0 | 4 / 6 | qbnorm | 19.00 | 20.00 | 21.00 | 22.00 |" in text
    assert "**21.50 ± 0.71** | **22.50 ± 0.71**" in text
