"""``xmodal data import`` / ``check`` and the commands of the "Your data" page (docs/data.md), end to end."""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from xmodal.cli import main
from xmodal.data import load_paired_split
from xmodal.data.importer import import_pairs, read_pairs

ROOT = Path(__file__).resolve().parents[1]


def _example(tmp, seed=0, n_train=24, n_val=8, k=2, d=6, dt=5, npz=False):
    """pairs.csv + feats/<id>.npy (variable length) + text_features.npy; returns the lengths."""
    rng = np.random.default_rng(seed)
    (tmp / "feats").mkdir()
    rows, lengths = [], {}
    for i in range(n_train + n_val):
        vid = f"clip{i:03d}"
        lengths[vid] = int(rng.integers(1, 6))
        arr = rng.standard_normal((lengths[vid], d)).astype(np.float32)
        if npz and i % 2:
            np.savez(tmp / "feats" / f"{vid}.npz", features=arr, other=np.zeros(3))
        else:
            np.save(tmp / "feats" / f"{vid}.npy", arr)
        rows += [(vid, f"caption {j} of {vid}", "train" if i < n_train else "val") for j in range(k)]
    rng.shuffle(rows)
    with open(tmp / "pairs.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["video_id", "caption", "split"])
        w.writerows(rows)
    np.save(tmp / "text_features.npy", rng.standard_normal((len(rows), dt)).astype(np.float32))
    return rows, lengths


@pytest.mark.parametrize("npz", [False, True])
def test_import_matches_the_table_and_files(tmp_path, npz):
    rows, lengths = _example(tmp_path, npz=npz)
    summary = import_pairs(tmp_path / "pairs.csv", features=tmp_path / "feats", out=tmp_path / "out",
                           text_features=tmp_path / "text_features.npy")
    assert summary["train"]["videos"] == 24 and summary["val"]["texts"] == 16
    tf = np.load(tmp_path / "text_features.npy")
    for split in ("train", "val"):
        s = load_paired_split(tmp_path / "out", split)
        idx = [i for i, r in enumerate(rows) if r[2] == split]
        np.testing.assert_array_equal(s.text, tf[idx])
        for t, i in enumerate(idx):  # independent check, row by row against the files
            vid, caption = rows[i][0], rows[i][1]
            v = s.text_to_video[t]
            assert s.video_names[v] == vid and s.captions[t] == caption
            path = tmp_path / "feats" / f"{vid}.npy"
            raw = np.load(path) if path.exists() else np.load(path.with_suffix(".npz"))["features"]
            assert s.video_mask[v].sum() == lengths[vid] == len(raw)
            np.testing.assert_array_equal(s.video[v, : len(raw)], raw)
            assert np.all(s.video[v, len(raw):] == 0)


def test_jsonl_glob_and_single_vectors(tmp_path):
    (tmp_path / "f").mkdir()
    for i in range(3):
        np.save(tmp_path / "f" / f"v{i}.npy", np.full(4, i, np.float32))
    lines = [{"video": f"v{i % 3}", "text": f"t{i}"} for i in range(6)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "o"
    import_pairs(tmp_path / "p.jsonl", features=str(tmp_path / "f" / "*.npy"), out=out, split="dev",
                 encode=lambda caps: np.ones((len(caps), 3), np.float32))
    s = load_paired_split(out, "dev")
    assert s.video.shape == (3, 4) and s.video_mask is None
    np.testing.assert_array_equal(s.text_to_video, [0, 1, 2, 0, 1, 2])
    assert read_pairs(tmp_path / "p.jsonl")[1] == {"video": "v1", "caption": "t1"}


def test_import_errors(tmp_path, capsys):
    _example(tmp_path)
    os.remove(tmp_path / "feats" / "clip003.npy")
    os.remove(tmp_path / "feats" / "clip005.npy")
    code = main(["data", "import", str(tmp_path / "pairs.csv"), "--features", str(tmp_path / "feats"),
                 "--out", str(tmp_path / "o"), "--text-features", str(tmp_path / "text_features.npy")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0
    assert re.match(r"xmodal data: error: --features: no feature file for 2 video\(s\): clip00[35], clip00[35]", err)
    (tmp_path / "bad.csv").write_text("id,words\n1,2\n")
    with pytest.raises(ValueError, match="needs a video column"):
        read_pairs(tmp_path / "bad.csv")
    with pytest.raises(ValueError, match="text-features: expected float"):
        import_pairs(tmp_path / "pairs.csv", features=tmp_path / "feats", out=tmp_path / "o",
                     text_features=tmp_path / "feats" / "clip000.npy")


def test_pairs_errors_carry_the_full_path(tmp_path):
    """'pairs: pairs.csv line 3' named the file without its folder; a non-UTF-8 .jsonl was a bare
    UnicodeDecodeError; a folder was 'not found'."""
    (tmp_path / "p.csv").write_text("video,caption\nv1,a dog\n../v2,a cat\n")
    (tmp_path / "p.jsonl").write_bytes('{"video": "caf\u00e9", "caption": "x"}\n'.encode("latin-1"))
    (tmp_path / "p.txt").write_text("video,caption\n")
    (tmp_path / "d.csv").mkdir()
    for name, needle in (("p.csv", "line 3: video id '../v2'"), ("p.jsonl", "is not a UTF-8 text file"),
                         ("p.txt", ""), ("d.csv", "is a directory")):
        with pytest.raises(ValueError, match="^pairs: ") as info:
            read_pairs(tmp_path / name)
        assert str(tmp_path / name) in str(info.value) and needle in str(info.value), info.value


def test_check_lists_every_problem_and_exits_1(tmp_path, capsys):
    _example(tmp_path)
    out = tmp_path / "d"
    import_pairs(tmp_path / "pairs.csv", features=tmp_path / "feats", out=out,
                 text_features=tmp_path / "text_features.npy")
    assert main(["data", "check", str(out)]) == 0
    text = capsys.readouterr().out
    assert "videos 24, feature dim 6, frames per video: min" in text and "ok: no problems" in text
    assert "captions per video: min 2, median 2, max 2" in text
    t = np.load(out / "val_text_features.npy")
    t[0, 0] = np.nan
    np.save(out / "val_text_features.npy", t)
    t2v = np.load(out / "val_text_to_video.npy")
    t2v[t2v == 3] = 99
    np.save(out / "val_text_to_video.npy", t2v)
    np.save(out / "train_video_mask.npy", np.ones((24, 2), bool))
    os.remove(out / "train_text_features.npy")
    assert main(["data", "check", str(out)]) == 1
    text = capsys.readouterr().out
    for want in ["train_text_features.npy (or train_caption_features.npy): file not found",
                 "train_video_mask.npy: expected shape [24, 5]",
                 "val_text_features.npy: contains 1 NaN/inf", "val_text_to_video.npy: values must lie in [0, 8)",
                 "4 problem(s)"]:
        assert want in text, (want, text)


def _doc_blocks(lang):
    """The code blocks of the "Your data" page of the documentation (docs/data.md)."""
    text = (ROOT / "docs" / "data.md").read_text()
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_the_commands_of_readme_your_data_run(tmp_path, one_thread):
    """Runs the bash blocks of the "Your data" page verbatim (xmodal = this checkout's CLI)
    on an example pairs.csv, then its Python blocks."""
    # The "From video files" block needs real video files: tests/test_video_encode.py runs that path; the
    # "From an image collection" block a CLIP folder: tests/test_data_import_images.py runs it with a stand-in.
    blocks = [b for b in _doc_blocks("bash") if "xmodal encode videos" not in b and "xmodal encode images" not in b]
    assert blocks and "xmodal data import" in blocks[0] and "xmodal train" in blocks[0]
    _example(tmp_path, n_train=40, n_val=10)
    (tmp_path / "configs").mkdir()
    shutil.copy(ROOT / "configs" / "synthetic.yaml", tmp_path / "configs")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    prelude = f'set -e\nxmodal() {{ "{sys.executable}" -m xmodal "$@"; }}\n'
    for block in blocks:
        res = subprocess.run(["bash", "-c", prelude + block], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
    assert "ok: no problems" in res.stdout and "selected normaliser" in res.stdout
    assert (tmp_path / "runs" / "mine" / "model.pt").is_file()
    for block in _doc_blocks("python"):
        exec(compile(block, "docs/data.md", "exec"), {})
