"""Trackers exactly once across real kills and a real full disk (issue 36.2), read back offline from what
each tracker wrote (MLflow's store, the W&B ``.wandb`` files, with the reader of ``test_trackers.py``) and
compared with TensorBoard's curves of an uninterrupted run of the same config.

Kills are ``SIGKILL`` to the training's process group (the W&B service with it), right after an epoch's
line is printed; the full disk is a real tmpfs filled while the run trains (root only; skipped otherwise).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from xmodal.config import from_dict
from xmodal.training.loop import train

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_trackers import CFG, _need, _same_curves, mlflow_curves, wandb_records, wandb_run  # noqa: E402
from test_workbench_logs import _events  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # subprocess runs: about 4 min


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """TensorBoard's curves of the uninterrupted run, and the config file the killed runs train."""
    _need("mlflow")
    _need("wandb")
    folder = tmp_path_factory.mktemp("reference")
    (folder / "c.yaml").write_text(yaml.safe_dump(CFG))
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(from_dict(CFG), folder / "run", verbose=False)
    finally:
        torch.set_num_threads(before)
    return _events(folder / "run" / "tensorboard"), folder / "c.yaml"


def _env() -> dict:
    """The training's own W&B service: WANDB_SERVICE (set by this process's W&B) would attach the child to
    this process's service, which a kill of the child's group leaves running."""
    import xmodal

    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}  # the xmodal this process imported:
    return {**env, "PYTHONPATH": str(Path(xmodal.__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}


def _train_killed(config: Path, run: Path, after_epoch: int) -> None:
    """``xmodal train`` in its own process group, SIGKILLed (the group: the W&B service too) as soon as the
    line of epoch ``after_epoch`` is printed."""
    proc = subprocess.Popen([sys.executable, "-m", "xmodal", "train", str(config), "--out", str(run), "--no-plots",
                             "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=_env(), start_new_session=True)
    try:
        for line in proc.stdout:
            if line.startswith(f"epoch {after_epoch:3d}/"):
                os.killpg(proc.pid, signal.SIGKILL)
                break
        else:
            raise AssertionError(f"the run ended before epoch {after_epoch}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=120)


def _every_point_once(run: Path, tb: dict) -> None:
    from xmodal.training.trackers import mlflow_key

    curves, client, run_id = mlflow_curves(run)
    _same_curves(tb, curves, mlflow_key)
    info = client.get_run(run_id)
    assert info.info.status == "FINISHED"
    runs = client.search_runs([info.info.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]  # continued, never a second run beside a RUNNING one
    wb = wandb_run(run)  # every stream parses (the test's own reader)
    _same_curves(tb, wb["curves"], final=False)


def test_a_kill_after_an_epoch_then_a_lost_trackers_json(reference, tmp_path):
    """kill -9 after epoch 2's line (W&B had not written all of it; trackers.json said sent), then
    trackers.json lost: the resume finds both tracker runs again and sends every missing point once."""
    tb, config = reference
    run = tmp_path / "run"
    _train_killed(config, run, after_epoch=2)
    ids = json.loads((run / "trackers.json").read_text())
    (run / "trackers.json").unlink()
    train(from_dict(CFG), run, verbose=False)
    after = json.loads((run / "trackers.json").read_text())
    assert after["mlflow"]["run_id"] == ids["mlflow"]["run_id"] and after["wandb"]["id"] == ids["wandb"]["id"]
    _every_point_once(run, tb)


def test_two_kills_and_a_garbled_trackers_json(reference, tmp_path):
    tb, config = reference
    run = tmp_path / "run"
    _train_killed(config, run, after_epoch=1)
    _train_killed(config, run, after_epoch=3)  # the resumed process, killed in turn
    ids = json.loads((run / "trackers.json").read_text())
    (run / "trackers.json").write_bytes(b'{"mlflow": {"run_id": "nope"}, "wandb": [1, 2], "epochs_sent": "x"')
    train(from_dict(CFG), run, verbose=False)
    after = json.loads((run / "trackers.json").read_text())
    assert after["mlflow"]["run_id"] == ids["mlflow"]["run_id"] and after["wandb"]["id"] == ids["wandb"]["id"]
    _every_point_once(run, tb)


def _fill(folder: Path, free: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_disk_full import _fill as fill

    fill(folder, free)


def test_a_full_disk_mid_run_is_one_line_then_the_resume_completes_every_tracker(reference, tmp_path, capfd):
    """The disk fills while epoch 3 trains: one warning per tracker and the one error line (3 tracebacks, 79
    lines before); after space is freed the resume sends MLflow every point it missed (380 before), every
    W&B stream parses (none did before) and W&B holds every point above its last step once."""
    tb, config = reference
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root): {res.stderr.strip() or res.returncode}")
    try:
        run = mnt / "run"
        proc = subprocess.Popen([sys.executable, "-m", "xmodal", "train", str(config), "--out", str(run),
                                 "--no-plots", "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=_env(), start_new_session=True)
        for line in proc.stdout:
            if line.startswith("epoch   2/"):
                _fill(mnt, 2048)  # the disk fills while epoch 3 trains
                break
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 1, err
        lines = err.strip().splitlines()
        assert "Traceback" not in err and "Logging error" not in err, err
        assert lines[-1].startswith("xmodal train: error: ") and "no space left on device" in lines[-1], err
        assert all(x.startswith("xmodal train: warning: ") for x in lines[:-1]) and len(lines) <= 3, err
        (mnt / ".filler").unlink()
        capfd.readouterr()
        train(from_dict(CFG), run, verbose=False)
        warned = capfd.readouterr().err
        from xmodal.training.trackers import mlflow_key

        curves, client, run_id = mlflow_curves(run)
        _same_curves(tb, curves, mlflow_key)  # MLflow: every point, once
        assert client.get_run(run_id).info.status == "FINISHED"
        wb = wandb_run(run)  # every stream parses with the test's own reader
        assert len(wb["streams"]) == 2
        missing = 0
        for tag, points in tb.items():
            if tag.startswith("final/"):
                continue
            have = dict(wb["curves"].get(tag, []))
            steps = [s for s, _ in wb["curves"].get(tag, [])]
            assert steps == sorted(set(steps)) and set(steps) <= {s for s, _ in points}, tag  # never twice
            missing += sum(1 for s, _ in points if s not in have)
        if missing:  # only points below W&B's last step, and the resume said how many
            assert f"wandb: {missing} point(s) below step" in warned, warned
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_the_model_artifact_seed_groups_and_no_absolute_path(reference, tmp_path, monkeypatch):
    """train.log_to logs the export folder as the model (MLflow ``model/`` with an MLmodel signature, W&B an
    artifact of type model); seeds of one config share a group; the trackers hold no absolute path."""
    from xmodal.training.trackers import seed_group

    runs = {}
    for seed in (1, 2):
        cfg = from_dict({**CFG, "train": {**CFG["train"], "seed": seed, "epochs": 2}})
        train(cfg, tmp_path / f"s{seed}", verbose=False)
        runs[seed] = tmp_path / f"s{seed}"
    groups = set()
    for seed, run in runs.items():
        curves, client, run_id = mlflow_curves(run)
        tags = client.get_run(run_id).data.tags
        groups.add(tags["xmodal.seed_group"])
        monkeypatch.chdir(run)
        model = Path(client.download_artifacts(run_id, "model", str(tmp_path / f"dl{seed}")))
        assert sorted(p.name for p in model.iterdir()) == ["MLmodel", "README.md", "config.json", "model.safetensors"]
        mlmodel = yaml.safe_load((model / "MLmodel").read_text())
        assert mlmodel["flavors"]["xmodal"]["format"] == "xmodal-export"
        inputs = json.loads(mlmodel["signature"]["inputs"])
        assert [i["name"] for i in inputs] == ["text_features", "video_features", "video_mask"]
        import xmodal

        assert xmodal.load_model(model).architecture() == xmodal.load_model(run).architecture()
        wb = json.loads((run / "trackers.json").read_text())["wandb"]["id"]
        kinds = set()
        for path in sorted((run / "wandb").glob(f"offline-run-*-{wb}/run-{wb}.wandb")):
            for rec in wandb_records(path):
                if rec.WhichOneof("record_type") == "artifact":
                    kinds.add(rec.artifact.type)
                if rec.WhichOneof("record_type") == "run":
                    assert rec.run.run_group == tags["xmodal.seed_group"]
        assert kinds == {"model"}
        # no path of this machine in the store, the artifacts or trackers.json
        import sqlite3

        con = sqlite3.connect(str(run / "mlflow.db"))
        dump = "\n".join(con.iterdump())
        locations = [r[0] for r in con.execute("SELECT artifact_location FROM experiments")] + \
            [r[0] for r in con.execute("SELECT artifact_uri FROM runs")]
        con.close()
        assert locations and not [loc for loc in locations if loc.startswith(("/", "file:"))], locations
        for text in (dump, (run / "trackers.json").read_text(), *(p.read_text() for p in (run / "mlartifacts").rglob("*.json"))):
            assert str(tmp_path) not in text and str(run.resolve()) not in text
    from xmodal.config import to_dict

    assert len(groups) == 1 and groups == {seed_group(to_dict(from_dict({**CFG, "train": {**CFG["train"], "seed": 7,
                                                                                        "epochs": 2}})))}
