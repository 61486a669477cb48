"""A full disk, met for real: a small tmpfs filled up to a few KB (mounting needs root; the
tests skip with a message otherwise). Every writing command ends in one line "no space
left on device", exit status 1, and leaves no temporary and no truncated output behind.

The error torch really raises on ENOSPC is a ``RuntimeError`` from its zip writer
("[enforce fail at inline_container.cc] unexpected pos N vs M"), FAISS's a
``RuntimeError`` "write error ... (No space left on device)": both are met here, not faked.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from xmodal.cli import main

REPO = Path(__file__).resolve().parents[1]
TINY = ["data.synthetic={num_train: 120, num_val: 60, num_test: 60, num_concepts: 10}",
        "train.epochs=1", "train.batch_size=32", "model.dim=16", "test_time.bank_size=100"]

pytestmark = pytest.mark.usefixtures("one_thread")


def _fill(folder: Path, free: int) -> None:
    """Fill the filesystem of ``folder`` and give back ``free`` bytes."""
    filler = folder / ".filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for chunk in (1 << 16, 1 << 12, 1):
            block = b"\0" * chunk
            while True:
                try:
                    os.write(fd, block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        os.ftruncate(fd, max(0, os.fstat(fd).st_size - free))
    finally:
        os.close(fd)


@pytest.fixture
def small_disk(tmp_path):
    """``make(free)`` -> a folder on a 1 MiB tmpfs with ``free`` bytes left."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True,
                         text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root): {res.stderr.strip() or res.returncode}")
    count = {"n": 0}

    def make(free: int) -> Path:
        count["n"] += 1
        _fill(mnt, free)
        folder = mnt / f"case{count['n']}"
        return folder

    try:
        yield make
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], check=False)  # still busy: detach it


def _one_line_no_space(capsys, rc) -> str:
    err = capsys.readouterr().err.strip()
    assert rc == 1, err
    assert len(err.splitlines()) == 1 and "no space left on device" in err, err
    assert "Traceback" not in err
    return err


def _no_temporaries(folder: Path) -> None:
    left = [p.name for p in folder.rglob("*") if ".tmp" in p.name]
    assert left == [], left


@pytest.mark.parametrize("free", [0, 16 << 10])
def test_train_on_a_full_disk(small_disk, capsys, free):
    from xmodal.config import load_config

    folder = small_disk(free)
    run = folder / "run"
    rc = main(["train", str(REPO / "configs/synthetic.yaml"), "--out", str(run), "--quiet", "--no-plots", *TINY])
    _one_line_no_space(capsys, rc)
    if run.is_dir():
        _no_temporaries(run)
        assert not (run / "model.pt").exists() and not (run / "metrics.json").exists()
        if (run / "config.yaml").exists():  # written whole or not at all
            load_config(run / "config.yaml")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from xmodal.config import load_config
    from xmodal.training.loop import train

    run = tmp_path_factory.mktemp("disk") / "run"
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(load_config(REPO / "configs/synthetic.yaml", [*TINY, "train.progress=false"]), run)
    finally:
        torch.set_num_threads(prev)
    feats = run.parent / "v.npy"
    np.save(feats, np.random.default_rng(0).standard_normal((500, 64)).astype(np.float32))
    return run, feats


@pytest.mark.parametrize("free", [0, 8 << 10, 64 << 10])
def test_index_on_a_full_disk(small_disk, capsys, trained, free):
    pytest.importorskip("faiss", reason="xmodal index needs the [faiss] extra")
    run, feats = trained
    out = small_disk(free) / "idx"
    rc = main(["index", "--run", str(run), "--video-features", str(feats), "--out", str(out)])
    _one_line_no_space(capsys, rc)
    if out.is_dir():
        _no_temporaries(out)
        assert not (out / "meta.json").exists()  # never a valid-looking, incomplete index


@pytest.mark.parametrize("free", [0, 24 << 10])
def test_report_on_a_full_disk(small_disk, capsys, trained, free):
    run, _ = trained
    folder = small_disk(free)
    folder.mkdir(exist_ok=True)
    out = folder / "r.html"
    rc = main(["report", str(run), "--out", str(out), "--examples", "2", "--threads", "1"])
    _one_line_no_space(capsys, rc)
    assert not out.exists()
    _no_temporaries(folder)


def test_normalize_save_bias_on_a_full_disk(small_disk, capsys, tmp_path):
    rng = np.random.default_rng(0)
    g = rng.standard_normal((2000, 8)).astype(np.float32)
    arrays = {"q": g[:50] + 0.1, "g": g, "p": np.arange(50), "b": g[100:400]}
    for k, a in arrays.items():
        np.save(tmp_path / f"{k}.npy", a)
    folder = small_disk(0)
    folder.mkdir(exist_ok=True)
    rc = main(["normalize", "--method", "sinkhorn", "--queries", str(tmp_path / "q.npy"),
               "--gallery", str(tmp_path / "g.npy"), "--positives", str(tmp_path / "p.npy"),
               "--bank", str(tmp_path / "b.npy"), "--l2", "--save-bias", str(folder / "bias.npy")])
    _one_line_no_space(capsys, rc)
    assert not (folder / "bias.npy").exists()
    _no_temporaries(folder)


def test_torch_save_really_raises_runtime_error_on_enospc(small_disk):
    """What the handling above is built on: torch.save meets ENOSPC as a RuntimeError."""
    from xmodal.runs import atomic_save

    folder = small_disk(0)
    folder.mkdir(exist_ok=True)
    with pytest.raises(RuntimeError):
        torch.save({"w": torch.zeros(50_000)}, folder / "raw.pt")
    (folder / "raw.pt").unlink(missing_ok=True)
    with pytest.raises(OSError, match="no space left on device while writing .*model.pt") as info:
        atomic_save({"w": torch.zeros(50_000)}, folder / "model.pt")
    assert info.value.errno == errno.ENOSPC
    assert list(folder.iterdir()) == []


def _no_hidden_leftovers(folder: Path) -> None:
    left = [p.name for p in folder.rglob("*") if p.name != ".filler"
            and (".tmp" in p.name or ".partial" in p.name or ".import-" in p.name)]
    assert left == [], left


@pytest.fixture
def dummy_encoders():
    """A text and an image encoder registered for the test: the write path, not the model, is under test."""
    from xmodal.features import encoders

    def text(inputs, *, batch_size, progress):
        return np.tile(np.arange(len(inputs), dtype=np.float32)[:, None], (1, 256))

    def image(inputs, *, batch_size, progress):
        return np.tile(np.arange(len(inputs), dtype=np.float32)[:, None], (1, 256))

    encoders.register_encoder("disk-text", text, kind="text")
    encoders.register_encoder("disk-image", image, kind="image")
    yield
    del encoders.ENCODERS["disk-text"], encoders.ENCODERS["disk-image"]


def _free_space(folder: Path) -> None:
    (folder.parent / ".filler").unlink()


@pytest.mark.parametrize("kind", ["text", "images"])
@pytest.mark.parametrize("free", [0, 16 << 10])
def test_encode_on_a_full_disk(small_disk, capsys, tmp_path, dummy_encoders, kind, free):
    src = tmp_path / "src"
    src.mkdir()
    if kind == "text":
        (src / "c.txt").write_text("".join(f"caption {i}\n" for i in range(200)))
        inputs = ["--captions", str(src / "c.txt"), "--model", "disk-text"]
    else:
        for i in range(200):
            (src / f"{i:03d}.jpg").write_bytes(b"")
        inputs = ["--dir", str(src), "--model", "disk-image"]
    folder = small_disk(free)
    folder.mkdir(exist_ok=True)
    out = folder / "feats.npy"
    rc = main(["encode", kind, *inputs, "--out", str(out), "--quiet"])
    err = _one_line_no_space(capsys, rc)
    assert str(out) in err
    assert not out.exists()
    _no_hidden_leftovers(folder)
    _free_space(folder)
    assert main(["encode", kind, *inputs, "--out", str(out), "--quiet"]) == 0
    assert np.load(out).shape == (200, 256)


def test_data_import_on_a_full_disk(small_disk, capsys, tmp_path):
    rng = np.random.default_rng(0)
    feats = tmp_path / "feats"
    feats.mkdir()
    lines = ["video,caption,split"]
    for i in range(40):
        np.save(feats / f"v{i}.npy", rng.standard_normal((8, 64)).astype(np.float32))
        lines.append(f"v{i},caption {i},{'train' if i < 30 else 'test'}")
    (tmp_path / "pairs.csv").write_text("\n".join(lines) + "\n")
    np.save(tmp_path / "t.npy", rng.standard_normal((40, 32)).astype(np.float32))
    args = ["data", "import", str(tmp_path / "pairs.csv"), "--features", str(feats),
            "--text-features", str(tmp_path / "t.npy")]
    folder = small_disk(24 << 10)
    folder.mkdir(exist_ok=True)
    out = folder / "data"
    rc = main([*args, "--out", str(out)])
    err = _one_line_no_space(capsys, rc)
    assert str(folder) in err and ".npy" in err, err  # names the file being written
    assert not out.exists()
    _no_hidden_leftovers(folder)
    _free_space(folder)
    assert main([*args, "--out", str(out)]) == 0
    assert (out / "train_video_features.npy").is_file()


def test_encode_videos_on_a_full_disk(small_disk, capsys, tmp_path, dummy_encoders):
    pytest.importorskip("av", reason="xmodal encode videos needs the [video] extra (PyAV)")
    from test_video_encode import gradient_frames, write_video

    vids = tmp_path / "vids"
    vids.mkdir()
    for name in ("a", "b", "c"):
        write_video(vids / f"{name}.mp4", gradient_frames(12), "mpeg4")
    folder = small_disk(24 << 10)  # room for one video's 12 x 256 float32 features, not three
    folder.mkdir(exist_ok=True)
    out = folder / "feats"
    out.mkdir()
    for stale in (".c.npy.tmp999999", ".c.npy.999999.tmp"):  # left by a killed encode (old and new names)
        (out / stale).write_bytes(b"\0" * 100)
    args = ["encode", "videos", str(vids), "--out", str(out), "--model", "disk-image", "--no-progress", "--all-frames"]
    rc = main(args)
    err = _one_line_no_space(capsys, rc)
    assert ".npy" in err and str(out) in err, err
    for p in out.glob("*.npy"):  # what is there is whole
        assert np.load(p).shape == (12, 256), p
    _no_hidden_leftovers(folder)
    _free_space(folder)
    assert main(args) == 0
    assert sorted(p.name for p in out.iterdir()) == ["a.npy", "b.npy", "c.npy", "encoder.json"]  # + the sidecar
