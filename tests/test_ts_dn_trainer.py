"""TS++ presets (thesis eqs. 4.1-4.6), margin bounds, relevancy -> per-epoch mAP/nDCG and
selection by mAP T->V, DN's validation protocol (``test_time.dn_source: val``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import xmodal
import xmodal.data as xdata
from xmodal.config import from_dict, load_config
from xmodal.data import PairedSplit
from xmodal.retrieval.evaluate import embed_split, retrieval_metrics, score
from xmodal.losses import build_loss
from xmodal.training.sampling import epoch_batches
from xmodal.training.schedule_plan import TemperaturePlan, cosine_period
from xmodal.training.loop import train

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "ts"
TINY = {"num_train": 120, "num_val": 60, "num_test": 60, "num_concepts": 10}

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------- literal thesis equations (float64)
def corr_cosine(t, alpha, period):  # eq. 4.1
    return (alpha * (1 + math.cos(2 * math.pi * t / period)) - alpha) / 2


def class_value(k_c, counts, lo, hi):  # eqs. 4.3 / 4.4
    return ((k_c - min(counts)) / (max(counts) - min(counts))) * (hi - lo) + lo


def _plan(cfg):
    splits = xdata.synthetic(**cfg.data.synthetic, seed=cfg.train.seed)
    tr = splits["train"]
    spe = len(epoch_batches(0, seed=cfg.train.seed, text_to_video=tr.text_to_video,
                            batch_size=cfg.train.batch_size, sampling=cfg.train.sampling,
                            captions_per_video=cfg.train.captions_per_video))
    loss = build_loss(cfg.loss.name, **({"margin": cfg.loss.margin} if cfg.loss.margin is not None
                                        else {"temperature": cfg.loss.temperature}))
    return TemperaturePlan(cfg, loss, tr, spe), tr, spe


@pytest.mark.parametrize("name,base,lo_key,hi_key", [
    ("ts_infonce_synthetic", 0.07, "t_min", "t_max"),
    ("ts_mimaxmargin_synthetic", 0.2, "m_min", "m_max"),
])
def test_preset_ends_at_peak_with_thesis_values(name, base, lo_key, hi_key):
    cfg = load_config(CONFIGS / f"{name}.yaml")
    s = cfg.schedule
    assert s.kind == "cosine" and s.cycles >= 3 and cfg.train.patience == 0 and cfg.train.metric == "map"
    plan, tr, spe = _plan(cfg)
    assert plan.base == pytest.approx(base)
    total = cfg.train.epochs * spe
    period = (total - 1) / s.cycles  # whole cycles from step 0 to the last step
    last = total - 1
    assert corr_cosine(last, s.alpha, period) == pytest.approx(s.alpha / 2, abs=1e-12)  # the peak
    # the cosine peaks (local maxima of eq. 4.1 over the integer steps) are cycles + 1 (both ends included)
    vals = [corr_cosine(t, s.alpha, period) for t in range(total)]
    peaks = [t for t in range(total) if vals[t] >= max(vals[max(0, t - 1):t + 2]) and vals[t] > 0]
    assert len(peaks) == s.cycles + 1 and peaks[-1] == last
    # eqs. 4.3-4.6 per sample at the last step, classes = the labels
    labels = tr.text_labels
    uniq, inverse = np.unique(labels, return_inverse=True)
    counts = np.bincount(inverse).astype(float)
    lo, hi = getattr(s, lo_key), getattr(s, hi_key)
    rows = np.arange(min(40, tr.num_texts))
    got = plan(last, rows).double().numpy()
    want = [class_value(counts[inverse[i]], counts, lo, hi) + corr_cosine(last, s.alpha, period) for i in rows]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # the most frequent class ends at its maximum + alpha/2 (sec. 4.1.2: frequent classes high)
    assert plan.class_values.max() == pytest.approx(hi) and plan.class_values.min() == pytest.approx(lo)
    assert cosine_period(cycles=s.cycles, period_epochs=s.period_epochs, steps_per_epoch=spe,
                         epochs=cfg.train.epochs) == pytest.approx(period)


def test_margin_losses_use_margin_bounds_not_temperature_bounds():
    cfg = load_config(CONFIGS / "ts_mimaxmargin_synthetic.yaml",
                      ["schedule.m_min=0.15", "schedule.m_max=0.35", "schedule.t_min=0.03", "schedule.t_max=0.1",
                       "data.synthetic={num_train: 100, num_val: 40, num_test: 40}"])
    plan, _, _ = _plan(cfg)
    assert plan.class_values.min() == pytest.approx(0.15) and plan.class_values.max() == pytest.approx(0.35)
    cfg_t = load_config(CONFIGS / "ts_infonce_synthetic.yaml",
                        ["schedule.m_min=0.15", "schedule.m_max=0.35",
                         "data.synthetic={num_train: 100, num_val: 40, num_test: 40}"])
    plan_t, _, _ = _plan(cfg_t)
    assert plan_t.class_values.max() == pytest.approx(cfg_t.schedule.t_max)


@pytest.mark.parametrize("override,word", [
    ("schedule.m_min=0.4", "schedule.m_min"), ("schedule.m_max=-1", "schedule.m_max"),
    ("schedule.cycles=-1", "schedule.cycles"), ("test_time.dn_source=test", "test_time.dn_source"),
    ("test_time.dn_seeds=0", "test_time.dn_seeds"), ("train.metric=ndcg", "train.metric"),
])
def test_config_rejects(override, word):
    with pytest.raises(ValueError, match=word):
        load_config(None, [override])


# ----------------------------------------------------------------- relevancy and mAP / nDCG
def naive_ap(scores, rel):
    order = sorted(range(len(scores)), key=lambda j: -scores[j])
    hits, total = 0.0, []
    for k, j in enumerate(order, 1):
        if rel[j] == 1:
            hits += 1
            total.append(hits / k)
    return sum(total) / len(total)


def naive_ndcg(scores, rel):
    order = sorted(range(len(scores)), key=lambda j: -scores[j])
    r = int(sum(1 for x in rel if x > 0))
    dcg = sum(rel[j] / math.log2(k + 1) for k, j in enumerate(order[:r], 1))
    idcg = sum(x / math.log2(k + 1) for k, x in enumerate(sorted(rel, reverse=True)[:r], 1))
    return dcg / idcg


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_label_relevancy_and_map_against_naive(seed):
    g = np.random.default_rng(seed)
    nv, per = 7 + seed, 2
    labels = g.integers(0, 3, nv)
    t2v = np.repeat(np.arange(nv), per)
    split = PairedSplit.from_arrays(video=g.standard_normal((nv, 4)), text=g.standard_normal((nv * per, 4)),
                                    text_to_video=t2v, video_labels=labels)
    rel = split.mir_relevancy()
    want = np.array([[float(labels[t2v[i]] == labels[j]) for j in range(nv)] for i in range(nv * per)])
    np.testing.assert_array_equal(rel, want)
    sim = torch.as_tensor(g.standard_normal((nv * per, nv)))  # continuous: no ties
    m = retrieval_metrics(sim, None, t2v, rel)
    s = sim.numpy()
    assert m["t2v"]["mAP"] == pytest.approx(100 * np.mean([naive_ap(s[i], want[i]) for i in range(len(s))]),
                                            abs=1e-4)
    assert m["v2t"]["mAP"] == pytest.approx(100 * np.mean([naive_ap(s[:, j], want[:, j]) for j in range(nv)]),
                                            abs=1e-4)
    assert m["t2v"]["nDCG"] == pytest.approx(100 * np.mean([naive_ndcg(s[i], want[i]) for i in range(len(s))]),
                                             abs=1e-4)
    assert score(m, "map") == m["t2v"]["mAP"]
    explicit = PairedSplit.from_arrays(video=np.eye(nv), text=np.ones((nv * per, nv)), text_to_video=t2v,
                                       video_labels=labels, relevancy=np.full((nv * per, nv), 0.5))
    assert float(explicit.mir_relevancy().mean()) == 0.5  # an explicit relevancy wins over labels
    assert explicit.subset([0, 2]).relevancy.shape == (2 * per, 2)


def test_relevancy_file_and_errors(tmp_path):
    g = np.random.default_rng(0)
    np.save(tmp_path / "s_video_features.npy", g.standard_normal((3, 4)).astype(np.float32))
    np.save(tmp_path / "s_text_features.npy", g.standard_normal((6, 5)).astype(np.float32))
    np.save(tmp_path / "s_text_to_video.npy", np.repeat(np.arange(3), 2))
    assert xdata.load_paired_split(tmp_path, "s").mir_relevancy() is None
    rel = g.random((6, 3))
    np.save(tmp_path / "s_relevancy.npy", rel)
    np.testing.assert_allclose(xdata.load_paired_split(tmp_path, "s").relevancy, rel, rtol=1e-6)
    np.save(tmp_path / "s_relevancy.npy", rel[:, :2])
    with pytest.raises(ValueError, match="s_relevancy.npy"):
        xdata.load_paired_split(tmp_path, "s")
    with pytest.raises(ValueError, match="relevancy"):
        PairedSplit.from_arrays(video=np.eye(3), text=np.eye(3), text_to_video=[0, 1, 2],
                                relevancy=np.full((3, 3), 1.5))
    with pytest.raises(ValueError, match="metric"):
        score(retrieval_metrics(torch.eye(3), None, np.arange(3)), "map")


def _tiny(**sections):
    d = {"data": {"name": "synthetic", "synthetic": dict(TINY)}, "model": {"kind": "linear", "dim": 16},
         "loss": {"name": "infonce", "temperature": 0.1},
         "optim": {"name": "adam", "lr": 3e-3, "warmup_epochs": 1},
         "test_time": {"normalizers": ["none", "dn", "sinkhorn"], "bank_size": 100},
         "train": {"seed": 3, "epochs": 5, "batch_size": 32, "patience": 0, "progress": False}}
    for name, values in sections.items():
        d.setdefault(name, {}).update(values)
    return from_dict(d)


def test_metric_map_without_relevancy_raises(tmp_path):
    from xmodal.training import loop as train_mod

    cfg = _tiny(train={"metric": "map"})
    real = train_mod.load_splits

    def no_labels(c):
        out = real(c)
        out["val"] = PairedSplit(video=out["val"].video, text=out["val"].text,
                                 text_to_video=out["val"].text_to_video)
        return out

    train_mod.load_splits = no_labels
    try:
        with pytest.raises(ValueError, match="train.metric"):
            train(cfg, tmp_path / "run")
    finally:
        train_mod.load_splits = real


def test_selection_by_map_and_dn_val_protocol(tmp_path):
    """One run: the best epoch is the one with the best logged mAP T->V; every epoch logs
    mAP/nDCG both ways; the stored DN means are the hand-computed val-sample means."""
    cfg = _tiny(train={"metric": "map", "epochs": 6}, schedule={"kind": "cosine", "alpha": 0.08, "cycles": 2},
                test_time={"dn_source": "val", "dn_num_samples": 20, "dn_seeds": 5})
    out = tmp_path / "run"
    summary = train(cfg, out)
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    maps = [r["val"]["t2v"]["mAP"] for r in log]
    assert all({"mAP", "nDCG"} <= set(r["val"][d]) for r in log for d in ("t2v", "v2t"))
    assert summary["best_epoch"] == int(np.argmax(maps)) + 1  # first best on ties, as the trainer
    assert summary["val_score"] == pytest.approx(max(maps))
    assert all(r["val_map"] == r["val"]["t2v"]["mAP"] for r in log)
    assert log[-1]["scheduled"] == pytest.approx(0.1 + 0.08 / 2)  # cycles: the last step is the peak (eq. 4.1)

    model = xmodal.load_model(out)
    val = xdata.synthetic(**cfg.data.synthetic, seed=cfg.train.seed)["val"]
    text, video = embed_split(model, val)
    text, video = text.double(), video.double()

    def hand_mean(x, side):  # 5 seeds x 20 random rows, a generator per (seed 0..4, side 0/1)
        means = []
        for k in range(5):
            rows = np.sort(np.random.default_rng([k, side]).choice(len(x), 20, replace=False))
            means.append(x[torch.from_numpy(rows)].mean(0))
        return torch.stack(means).mean(0)

    dn = model.test_time.dn
    assert dn["hparams"]["seeds"] == 5 and dn["hparams"]["num_samples"] == 20
    assert model.test_time.hparams["dn_source"] == "val"
    torch.testing.assert_close(dn["tensors"]["mu_q"].double(), hand_mean(text, 0), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dn["tensors"]["mu_g"].double(), hand_mean(video, 1), rtol=1e-5, atol=1e-6)
