"""``xmodal data import`` (issues 26.5, 24): missing feature files found before any caption is encoded,
``--skip-missing``, ids are file stems, ``--dtype float16``, features streamed one video at a time, groups in
the summary of a clip table, progress lines without a terminal."""

from __future__ import annotations

import re
import tracemalloc

import numpy as np
import pytest

from xmodal.cli import main
from xmodal.data import load_paired_split
from xmodal.data.importer import import_pairs, pad_frames, read_features


def _table(tmp_path, n=12, frames=(1, 5), dim=16, seed=0, missing=(), ids=None):
    """``n`` videos with 2 captions each (last 4 videos in val), their feature files and text features."""
    rng = np.random.default_rng(seed)
    feats = tmp_path / "feats"
    feats.mkdir()
    ids = ids or [f"v{i:02d}" for i in range(n)]
    lines = ["video_id,caption,split"]
    for i, v in enumerate(ids):
        if v not in missing:
            np.save(feats / f"{v}.npy", rng.standard_normal((rng.integers(*frames), dim)).astype(np.float32))
        split = "train" if i < n - 4 else "val"
        lines += [f"{v},video {i} first caption,{split}", f"{v},video {i} second caption,{split}"]
    (tmp_path / "pairs.csv").write_text("\n".join(lines) + "\n")
    text = rng.standard_normal((2 * n, 8)).astype(np.float32)
    np.save(tmp_path / "text.npy", text)
    return feats, text, ids


class Recorder:
    """A text encoder that records whether it ran."""

    def __init__(self):
        self.calls = 0

    def __call__(self, captions):
        self.calls += 1
        return np.ones((len(captions), 4), np.float32) * np.arange(len(captions))[:, None]


def test_missing_feature_files_are_found_before_any_caption_is_encoded(tmp_path):
    feats, _, _ = _table(tmp_path, missing=("v03", "v07"))
    enc = Recorder()
    with pytest.raises(ValueError) as info:
        import_pairs(tmp_path / "pairs.csv", features=feats, out=tmp_path / "o", encode=enc)
    assert enc.calls == 0  # 26.5: it encoded every caption (38 s) first
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("--features: no feature file for 2 video(s): v03, v07")
    assert "a video id is the feature file's name without .npy, i.e. the video's file stem" in msg
    assert not (tmp_path / "o").exists()
    np.save(feats / "v03.npy", np.ones((2, 16), np.float32))
    (feats / "v07.npy").write_bytes(b"not an array")  # a corrupt file: its header is read before any caption
    with pytest.raises(ValueError, match=r"v07.npy: not a readable .npy array"):
        import_pairs(tmp_path / "pairs.csv", features=feats, out=tmp_path / "o", encode=enc)
    assert enc.calls == 0


def test_ids_with_their_extension_are_told_to_drop_it(tmp_path, capsys):
    feats, _, _ = _table(tmp_path, n=6)
    rows = (tmp_path / "pairs.csv").read_text().replace("v01,", "v01.mp4,")
    (tmp_path / "pairs.csv").write_text(rows)
    rc = main(["data", "import", str(tmp_path / "pairs.csv"), "--features", str(feats), "--out", str(tmp_path / "o"),
               "--text-features", str(tmp_path / "text.npy")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "'v01.mp4' includes its extension: write 'v01'" in err


def test_skip_missing_drops_and_names_their_rows(tmp_path, capsys):
    feats, text, ids = _table(tmp_path, missing=("v03", "v10"))
    rc = main(["data", "import", str(tmp_path / "pairs.csv"), "--features", str(feats), "--out", str(tmp_path / "o"),
               "--text-features", str(tmp_path / "text.npy"), "--skip-missing"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "skipped 2 video(s) without a feature file" in out and "(4 row(s) dropped): v03, v10" in out
    train, val = load_paired_split(tmp_path / "o", "train"), load_paired_split(tmp_path / "o", "val")
    kept = [v for v in ids if v not in ("v03", "v10")]
    assert train.video_names == kept[:7] and val.video_names == kept[7:]
    # the kept rows' text features are the table's rows, by an explicit loop over the table
    rows = [i for i in range(len(ids) * 2) if ids[i // 2] not in ("v03", "v10")]
    want = np.stack([text[i] for i in rows])
    np.testing.assert_array_equal(np.concatenate([train.text, val.text]), want)
    for split, names in ((train, kept[:7]), (val, kept[7:])):
        for row, v in enumerate(names):
            f = np.load(feats / f"{v}.npy")
            np.testing.assert_array_equal(split.video[row, :len(f)], f)


def test_streamed_import_equals_the_in_memory_reference_and_holds_one_video(tmp_path):
    """24: import held every video's features (and a padded copy) at once."""
    feats, text, ids = _table(tmp_path, n=60, frames=(20, 41), dim=256)
    tracemalloc.start()
    try:
        import_pairs(tmp_path / "pairs.csv", features=feats, out=tmp_path / "o", text_features=tmp_path / "text.npy")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    total = sum((feats / f"{v}.npy").stat().st_size for v in ids)
    print(f"traced peak {peak / 2**20:.2f} MiB for {total / 2**20:.2f} MiB of features")
    assert peak < total / 4
    # reference: the in-memory path (read every file, pad_frames)
    for split, names in (("train", ids[:-4]), ("val", ids[-4:])):
        ref, ref_mask = pad_frames([read_features(feats / f"{v}.npy") for v in names])
        s = load_paired_split(tmp_path / "o", split)
        np.testing.assert_array_equal(np.load(tmp_path / "o" / f"{split}_video_features.npy"), ref)
        np.testing.assert_array_equal(s.video_mask, ref_mask)


def test_dtype_float16_writes_float16(tmp_path, capsys):
    feats, _, _ = _table(tmp_path, n=8, frames=(2, 4))
    (feats / "v01.npy").unlink()
    np.save(feats / "v01.npy", np.ones(16, np.float32))  # a [D] vector among [F, D]
    base = ["data", "import", str(tmp_path / "pairs.csv"), "--features", str(feats), "--text-features",
            str(tmp_path / "text.npy"), "--expert", f"audio={feats}"]
    assert main([*base, "--out", str(tmp_path / "f32")]) == 0
    assert main([*base, "--out", str(tmp_path / "f16"), "--dtype", "float16"]) == 0
    assert "float16 features" in capsys.readouterr().out
    for name in ("train_video_features.npy", "train_text_features.npy", "val_video_features.audio.npy"):
        a32, a16 = np.load(tmp_path / "f32" / name), np.load(tmp_path / "f16" / name)
        assert a32.dtype == np.float32 and a16.dtype == np.float16
        np.testing.assert_array_equal(a16, a32.astype(np.float16))
    np.testing.assert_array_equal(np.load(tmp_path / "f16" / "train_video_mask.npy"),
                                  np.load(tmp_path / "f32" / "train_video_mask.npy"))
    assert main(["data", "check", str(tmp_path / "f16")]) == 0


def test_clip_table_summary_names_the_groups(tmp_path, capsys):
    feats = tmp_path / "f"
    feats.mkdir()
    lines = ["video_id,clip_id,start,caption"]
    for v in ("a", "b", "c"):
        for c in range(2):
            np.save(feats / f"{v}{c}.npy", np.ones((2, 4), np.float32))
            lines.append(f"{v},{v}{c},{c},{v} clip {c}")
    (tmp_path / "pairs.csv").write_text("\n".join(lines) + "\n")
    np.save(tmp_path / "t.npy", np.ones((6, 3), np.float32))
    assert main(["data", "import", str(tmp_path / "pairs.csv"), "--features", str(feats), "--out", str(tmp_path / "o"),
                 "--text-features", str(tmp_path / "t.npy")]) == 0
    assert "train: 6 clips in 3 groups (long videos), 6 texts" in capsys.readouterr().out


def test_progress_lines_without_a_terminal(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XMODAL_PROGRESS_SECONDS", "0")
    feats, _, _ = _table(tmp_path, n=6)
    args = ["data", "import", str(tmp_path / "pairs.csv"), "--features", str(feats), "--text-features",
            str(tmp_path / "text.npy")]
    assert main([*args, "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert re.search(r"^data import train: read features: 2/2 videos \(100%\)", err, re.M), err
    assert main([*args, "--out", str(tmp_path / "q"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
