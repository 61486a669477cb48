"""``train.log_to: [mlflow, wandb]`` (issue 29): read back offline what each tracker wrote (MLflow's client on
the run's own store, the W&B offline run's ``.wandb`` records) and compare the curves with TensorBoard's event
files; a resumed run continues the same tracker run without duplicated steps."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
import torch

from xmodal.config import from_dict
from xmodal.training.loop import train

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_workbench_logs import _events, _log, tiny  # noqa: E402

pytest.importorskip("tensorboard", reason="tensorboard not installed (pip install 'xmodal[tensorboard]')")
pytestmark = pytest.mark.usefixtures("one_thread")
F32 = dict(rel=1e-6, abs=1e-7)  # TensorBoard's event files hold float32; the trackers the float64


def _need(name):
    return pytest.importorskip(name, reason=f"the [{name}] extra is not installed (pip install 'xmodal[{name}]')")


# --------------------------------------------------------------------------- readers

def mlflow_curves(run: Path, uri: str | None = None) -> tuple[dict, object, str]:
    """``({key: [(step, value)]}, client, run_id)`` from the MLflow store (default: the run's own)."""
    from mlflow.tracking import MlflowClient

    state = json.loads((run / "trackers.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=uri or "sqlite:///" + str((run / "mlflow.db").resolve()))
    run_id = state["run_id"]
    keys = client.get_run(run_id).data.metrics
    curves = {k: [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, k), key=lambda m: m.step)]
              for k in keys}
    return curves, client, run_id


def wandb_records(path: Path):
    """The protobuf records of a W&B ``.wandb`` file (LevelDB log blocks of 32 KiB after a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            break
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:  # full
            raw = chunk
        elif kind == 2:  # first
            buf = chunk
            continue
        elif kind == 3:  # middle
            buf += chunk
            continue
        else:  # last
            raw, buf = buf + chunk, b""
        rec = pb.Record()
        rec.ParseFromString(raw)
        yield rec


def wandb_run(run: Path) -> dict:
    """Every offline stream of the run's W&B id, in order: history ``{key: [(step, value)]}``, config, summary."""
    run_id = json.loads((run / "trackers.json").read_text())["wandb"]["id"]
    streams = sorted((run / "wandb").glob(f"offline-run-*-{run_id}"))
    curves: dict[str, list] = {}
    config, summary = {}, {}
    for folder in streams:
        for rec in wandb_records(folder / f"run-{run_id}.wandb"):
            kind = rec.WhichOneof("record_type")
            if kind == "history":
                step = rec.history.step.num
                for item in rec.history.item:
                    key = item.key or "/".join(item.nested_key)
                    if not key.startswith("_"):
                        curves.setdefault(key, []).append((step, json.loads(item.value_json)))
            elif kind in ("config", "run"):
                updates = rec.config.update if kind == "config" else rec.run.config.update
                config.update({u.key: json.loads(u.value_json) for u in updates})
            elif kind == "summary":
                summary.update({u.key or "/".join(u.nested_key): json.loads(u.value_json)
                                for u in rec.summary.update})
    return {"streams": streams, "curves": curves, "config": config, "summary": summary}


def _same_curves(tb: dict, other: dict, key=lambda tag: tag, final: bool = True) -> None:
    """Every TensorBoard curve in ``other`` at the same steps, once each, with the same values (``final``:
    the final tables too; W&B holds those in its summary, checked apart)."""
    tb = {t: p for t, p in tb.items() if final or not t.startswith("final/")}
    assert {key(t) for t in tb} <= set(other)
    for tag, points in tb.items():
        got = other[key(tag)]
        assert [s for s, _ in got] == [s for s, _ in points], tag  # the same steps, each once
        if tag != "epoch/time_s":
            assert [v for _, v in got] == pytest.approx([v for _, v in points], **F32), tag


CFG = tiny(train={"log_to": ["tensorboard", "mlflow", "wandb"]}, loss={"name": "calince", "temperature": 0.1})


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    _need("mlflow")
    _need("wandb")
    out = tmp_path_factory.mktemp("trackers") / "full"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        summary = train(from_dict(CFG), out, verbose=False, command="xmodal train c.yaml --out full")
    finally:
        torch.set_num_threads(before)
    return out, summary


def test_mlflow_and_wandb_hold_the_tensorboard_curves_config_provenance_and_final_tables(full, monkeypatch):
    from xmodal.training.trackers import mlflow_key

    run, summary = full
    monkeypatch.chdir(run)  # the run's artifact locations are relative to it (as 'cd RUN && mlflow ui' reads them)
    tb = _events(run / "tensorboard")
    assert any(t.startswith("train/terms/") for t in tb) and "val/t2v/R@1" in tb and "train/loss" in tb
    curves, client, run_id = mlflow_curves(run)
    _same_curves(tb, curves, mlflow_key)
    info = client.get_run(run_id)
    assert info.info.status == "FINISHED"
    params = info.data.params
    assert params["model.kind"] == "linear" and params["loss.name"] == "calince" and params["train.epochs"] == "4"
    prov = json.loads((run / "provenance.json").read_text())
    local = Path(client.download_artifacts(run_id, "provenance.json", str(run.parent)))
    sent = json.loads(local.read_text())
    assert sent["command"] == prov["command"] == "xmodal train c.yaml --out full" and sent["data"] == prov["data"]
    assert info.data.tags["mlflow.source.git.commit"] == (prov["git_revision"] or "")
    metrics = json.loads(Path(client.download_artifacts(run_id, "metrics.json", str(run.parent))).read_text())
    assert metrics == json.loads((run / "metrics.json").read_text())

    wb = wandb_run(run)
    assert len(wb["streams"]) == 1
    _same_curves(tb, wb["curves"], final=False)
    assert wb["config"]["model"]["kind"] == "linear" and wb["config"]["provenance"]["command"] == prov["command"]
    last = _log(run)[-1]["step"]
    for name, res in summary["val"].items():  # the final tables
        if name == "protocol":
            continue
        tag = f"final/val/{name}/t2v/R@1"
        assert tb[tag] == [(last, pytest.approx(res["t2v"]["R@1"], **F32))]
        assert curves[mlflow_key(tag)] == [(last, res["t2v"]["R@1"])]
        assert wb["summary"][tag] == res["t2v"]["R@1"]


def test_a_resumed_run_continues_the_same_tracker_runs_without_duplicated_steps(full, tmp_path):
    from xmodal.training.trackers import mlflow_key

    ref, _ = full
    cfg = from_dict(CFG)
    assert train(cfg, tmp_path, stop_after_epochs=2, verbose=False) == {"stopped": True, "epoch": 2}
    ids = json.loads((tmp_path / "trackers.json").read_text())
    assert ids["epochs_sent"] == 2
    train(cfg, tmp_path, verbose=False)
    after = json.loads((tmp_path / "trackers.json").read_text())
    assert after["mlflow"]["run_id"] == ids["mlflow"]["run_id"] and after["wandb"]["id"] == ids["wandb"]["id"]
    tb = _events(ref / "tensorboard")  # the uninterrupted run's curves
    curves, client, run_id = mlflow_curves(tmp_path)
    assert len(client.search_runs([client.get_run(run_id).info.experiment_id])) == 1
    _same_curves(tb, curves, mlflow_key)
    wb = wandb_run(tmp_path)
    # the killed process's stream and the resumed one, one W&B run id (W&B names a stream folder by the second
    # it started: a resume within the same second waits for the next, or it would overwrite the first stream)
    assert len(wb["streams"]) == 2
    _same_curves(tb, wb["curves"], final=False)


def test_a_kill_between_the_checkpoint_and_the_send_resends_that_epoch_once(tmp_path, monkeypatch):
    """The journal holds the epoch's per-step rows before its checkpoint: a kill between the checkpoint and
    the send loses nothing (it lost that epoch's per-step scalars before issue 36.2)."""
    _need("mlflow")
    from xmodal.training import trackers

    cfg = from_dict(tiny(train={"log_to": ["tensorboard", "mlflow"]}))
    real = trackers.Trackers.flush

    def killed_at_epoch_2(self, epochs, step=None):
        if epochs == 2:
            raise KeyboardInterrupt  # the checkpoint of epoch 2 is on disk, nothing of it was sent
        real(self, epochs, step)

    monkeypatch.setattr(trackers.Trackers, "flush", killed_at_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path, verbose=False)
    monkeypatch.undo()
    assert json.loads((tmp_path / "trackers.json").read_text())["epochs_sent"] == 1
    train(cfg, tmp_path, verbose=False)
    curves, _, _ = mlflow_curves(tmp_path)
    log = _log(tmp_path)
    assert [s for s, _ in curves["epoch/train_loss"]] == [r["step"] for r in log]  # epoch 2 once, from the resume
    assert [v for _, v in curves["epoch/train_loss"]] == [r["train_loss"] for r in log]
    steps = [s for s, _ in curves["train/loss"]]
    assert steps == list(range(log[-1]["step"]))  # every step once, epoch 2's from the journal
    tb = _events(tmp_path / "tensorboard")
    assert [v for _, v in curves["train/loss"]] == pytest.approx([v for _, v in tb["train/loss"]], **F32)


def test_environment_overrides_and_a_fresh_run_clears_the_trackers(tmp_path, monkeypatch):
    _need("mlflow")
    _need("wandb")
    other = tmp_path / "elsewhere.db"
    # a store the user names keeps MLflow's own artifact default (./mlruns of the working directory)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///" + str(other))
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "mine")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cfg = from_dict(tiny(train={"log_to": ["mlflow", "wandb"], "epochs": 2}))
    train(cfg, tmp_path / "run", verbose=False)
    assert not (tmp_path / "run" / "mlflow.db").exists() and not (tmp_path / "run" / "wandb").exists()
    curves, client, run_id = mlflow_curves(tmp_path / "run", uri="sqlite:///" + str(other))
    assert client.get_experiment(client.get_run(run_id).info.experiment_id).name == "mine"
    assert len(curves["epoch/train_loss"]) == 2
    assert (tmp_path / "mlruns").is_dir()  # MLflow's default artifact root, not the run's
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.delenv("WANDB_MODE")
    train(cfg, tmp_path / "run2", verbose=False)
    first = json.loads((tmp_path / "run2" / "trackers.json").read_text())
    train(cfg, tmp_path / "run2", verbose=False, resume=False)  # a fresh run: the old tracker runs go
    second = json.loads((tmp_path / "run2" / "trackers.json").read_text())
    assert first["mlflow"]["run_id"] != second["mlflow"]["run_id"] and first["wandb"]["id"] != second["wandb"]["id"]
    _, client, run_id = mlflow_curves(tmp_path / "run2")
    assert len(client.search_runs([client.get_run(run_id).info.experiment_id])) == 1
    assert [p.name.rsplit("-", 1)[1] for p in (tmp_path / "run2" / "wandb").glob("offline-run-*")] == [second["wandb"]["id"]]


def test_a_missing_tracker_package_names_its_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    with pytest.raises(ValueError, match=r"'mlflow' needs MLflow \(pip install 'xmodal\[mlflow\]'\)"):
        train(from_dict(tiny(train={"log_to": ["mlflow"], "epochs": 1})), tmp_path, verbose=False)


def test_tracker_keys_and_params():
    from xmodal.training.trackers import flat_params, mlflow_key

    assert mlflow_key("final/test/dn/v2t/R@50") == "final/test/dn/v2t/R_at_50"
    assert mlflow_key("a+b=c") == "a_b_c"
    assert flat_params({"model": {"kind": "mlp", "dim": 8}, "loss": {"kwargs": {}}, "train": {"log_to": ["mlflow"]}}) == {
        "model.kind": "mlp", "model.dim": "8", "loss.kwargs": "{}", "train.log_to": '["mlflow"]'}


def test_a_tracker_that_cannot_start_is_one_line(tmp_path, monkeypatch):
    _need("mlflow")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///" + str(tmp_path / "file" / "x.db"))
    with pytest.raises(ValueError, match=r"^train.log_to: mlflow could not start \(") as err:
        train(from_dict(tiny(train={"log_to": ["mlflow"], "epochs": 1})), tmp_path / "run", verbose=False)
    assert "\n" not in str(err.value)


def test_a_resume_in_the_same_second_gets_its_own_wandb_stream_folder(tmp_path):
    """W&B names a stream folder by its start second; a resume must not start in the second of the last stream
    (seen: a fast resume overwrote the first stream and lost its steps)."""
    import time
    from datetime import datetime

    from xmodal.training.trackers import _free_stream_second

    def stamp():
        return datetime.fromtimestamp(time.time()).strftime("%Y%m%d_%H%M%S")

    taken = stamp()
    (tmp_path / f"offline-run-{taken}-abcd1234").mkdir()
    _free_stream_second(tmp_path, "abcd1234")
    assert stamp() != taken


def test_the_journal_reader_skips_what_it_did_not_write(tmp_path):
    """Lines the fuzz run found (test_fuzz_model_files.py): an infinite step, 10,000 nested brackets, non-UTF-8,
    wrong types; each is skipped, the good rows are kept in order."""
    from xmodal.training.trackers import JOURNAL_FILE, read_journal

    lines = [b'{"s":0,"v":{"train/loss":1.5}}', b'{"s": 1e400}', b"[" * 10_000, b"\xff\xfe",
             b'{"s":1,"v":{"x":"a"}}', b'{"s":-1,"v":{}}', b'{"s":2,"v":{"train/loss":1.25,"train/lr":0.1}}',
             b'{"s":9,"v":{"train/loss":1.0}}', b'{"s":3,"v":{"train/loss":2.0}']  # torn last line
    (tmp_path / JOURNAL_FILE).write_bytes(b"\n".join(lines))
    assert read_journal(tmp_path, 5) == [(0, {"train/loss": 1.5}), (2, {"train/loss": 1.25, "train/lr": 0.1})]
    with pytest.raises(ValueError, match="before"):
        read_journal(tmp_path, -1)
