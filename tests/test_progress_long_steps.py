"""Every long step reports as training does (issue 43 item 4): ``eval --run``, the index build's steps and
``data check`` print, without a terminal, lines with the count, the fraction, the rate and the time left
(``XMODAL_PROGRESS_SECONDS`` 0 here: a line at every step instead of every 30 s)."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("faiss")

from xmodal.cli import main  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

#: ``desc: 8/40 queries (20%), 1,234 queries/s, 0 s elapsed, about 1 s left``
LINE = r"{desc}: (\d+)/(\d+) [\w ]+ \((\d+)%\), (?:[\d,.]+ [\w ]+/s|[\d a-z]+ per [\w ]+), [\d a-z]+ elapsed, about [\d a-z]+ left"


def counted(text: str, desc: str) -> list[tuple[int, int, int]]:
    """``(count, total, percent)`` of every line of ``desc`` that carries a rate and a time left."""
    return [tuple(map(int, m.groups())) for m in re.finditer(LINE.format(desc=re.escape(desc)), text)]


def check_lines(found: list, total: int) -> None:
    assert found, "no progress line with a count, a fraction, a rate and the time left"
    for count, tot, pct in found:
        assert tot == total and 0 < count < total and pct == round(100 * count / total)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    root = tmp_path_factory.mktemp("progress")
    cfg = from_dict({
        "data": {"name": "synthetic", "synthetic": {"num_train": 400, "num_val": 60, "num_test": 60,
                                                     "num_concepts": 10}},
        "model": {"kind": "linear", "dim": 16},
        "loss": {"name": "infonce", "temperature": 0.05},
        "test_time": {"normalizers": ["none"], "bank_size": 100},
        "train": {"seed": 0, "epochs": 1, "batch_size": 32},
    })
    train(cfg, root / "run", resume=False, progress=False, verbose=False)
    rng = np.random.default_rng(3)
    paths = {"video": root / "v.npy", "text": root / "t.npy", "t2v": root / "m.npy"}
    np.save(paths["video"], rng.standard_normal((300, 64)).astype(np.float32))
    np.save(paths["text"], rng.standard_normal((40, 48)).astype(np.float32))
    np.save(paths["t2v"], rng.choice(300, 40, replace=False))
    return root / "run", {k: str(v) for k, v in paths.items()}


def test_eval_run_reports_without_a_terminal(run_dir, capsys, monkeypatch):
    """Before: eval --run passed progress_enabled (False without a terminal), so no line ever came."""
    run, p = run_dir
    monkeypatch.setenv("XMODAL_PROGRESS_SECONDS", "0")
    assert main(["eval", "--run", str(run), "--video-features", p["video"], "--text-features", p["text"],
                 "--text-to-video", p["t2v"], "--block-size", "8"]) == 0
    err = capsys.readouterr().err
    check_lines(counted(err, "retrieval"), 40)
    assert "retrieval: 40/40 queries (100%)" in err  # the last line
    # --no-progress: nothing
    assert main(["eval", "--run", str(run), "--video-features", p["video"], "--text-features", p["text"],
                 "--text-to-video", p["t2v"], "--block-size", "8", "--no-progress"]) == 0
    assert "retrieval:" not in capsys.readouterr().err


def test_index_build_steps_report_count_fraction_rate_and_time_left(run_dir, tmp_path, capsys, monkeypatch):
    from xmodal.progress import Stages
    from xmodal.retrieval.build import write_index

    run, _ = run_dir
    gallery = np.random.default_rng(4).standard_normal((8000, 64)).astype(np.float32)  # 2+ cell counts to try
    monkeypatch.setenv("XMODAL_PROGRESS_SECONDS", "0")
    with Stages(show=None) as stage:
        write_index(str(run), gallery, tmp_path / "idx", normalizer="none", kind="ivf", block_rows=2000, log=stage)
    err = capsys.readouterr().err
    check_lines(counted(err, "index: encoding the gallery"), 8000)
    check_lines(counted(err, "index: adding"), 8000)
    check_lines(counted(err, "index: assigning cells"), 8000)
    check_lines(counted(err, "index: exact top-10 of 1000 recall queries"), 8000)  # the run's stored train texts
    check_lines(counted(err, "index: training the cell quantisers"), 3)  # 1, 2 and 4 x sqrt(N)
    assert re.search(r"index: measuring recall@10 and queries/s \(nprobe\): \d+ settings, [\d,.]+ settings/s", err)
    capsys.readouterr()
    with Stages(show=False) as stage:  # --no-progress: no counted line
        write_index(str(run), gallery, tmp_path / "idx2", normalizer="none", kind="ivf", block_rows=2000, log=stage)
    assert "index: adding" not in capsys.readouterr().err


def test_data_check_reports_the_rows_it_hashes(tmp_path, capsys, monkeypatch):
    from xmodal.data.synthetic import write_synthetic

    write_synthetic(tmp_path / "data", seed=0)
    monkeypatch.setenv("XMODAL_PROGRESS_SECONDS", "0")
    main(["data", "check", str(tmp_path / "data")])
    err = capsys.readouterr().err
    check_lines(counted(err, "data check: inspecting"), 3)
    hashed = [m for m in re.finditer(r"data check: hashing (\w+) videos: (\d+)/(\d+) videos \((\d+)%\)", err)]
    assert hashed and any(m.group(2) == m.group(3) for m in hashed)
