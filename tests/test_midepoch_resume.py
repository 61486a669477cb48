"""Checkpoints inside an epoch (``train.checkpoint_minutes``, issue 34.5): a training process killed with
SIGKILL after a mid-epoch checkpoint, then resumed, ends with the weights of a run never interrupted, bit
for bit (plain, EMA, a batch loader with a worker process); the loss states with queues, schedules and
the hierarchy resume mid-epoch too (a crash raised inside a step); the logs hold each step once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_train import RESUME_CASES, tiny_config
from xmodal.config import to_dict
from xmodal.training.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]

# 360 training texts, batch 60: 6 steps per epoch; the kill comes inside step 10 (epoch 2, batch 4)
STEPS_PER_EPOCH, KILL_AT = 6, 10

#: The child: train, and SIGKILL itself inside the KILL_AT-th step (after its backward, before the update),
#: so the newest checkpoint on disk is the one written after the step before (every step writes one here).
CHILD = """
import json, os, signal, sys
import torch
import xmodal.dist as dist
from xmodal.config import from_dict
from xmodal.training.loop import train

torch.set_num_threads(1)
cfg, out, kill_at = from_dict(json.loads(sys.argv[1])), sys.argv[2], int(sys.argv[3])
average, calls = dist.average_gradients, [0]
def counting(params):
    calls[0] += 1
    if calls[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return average(params)
dist.average_gradients = counting
train(cfg, out, progress=False, verbose=False)
"""

KILL_CASES = {
    "plain": dict(model={"kind": "mlp", "dim": 16, "width": 32, "dropout": 0.2}),
    "ema": dict(model={"kind": "mlp", "dim": 16, "width": 32, "dropout": 0.2}, optim={"ema": 0.9}),
    "loader-worker": dict(model={"kind": "mlp", "dim": 16, "width": 32, "dropout": 0.2}, train={"workers": 1}),
}


def _config(sections: dict, minutes: float):
    sections = {k: dict(v) for k, v in sections.items()}
    sections.setdefault("train", {}).update(epochs=2, batch_size=60, checkpoint_minutes=minutes)
    return tiny_config(**sections)


def _weights(run: Path) -> dict:
    return torch.load(run / "model.pt", weights_only=True)["model"]["state_dict"]


def _same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _child_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.parametrize("case", sorted(KILL_CASES))
def test_sigkill_after_a_midepoch_checkpoint_then_resume_is_bit_identical(tmp_path, case):
    # the uninterrupted reference never writes a mid-epoch checkpoint (0 = at epoch ends only)
    full = train(_config(KILL_CASES[case], 0), tmp_path / "full", progress=False, verbose=False)
    cfg = _config(KILL_CASES[case], 1e-9)  # a checkpoint after every step
    killed = tmp_path / "killed"
    res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(to_dict(cfg)), str(killed), str(KILL_AT)],
                         env=_child_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == -9, res.stderr[-2000:]  # killed by SIGKILL, not finished
    assert not (killed / "model.pt").exists()
    ck = torch.load(killed / "checkpoint.pt", weights_only=True)
    assert ck["state"]["epoch"] == 1 and ck["state"]["batch"] == KILL_AT - 1 - STEPS_PER_EPOCH  # mid-epoch 2
    assert ck["state"]["step"] == KILL_AT - 1
    torch.manual_seed(12345)  # disturbed: the checkpoint restores the RNG
    resumed = train(cfg, killed, progress=False, verbose=False)
    _same_weights(_weights(tmp_path / "full"), _weights(killed))
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)
    b = torch.load(killed / "checkpoint.pt", weights_only=True)
    if "ema" in a:
        _same_weights(a["ema"], b["ema"])
    for k, v in a["optimizer"]["state"].items():
        assert all(torch.equal(v[n], b["optimizer"]["state"][k][n]) for n in v), k
    assert full["val"] == resumed["val"]
    history = [json.loads(x) for x in (killed / "log.jsonl").read_text().splitlines()]
    reference = [json.loads(x) for x in (tmp_path / "full" / "log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in history] == [1, 2]
    # the interrupted epoch's mean loss covers its batches exactly once, as without the kill
    assert [r["train_loss"] for r in history] == [r["train_loss"] for r in reference]
    assert [r["step"] for r in history] == [6, 12]


class Crash(Exception):
    """Raised inside a step: the process 'dies' (its checkpoint stays, nothing after it is written)."""


def _crash_at(monkeypatch, step: int) -> None:
    import xmodal.dist as dist

    average, calls = dist.average_gradients, [0]

    def counting(params):
        calls[0] += 1
        if calls[0] == step:
            raise Crash
        return average(params)

    monkeypatch.setattr(dist, "average_gradients", counting)


@pytest.mark.parametrize("case", sorted(RESUME_CASES))
def test_midepoch_resume_keeps_every_loss_state(tmp_path, monkeypatch, case):
    """Queues (NCL, CrossCLR), learnable temperatures, the Cali-NCE head and TS++ class schedules."""
    from xmodal.losses import LOSSES

    sections = RESUME_CASES[case]
    if sections.get("loss", {}).get("name", "infonce") not in LOSSES:
        pytest.skip(f"loss {sections['loss']['name']} not registered")
    train(_config(sections, 0), tmp_path / "full", progress=False, verbose=False)
    cfg = _config(sections, 1e-9)
    with monkeypatch.context() as m:
        _crash_at(m, KILL_AT)
        with pytest.raises(Crash):
            train(cfg, tmp_path / "killed", progress=False, verbose=False)
    assert torch.load(tmp_path / "killed" / "checkpoint.pt", weights_only=True)["state"]["batch"] == 3
    torch.manual_seed(1)
    train(cfg, tmp_path / "killed", progress=False, verbose=False)
    _same_weights(_weights(tmp_path / "full"), _weights(tmp_path / "killed"))
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=True)["loss"]
    b = torch.load(tmp_path / "killed" / "checkpoint.pt", weights_only=True)["loss"]
    _same_weights(a, b)


def test_a_resume_may_change_checkpoint_minutes_but_nothing_else(tmp_path, monkeypatch):
    cfg = _config({}, 1e-9)
    with monkeypatch.context() as m:
        _crash_at(m, 3)  # inside the first epoch: nothing in log.jsonl yet
        with pytest.raises(Crash):
            train(cfg, tmp_path / "run", progress=False, verbose=False)
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["state"]["batch"] == 2
    with pytest.raises(ValueError, match="different config"):
        train(_config({"optim": {"lr": 1e-2}}, 1e-9), tmp_path / "run", progress=False, verbose=False)
    train(_config({}, 30), tmp_path / "run", progress=False, verbose=False)  # resumed, not refused
    train(_config({}, 0), tmp_path / "ref", progress=False, verbose=False)
    _same_weights(_weights(tmp_path / "ref"), _weights(tmp_path / "run"))


def test_checkpoint_minutes_is_checked():
    from xmodal.config import validate

    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="train.checkpoint_minutes"):
            validate(_config({}, bad))


def test_logs_after_a_midepoch_kill_hold_every_step_once(tmp_path):
    """TensorBoard and MLflow after a SIGKILL inside the first epoch (no epoch in log.jsonl yet): the resumed
    run reopens the same MLflow run, and both hold the uninterrupted run's curves, each step once."""
    pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'xmodal[tensorboard]')")
    pytest.importorskip("mlflow", reason="the [mlflow] extra is not installed (pip install 'xmodal[mlflow]')")
    from torch.utils.tensorboard import SummaryWriter

    from test_trackers import _same_curves, mlflow_curves
    from test_workbench_logs import _events
    from xmodal.training.trackers import mlflow_key

    logs = {"train": {"log_to": ["tensorboard", "mlflow"]}}
    train(_config(logs, 0), tmp_path / "full", progress=False, verbose=False)
    cfg = _config(logs, 1e-9)
    run = tmp_path / "killed"
    res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(to_dict(cfg)), str(run), "5"],
                         env=_child_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == -9, res.stderr[-2000:]
    ck = torch.load(run / "checkpoint.pt", weights_only=True)["state"]
    assert (ck["epoch"], ck["batch"], ck["history"]) == (0, 4, [])
    sent_before = mlflow_curves(run)[0][mlflow_key("train/loss")]
    assert [s for s, _ in sent_before] == [0, 1, 2, 3]  # the steps before the checkpoint were sent with it
    with SummaryWriter(str(run / "tensorboard")) as w:  # what a kill can leave past the checkpoint
        w.add_scalar("train/loss", 999.0, 4)
    ids = json.loads((run / "trackers.json").read_text())
    train(cfg, run, progress=False, verbose=False)
    assert json.loads((run / "trackers.json").read_text())["mlflow"]["run_id"] == ids["mlflow"]["run_id"]
    tb_full, tb_res = _events(tmp_path / "full" / "tensorboard"), _events(run / "tensorboard")
    assert set(tb_full) == set(tb_res)
    for tag in tb_full:
        if tag != "epoch/time_s":
            assert [s for s, _ in tb_res[tag]] == [s for s, _ in tb_full[tag]], tag  # once each, the 999 purged
            assert tb_res[tag] == tb_full[tag], tag
    curves, client, run_id = mlflow_curves(run)
    assert len(client.search_runs([client.get_run(run_id).info.experiment_id])) == 1
    _same_curves(tb_full, curves, mlflow_key)


def test_progress_lines_without_a_terminal_before_inside_and_after_the_epochs(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XMODAL_PROGRESS_SECONDS", "0")  # a line at every update instead of every 30 s
    train(_config({}, 1e-9), tmp_path / "run", verbose=False)  # progress=None, stderr is not a terminal
    err = capsys.readouterr().err
    assert "\r" not in err  # lines, not a bar
    for expected in ("train: loading the data", "train: drawing the epoch's batches",
                     "train: epoch 1/2: 1/6 batches (17%)", "train: epoch 2/2: 6/6 batches (100%)",
                     "train: checkpoint at epoch 2/2, batch 3/6 (step 9)", "train: epoch 2/2: validating",
                     "train: fitting the test-time normalisers", "train: evaluating test"):
        assert expected in err, expected
    line = next(x for x in err.splitlines() if x.startswith("train: epoch 2/2: 4/6 batches"))
    assert "clips/s, loss " in line and "about" in line and "left" in line  # rate, loss, time left
    train(_config({}, 1e-9), tmp_path / "quiet", progress=False, verbose=False)
    assert capsys.readouterr().err == ""


def test_midepoch_resume_with_the_hierarchy(tmp_path, monkeypatch):
    """Batches of whole groups, the global towers, CrossCLR's queue, RAdam and reduce-on-plateau."""
    import numpy as np

    from test_hierarchy import hier_split
    from test_hierarchy_train import hier_config

    data = tmp_path / "data"
    data.mkdir()
    for i, name in enumerate(("train", "val", "test")):
        s = hier_split(seed=10 + i, groups=24 if name == "train" else 10)
        for role, arr in (("video_features", s.video), ("video_mask", s.video_mask), ("text_features", s.text),
                          ("text_to_video", s.text_to_video), ("video_to_group", s.video_to_group)):
            np.save(data / f"{name}_{role}.npy", arr)
    full = hier_config(data, train={"epochs": 2, "checkpoint_minutes": 0})
    cfg = hier_config(data, train={"epochs": 2, "checkpoint_minutes": 1e-9})
    train(full, tmp_path / "full", progress=False, verbose=False)
    with monkeypatch.context() as m:
        _crash_at(m, 9)  # 6 batches of 4 groups per epoch: inside epoch 2
        with pytest.raises(Crash):
            train(cfg, tmp_path / "killed", progress=False, verbose=False)
    assert torch.load(tmp_path / "killed" / "checkpoint.pt", weights_only=True)["state"]["batch"] == 2
    torch.manual_seed(5)
    train(cfg, tmp_path / "killed", progress=False, verbose=False)
    _same_weights(_weights(tmp_path / "full"), _weights(tmp_path / "killed"))
