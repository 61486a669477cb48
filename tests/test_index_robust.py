"""``xmodal index`` / ``query`` on hostile input and a full disk (issue 36, items 3, 4 and 9).

- A full disk while ``videos.npy`` is written ends in one line "no space left on device", never in
  SIGBUS (it was written through a memory map), and leaves no temporary.
- ``index --overwrite`` on a full disk keeps the previous index: the new one is built beside it and
  swapped in at the end.
- ivfpq on a gallery too small to train its quantisers, and a finite feature row whose embedding is
  not finite (3e38), are refused in one line naming the row; ``--ef-search`` / ``--nprobe`` are bounded.

The full-disk cases fill a real tmpfs (mounting needs root; skipped otherwise), as tests/test_disk_full.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("faiss", reason="xmodal index needs the [faiss] extra")

from xmodal.cli import main  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TINY = ["data.synthetic={num_train: 120, num_val: 60, num_test: 60, num_concepts: 10}",
        "train.epochs=1", "train.batch_size=32", "model.dim=16", "test_time.bank_size=100", "train.progress=false"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from xmodal.config import load_config
    from xmodal.training.loop import train

    root = tmp_path_factory.mktemp("robust")
    train(load_config(REPO / "configs/synthetic.yaml", TINY), root / "run")
    rng = np.random.default_rng(0)
    np.save(root / "v.npy", rng.standard_normal((500, 64)).astype(np.float32))
    np.save(root / "v_other.npy", rng.standard_normal((400, 64)).astype(np.float32))
    np.save(root / "t.npy", rng.standard_normal((2, 48)).astype(np.float32))
    return root


def _one_line(capsys, rc, *, code=2) -> str:
    """One line on stderr, no traceback; exit status 2 for bad input, 1 for a full disk (as the CLI does)."""
    err = capsys.readouterr().err.strip()
    assert rc == code, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# ----------------------------------------------------------------------------- hostile input (36.9)
@pytest.mark.parametrize("kind", ["ivfpq"])
def test_ivfpq_on_a_gallery_too_small_to_train_is_one_line(trained, tmp_path, capsys, kind):
    np.save(tmp_path / "one.npy", np.ones((1, 64), np.float32))
    rc = main(["index", "--run", str(trained / "run"), "--video-features", str(tmp_path / "one.npy"),
               "--kind", kind, "--out", str(tmp_path / "idx")])
    err = _one_line(capsys, rc)
    assert "--kind" in err and "1 video" in err and "flat" in err
    assert not (tmp_path / "idx" / "meta.json").exists()


@pytest.mark.parametrize("kind", ["flat", "ivf", "ivfpq", "hnsw"])
def test_a_row_that_embeds_to_non_finite_values_is_refused_by_name(trained, tmp_path, capsys, kind):
    """3e38 is a finite float32; the video head overflows it to inf, and the L2 norm to NaN. On flat it
    was indexed as NaN with rc 0 (that video could never be found); ivf / ivfpq ended in FAISS tracebacks."""
    v = np.load(trained / "v.npy")
    v[7] = 3e38
    np.save(tmp_path / "big.npy", v)
    (tmp_path / "names.txt").write_text("".join(f"clip{i}\n" for i in range(len(v))))
    rc = main(["index", "--run", str(trained / "run"), "--video-features", str(tmp_path / "big.npy"),
               "--names", str(tmp_path / "names.txt"), "--kind", kind, "--out", str(tmp_path / "idx")])
    err = _one_line(capsys, rc)
    assert "--video-features" in err and "row 7" in err and "clip7" in err and "finite" in err
    assert not (tmp_path / "idx" / "meta.json").exists()


def test_biased_index_refuses_non_finite_rows_and_tiny_pq_galleries(tmp_path):
    """Arrays were checked already; a row source (the build's embeddings on disk) reached FAISS unchecked."""
    from xmodal.retrieval.index import MIN_PQ_ROWS, BiasedIndex
    from xmodal.retrieval.rowstore import RowStore

    g = np.random.default_rng(0).standard_normal((100, 8)).astype(np.float32)
    g[43, 2] = np.nan
    store = RowStore(100, 8, directory=tmp_path, in_memory_bytes=0)
    store.append(g)
    for kind in ("flat", "ivf", "ivfpq", "hnsw"):
        with pytest.raises(ValueError, match="gallery: row 43 is not finite"):
            BiasedIndex(store, kind=kind, block_rows=16)
    store.close()
    with pytest.raises(ValueError, match="gallery: contains 1 NaN"):
        BiasedIndex(g, kind="flat")
    with pytest.raises(ValueError, match=f"gallery: ivfpq needs at least {MIN_PQ_ROWS} rows"):
        BiasedIndex(np.ones((1, 8), np.float32), kind="ivfpq")


@pytest.mark.parametrize("flag,value", [("--ef-search", "1000000000"), ("--ef-search", "100000000000000000000"),
                                        ("--nprobe", "100000000000000000000")])
def test_search_parameters_are_bounded_in_query(trained, tmp_path, capsys, flag, value):
    kind = "hnsw" if flag == "--ef-search" else "ivf"
    out = tmp_path / "idx"
    assert main(["index", "--run", str(trained / "run"), "--video-features", str(trained / "v.npy"),
                 "--kind", kind, "--out", str(out)]) == 0
    capsys.readouterr()
    rc = main(["query", "--index", str(out), "--text-features", str(trained / "t.npy"), flag, value])
    err = _one_line(capsys, rc)
    assert err.startswith(f"xmodal query: error: {flag}:") and "at most" in err


@pytest.mark.parametrize("flag,value,kind", [("--ef-search", "1000000000", "hnsw"),
                                             ("--nprobe", "100000000000000000000", "ivf")])
def test_search_parameters_are_bounded_in_index(trained, tmp_path, capsys, flag, value, kind):
    rc = main(["index", "--run", str(trained / "run"), "--video-features", str(trained / "v.npy"),
               "--kind", kind, flag, value, "--out", str(tmp_path / "idx")])
    err = _one_line(capsys, rc)
    assert err.startswith(f"xmodal index: error: {flag}:") and "at most" in err


def test_whole_number_refuses_an_integer_too_large_for_a_float_in_one_line():
    from xmodal._validate import whole_number

    assert whole_number(10**20, "n") == 10**20
    with pytest.raises(ValueError, match="n: must be an integer >= 0"):
        whole_number(-10**30, "n")


# ----------------------------------------------------------------------------- a full disk (36.3, 36.4)
@pytest.fixture
def tmpfs(tmp_path):
    """``make(size, free=None)`` -> an empty folder on a fresh tmpfs of ``size`` bytes; ``fill(folder, free)``
    then leaves ``free`` bytes on it."""
    mounted = []

    def make(size: int) -> Path:
        mnt = tmp_path / f"mnt{len(mounted)}"
        mnt.mkdir()
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                             capture_output=True, text=True)
        if res.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs to fill (needs root): {res.stderr.strip() or res.returncode}")
        mounted.append(mnt)
        return mnt

    try:
        yield make
    finally:
        for mnt in mounted:
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(folder: Path, free: int) -> None:
    """Fill ``folder``'s filesystem, then give ``free`` bytes back (test_disk_full's helper)."""
    from test_disk_full import _fill

    _fill(folder, free)


def _cli(*args: str) -> subprocess.CompletedProcess:
    """The command in a child process: a SIGBUS kills the child, not the test run."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "xmodal", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name != ".filler" and
                  (".tmp" in p.name or ".build" in p.name or ".old" in p.name))


@pytest.mark.parametrize("share", [0.5, 0.9])
def test_a_full_disk_while_videos_npy_is_written_is_one_line_not_sigbus(trained, tmp_path, tmpfs, share):
    """The space runs out inside videos.npy (an ivfpq index is small, the embeddings are not): it was
    written through np.lib.format.open_memmap, and a store into a page the filesystem cannot back is
    SIGBUS (rc -7, no message, the temporary left)."""
    big = tmp_path / "big.npy"
    np.save(big, np.random.default_rng(1).standard_normal((6000, 64)).astype(np.float32))
    ref = tmp_path / "ref"
    args = ["index", "--run", str(trained / "run"), "--video-features", str(big), "--kind", "ivfpq", "--quiet",
            "--store", "float32"]
    assert _cli(*args, "--out", str(ref)).returncode == 0
    videos = (ref / "videos.npy").stat().st_size
    others = sum(p.stat().st_size for p in ref.iterdir() if p.name not in ("videos.npy", "meta.json"))
    mnt = tmpfs(4 << 20)
    fill(mnt, others + (64 << 10) + int(share * videos) - (share == 0.9) * (96 << 10))
    out = mnt / "idx"
    res = _cli(*args, "--out", str(out))
    err = res.stderr.strip()
    assert res.returncode == 1, (res.returncode, err[-2000:])
    assert len(err.splitlines()) == 1 and "no space left on device" in err, err
    assert _left(mnt) == []
    assert not (out / "meta.json").exists()


@pytest.mark.parametrize("free", [0, 8 << 10, 64 << 10, 160 << 10])
def test_overwrite_on_a_full_disk_keeps_the_previous_index(trained, tmpfs, capsys, free):
    from xmodal.retrieval.search import SearchIndex

    mnt = tmpfs(2 << 20)
    out = mnt / "idx"
    assert main(["index", "--run", str(trained / "run"), "--video-features", str(trained / "v.npy"),
                 "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    fill(mnt, free)
    rc = main(["index", "--run", str(trained / "run"), "--video-features", str(trained / "v_other.npy"),
               "--kind", "hnsw", "--overwrite", "--quiet", "--out", str(out)])
    err = _one_line(capsys, rc, code=1)
    assert "no space left on device" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the last good index, untouched
    assert SearchIndex(out).index.num_items == 500
    assert _left(mnt) == []


def test_overwrite_replaces_every_file_and_drops_the_ones_the_new_index_has_no_use_for(trained, tmp_path, capsys):
    from xmodal.retrieval.search import SearchIndex

    out = tmp_path / "idx"
    names = tmp_path / "names.txt"
    names.write_text("".join(f"v{i}\n" for i in range(500)))
    assert main(["index", "--run", str(trained / "run"), "--video-features", str(trained / "v.npy"),
                 "--names", str(names), "--out", str(out)]) == 0
    assert (out / "names.txt").is_file()
    assert main(["index", "--run", str(trained / "run"), "--video-features", str(trained / "v_other.npy"),
                 "--overwrite", "--out", str(out)]) == 0
    idx = SearchIndex(out)
    assert idx.index.num_items == 400 and idx.names is None and not (out / "names.txt").exists()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
