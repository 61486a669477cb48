"""``xmodal data import`` / ``data check``: what costs hours later, caught at once and named.

Each test builds its own small table and feature files; the expected values come from the
files written here (row by row), never from the code under test.
"""

from __future__ import annotations

import csv
import hashlib
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from xmodal.cli import main
from xmodal.data import load_paired_split
from xmodal.data.importer import import_pairs


def _make(tmp: Path, splits=(("train", 12), ("val", 6), ("test", 6)), d=6, dt=4, frames=(1, 5), seed=0,
          audio=False, prefix="v"):
    rng = np.random.default_rng(seed)
    (tmp / "feats").mkdir(exist_ok=True)
    if audio:
        (tmp / "audio").mkdir(exist_ok=True)
    rows, feats = [], {}
    i = 0
    for split, n in splits:
        for _ in range(n):
            vid = f"{prefix}{i:03d}"
            feats[vid] = rng.standard_normal((int(rng.integers(*frames, endpoint=True)), d)).astype(np.float32)
            np.save(tmp / "feats" / f"{vid}.npy", feats[vid])
            if audio:
                np.save(tmp / "audio" / f"{vid}.npy", rng.standard_normal(3).astype(np.float32))
            rows += [(vid, f"caption {j} of {vid}", split) for j in range(2)]
            i += 1
    _table(tmp / "pairs.csv", rows)
    np.save(tmp / "tf.npy", rng.standard_normal((len(rows), dt)).astype(np.float32))
    return rows, feats


def _table(path, rows, delimiter=",", bom=False):
    with open(path, "w", newline="", encoding="utf-8-sig" if bom else "utf-8") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(["video_id", "caption", "split"])
        w.writerows(rows)


def _import(tmp, *extra, out="out", pairs="pairs.csv", tf="tf.npy"):
    return main(["data", "import", str(tmp / pairs), "--features", str(tmp / "feats"), "--out", str(tmp / out),
                 "--text-features", str(tmp / tf), *extra])


def _one_line(capsys):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_second_import_replaces_every_file_of_the_first(tmp_path, capsys):
    """Issue 15.1: the first import's expert files and test split survived a second import."""
    _make(tmp_path, audio=True)
    assert _import(tmp_path, "--expert", f"audio={tmp_path / 'audio'}") == 0
    first = set(_digest(tmp_path / "out"))
    assert "test_video_features.npy" in first and "train_video_features.audio.npy" in first
    # the second table: other videos, no test split, no expert
    second = tmp_path / "second"
    second.mkdir()
    rows, feats = _make(second, splits=(("train", 8), ("val", 4)), prefix="w", seed=1)
    assert main(["data", "import", str(second / "pairs.csv"), "--features", str(second / "feats"),
                 "--out", str(tmp_path / "out"), "--text-features", str(second / "tf.npy")]) == 0
    names = set(_digest(tmp_path / "out"))
    assert not any(n.startswith("test_") or ".audio." in n for n in names), names
    s = load_paired_split(tmp_path / "out", "train")
    assert s.video_names == [f"w{i:03d}" for i in range(8)] and not s.experts
    for row, vid in enumerate(s.video_names):
        np.testing.assert_array_equal(s.video[row, :len(feats[vid])], feats[vid])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")] == []  # no temporaries left


def test_failed_import_leaves_nothing_and_keeps_the_previous_folder(tmp_path, capsys):
    _make(tmp_path)
    np.save(tmp_path / "feats" / "v020.npy", np.ones((2, 9), np.float32))  # a test video of another size
    assert _import(tmp_path) == 2
    err = _one_line(capsys)
    assert "v020" in err and "v020.npy" in err and "9" in err  # which video, which file, which size
    assert not (tmp_path / "out").exists()  # nothing half-written for 'check' to call clean
    np.save(tmp_path / "feats" / "v020.npy", np.ones((2, 6), np.float32))
    assert _import(tmp_path) == 0
    before = _digest(tmp_path / "out")
    np.save(tmp_path / "feats" / "v003.npy", np.full((2, 6), np.nan, np.float32))
    assert _import(tmp_path) == 2
    assert "v003.npy" in _one_line(capsys)
    assert _digest(tmp_path / "out") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["feats", "out", "pairs.csv", "tf.npy"]


def test_out_with_foreign_files_or_a_file_is_refused_untouched(tmp_path, capsys):
    _make(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    np.save(tmp_path / "out" / "train_relevancy.npy", np.zeros((2, 2), np.float32))  # not written by import
    assert _import(tmp_path) == 2
    err = _one_line(capsys)
    assert "--out" in err and "notes.txt" in err and "train_relevancy.npy" in err
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
    (tmp_path / "file").write_text("x")
    assert _import(tmp_path, out="file") == 2
    assert "--out" in _one_line(capsys) and (tmp_path / "file").read_text() == "x"


@pytest.mark.parametrize("vid", ["../secret", "{abs}", "sub/../../secret"])
def test_ids_cannot_read_files_outside_features(tmp_path, capsys, vid):
    """Issue 15.9: ids with '..' or an absolute path read feature files outside --features."""
    _make(tmp_path)
    np.save(tmp_path / "secret.npy", np.full((1, 6), 7.0, np.float32))
    rows = list(csv.reader(open(tmp_path / "pairs.csv")))[1:]
    rows[0][0] = vid.format(abs=str(tmp_path / "secret"))
    _table(tmp_path / "pairs.csv", rows)
    assert _import(tmp_path) == 2
    err = _one_line(capsys)
    assert "video id" in err and "--features" in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("delimiter, bom", [(",", True), (";", False), (";", True), ("\t", False)])
def test_spreadsheet_csvs_are_read(tmp_path, delimiter, bom):
    rows, _ = _make(tmp_path)
    import_pairs(tmp_path / "pairs.csv", features=tmp_path / "feats", out=tmp_path / "ref",
                 text_features=tmp_path / "tf.npy")
    _table(tmp_path / "sheet.csv", rows, delimiter=delimiter, bom=bom)
    import_pairs(tmp_path / "sheet.csv", features=tmp_path / "feats", out=tmp_path / "got",
                 text_features=tmp_path / "tf.npy")
    assert _digest(tmp_path / "got") == _digest(tmp_path / "ref")


def test_max_frames_samples_uniformly(tmp_path, capsys):
    rows, feats = _make(tmp_path, frames=(1, 30))
    assert _import(tmp_path, "--max-frames", "4") == 0
    s = load_paired_split(tmp_path / "out", "train")
    assert s.video.shape[1] <= 4
    for row, vid in enumerate(s.video_names):
        f = feats[vid]
        n = len(f)
        want = f if n <= 4 else f[[int((i + 0.5) * n / 4) for i in range(4)]]  # middle of 4 equal segments
        assert s.video_mask[row].sum() == len(want)
        np.testing.assert_array_equal(s.video[row, :len(want)], want)
    assert _import(tmp_path, "--max-frames", "0", out="o2") == 2
    assert "--max-frames" in _one_line(capsys)


def test_huge_header_is_refused_before_allocation(tmp_path, capsys):
    """Issue 15.10: a .npy whose header claims shape (2**40,) made import/check allocate 8 TiB."""
    from numpy.lib import format as npformat

    _make(tmp_path)

    def forge(path, shape):
        with open(path, "wb") as fp:
            npformat.write_array_header_1_0(fp, {"descr": "<f4", "fortran_order": False, "shape": shape})
            fp.write(b"\0" * 64)

    forge(tmp_path / "feats" / "v002.npy", (2 ** 40,))
    tracemalloc.start()
    assert _import(tmp_path) == 2
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    err = _one_line(capsys)
    assert "v002.npy" in err and "header" in err and peak < 50 * 2 ** 20
    np.save(tmp_path / "feats" / "v002.npy", np.ones((2, 6), np.float32))
    assert _import(tmp_path) == 0
    forge(tmp_path / "out" / "val_text_features.npy", (2 ** 20, 2 ** 20))
    assert main(["data", "check", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    assert "PROBLEM: " in out and "val_text_features.npy: its header declares" in out
    # the commands that read .npy flags (eval, index, query) check headers the same way
    forge(tmp_path / "sim.npy", (2 ** 30, 2 ** 30))
    assert main(["eval", "--sim", str(tmp_path / "sim.npy"), "--text-to-video", str(tmp_path / "tf.npy")]) == 2
    assert "--sim" in (err := _one_line(capsys)) and "header declares" in err
    # an .npz given to --text-features: one line
    np.savez(tmp_path / "tf.npz", a=np.ones((36, 4)))
    assert _import(tmp_path, tf="tf.npz", out="o3") == 2
    assert "--text-features" in (err := _one_line(capsys)) and ".npz" in err


def test_split_names_and_leakage(tmp_path, capsys):
    rows, _ = _make(tmp_path)
    clash = [(v, c, "Train" if i == 0 else s) for i, (v, c, s) in enumerate(rows)]
    _table(tmp_path / "clash.csv", clash)
    assert _import(tmp_path, pairs="clash.csv") == 2
    assert "'Train'" in _one_line(capsys)
    renamed = [(v, c, "validation" if s == "val" else s) for v, c, s in rows]
    renamed.append((rows[0][0], "the first train video again", "test"))  # leakage
    _table(tmp_path / "renamed.csv", renamed)
    np.save(tmp_path / "tf2.npy", np.ones((len(renamed), 4), np.float32))
    assert _import(tmp_path, pairs="renamed.csv", tf="tf2.npy") == 0
    out = capsys.readouterr().out
    assert "note: split 'validation' is not one of train, val, test" in out and "several splits" in out
    assert main(["data", "check", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    assert "[across splits]" in out and "are in both 'test' and 'train' (leakage): 'v000'" in out
    assert "note: split 'validation'" in out
    # the config's names: 'validation' configured -> no note
    (tmp_path / "c.yaml").write_text("data: {name: paired, root: out, val_split: validation}\n")
    assert main(["data", "check", str(tmp_path / "out"), "--config", str(tmp_path / "c.yaml"),
                 "--threads", "1"]) == 1
    assert "note: split 'validation'" not in capsys.readouterr().out


def test_check_compares_splits_and_names_rows(tmp_path, capsys):
    _make(tmp_path, audio=True)
    assert _import(tmp_path, "--expert", f"audio={tmp_path / 'audio'}", "--threads", "1") == 0
    out = tmp_path / "out"
    assert main(["data", "check", str(out)]) == 0
    capsys.readouterr()
    # a test split of another feature size (the run used to die after training), a missing expert,
    # NaN in one video, a relevancy of 2.0
    v = np.load(out / "test_video_features.npy")
    np.save(out / "test_video_features.npy", np.concatenate([v, v[..., :2]], -1))
    (out / "val_video_features.audio.npy").unlink()
    tv = np.load(out / "train_video_features.npy")
    tv[3, 0, 1] = np.nan
    np.save(out / "train_video_features.npy", tv)
    rel = np.zeros((12, 6), np.float32)
    rel[4, 5] = 2.0
    np.save(out / "val_relevancy.npy", rel)
    assert main(["data", "check", str(out)]) == 1
    text = capsys.readouterr().out
    for want in ["test_video_features.npy: feature size 8, but train_video_features.npy has 6",
                 "val_video_features.audio.npy: file not found; split 'train' has expert 'audio'",
                 "train_video_features.npy: contains 1 NaN/inf value(s) in real frames in rows [3]: videos 'v003'",
                 "val_relevancy.npy: values must be finite and lie in [0, 1]; 1 do not, the first at row 4 (text), "
                 "column 5 (video): 2.0"]:
        assert want in text, (want, text)


def test_check_reports_unmasked_padding_and_a_dominating_video(tmp_path, capsys):
    rows, feats = _make(tmp_path, frames=(2, 6))
    np.save(tmp_path / "feats" / "v004.npy", np.ones((200, 6), np.float32))
    assert _import(tmp_path) == 0
    text = capsys.readouterr().out
    assert "note: the longest video ('v004', 200 frames" in text and "--max-frames" in text
    out = tmp_path / "out"
    assert main(["data", "check", str(out)]) == 0
    assert "note: train: the longest video ('v004', 200 frames" in capsys.readouterr().out
    (out / "train_video_mask.npy").unlink()  # zero-padded frames without their mask
    assert main(["data", "check", str(out)]) == 1
    text = capsys.readouterr().out
    assert "train_video_features.npy: 12 video(s) end in all-zero frames" not in text  # v004 is full length
    assert "train_video_features.npy: 11 video(s) end in all-zero frames (rows [0, 1, 2, 3, 5] ...: videos " \
           "'v000'" in text and "no train_video_mask.npy" in text


def test_train_checks_split_sizes_before_epoch_one(tmp_path):
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    _make(tmp_path, splits=(("train", 40), ("val", 10), ("test", 10)))
    assert import_pairs(tmp_path / "pairs.csv", features=tmp_path / "feats", out=tmp_path / "d",
                        text_features=tmp_path / "tf.npy")
    v = np.load(tmp_path / "d" / "test_video_features.npy")
    np.save(tmp_path / "d" / "test_video_features.npy", v[..., :4])
    cfg = from_dict({"data": {"name": "paired", "root": str(tmp_path / "d"), "val_split": "val"},
                     "model": {"kind": "meanp", "dim": 8, "width": 16},
                     "train": {"epochs": 2, "batch_size": 8}})
    with pytest.raises(ValueError, match="video features of size 4, the training split .* 6"):
        train(cfg, tmp_path / "run", resume=False, progress=False)
    assert not (tmp_path / "run" / "checkpoint.pt").exists() and not (tmp_path / "run" / "log.jsonl").exists()
    os.remove(tmp_path / "d" / "test_video_features.npy")
