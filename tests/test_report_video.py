"""``xmodal report`` for video runs: NAME.<ext> lookup confined to --images, middle-frame thumbnails,
gallery size + chance level, and ``--data`` for a moved data folder."""

import base64
import importlib.util
import io
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from xmodal.cli import main
from xmodal.features.media import find_media as find_item
from xmodal.reporting.report import chance_levels

ROOT = Path(__file__).resolve().parents[1]
HAVE_AV = importlib.util.find_spec("av") is not None


def test_find_item_confined_to_root(tmp_path):
    root = tmp_path / "imgs"
    (root / "sub").mkdir(parents=True)
    (root / "a.jpg").write_bytes(b"x")
    (root / "sub" / "v1.mp4").write_bytes(b"x")
    (tmp_path / "secret.jpg").write_bytes(b"x")
    os.symlink(tmp_path / "secret.jpg", root / "link.jpg")
    r = root.resolve()
    assert find_item(root, "a.jpg") == r / "a.jpg"
    assert find_item(root, "a") == r / "a.jpg"  # NAME.<ext>
    assert find_item(root, "sub/v1") == r / "sub" / "v1.mp4"
    for bad in ("../secret.jpg", "../secret", str(tmp_path / "secret.jpg"), "link.jpg", "link", "sub/../a.jpg",
                "missing", "", "a\x00"):
        assert find_item(root, bad) is None, bad


def test_chance_levels_against_random_rankings():
    t2v = np.array([0, 0, 1, 3, 3, 3])  # video 2 has no text
    c = chance_levels(t2v, 4)
    assert c["videos"] == 4 and c["texts"] == 6
    rng = np.random.default_rng(0)
    trials = 20000
    # t2v: a random ranking of the 4 videos puts the text's video first
    hits_t2v = np.mean([rng.permutation(4)[0] == t2v[rng.integers(6)] for _ in range(trials)])
    # v2t: a random ranking of the 6 texts for a video that has texts puts one of its texts first
    queried = [0, 1, 3]
    hits_v2t = np.mean([t2v[rng.permutation(6)[0]] == queried[rng.integers(3)] for _ in range(trials)])
    assert abs(c["t2v"] - 100 * hits_t2v) < 1.0
    assert abs(c["v2t"] - 100 * hits_v2t) < 1.0


def _write_gradient_clip(path, n=9):
    import av

    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=10)
        s.width, s.height, s.pix_fmt = 32, 32, "yuv420p"
        for i in range(n):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), 20 * i, np.uint8), format="rgb24")
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


@pytest.mark.skipif(not HAVE_AV, reason="PyAV not installed (pip install 'xmodal[video]')")
def test_video_thumbnail_is_the_middle_frame(tmp_path):
    from PIL import Image

    from xmodal.reporting.report import _thumb

    _write_gradient_clip(tmp_path / "v.mp4")
    uri = _thumb(find_item(tmp_path, "v"))
    assert uri.startswith("data:image/jpeg;base64,")
    with Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))) as im:
        assert abs(np.asarray(im.convert("RGB"), float).mean() - 20 * 4) < 6  # frame 9 // 2 = 4
    (tmp_path / "bad.mp4").write_bytes(b"not a video")
    assert _thumb(find_item(tmp_path, "bad")) is None


@pytest.mark.usefixtures("one_thread")
def test_report_data_override_gallery_and_video_thumbs(tmp_path, capsys):
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 24), ("val", 8)):
        np.save(data / f"{split}_video_features.npy", rng.standard_normal((n, 6)).astype(np.float32))
        np.save(data / f"{split}_text_features.npy", rng.standard_normal((2 * n, 5)).astype(np.float32))
        np.save(data / f"{split}_text_to_video.npy", np.repeat(np.arange(n), 2))
        (data / f"{split}_videos.txt").write_text("".join(f"{split}{i}\n" for i in range(n)))
    run = tmp_path / "run"
    assert main(["train", str(ROOT / "configs/synthetic.yaml"), "--out", str(run), "data.name=paired",
                 f"data.root={data}", "data.val_split=val", "model.dim=8", "train.epochs=1", "train.batch_size=8",
                 "test_time.bank_size=8", "--quiet", "--no-plots"]) == 0
    moved = tmp_path / "moved"
    shutil.move(data, moved)
    assert main(["report", str(run), "--out", str(tmp_path / "r.html"), "--threads", "1"]) != 0
    capsys.readouterr()
    assert main(["report", str(run), "--out", str(tmp_path / "nodir.html"), "--data", str(tmp_path / "nope")]) == 2
    assert "--data" in capsys.readouterr().err
    vids = tmp_path / "vids"
    vids.mkdir()
    if HAVE_AV:
        for i in range(8):
            _write_gradient_clip(vids / f"val{i}.mp4", n=3)
    (tmp_path / "outside.jpg").write_bytes(b"x")
    assert main(["report", str(run), "--out", str(tmp_path / "r.html"), "--data", str(moved),
                 "--images", str(vids), "--threads", "1"]) == 0
    text = (tmp_path / "r.html").read_text()
    assert "Gallery: 8 videos (t2v), 16 texts (v2t); chance R@1: t2v 12.50%, v2t 12.50%." in text
    if HAVE_AV:
        assert text.count("data:image/jpeg;base64,") >= 8  # example rankings show the videos' middle frames
        assert "(no image)" not in text
