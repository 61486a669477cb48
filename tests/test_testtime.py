"""Test-time pipeline of a run: normalisers fitted once and stored, ``model.similarity``
reproduces metrics.json, NCL's queue bank by default, the oracle reported but never
selected, no refitting of stored state."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import xmodal
from xmodal.config import from_dict
from xmodal.data import synthetic
from xmodal.metrics import retrieval
from xmodal.retrieval.testtime import TestTime, fit_normalizer, fit_test_time, select, uses_test_queries
from xmodal.training.loop import train

TINY = {"num_train": 120, "num_val": 60, "num_test": 60, "num_concepts": 10}
pytestmark = pytest.mark.usefixtures("one_thread")


def _ncl_config(seed):
    # test_time.normalizers left at its default: "ncl" must be in it for a loss with a query bank
    return from_dict({
        "data": {"name": "synthetic", "synthetic": dict(TINY)}, "model": {"dim": 16},
        "loss": {"name": "ncl", "temperature": 0.1, "kwargs": {"queue_size": 64}}, "optim": {"lr": 3e-3},
        "test_time": {"bank_size": 100}, "train": {"seed": seed, "epochs": 2, "batch_size": 32, "patience": 0,
                                                   "progress": False}})


def _recall_only(metrics):
    """The recall keys (labelled splits also carry mAP / nDCG, from their label relevancy)."""
    return {d: {k: v for k, v in m.items() if k not in ("mAP", "nDCG")} for d, m in metrics.items()}


def _metrics_naive(t2v, v2t, text_to_video):
    """t2v: each text's own video; v2t: a video's own captions (any of them)."""
    own = text_to_video[None, :] == np.arange(v2t.shape[0])[:, None]
    return {"t2v": retrieval(t2v, text_to_video), "v2t": retrieval(v2t, own)}


@pytest.mark.parametrize("seed", [0, 1])
def test_model_similarity_reproduces_metrics_json_exactly(tmp_path, seed):
    summary = train(_ncl_config(seed), tmp_path)
    written = json.loads((tmp_path / "metrics.json").read_text())
    model = xmodal.load_model(tmp_path)
    assert isinstance(model.test_time, TestTime)
    assert "ncl" in model.test_time.names and "ncl" in written["test"]
    assert model.test_time.selected == summary["normalizer"] == written["normalizer"]
    test = synthetic(**TINY, seed=seed)["test"]
    for name in [*(n for n in written["test"] if n != "protocol"), "selected"]:
        t2v = model.similarity(test.text, test.video, normalizer=name)
        v2t = model.similarity(test.text, test.video, normalizer=name, direction="v2t")
        assert t2v.shape == (test.num_texts, test.num_videos) and v2t.shape == (test.num_videos, test.num_texts)
        key = written["normalizer"] if name == "selected" else name
        assert _metrics_naive(t2v, v2t, test.text_to_video) == _recall_only(written["test"][key]), name
    # the oracle is in the table but never selected, and also reproduced
    assert set(written["oracle"]["test"]) == {"sinkhorn_oracle"}
    assert written["normalizer"] != "sinkhorn_oracle"
    t2v = model.similarity(test.text, test.video, normalizer="ncl_oracle")
    v2t = model.similarity(test.text, test.video, normalizer="sinkhorn_oracle", direction="v2t")
    assert _metrics_naive(t2v, v2t, test.text_to_video) == _recall_only(written["oracle"]["test"]["sinkhorn_oracle"])


def test_stored_state_is_used_not_refitted(tmp_path, monkeypatch):
    train(_ncl_config(0), tmp_path)
    model = xmodal.load_model(tmp_path)
    test = synthetic(**TINY, seed=0)["test"]
    before = {n: model.similarity(test.text, test.video, n) for n in ("dn", "ncl")}
    from xmodal.normalize import DistributionNormalization

    def no_fit(*a, **k):
        raise AssertionError("DN refitted")

    monkeypatch.setattr(DistributionNormalization, "fit", no_fit)
    text, video = model.encode_text(test.text), model.encode_video(test.video)
    # DN: the stored means, in float64 from the formula (x - lam mu_x) . (y - lam mu_y)
    dn = model.test_time.dn
    lam = dn["hparams"]["lam"]
    mu_q, mu_g = dn["tensors"]["mu_q"].double(), dn["tensors"]["mu_g"].double()
    ref = (text.double() - lam * mu_q) @ (video.double() - lam * mu_g).T
    torch.testing.assert_close(model.similarity(test.text, test.video, "dn").double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.similarity(test.text, test.video, "dn"), before["dn"])
    # NCL: biases against this gallery from the stored queue (not from the test queries)
    bank_t, _ = model.test_time.banks["ncl"]
    bias = fit_normalizer("sinkhorn", text, video, bank_t, temperature=model.temperature, iters=4).bias
    torch.testing.assert_close(before["ncl"], text @ video.T + bias[None, :])
    assert len(bank_t) == 64  # the loss's queue, full after 2 epochs x 11 steps x 32


def test_selection_ignores_test_query_normalisers():
    tt = TestTime(names=("none", "dn", "dsl"))
    val = {"none": {"s": 1.0}, "dn": {"s": 2.0}, "dsl": {"s": 9.0}}
    assert select(tt, val, lambda m: m["s"]) == "dn"
    assert uses_test_queries("dsl") and uses_test_queries("ncl_oracle") and not uses_test_queries("ncl")
    val["dn"]["s"] = 1.0  # ties prefer none
    assert select(tt, val, lambda m: m["s"]) == "none"


def test_ncl_dropped_without_a_bank_and_unknown_names_rejected():
    g = torch.Generator().manual_seed(0)
    t, v = torch.randn(30, 4, generator=g), torch.randn(30, 4, generator=g)
    tt = fit_test_time(["none", "ncl", "sinkhorn"], text_bank=t, video_bank=v, temperature=0.05)
    assert tt.names == ("none", "sinkhorn")
    with pytest.raises(ValueError, match="normalizer"):
        tt.similarity(t, v, "ncl")
    with pytest.raises(ValueError, match="normalizer"):
        tt.similarity(t, v, "magic")
    with pytest.raises(ValueError, match="direction"):
        tt.similarity(t, v, "none", direction="sideways")
    state = TestTime.from_state_dict(tt.state_dict())
    torch.testing.assert_close(state.similarity(t, v, "sinkhorn"), tt.similarity(t, v, "sinkhorn"))


def test_legacy_dict_test_time_is_converted():
    g = torch.Generator().manual_seed(0)
    t, v = torch.randn(30, 4, generator=g), torch.randn(30, 4, generator=g)
    legacy = {"normalizer": "dn", "text_bank": t, "video_bank": v, "temperature": 0.07,
              "kwargs": {"dn": {"lam": 0.25}, "sinkhorn": {"temperature": 0.07, "iters": 4}},
              "val": {"none": {}, "dn": {}, "sinkhorn": {}}}
    tt = TestTime.from_state_dict(legacy)
    assert tt.selected == "dn" and tt.names == ("none", "dn", "sinkhorn") and tt.temperature == 0.07
    assert tt["normalizer"] == "dn"
    fresh = fit_test_time(["none", "dn", "sinkhorn"], text_bank=t, video_bank=v, temperature=0.07)
    for name in tt.names:
        torch.testing.assert_close(tt.similarity(t[:5], v, name), fresh.similarity(t[:5], v, name))


def test_bench_scripts_do_not_import_cli_modules():
    from pathlib import Path

    for p in (Path(__file__).resolve().parents[1] / "bench").glob("*.py"):
        assert "xmodal.commands" not in p.read_text(), p.name
