"""Zero-shot runs (issue 33.4): ``model.kind: identity`` with ``train.epochs: 0`` writes a normal run
folder whose metrics equal R@K recomputed by hand from the features (frames averaged, L2-normalised,
cosine, pessimistic ranks), whose DN equals :class:`xmodal.normalize.DistributionNormalization` fitted
on the validation embeddings (the DN paper's protocol: per seed and averaged), and which ``eval --run``,
``index``, ``query``, ``export`` and ``compare`` take unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from xmodal.cli import main
from xmodal.config import from_dict, load_config
from xmodal.data import load_paired_split
from xmodal.data.synthetic import synthetic
from xmodal.data.writer import save_split
from xmodal.normalize import DistributionNormalization
from xmodal.training.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
DIM = 16
DN = {"lam": 0.25, "num_samples": 20, "seeds": 5}


def config(root: Path, **over) -> dict:
    cfg = {"data": {"name": "paired", "root": str(root), "train_split": "train", "val_split": "val",
                    "test_split": "test"},
           "model": {"kind": "identity", "standardize": False}, "loss": {"name": "infonce", "temperature": 0.01},
           "test_time": {"normalizers": ["none", "dn", "sinkhorn"], "dn_lam": DN["lam"], "dn_source": "val",
                         "dn_num_samples": DN["num_samples"], "dn_seeds": DN["seeds"], "bank_size": 50},
           "train": {"seed": 0, "epochs": 0, "batch_size": 16}}
    for dotted, value in over.items():
        section, key = dotted.split("__")
        cfg[section][key] = value
    return cfg


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    root = tmp_path_factory.mktemp("zs") / "data"
    for name, split in synthetic(num_train=60, num_val=40, num_test=30, video_dim=DIM, text_dim=DIM, frames=3,
                                 num_concepts=6, seed=3).items():
        save_split(split, root, name)
    return root


@pytest.fixture(scope="module")
def run(layout, tmp_path_factory):
    out = tmp_path_factory.mktemp("zsrun") / "run"
    summary = train(from_dict(config(layout)), out, resume=False, progress=False, verbose=False)
    return out, summary


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def embeddings(split) -> tuple[np.ndarray, np.ndarray]:
    """The identity model by hand: frames averaged over the real ones, L2-normalised (float64)."""
    video = np.asarray(split.video, dtype=np.float64)
    if video.ndim == 3:
        mask = np.ones(video.shape[:2], bool) if split.video_mask is None else np.asarray(split.video_mask)
        video = np.stack([video[i][mask[i]].mean(0) for i in range(len(video))])
    return unit(np.asarray(split.text, dtype=np.float64)), unit(video)


def recalls(sim: np.ndarray, t2v: np.ndarray, ks=(1, 5, 10)) -> dict:
    """R@K of both directions with explicit loops (ties pessimistic: no random ties here)."""
    t_ranks = [1 + sum(sim[t, j] >= sim[t, t2v[t]] for j in range(sim.shape[1]) if j != t2v[t])
               for t in range(sim.shape[0])]
    v_ranks = []
    for v in range(sim.shape[1]):
        best = max(sim[t, v] for t in range(sim.shape[0]) if t2v[t] == v)
        v_ranks.append(1 + sum(sim[t, v] >= best for t in range(sim.shape[0]) if t2v[t] != v))
    return {"t2v": {f"R@{k}": 100.0 * np.mean(np.array(t_ranks) <= k) for k in ks},
            "v2t": {f"R@{k}": 100.0 * np.mean(np.array(v_ranks) <= k) for k in ks}}


def close(got: dict, want: dict) -> None:
    for d in want:
        for m, v in want[d].items():
            assert got[d][m] == pytest.approx(v, abs=1e-9), (d, m)


def test_identity_run_metrics_equal_recall_by_hand(run, layout):
    out, summary = run
    for name in ("config.yaml", "metrics.json", "per_query.npz", "model.pt", "provenance.json"):
        assert (out / name).is_file(), name
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs_run"] == 0 and metrics["best_epoch"] == 0 and np.isfinite(metrics["val_score"])
    from xmodal.models import load_model, parameter_count

    assert parameter_count(load_model(out)) == 0
    for split in ("val", "test"):
        s = load_paired_split(layout, split)
        t, v = embeddings(s)
        close(metrics[split]["none"], recalls(t @ v.T, np.asarray(s.text_to_video)))
    # rsum of the raw scores on val: what a trained run's best epoch reports
    assert metrics["val_score"] == pytest.approx(sum(metrics["val"]["none"][d][f"R@{k}"]
                                                     for d in ("t2v", "v2t") for k in (1, 5, 10)))


def test_dn_numbers_equal_distribution_normalization(run, layout):
    out, _ = run
    metrics = json.loads((out / "metrics.json").read_text())
    val_t, val_v = (torch.from_numpy(x.astype(np.float32)) for x in embeddings(load_paired_split(layout, "val")))
    s = load_paired_split(layout, "test")
    t, v = (torch.from_numpy(x.astype(np.float32)) for x in embeddings(s))
    t2v = np.asarray(s.text_to_video)
    # the run's dn: one normaliser from the average of the 5 seeds' sample means (what an index folds in)
    dn = DistributionNormalization(lam=DN["lam"], num_samples=DN["num_samples"], seeds=DN["seeds"]).fit(val_t, val_v)
    q, g = dn.transform(t, v)
    close(metrics["test"]["dn"], recalls((q @ g.T).double().numpy(), t2v))
    # the paper's protocol: one DN per seed, recalls averaged (and their spread) over the seeds
    per = [recalls((lambda qg: (qg[0] @ qg[1].T).double().numpy())(r.transform(t, v)), t2v)
           for r in DistributionNormalization.fit_per_seed(val_t, val_v, lam=DN["lam"],
                                                           num_samples=DN["num_samples"], seeds=DN["seeds"])]
    record = metrics["dn_per_seed"]
    assert record["seeds"] == [0, 1, 2, 3, 4] and record["num_samples"] == DN["num_samples"]
    for d in ("t2v", "v2t"):
        for k in (1, 5, 10):
            vals = [p[d][f"R@{k}"] for p in per]
            assert record["test"]["mean"][d][f"R@{k}"] == pytest.approx(np.mean(vals), abs=1e-9)
            assert record["test"]["std"][d][f"R@{k}"] == pytest.approx(np.std(vals, ddof=1), abs=1e-9)
    assert len({json.dumps(p) for p in per}) > 1  # the seeds really differ on this data


def test_more_dn_samples_than_val_holds_is_said_and_has_no_spread(layout, tmp_path):
    """dn_num_samples beyond the val split: the run says how many rows each seed drew (40 videos of the
    100 asked), and seeds that all take every row of both sides are one fit: no std of 0.00 reported as a
    spread (issue 42)."""
    from xmodal.commands.train import format_summary

    val = load_paired_split(layout, "val")
    held = {"text": len(val.text), "video": len(val.video)}
    assert held == {"text": 120, "video": 40}
    summary = train(from_dict(config(layout, test_time__dn_num_samples=100)), tmp_path / "a", resume=False,
                    progress=False, verbose=False)
    record = json.loads((tmp_path / "a" / "metrics.json").read_text())["dn_per_seed"]
    assert record["num_samples_used"] == {"text": 100, "video": 40} and "seeds_identical" not in record
    assert "100 val texts and 40 val videos each of the 100 asked" in format_summary(summary)
    summary = train(from_dict(config(layout, test_time__dn_num_samples=200)), tmp_path / "b", resume=False,
                    progress=False, verbose=False)
    record = json.loads((tmp_path / "b" / "metrics.json").read_text())["dn_per_seed"]
    assert record["num_samples_used"] == held and record["seeds_identical"] is True and record["std"] is None
    assert all(v is None for d in record["test"]["std"].values() for v in d.values())
    assert len({json.dumps(p) for p in record["test"]["per_seed"]}) == 1  # truly one fit
    text = format_summary(summary)
    assert "120 val texts and 40 val videos each of the 200 asked: all of them" in text and "no spread" in text
    assert "+- 0.00" not in text and "val samples each" not in text


def test_config_refusals_are_one_line(layout, tmp_path):
    cases = [({"train__epochs": 3}, "train.epochs: model.kind identity has no parameters"),
             ({"model__standardize": True}, "model.standardize: an identity model"),
             ({"model__text_kind": "linear"}, "model.text_kind: an identity model"),
             ({"model__kind": "linear"}, "train.epochs: must be >= 1, got 0 (0: only for model.kind: identity")]
    for over, needle in cases:
        with pytest.raises(ValueError) as err:
            from_dict(config(layout, **over))
        assert needle in str(err.value) and "\n" not in str(err.value)
    other = tmp_path / "other"
    for name, split in synthetic(num_train=20, num_val=10, num_test=10, video_dim=DIM, text_dim=12, seed=1).items():
        save_split(split, other, name)
    with pytest.raises(ValueError, match="^model.kind: identity needs video and text features of one size"):
        train(from_dict(config(other)), tmp_path / "r", resume=False, progress=False, verbose=False)


def test_commands_take_the_zero_shot_run_unchanged(run, layout, tmp_path, capsys):
    out, _ = run
    metrics = json.loads((out / "metrics.json").read_text())
    capsys.readouterr()
    assert main(["eval", "--run", str(out), "--data", str(layout), "--split", "test", "--normalizer", "dn",
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["t2v"]["R@1"] == pytest.approx(metrics["test"]["dn"]["t2v"]["R@1"])
    assert main(["index", "--run", str(out), "--data", str(layout), "--split", "test", "--out", str(tmp_path / "i"),
                 "--normalizer", "dn", "--quiet"]) == 0
    assert json.loads((tmp_path / "i" / "meta.json").read_text())["text_encoder"] is None  # nothing recorded
    assert main(["export", str(out), "--out", str(tmp_path / "e")]) == 0
    card = (tmp_path / "e" / "README.md").read_text()
    assert "zero-shot: no trained parameters" in card and "trained with `xmodal train`" not in card
    from xmodal.models import load_model

    s = load_paired_split(layout, "test")
    a, b = load_model(out), load_model(tmp_path / "e")
    assert torch.equal(a.similarity(s.text, s.video, "dn", video_mask=s.video_mask),
                       b.similarity(s.text, s.video, "dn", video_mask=s.video_mask))
    trained = tmp_path / "trained"
    cfg = config(layout, model__kind="linear", model__standardize=True, train__epochs=2)
    cfg["model"]["dim"] = 8
    train(from_dict(cfg), trained, resume=False, progress=False, verbose=False)
    capsys.readouterr()
    assert main(["compare", str(out), str(trained), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert rows and {"direction", "metric", "diff", "ci_low", "ci_high", "p_value", "verdict"} <= set(rows[0])


def test_shipped_config_is_the_dn_protocol(layout):
    cfg = load_config(ROOT / "configs" / "zeroshot" / "clip_dn.yaml", ["data.name=paired", f"data.root={layout}"])
    t = cfg.test_time
    assert (cfg.model.kind, cfg.train.epochs, cfg.model.standardize) == ("identity", 0, False)
    assert (t.dn_lam, t.dn_num_samples, t.dn_seeds, t.dn_source) == (0.25, 100, 5, "val")
