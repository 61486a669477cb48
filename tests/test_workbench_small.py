"""Small things of issue 16: ``index --normalizer selected`` on a run that selected a
normaliser an index cannot hold; report plots (legend placement, integer epoch ticks,
image/video wording)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from xmodal.cli import main
from xmodal.config import from_dict
from xmodal.training.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("wb_small")
    cfg = from_dict({
        "data": {"name": "synthetic", "synthetic": {"num_train": 120, "num_val": 60, "num_test": 60,
                                                     "num_concepts": 10}},
        "model": {"kind": "linear", "dim": 16}, "loss": {"name": "infonce", "temperature": 0.05},
        "test_time": {"normalizers": ["none", "dn", "sinkhorn", "qbnorm"], "bank_size": 100},
        "train": {"seed": 0, "epochs": 3, "batch_size": 32, "device": "cpu"},
    })
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    train(cfg, root / "run", resume=False, progress=False, verbose=False)
    torch.set_num_threads(before)
    return root / "run"


def _as_if_selected(run_dir, tmp_path, name: str, boost: str):
    """A copy of the run whose stored choice on val is ``name`` (as when QB-Norm wins on val),
    with ``boost``'s val R@1 raised so the fallback is not trivially ``none``."""
    payload = torch.load(run_dir / "model.pt", weights_only=True)
    payload["model"]["test_time"]["selected"] = name
    payload["model"]["test_time"]["val"][boost]["t2v"]["R@1"] += 50.0
    out = tmp_path / "qb_run"
    out.mkdir()
    torch.save(payload, out / "model.pt")
    return out, payload


def test_index_selected_falls_back_to_best_foldable_and_says_so(run_dir, tmp_path, capsys):
    pytest.importorskip("faiss")
    from xmodal.evaluate import score

    run, payload = _as_if_selected(run_dir, tmp_path, "qbnorm", boost="dn")
    val = payload["model"]["test_time"]["val"]
    metric = payload["config"]["train"]["metric"]
    foldable = [n for n in ("none", "dn", "sinkhorn") if n in val]
    expected = max(foldable, key=lambda n: (score(val[n], metric), n == "none"))  # independent pick
    feats = tmp_path / "v.npy"
    in_dim = payload["model"]["architecture"]["video"]["in_dim"]
    np.save(feats, np.random.default_rng(0).standard_normal((30, in_dim)).astype(np.float32))
    assert main(["index", "--run", str(run), "--video-features", str(feats), "--out", str(tmp_path / "idx")]) == 0
    out = capsys.readouterr()
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    assert meta["normalizer"] == expected == "dn" and meta["fallback_from"] == "qbnorm"
    assert "qbnorm" in out.err and f"using {expected}" in out.err and "cannot be folded" in out.err
    # naming qbnorm explicitly still refuses (the user asked for it)
    assert main(["index", "--run", str(run), "--video-features", str(feats), "--out", str(tmp_path / "i2"),
                 "--normalizer", "qbnorm"]) == 2
