"""Run directories: weights-only loading (a code payload never runs), one-line errors for
corrupt / truncated / foreign checkpoints, a writer lock tested with a real second
process, disk full, stale temporaries, divergence, and CLI argument checks."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import xmodal
from xmodal.cli import main
from xmodal.config import from_dict, load_config
from xmodal.runs import RunDirError, RunLock, load_checkpoint
from xmodal.training.loop import train

REPO = Path(__file__).resolve().parents[1]
TINY = {"num_train": 120, "num_val": 60, "num_test": 60, "num_concepts": 10}
CLI_TINY = ["data.synthetic={num_train: 120, num_val: 60, num_test: 60, num_concepts: 10}",
            "train.epochs=1", "train.batch_size=32", "model.dim=16", "test_time.bank_size=100"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_config(epochs=1, **train_kw):
    return from_dict({
        "data": {"name": "synthetic", "synthetic": dict(TINY)}, "model": {"dim": 16},
        "loss": {"name": "infonce", "temperature": 0.1}, "optim": {"lr": 3e-3},
        "test_time": {"normalizers": ["none", "dn"], "bank_size": 100, "oracle": False},
        "train": {"seed": 0, "epochs": epochs, "batch_size": 32, "patience": 0, "progress": False, **train_kw}})


class _Payload:
    """Unpickling this calls ``open(marker, "w")``: it creates a file (a stand-in for any code)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _evil_checkpoint(path: Path, marker: Path) -> None:
    torch.save({"config": {}, "model": {"payload": _Payload(marker)}, "state": {}}, path)


def test_payload_is_live_but_never_runs_through_xmodal(tmp_path, capsys):
    marker = tmp_path / "pwned"
    run = tmp_path / "run"
    run.mkdir()
    _evil_checkpoint(run / "model.pt", marker)
    # the payload is real: the unsafe loader runs it
    torch.load(run / "model.pt", weights_only=False)
    assert marker.exists()
    marker.unlink()
    for path in (run, run / "model.pt"):
        with pytest.raises(ValueError, match=r"model\.pt: refused to load.*could run code"):
            xmodal.load_model(path)
    # resume and `xmodal train` on a run directory whose checkpoint carries the payload
    _evil_checkpoint(run / "checkpoint.pt", marker)
    with pytest.raises(ValueError, match=r"checkpoint\.pt: refused to load"):
        train(tiny_config(), run)
    rc = main(["train", str(REPO / "configs/synthetic.yaml"), "--out", str(run), "--quiet", *CLI_TINY])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "refused to load" in err and "checkpoint.pt" in err
    assert not marker.exists()


def _real_model_file(tmp_path: Path) -> Path:
    train(tiny_config(), tmp_path / "good")
    return tmp_path / "good" / "model.pt"


def test_corrupt_truncated_foreign_files_are_one_line_value_errors(tmp_path):
    good = _real_model_file(tmp_path)
    data = good.read_bytes()
    cases = {"truncated.pt": data[: len(data) // 2], "empty.pt": b"", "garbage.pt": b"not a checkpoint at all"}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
    torch.save({"weights": torch.ones(3)}, tmp_path / "foreign.pt")
    torch.save(torch.ones(3), tmp_path / "tensor.pt")
    for name in [*cases, "foreign.pt", "tensor.pt"]:
        with pytest.raises(ValueError) as info:
            xmodal.load_model(tmp_path / name)
        msg = str(info.value)
        assert name in msg and "\n" not in msg, msg
    assert isinstance(xmodal.load_model(good), xmodal.models.TwoTower)
    # what xmodal writes is weights-only loadable (checkpoint included)
    for f in ("model.pt", "checkpoint.pt"):
        torch.load(tmp_path / "good" / f, weights_only=True)


def test_truncated_checkpoint_on_resume_names_the_file(tmp_path, capsys):
    run = tmp_path / "run"
    rc = main(["train", str(REPO / "configs/synthetic.yaml"), "--out", str(run), "--quiet", "--no-plots",
               *CLI_TINY, "train.epochs=2"])
    assert rc == 0
    ck = run / "checkpoint.pt"
    ck.write_bytes(ck.read_bytes()[:100])
    capsys.readouterr()
    rc = main(["train", str(REPO / "configs/synthetic.yaml"), "--out", str(run), "--quiet", "--no-plots",
               *CLI_TINY, "train.epochs=2"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "checkpoint.pt" in err and "truncated" in err


def test_second_writer_fails_at_once_naming_run_and_pid(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with RunLock(run):  # this test process is the first writer
        res = subprocess.run([sys.executable, "-m", "xmodal", "train", str(REPO / "configs/synthetic.yaml"),
                              "--out", str(run), "--quiet", "--no-plots", *CLI_TINY],
                             capture_output=True, text=True, env=ENV, timeout=300)
        assert res.returncode == 2, res.stderr
        err = res.stderr.strip()
        assert len(err.splitlines()) == 1
        assert str(run) in err and f"process {os.getpid()}" in err and "in use" in err
        assert not (run / "config.yaml").exists()  # nothing written by the refused writer
    # released: the same directory trains now
    train(tiny_config(), run)


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text(dead.stdout.strip() + "\n")
    train(tiny_config(), run)
    assert (run / "model.pt").is_file()


def test_in_process_second_lock_is_refused(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RunDirError, match="in use by process"):
            RunLock(tmp_path).acquire()


def test_disk_full_says_so_and_leaves_no_temporary(tmp_path, monkeypatch, capsys):
    import xmodal.runs as runs

    def full(obj, path, *a, **k):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runs.torch, "save", full)
    with pytest.raises(OSError, match="no space left on device while writing .*checkpoint.pt"):
        train(tiny_config(), tmp_path / "a")
    assert not list((tmp_path / "a").glob(".*tmp*"))
    capsys.readouterr()  # the in-process run's own lines (its warm-up note); the CLI's error is what counts
    rc = main(["train", str(REPO / "configs/synthetic.yaml"), "--out", str(tmp_path / "b"), "--quiet", *CLI_TINY])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1 and "no space left on device" in err


def test_stale_temporaries_are_removed_on_the_next_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for name in (".checkpoint.pt.tmp12345", ".model.pt.tmp999", ".log.jsonl.tmp1"):
        (run / name).write_bytes(b"left by a killed save")
    train(tiny_config(), run)
    assert sorted(p.name for p in run.glob(".*tmp*")) == []
    (run / "keep.tmp").write_text("not ours")  # a user's file: the run directory is refused, not cleaned
    with pytest.raises(RunDirError, match=r"not an xmodal run's \(keep\.tmp\)"):
        train(tiny_config(), run)
    assert (run / "keep.tmp").read_text() == "not ours"


def test_nan_loss_stops_with_epoch_and_step(tmp_path, monkeypatch):
    from xmodal.losses import InfoNCE

    real = InfoNCE.forward
    calls = {"n": 0}

    def forward(self, *a, **k):
        calls["n"] += 1
        out = real(self, *a, **k)
        return out * float("nan") if calls["n"] == 5 else out

    monkeypatch.setattr(InfoNCE, "forward", forward)
    # 120 train videos x 3 captions / 32 = 11 steps per epoch: call 5 is epoch 1 step 5
    with pytest.raises(ValueError, match="training diverged at epoch 1 step 5"):
        train(tiny_config(), tmp_path)


@pytest.mark.parametrize("argv, field", [
    (["bench", "--epochs", "0", "--quick"], "--epochs"),
    (["train", str(REPO / "configs/synthetic.yaml"), "--out", "{tmp}/r", "--threads", "0"], "--threads"),
    (["train", str(REPO / "configs/synthetic.yaml"), "--out", "{tmp}/r", "--threads=0"], "--threads"),
    (["train", str(REPO / "configs/synthetic.yaml"), "--out", "{tmp}/afile"], "not a directory"),
    (["train", "{tmp}/list.yaml", "--out", "{tmp}/r"], "mapping"),
    (["train", "{tmp}/strtemp.yaml", "--out", "{tmp}/r"], "loss.temperature"),
])
def test_cli_bad_arguments_are_one_line_errors(tmp_path, capsys, argv, field):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "list.yaml").write_text("- loss\n- train\n")
    (tmp_path / "strtemp.yaml").write_text('loss: {name: infonce, temperature: "0.05"}\n')
    rc = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and field in err, err
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def test_config_numbers_from_yaml_and_strings_refused(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("optim: {lr: 3e-4}\nloss: {temperature: 5e-2}\n")
    cfg = load_config(p, ["optim.weight_decay=1e-2"])
    assert cfg.optim.lr == 3e-4 and cfg.loss.temperature == 0.05 and cfg.optim.weight_decay == 0.01
    for bad in (['loss.temperature="0.05"'], ['optim.lr="1e-3"'], ['loss.kwargs={temperature: "0.1"}']):
        with pytest.raises(ValueError, match="expected a number"):
            load_config(None, bad)


def test_load_checkpoint_reads_plain_payloads(tmp_path):
    torch.save({"model": {"w": torch.arange(3)}, "summary": {"a": [1.0, None, "x"]}}, tmp_path / "m.pt")
    ck = load_checkpoint(tmp_path / "m.pt")
    assert torch.equal(ck["model"]["w"], torch.arange(3)) and ck["summary"] == {"a": [1.0, None, "x"]}
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        load_checkpoint(tmp_path / "missing.pt")
    json.dumps(ck["summary"])


def test_a_file_that_is_no_pickle_is_not_called_dangerous(tmp_path):
    """Random bytes or a ``.npy`` renamed to ``model.pt`` are "not a torch file"; only a zip
    archive or a real pickle gets the could-run-code refusal (the old message said so for any
    file torch's weights-only reader rejected)."""
    import pickle

    import numpy as np

    from xmodal.runs import load_checkpoint

    np.save(tmp_path / "a.npy", np.ones(3))
    (tmp_path / "a.npy").rename(tmp_path / "npy.pt")
    (tmp_path / "bytes.pt").write_bytes(b"garbage, not a checkpoint" * 3)
    (tmp_path / "pickle.pt").write_bytes(pickle.dumps("a plain string"))
    for name in ("npy.pt", "bytes.pt"):
        with pytest.raises(ValueError, match=r"not a readable checkpoint \(not a torch file\)"):
            load_checkpoint(tmp_path / name)
    with pytest.raises(ValueError, match=r"pickle.pt: (refused|not an xmodal)"):
        load_checkpoint(tmp_path / "pickle.pt")
