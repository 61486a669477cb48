"""``xmodal data import --expert NAME=DIR_OR_GLOB``: several experts, some videos lacking one."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from xmodal.cli import main
from xmodal.data import load_paired_split


def _make(tmp, seed):
    rng = np.random.default_rng(seed)
    for d in ("feats", "audio", "flow"):
        (tmp / d).mkdir()
    rows, audio, flow = [], {}, {}
    for i in range(14):
        vid = f"v{i:02d}"
        np.save(tmp / "feats" / f"{vid}.npy", rng.standard_normal(6).astype(np.float32))
        if rng.random() < 0.6 or i == 0:              # audio: one vector, missing for some videos
            audio[vid] = rng.standard_normal(3).astype(np.float32)
            np.save(tmp / "audio" / f"{vid}.npy", audio[vid])
        if i != 5:                                    # flow: several frames, missing for v05
            flow[vid] = rng.standard_normal((int(rng.integers(1, 4)), 4)).astype(np.float32)
            np.save(tmp / "flow" / f"{vid}.npy", flow[vid])
        rows += [(vid, f"caption {j} of {vid}", "train" if i < 10 else "val") for j in range(2)]
    rows.insert(0, rows.pop())  # the table order is not the video order
    with open(tmp / "pairs.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["video_id", "caption", "split"])
        w.writerows(rows)
    np.save(tmp / "tf.npy", rng.standard_normal((len(rows), 5)).astype(np.float32))
    return audio, flow


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_experts_are_written_with_masks_for_missing_videos(tmp_path, capsys, seed):
    audio, flow = _make(tmp_path, seed)
    rc = main(["data", "import", str(tmp_path / "pairs.csv"), "--features", str(tmp_path / "feats"),
               "--out", str(tmp_path / "out"), "--text-features", str(tmp_path / "tf.npy"),
               "--expert", f"audio={tmp_path / 'audio'}", "--expert", f"flow={tmp_path / 'flow'}/*.npy"])
    assert rc == 0
    assert "expert audio:" in capsys.readouterr().out
    for split in ("train", "val"):
        s = load_paired_split(tmp_path / "out", split)
        assert set(s.experts) == {"audio", "flow"}
        a, am = s.experts["audio"], s.expert_masks.get("audio")
        f, fm = s.experts["flow"], s.expert_masks["flow"]
        names = list(s.video_names)
        if all(v in audio for v in names):
            assert am is None
        for row, vid in enumerate(names):  # row by row against the files
            if vid in audio:
                np.testing.assert_array_equal(a[row], audio[vid])
                assert am is None or am[row]
            else:
                assert not am[row] and not a[row].any()
            n = len(flow.get(vid, ()))
            assert fm[row].sum() == n and not f[row, n:].any()
            if n:
                np.testing.assert_array_equal(f[row, :n], flow[vid])
    assert main(["data", "check", str(tmp_path / "out")]) == 0


def test_single_vector_expert_present_everywhere_has_no_mask(tmp_path):
    _make(tmp_path, 0)
    from xmodal.data.importer import import_pairs

    summary = import_pairs(tmp_path / "pairs.csv", features=tmp_path / "feats", out=tmp_path / "out",
                           text_features=tmp_path / "tf.npy", experts={"same": tmp_path / "feats"})
    assert summary["train"]["experts"] == {"same": 10}
    assert not (tmp_path / "out" / "train_video_mask.same.npy").exists()
    s = load_paired_split(tmp_path / "out", "train")
    np.testing.assert_array_equal(s.experts["same"], s.video)


@pytest.mark.parametrize("spec, match", [
    ("audio", "NAME=DIR_OR_GLOB"), ("=x", "NAME=DIR_OR_GLOB"), ("video=x", "bad expert name"),
    ("a b=x", "bad expert name"), ("audio={tmp}/nothing/*.npy", "--expert audio")])
def test_bad_expert_specs_are_one_line_errors(tmp_path, capsys, spec, match):
    _make(tmp_path, 0)
    rc = main(["data", "import", str(tmp_path / "pairs.csv"), "--features", str(tmp_path / "feats"),
               "--out", str(tmp_path / "out"), "--text-features", str(tmp_path / "tf.npy"),
               "--expert", spec.format(tmp=tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1


def test_expert_missing_for_a_whole_split_is_an_error(tmp_path):
    _make(tmp_path, 0)
    (tmp_path / "few").mkdir()
    np.save(tmp_path / "few" / "v00.npy", np.ones(2, np.float32))  # a train video only
    from xmodal.data.importer import import_pairs

    with pytest.raises(ValueError, match="--expert few: no video of the split"):
        import_pairs(tmp_path / "pairs.csv", features=tmp_path / "feats", out=tmp_path / "out",
                     text_features=tmp_path / "tf.npy", experts={"few": tmp_path / "few"})
