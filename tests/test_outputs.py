"""Nothing lost, nothing stale (issue 15): a command writes only its own files, removes the
files of its kind the new result does not contain, never writes through a link it did not
create, refuses an --out holding other files; config values are checked before epoch 1;
runs and indexes declaring more than they hold are refused before allocation; and a list
of inputs that used to end in tracebacks now give one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import xmodal
from xmodal.cli import main
from xmodal.config import from_dict, load_config
from xmodal.runs import RunDirError, load_checkpoint
from xmodal.training.loop import train

REPO = Path(__file__).resolve().parents[1]
TINY = {"num_train": 120, "num_val": 60, "num_test": 60, "num_concepts": 10}
CLI_TINY = ["data.synthetic={num_train: 120, num_val: 60, num_test: 60, num_concepts: 10}",
            "train.epochs=1", "train.batch_size=32", "model.dim=16", "test_time.bank_size=100"]
CONFIG = str(REPO / "configs/synthetic.yaml")

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_config(epochs=1, **sections):
    d = {"data": {"name": "synthetic", "synthetic": dict(TINY)}, "model": {"dim": 16},
         "loss": {"name": "infonce", "temperature": 0.1}, "optim": {"lr": 3e-3},
         "test_time": {"normalizers": ["none", "dn", "sinkhorn"], "bank_size": 100, "oracle": False},
         "train": {"seed": 0, "epochs": epochs, "batch_size": 32, "patience": 0, "progress": False}}
    for name, values in sections.items():
        d[name].update(values)
    return from_dict(d)


def _one_line(capsys, rc, code=2) -> str:
    err = capsys.readouterr().err.strip()
    assert rc == code, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = tmp_path_factory.mktemp("outputs") / "run"
        train(tiny_config(), run)
    finally:
        torch.set_num_threads(prev)
    return run


def _copy(run: Path, dest: Path) -> Path:
    shutil.copytree(run, dest)
    return dest


# ----------------------------------------------------------------------------- train
def test_no_resume_removes_the_old_model_before_training(finished, tmp_path):
    run = _copy(finished, tmp_path / "run")
    (run / "report.html").write_text("<title>xmodal run report</title>")  # the old run's page
    old = load_checkpoint(run / "model.pt")["config"]
    # the new run "dies" after its first epoch (of two): nothing of the old run may be served
    state = train(tiny_config(epochs=2, model={"dim": 8}), run, resume=False, stop_after_epochs=1)
    assert state == {"stopped": True, "epoch": 1}
    for name in ("model.pt", "metrics.json", "report.html"):
        assert not (run / name).exists(), name
    loaded = xmodal.load_model(run)  # the new run's last checkpoint, never the old model
    assert loaded.encode_text(np.zeros((1, 48), np.float32)).shape[1] == 8
    assert load_checkpoint(run / "checkpoint.pt")["config"] != old
    assert len((run / "log.jsonl").read_text().splitlines()) == 1


def test_fresh_run_without_checkpoint_removes_a_stale_model(finished, tmp_path):
    run = _copy(finished, tmp_path / "run")
    (run / "checkpoint.pt").unlink()  # resume=True but nothing to resume: a fresh run
    train(tiny_config(epochs=2), run, stop_after_epochs=1)
    assert not (run / "model.pt").exists() and not (run / "metrics.json").exists()


def test_lock_that_is_a_symlink_is_refused_not_written_through(tmp_path, capsys):
    target = tmp_path / "precious.txt"
    target.write_text("user data\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").symlink_to(target)
    with pytest.raises(RunDirError, match=r"\.lock is a symbolic link"):
        train(tiny_config(), run)
    rc = main(["train", CONFIG, "--out", str(run), "--quiet", "--no-plots", *CLI_TINY])
    assert ".lock" in _one_line(capsys, rc)
    assert target.read_text() == "user data\n"
    assert sorted(p.name for p in run.iterdir()) == [".lock"]


def test_out_holding_user_files_is_refused(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    (out / "features.npy").write_bytes(b"not touched")
    rc = main(["train", CONFIG, "--out", str(out), "--quiet", "--no-plots", *CLI_TINY])
    err = _one_line(capsys, rc)
    assert "features.npy" in err and "notes.txt" in err
    assert sorted(p.name for p in out.iterdir()) == ["features.npy", "notes.txt"]
    assert (out / "notes.txt").read_text() == "keep me"


def test_config_file_inside_out_is_refused_and_kept(tmp_path, capsys):
    out = tmp_path / "exp"
    out.mkdir()
    text = "# my experiment\nloss: {name: infonce}\n"
    for name in ("exp.yaml", "config.yaml"):  # a user's config under any name, the run's own name included
        for f in out.iterdir():
            f.unlink()
        (out / name).write_text(text)
        rc = main(["train", str(out / name), "--out", str(out), "--quiet", "--no-plots", *CLI_TINY])
        assert "config" in _one_line(capsys, rc)
        assert (out / name).read_text() == text
        assert sorted(p.name for p in out.iterdir()) == [name]


def test_resuming_from_the_runs_own_config_is_allowed(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path / "run")
    rc = main(["train", str(run / "config.yaml"), "--out", str(run), "--quiet", "--no-plots"])
    assert rc == 0, capsys.readouterr().err


def test_refused_resume_leaves_the_runs_config_alone(finished, tmp_path):
    run = _copy(finished, tmp_path / "run")
    before = (run / "config.yaml").read_text()
    with pytest.raises(ValueError, match="different config"):
        train(tiny_config(optim={"lr": 1e-2}), run)
    assert (run / "config.yaml").read_text() == before
    assert (run / "model.pt").is_file()  # the refused call removed nothing


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize("override, field", [
    ("test_time.sinkhorn_iters=0", "test_time.sinkhorn_iters"),
    ("test_time.sinkhorn_iters=100000000", "test_time.sinkhorn_iters"),
    ("test_time.qb_k=0", "test_time.qb_k"),
    ("model.width=100000000000", "model.width"),
    ("model.dim=100000000000", "model.dim"),
    ("optim.lr=1e38", "optim.lr"),
])
def test_config_values_refused_before_epoch_1(tmp_path, capsys, override, field):
    rc = main(["train", CONFIG, "--out", str(tmp_path / "r"), "--quiet", "--no-plots", *CLI_TINY, override])
    assert _one_line(capsys, rc).startswith(f"xmodal train: error: {field}")
    assert not (tmp_path / "r").exists()


def test_weights_turning_nan_is_the_divergence_message(tmp_path, monkeypatch):
    real = torch.optim.Adam.step

    def step(self, *a, **k):
        out = real(self, *a, **k)
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    p.fill_(float("inf"))
        return out

    monkeypatch.setattr(torch.optim.Adam, "step", step)
    cfg = tiny_config(train={"batch_size": 120 * 3})  # one step per epoch: the loss never sees the inf
    with pytest.raises(ValueError, match="training diverged in epoch 1"):
        train(cfg, tmp_path / "r")


# ----------------------------------------------------------------------------- loading runs
def test_tiny_model_file_declaring_huge_layers_is_refused_before_allocation(finished, tmp_path):
    ck = load_checkpoint(finished / "model.pt")
    arch = ck["model"]["architecture"]
    arch["video"].update(kind="mlp", width=1 << 23)  # 8 Mi x (64 + 16): 2.5 GiB of float32 declared
    torch.save(ck, tmp_path / "huge.pt")
    assert (tmp_path / "huge.pt").stat().st_size < 100_000
    code = ("import resource, sys, xmodal\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "try:\n    xmodal.load_model(sys.argv[1])\n"
            "except ValueError as e:\n    print(str(e))\n"
            "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "huge.pt")], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(xmodal.__file__).parents[1]), "OMP_NUM_THREADS": "1"},
                         timeout=300)
    msg, grown_mb = res.stdout.strip().splitlines()
    assert "huge.pt" in msg and ("architecture declares" in msg or "must be at most" in msg), res.stdout + res.stderr
    assert int(grown_mb) < 200, f"loading grew the process by {grown_mb} MB"


def test_bogus_selected_normalizer_in_model_file(finished, tmp_path, capsys):
    ck = load_checkpoint(finished / "model.pt")
    ck["model"]["test_time"]["selected"] = "bogus"
    torch.save(ck, tmp_path / "m.pt")
    with pytest.raises(ValueError, match=r"m\.pt.*test_time\.selected.*bogus"):
        xmodal.load_model(tmp_path / "m.pt")
    np.save(tmp_path / "t.npy", np.zeros((3, 48), np.float32))
    np.save(tmp_path / "v.npy", np.zeros((3, 64), np.float32))
    np.save(tmp_path / "m.npy", np.arange(3))
    rc = main(["eval", "--run", str(tmp_path / "m.pt"), "--text-features", str(tmp_path / "t.npy"),
               "--video-features", str(tmp_path / "v.npy"), "--text-to-video", str(tmp_path / "m.npy")])
    assert "--run" in _one_line(capsys, rc)


class _Payload:
    def __reduce__(self):
        return (os.getcwd, ())


@pytest.mark.parametrize("how", ["zip", "legacy", "raw pickle"])
def test_pickle_refusal_says_it_could_run_code(tmp_path, how):
    import pickle

    path = tmp_path / "evil.pt"
    if how == "zip":
        torch.save({"model": _Payload()}, path)
    elif how == "legacy":
        torch.save({"model": _Payload()}, path, _use_new_zipfile_serialization=False)
    else:
        path.write_bytes(pickle.dumps({"model": _Payload()}, protocol=4))
    with pytest.raises(ValueError) as info:
        xmodal.load_model(path)
    msg = str(info.value)
    assert "refused" in msg and "could run code" in msg and "corrupt" not in msg, msg


def test_compressed_zip_checkpoint_is_refused(finished, tmp_path):
    import zipfile

    src = zipfile.ZipFile(finished / "model.pt")
    with zipfile.ZipFile(tmp_path / "deflated.pt", "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            out.writestr(info.filename, src.read(info.filename))
    with pytest.raises(ValueError, match="compressed"):
        load_checkpoint(tmp_path / "deflated.pt")


# ----------------------------------------------------------------------------- index / query
@pytest.fixture
def feats(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "v5.npy", rng.standard_normal((5, 64)).astype(np.float32))
    np.save(tmp_path / "v9.npy", rng.standard_normal((9, 64)).astype(np.float32))
    np.save(tmp_path / "t.npy", rng.standard_normal((2, 48)).astype(np.float32))
    (tmp_path / "names5.txt").write_text("".join(f"old{i}\n" for i in range(5)))
    return tmp_path


def test_index_overwrite_without_names_removes_the_old_names(finished, feats, capsys):
    pytest.importorskip("faiss", reason="needs the [faiss] extra")
    out = feats / "idx"
    assert main(["index", "--run", str(finished), "--video-features", str(feats / "v5.npy"), "--out", str(out),
                 "--names", str(feats / "names5.txt")]) == 0
    assert main(["index", "--run", str(finished), "--video-features", str(feats / "v9.npy"), "--out", str(out),
                 "--overwrite"]) == 0
    assert not (out / "names.txt").exists()
    capsys.readouterr()
    assert main(["query", "--index", str(out), "--text-features", str(feats / "t.npy"), "--k", "9"]) == 0
    assert "old0" not in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["index.faiss", "meta.json", "model.pt", "query_shift.npy",
                                                      "videos.npy"]


def test_names_shorter_than_the_gallery_is_one_line(finished, feats, capsys):
    pytest.importorskip("faiss", reason="needs the [faiss] extra")
    out = feats / "idx"
    assert main(["index", "--run", str(finished), "--video-features", str(feats / "v9.npy"), "--out", str(out)]) == 0
    shutil.copyfile(feats / "names5.txt", out / "names.txt")  # an index edited by hand
    capsys.readouterr()
    rc = main(["query", "--index", str(out), "--text-features", str(feats / "t.npy"), "--k", "9"])
    err = _one_line(capsys, rc)
    assert "names.txt" in err and "5 names" in err and "9 videos" in err


def test_index_out_checks(finished, feats, capsys, tmp_path):
    pytest.importorskip("faiss", reason="needs the [faiss] extra")
    base = ["index", "--run", str(finished), "--video-features", str(feats / "v5.npy")]
    (tmp_path / "afile").write_text("x")
    assert "not a directory" in _one_line(capsys, main(base + ["--out", str(tmp_path / "afile")]))
    before = {p.name: p.stat().st_mtime_ns for p in finished.iterdir()}
    err = _one_line(capsys, main(base + ["--out", str(finished), "--overwrite"]))
    assert "--out" in err and "run directory" in err
    assert {p.name: p.stat().st_mtime_ns for p in finished.iterdir()} == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert "notes.txt" in _one_line(capsys, main(base + ["--out", str(mine), "--overwrite"]))
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_faiss_file_declaring_more_than_it_holds_is_refused(tmp_path):
    faiss = pytest.importorskip("faiss", reason="needs the [faiss] extra")
    import struct

    from xmodal.retrieval.index import BiasedIndex

    ix = faiss.IndexFlatIP(4)
    ix.add(np.ones((3, 4), np.float32))
    faiss.write_index(ix, str(tmp_path / "a.faiss"))
    data = bytearray((tmp_path / "a.faiss").read_bytes())
    assert BiasedIndex.load(tmp_path / "a.faiss").num_items == 3
    data[8:16] = struct.pack("<q", 1 << 40)  # ntotal
    (tmp_path / "b.faiss").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="declares"):
        BiasedIndex.load(tmp_path / "b.faiss")
    data = bytearray((tmp_path / "a.faiss").read_bytes())
    data[37:45] = struct.pack("<Q", (1 << 40) - 1)  # the stored vector's length
    (tmp_path / "c.faiss").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="declares"):
        BiasedIndex.load(tmp_path / "c.faiss")


# ----------------------------------------------------------------------------- report
def test_report_on_a_run_with_an_empty_config_refuses(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path / "run")
    (run / "config.yaml").write_text("")
    rc = main(["report", str(run), "--examples", "1"])
    assert "config.yaml" in _one_line(capsys, rc) and not (run / "report.html").exists()


@pytest.mark.parametrize("content", ["[1, 2]", '{"val": [1, 2]}', '{"val": {"none": 3}}', "{not json"])
def test_report_on_a_foreign_metrics_json_is_one_line(finished, tmp_path, capsys, content):
    run = _copy(finished, tmp_path / "run")
    (run / "metrics.json").write_text(content)
    rc = main(["report", str(run), "--examples", "1"])
    assert "metrics.json" in _one_line(capsys, rc)


def test_report_on_a_bench_csv_without_dataset_column(tmp_path, capsys):
    (tmp_path / "results.csv").write_text("objective,normalizer,R@1 mean,R@1 std\ninfonce,none,1.0,0.0\n")
    rc = main(["report", str(tmp_path)])
    err = _one_line(capsys, rc)
    assert "results.csv" in err and "dataset" in err


def test_report_out_checks(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path / "run")
    (tmp_path / "folder").mkdir()
    assert "directory" in _one_line(capsys, main(["report", str(run), "--out", str(tmp_path / "folder")]))
    (tmp_path / "mine.html").write_text("<p>my own page</p>")
    assert "not a page written" in _one_line(capsys, main(["report", str(run), "--out",
                                                            str(tmp_path / "mine.html")]))
    assert (tmp_path / "mine.html").read_text() == "<p>my own page</p>"
    out = tmp_path / "r.html"
    for _ in range(2):  # its own page is replaced
        assert main(["report", str(run), "--out", str(out), "--examples", "1"]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


# ----------------------------------------------------------------------------- normalize
def test_normalize_save_bias_to_a_directory_is_one_line(tmp_path, capsys):
    rng = np.random.default_rng(0)
    g = rng.standard_normal((6, 4)).astype(np.float32)
    for name, a in {"q": g + 0.1, "g": g, "p": np.arange(6), "b": g}.items():
        np.save(tmp_path / f"{name}.npy", a)
    (tmp_path / "dir").mkdir()
    rc = main(["normalize", "--method", "sinkhorn", "--queries", str(tmp_path / "q.npy"), "--gallery",
               str(tmp_path / "g.npy"), "--positives", str(tmp_path / "p.npy"), "--bank", str(tmp_path / "b.npy"),
               "--l2", "--save-bias", str(tmp_path / "dir")])
    assert _one_line(capsys, rc).startswith("xmodal normalize: error: --save-bias")
    assert list((tmp_path / "dir").iterdir()) == []
