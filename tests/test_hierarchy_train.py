"""The two-level model end to end: training on a hierarchical split gives p2v / v2p in
metrics.json and in `xmodal eval --run --data`, exact resume with the hierarchy, RAdam and
reduce-on-plateau, and the CrossCLR/COOT preset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from test_hierarchy import hier_split
from xmodal.cli import main
from xmodal.config import from_dict, load_config
from xmodal.models import load_model
from xmodal.training.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("hier")
    for i, name in enumerate(("train", "val", "test")):
        s = hier_split(seed=10 + i, groups=24 if name == "train" else 10)
        for role, arr in (("video_features", s.video), ("video_mask", s.video_mask), ("text_features", s.text),
                          ("text_to_video", s.text_to_video), ("video_to_group", s.video_to_group)):
            np.save(root / f"{name}_{role}.npy", arr)
    return root


def hier_config(data_dir, **sections):
    d = {"data": {"name": "paired", "root": str(data_dir), "val_split": "val", "test_split": "test"},
         "model": {"kind": "transformer", "dim": 16, "hidden": 16, "heads": 2, "layers": 1, "dropout": 0.1,
                   "hierarchy": True, "global_heads": 2},
         "loss": {"name": "crossclr", "temperature": 0.1, "kwargs": {"queue_size": 48}},
         "optim": {"name": "radam", "lr": 3e-3, "betas": [0.56, 0.999], "warmup_epochs": 1,
                   "scheduler": "plateau", "plateau_patience": 0, "plateau_cooldown": 0},
         "test_time": {"normalizers": ["none", "dn"], "bank_size": 50},
         "train": {"seed": 2, "epochs": 2, "batch_size": 4, "patience": 0, "progress": False, "device": "cpu"}}
    for name, values in sections.items():
        d.setdefault(name, {}).update(values)
    return from_dict(d)


def _naive_p2v_r1(model, split):
    """Paragraph -> video R@1 from the global embeddings with a plain loop."""
    p, v, _ = model.encode_groups(*split.video_input(), split.text, split.text_to_video, split.video_to_group)
    sim = (p @ v.T).tolist()
    hits = [all(row[i] > row[j] for j in range(len(row)) if j != i) for i, row in enumerate(sim)]
    return 100.0 * sum(hits) / len(hits)


def _naive_flat_p2v_r1(model, split):
    """The flat reference by hand: each group's mean of normalised clip (caption) embeddings, a loop."""
    v, t = model.encode_video(*split.video_input()), model.encode_text(split.text)
    videos = [v[rows].mean(0) for rows in split.group_rows()]
    paragraphs = [t[p].mean(0) for p in split.paragraphs()]
    hits = 0
    for i, p in enumerate(paragraphs):
        s = [float(p @ x / (p.norm() * x.norm())) for x in videos]
        hits += all(s[i] > s[j] for j in range(len(s)) if j != i)
    return 100.0 * hits / len(paragraphs)


def test_two_epochs_give_p2v_in_metrics_and_eval(data_dir, tmp_path, capsys):
    from xmodal.data import load_paired_split

    summary = train(hier_config(data_dir), tmp_path / "run")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    for split in ("val", "test"):
        for name in ("none", "dn"):
            m = metrics[split][name]
            assert set(m) >= {"t2v", "v2t", "p2v", "v2p", "p2v_flat", "v2p_flat"}
            assert m["p2v"].keys() == m["t2v"].keys() == m["p2v_flat"].keys()
        assert metrics[split]["none"]["p2v"] == metrics[split]["dn"]["p2v"]  # cosine at the paragraph level
    model = load_model(tmp_path / "run")
    test = load_paired_split(data_dir, "test")
    assert metrics["test"]["none"]["p2v"]["R@1"] == pytest.approx(_naive_p2v_r1(model, test))
    assert metrics["test"]["none"]["p2v_flat"]["R@1"] == pytest.approx(_naive_flat_p2v_r1(model, test))
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert len(log) == 2 and all({"p2v", "p2v_flat"} <= set(r["val"]) for r in log)
    assert {"local", "global"} <= set(log[0]["loss_terms"])
    capsys.readouterr()
    assert main(["eval", "--run", str(tmp_path / "run"), "--data", str(data_dir), "--split", "test",
                 "--normalizer", "none", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for d in ("t2v", "v2t", "p2v", "v2p", "p2v_flat", "v2p_flat"):
        for k in ("R@1", "R@5", "R@10", "MdR", "MnR"):
            assert out[d][k] == pytest.approx(metrics["test"]["none"][d][k]), (d, k)
    assert summary["test"]["none"]["v2p"] == metrics["test"]["none"]["v2p"]
    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "r.html")]) == 0
    html = (tmp_path / "r.html").read_text()
    assert "p2v R@1" in html and "v2p MnR" in html and "p2v_flat R@1" in html and "v2p_flat MnR" in html
    from xmodal.commands.train import format_summary

    table = format_summary(summary)
    # the val and test paragraph tables each carry the global towers' row and the flat reference
    assert table.count("global towers") == 2 and table.count("      flat reference ") == 2


def test_flat_run_gets_mean_pooled_p2v_and_hierarchy_needs_groups(data_dir, tmp_path):
    from xmodal.data import load_paired_split

    flat = train(hier_config(data_dir, model={"hierarchy": False}, train={"epochs": 1, "batch_size": 16,
                                                                          "metric": "p2v_rsum"}),
                 tmp_path / "flat")
    model = load_model(tmp_path / "flat")
    test = load_paired_split(data_dir, "test")
    # by hand: each group's mean of normalised clip (caption) embeddings, a plain loop
    v, t = model.encode_video(*test.video_input()), model.encode_text(test.text)
    videos = [v[rows].mean(0) for rows in test.group_rows()]
    paragraphs = [t[p].mean(0) for p in test.paragraphs()]
    hits = 0
    for i, p in enumerate(paragraphs):
        s = [float(p @ x / (p.norm() * x.norm())) for x in videos]
        hits += all(s[i] > s[j] for j in range(len(s)) if j != i)
    assert flat["test"]["none"]["p2v"]["R@1"] == pytest.approx(100.0 * hits / len(paragraphs))
    log = [json.loads(x) for x in (tmp_path / "flat" / "log.jsonl").read_text().splitlines()]
    p2v = log[0]["val"]
    assert log[0]["val_p2v_rsum"] == pytest.approx(sum(p2v[d][f"R@{k}"] for d in ("p2v", "v2p") for k in (1, 5, 10)))
    nogroups = tmp_path / "nogroups"
    nogroups.mkdir()
    for f in data_dir.iterdir():
        if "video_to_group" not in f.name:
            (nogroups / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ValueError, match="model.hierarchy: .*no groups"):
        train(hier_config(nogroups), tmp_path / "x")
    with pytest.raises(ValueError, match="train.metric: 'p2v_rsum' needs groups"):
        train(hier_config(nogroups, model={"hierarchy": False}, train={"metric": "p2v_rsum"}), tmp_path / "y")


def test_resume_is_bit_identical_with_hierarchy(data_dir, tmp_path):
    cfg = hier_config(data_dir, train={"epochs": 4})
    full = train(cfg, tmp_path / "full")
    assert train(cfg, tmp_path / "killed", stop_after_epochs=2) == {"stopped": True, "epoch": 2}
    torch.manual_seed(999)  # disturbed: the checkpoint restores it
    resumed = train(cfg, tmp_path / "killed")
    a = torch.load(tmp_path / "full" / "model.pt", weights_only=True)["model"]["state_dict"]
    b = torch.load(tmp_path / "killed" / "model.pt", weights_only=True)["model"]["state_dict"]
    assert a.keys() == b.keys() and any(k.startswith("global_video.") for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ca = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)
    cb = torch.load(tmp_path / "killed" / "checkpoint.pt", weights_only=True)
    for k, v in ca["loss"].items():  # the local queue included
        assert torch.equal(v, cb["loss"][k]), k
    assert ca["plateau"] == cb["plateau"]
    assert full["val"] == resumed["val"]
    lrs = [json.loads(x)["lr"] for x in (tmp_path / "full" / "log.jsonl").read_text().splitlines()]
    assert lrs == [json.loads(x)["lr"] for x in (tmp_path / "killed" / "log.jsonl").read_text().splitlines()]


def test_plateau_reduces_the_lr_after_warmup_when_val_stalls(data_dir, tmp_path):
    # lr so small that val hardly moves: with patience 0 an epoch without improvement after the
    # warm-up divides the LR by 10 (cooldown 0). (ReduceLROnPlateau ignores changes below its
    # eps 1e-8, so the lr is not smaller still.)
    cfg = hier_config(data_dir, optim={"lr": 1e-6, "warmup_epochs": 1}, train={"epochs": 4})
    train(cfg, tmp_path / "run")
    lrs = [json.loads(x)["lr"] for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert lrs[0] == pytest.approx(1e-6)
    assert all(b <= a for a, b in zip(lrs, lrs[1:])) and lrs[-1] < lrs[0]


def test_coot_preset_loads_validates_and_trains(data_dir, tmp_path):
    path = ROOT / "configs" / "crossclr" / "coot_youcook2.yaml"
    cfg = load_config(path)
    m, lo, o = cfg.model, cfg.loss, cfg.optim
    assert (m.hierarchy, m.dim, m.heads, m.global_heads, m.dropout) == (True, 384, 8, 8, 0.05)
    # Table 7's "Pooler ATN" / "AF heads 2" are the local level's; the global level averages + context
    assert (m.local_pooling, m.pool_heads, m.pool_hidden, m.global_pooling, m.global_context, m.block,
            m.standardize) == ("atn", 2, 768, "mean", True, "release", True)
    assert (lo.name, lo.temperature, lo.global_weight) == ("crossclr", 0.03, 0.6)
    assert lo.kwargs == {"weight_scale": 0.0035, "intra_weight": 0.8, "prune_threshold": 0.9, "queue_size": 5000,
                         "intra_mode": "logit"}
    assert (o.name, o.lr, o.betas, o.eps, o.warmup_epochs, o.scheduler, o.plateau_patience, o.plateau_cooldown) == \
        ("radam", 7e-4, (0.56, 0.98), 1.5e-9, 4.0, "plateau", 6, 4)
    assert cfg.train.batch_size == 64 and cfg.train.epochs == 40
    # on a hierarchical split directory (the YouCook2 route), shrunk to one short epoch
    small = load_config(path, ["data.name=paired", f"data.root={data_dir}", "data.val_split=val",
                               "train.batch_size=8", "train.epochs=1", "train.progress=false", "train.device=cpu",
                               "loss.kwargs.queue_size=100", "test_time.bank_size=50"])
    summary = train(small, tmp_path / "preset")
    assert {"p2v", "v2p", "p2v_flat", "v2p_flat"} <= set(summary["val"]["none"])


def test_synthetic_groups_train_with_the_preset_defaults(tmp_path):
    from xmodal.data import synthetic

    s = synthetic(num_train=20, num_val=10, num_test=10, clips_per_group=6, seed=0)
    assert s["train"].video_to_group.tolist() == [0] * 6 + [1] * 6 + [2] * 6 + [3] * 2
    path = ROOT / "configs" / "crossclr" / "coot_youcook2.yaml"
    small = load_config(path, ["data.synthetic.num_train=120", "data.synthetic.num_val=60",
                               "data.synthetic.num_test=60", "train.batch_size=4", "train.epochs=1",
                               "train.progress=false", "train.device=cpu", "model.dim=32", "model.hidden=32",
                               "loss.kwargs.queue_size=100", "test_time.bank_size=50"])
    summary = train(small, tmp_path / "synthetic")
    assert {"p2v", "v2p"} <= set(summary["test"]["none"])
