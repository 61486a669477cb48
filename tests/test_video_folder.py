"""``xmodal encode videos`` on a folder the way a camera, a phone and a Mac leave it (issue 26.1-4, 25.1, 25.7):
every file accounted for, probed containers, subfolders, truncated files, a stated default sampling, streamed
decoding with bounded memory, and progress lines without a terminal.

The clips are written by the tests with PyAV; the image encoder is a registered stand-in whose features are
each frame's mean R, G, B (so a frame's index, written as its grey level, can be read back from the features).
"""

from __future__ import annotations

import importlib.util
import os
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from xmodal.cli import main

pytestmark = pytest.mark.skipif(importlib.util.find_spec("av") is None,
                                reason="PyAV not installed (pip install 'xmodal[video]')")
STEP = 5  # frame i is a flat grey of level STEP * i (readable after lossy coding; no clip here exceeds 50 frames)


def write(path, n=12, *, codec="libx264", w=64, h=48, rate=10, pix="yuv420p", fmt=None, level=None):
    """Write ``n`` flat grey frames (frame i at level ``STEP * i``, or ``level(i)``) with PyAV."""
    import av

    level = level or (lambda i: STEP * i)
    with av.open(str(path), "w", format=fmt) as c:
        s = c.add_stream(codec, rate=rate)
        s.width, s.height, s.pix_fmt = w, h, pix
        for i in range(n):
            a = np.full((h, w, 3), level(i) % 256, np.uint8)
            for p in s.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return Path(path)


def expected(indices):
    """The levels :func:`levels` reads back for frames ``indices``."""
    assert max(indices) * STEP < 256
    return list(indices)


def levels(x):
    """Frame levels from RGB frames ``[F, H, W, 3]`` or from the stand-in encoder's ``[F, 3]`` features."""
    x = np.asarray(x, dtype=np.float64)
    return np.rint(x.reshape(len(x), -1).mean(1) / STEP).astype(int).tolist()


@pytest.fixture
def mean_rgb():
    """An image encoder whose feature is the frame's mean R, G, B (0-255): sampling is readable from it."""
    from xmodal.features import encoders

    seen = {"sizes": []}

    def fn(images, *, batch_size, progress):
        seen["sizes"] += [im.size for im in images]
        return np.stack([np.asarray(im.convert("RGB"), np.float32).mean((0, 1)) for im in images])

    encoders.register_encoder("mean-rgb", fn, kind="image", overwrite=True)
    yield seen
    encoders.ENCODERS.pop("mean-rgb", None)


def camera_folder(root: Path) -> dict[str, str]:
    """A folder as users have them; returns ``{name: what the scan must make of it}``."""
    root.mkdir()
    (root / "sub" / "deeper").mkdir(parents=True)
    write(root / "a.mp4")
    write(root / "b.MTS", codec="mpeg2video", fmt="mpegts")  # camcorder (AVCHD) name
    write(root / "c.m2ts", fmt="mpegts")
    write(root / "d.3gp", codec="h263", w=176, h=144)  # a phone's
    write(root / "e.mov", codec="prores", pix="yuv422p10le")
    write(root / "f.avi", codec="mjpeg", pix="yuvj420p")
    write(root / "g.webm", codec="libvpx-vp9")
    write(root / "clip_no_extension", fmt="mp4")  # found by probing only
    write(root / "h.vid", fmt="matroska")  # an extension FFmpeg does not know: probed
    write(root / "sub" / "s1.mp4")
    write(root / "sub" / "deeper" / "s2.ts", fmt="mpegts")
    (root / "._a.mp4").write_bytes(b"\x00\x05\x16\x07" + b"\x00" * 80)  # AppleDouble metadata
    (root / ".DS_Store").write_bytes(b"\x00" * 64)
    (root / "notes.txt").write_text("shot on the 3rd\n")
    (root / "poster.jpg").write_bytes(_jpeg())
    os.mkfifo(root / "pipe.mp4")
    (root / "gone.mp4").symlink_to(root / "nowhere.mp4")
    (root / "loop.mp4").symlink_to(root / "loop.mp4")
    (root / "folder.mp4").mkdir()
    return {"a": "video", "b": "video", "c": "video", "d": "video", "e": "video", "f": "video", "g": "video",
            "clip_no_extension": "video", "h": "video", "gone": "video", "loop": "video",
            "sub": "subfolder (--recursive reads it)", "folder.mp4": "subfolder (--recursive reads it)",
            "._a.mp4": "macOS AppleDouble (._*)", ".DS_Store": "hidden", "notes.txt": "not a video",
            "poster.jpg": "image", "pipe.mp4": "not a regular file (FIFO, socket or device)"}


def _jpeg() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


# --- scanning: every entry accounted for -------------------------------------------------------

def test_scan_accounts_for_every_entry(tmp_path):
    from xmodal.features.folder import scan_videos

    want = camera_folder(tmp_path / "cam")
    scan = scan_videos(tmp_path / "cam")
    got = {vid: "video" for vid, _ in scan.videos}
    for reason, names in scan.skipped.items():
        got.update({n: reason for n in names})
    assert got == want
    assert scan.looked_at == len(os.listdir(tmp_path / "cam"))  # every entry, none twice

    deep = scan_videos(tmp_path / "cam", recursive=True)
    ids = [vid for vid, _ in deep.videos]
    assert ids == sorted(["a", "b", "c", "d", "e", "f", "g", "clip_no_extension", "h", "gone", "loop", "sub/s1",
                          "sub/deeper/s2"])
    assert "subfolder (--recursive reads it)" not in deep.skipped
    assert deep.looked_at == 18  # the two folders are entered, not counted; their two files are


def test_cli_summary_names_every_skip_and_fails_only_unreadable_videos(tmp_path, capsys, mean_rgb):
    camera_folder(tmp_path / "cam")
    feats = tmp_path / "feats"
    rc = main(["encode", "videos", str(tmp_path / "cam"), "--out", str(feats), "--model", "mean-rgb", "--no-progress"])
    out, err = capsys.readouterr()
    assert rc == 1  # the broken and the looping link are videos that could not be read
    assert "Traceback" not in err
    errors = sorted(line for line in err.splitlines() if ": error: " in line)
    assert len(errors) == 2 and "gone.mp4: broken or looping" in errors[0] and "loop.mp4" in errors[1]
    assert "skipped pipe.mp4: not a regular file" in err  # named, never opened (a FIFO would block)
    assert sorted(p.name for p in feats.iterdir()) == sorted(
        [f"{s}.npy" for s in ("a", "b", "c", "d", "e", "f", "g", "clip_no_extension", "h")] + ["encoder.json"])
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("looked at 18 file(s): encoded 9 video(s)")
    for part in ("2 failed", "1 macOS AppleDouble (._*) (._a.mp4)", "1 hidden (.DS_Store)", "1 image (poster.jpg)",
                 "1 not a video (notes.txt)", "2 subfolder (--recursive reads it) (folder.mp4, sub)"):
        assert part in summary, part
    rc = main(["encode", "videos", str(tmp_path / "cam"), "--out", str(feats), "--model", "mean-rgb", "--no-progress",
               "--recursive"])
    out, _ = capsys.readouterr()
    assert (feats / "sub" / "s1.npy").is_file() and (feats / "sub" / "deeper" / "s2.npy").is_file()
    assert "encoded 2 video(s)" in out and "9 already there" in out


def test_the_same_files_from_a_list_give_the_same_features(tmp_path, capsys, mean_rgb):
    camera_folder(tmp_path / "cam")
    names = ["b.MTS", "d.3gp", "clip_no_extension"]
    (tmp_path / "list.txt").write_text("".join(f"cam/{n}\n" for n in names))
    assert main(["encode", "videos", str(tmp_path / "list.txt"), "--out", str(tmp_path / "l"), "--model", "mean-rgb",
                 "--frames", "4", "--no-progress"]) == 0
    assert main(["encode", "videos", str(tmp_path / "cam"), "--out", str(tmp_path / "d"), "--model", "mean-rgb",
                 "--frames", "4", "--no-progress"]) == 1
    for n in names:
        stem = Path(n).stem
        np.testing.assert_array_equal(np.load(tmp_path / "l" / f"{stem}.npy"), np.load(tmp_path / "d" / f"{stem}.npy"))
        assert levels(np.load(tmp_path / "d" / f"{stem}.npy")) == [1, 4, 7, 10]  # uniform over 12 frames


def test_a_zero_byte_feature_file_is_redone(tmp_path, capsys, mean_rgb):
    (tmp_path / "v").mkdir()
    write(tmp_path / "v" / "x.mp4")
    write(tmp_path / "v" / "y.mp4")
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "x.npy").write_bytes(b"")  # a killed run before atomic writes, or a full disk
    np.save(tmp_path / "f" / "y.npy", np.zeros((2, 3), np.float32))  # finished: kept
    assert main(["encode", "videos", str(tmp_path / "v"), "--out", str(tmp_path / "f"), "--model", "mean-rgb",
                 "--frames", "3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert levels(np.load(tmp_path / "f" / "x.npy")) == [2, 6, 10]
    assert np.load(tmp_path / "f" / "y.npy").shape == (2, 3)
    assert "encoded 1 video(s)" in out and "1 already there" in out and "1 unfinished .npy redone" in out


# --- sampling: a stated default, every frame only on request ----------------------------------

def test_default_is_one_frame_per_second_with_an_estimate(tmp_path, capsys, mean_rgb):
    (tmp_path / "v").mkdir()
    write(tmp_path / "v" / "long.mp4", 45, rate=10)  # 4.5 s
    write(tmp_path / "v" / "short.webm", 8, rate=10, codec="libvpx-vp9")  # 0.8 s
    assert main(["encode", "videos", str(tmp_path / "v"), "--out", str(tmp_path / "f"), "--model", "mean-rgb",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "about 6 frames to encode at 1 frame per second, the default" in out  # 5 + 1 from the headers
    assert levels(np.load(tmp_path / "f" / "long.npy")) == expected([0, 10, 20, 30, 40])
    assert levels(np.load(tmp_path / "f" / "short.npy")) == [0]
    assert main(["encode", "videos", str(tmp_path / "v"), "--out", str(tmp_path / "all"), "--model", "mean-rgb",
                 "--all-frames", "--no-progress"]) == 0
    assert "about 53 frames to encode at every frame (--all-frames)" in capsys.readouterr().out
    assert levels(np.load(tmp_path / "all" / "long.npy")) == expected(range(45))
    assert main(["encode", "videos", str(tmp_path / "v"), "--out", str(tmp_path / "x"), "--fps", "2",
                 "--all-frames"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_fps_on_a_stream_without_timestamps_uses_its_frame_rate(tmp_path):
    """25.7: a raw H.264 stream has no timestamps; --fps 1 kept 50 of 50 frames instead of 2."""
    from xmodal.features import video

    path = write(tmp_path / "raw.h264", 50, rate=25, fmt="h264")
    import av

    with av.open(str(path)) as c:
        assert all(f.time is None for f in c.decode(video=0))  # the case under test
    assert levels(video.decode_frames(path, fps=1)) == expected([0, 25])
    assert levels(video.decode_frames(path, fps=5)) == expected(range(0, 50, 5))


# --- truncated files --------------------------------------------------------------------------

def _half(src: Path, dst: Path) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[: len(data) // 2])
    return dst


def test_truncated_file_is_named_and_kept_or_skipped(tmp_path, capsys, mean_rgb):
    """26.2: the first half of a 75-frame .mkv decoded part of its frames and counted as encoded, silently."""
    (tmp_path / "v").mkdir()
    full = write(tmp_path / "full.mkv", 75, rate=25, fmt="matroska", level=lambda i: 3 * i)
    _half(full, tmp_path / "v" / "cut.mkv")
    write(tmp_path / "v" / "ok.mp4", 20, rate=25)
    args = ["encode", "videos", str(tmp_path / "v"), "--model", "mean-rgb", "--all-frames", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "keep")]) == 0
    out, err = capsys.readouterr()
    warning = [ln for ln in err.splitlines() if "warning" in ln]
    assert len(warning) == 1 and "cut.mkv: truncated: decoded" in warning[0] and "of a declared 3.0 s" in warning[0]
    kept = np.load(tmp_path / "keep" / "cut.npy")
    assert 0 < len(kept) < 75
    assert "1 truncated (kept)" in out
    assert main([*args, "--out", str(tmp_path / "skip"), "--truncated", "skip"]) == 0
    out, err = capsys.readouterr()
    assert not (tmp_path / "skip" / "cut.npy").exists() and (tmp_path / "skip" / "ok.npy").is_file()
    assert "cut.mkv: truncated" in err and "1 truncated (skipped)" in out


def test_truncation_rule_against_the_header():
    from xmodal.features.video import VideoInfo, truncation

    info = VideoInfo("matroska,webm", "h264", 64, 48, None, 3.0, 25.0)
    assert truncation(info, 75, 0.0, 2.96) is None
    assert truncation(info, 70, 0.0, 2.76) is None  # 0.2 s short: within 0.5 s
    assert "covering 1.0 s of a declared 3.0 s" in truncation(info, 25, 0.0, 0.96)
    assert "decoder stopped (bad data)" in truncation(info, 10, 0.0, 0.36, "bad data")
    counted = VideoInfo("mov,mp4", "h264", 64, 48, 300, None, 30.0)
    assert truncation(counted, 290, None, None) is None and "of 300 declared" in truncation(counted, 200, None, None)


# --- memory bounded by the settings, not by the file --------------------------------------------

def test_frames_are_streamed_not_held(tmp_path, mean_rgb):
    """25.1: every frame of a video was decoded into a list and stacked (twice its size) before encoding."""
    from xmodal.features.encoders import iter_encode_videos

    path = write(tmp_path / "big.mp4", 40, w=1024, h=768, rate=10)  # 40 x 2.4 MB of RGB
    tracemalloc.start()
    try:
        (i, feats), = list(iter_encode_videos([path], model="mean-rgb", batch_size=4, max_side=256))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert feats.shape == (40, 3) and levels(feats) == expected(range(40))
    whole = 40 * 1024 * 768 * 3
    print(f"traced peak {peak / 2**20:.1f} MiB against {whole / 2**20:.1f} MiB of frames")
    assert peak < whole / 8
    assert set(mean_rgb["sizes"]) == {(256, 192)}  # converted at reduced size in the decoder, aspect kept


def test_declared_size_is_checked_before_decoding(tmp_path, capsys, mean_rgb):
    from xmodal.features import video

    (tmp_path / "v").mkdir()
    path = write(tmp_path / "v" / "wide.mp4", 3, w=640, h=480)
    with pytest.raises(ValueError, match=r"^wide.mp4: declares 640x480 frames, over the limit of 300,000 pixels"):
        video.decode_frames(path, max_pixels=300_000)
    assert video.decode_frames(path, max_pixels=640 * 480).shape == (3, 480, 640, 3)
    write(tmp_path / "v" / "small.mp4", 3)
    assert main(["encode", "videos", str(tmp_path / "v"), "--out", str(tmp_path / "f"), "--model", "mean-rgb",
                 "--max-pixels", "300000", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "wide.mp4: declares 640x480 frames" in err and (tmp_path / "f" / "small.npy").is_file()


def test_a_resolution_change_mid_stream(tmp_path, mean_rgb):
    """25.7: two MPEG-TS segments of different sizes, concatenated (a valid stream); the error did not name
    the file. decode_frames scales later frames to the first size; the encoder takes each as it is."""
    from xmodal.features import video
    from xmodal.features.encoders import encode_videos

    a = write(tmp_path / "a.ts", 6, w=64, h=48, fmt="mpegts")
    b = write(tmp_path / "b.ts", 6, w=96, h=64, fmt="mpegts", level=lambda i: STEP * (i + 6))
    joined = tmp_path / "joined.ts"
    joined.write_bytes(a.read_bytes() + b.read_bytes())
    frames = video.decode_frames(joined)
    assert frames.shape == (12, 48, 64, 3) and levels(frames) == list(range(12))
    feats, = encode_videos([joined], model="mean-rgb")
    assert levels(feats) == list(range(12))


def test_one_bad_file_never_stops_the_run_whatever_it_raises(tmp_path, monkeypatch, mean_rgb):
    """25.1: the per-file loop caught only ValueError; a MemoryError stopped the whole run."""
    from xmodal.features import video
    from xmodal.features.encoders import iter_encode_videos

    paths = [write(tmp_path / f"{n}.mp4", 4) for n in "abc"]
    real, calls = video.to_rgb, []

    def flaky(frame, max_side=None, size=None):  # the 2nd frame of the 2nd video cannot be allocated
        calls.append(1)
        if len(calls) == 6:
            raise MemoryError("Cannot allocate memory")
        return real(frame, max_side, size)

    monkeypatch.setattr(video, "to_rgb", flaky)
    results = dict(iter_encode_videos(paths, model="mean-rgb", batch_size=3))
    assert isinstance(results[1], ValueError) and str(results[1]) == "b.mp4: MemoryError: Cannot allocate memory"
    assert levels(results[0]) == [0, 1, 2, 3] and levels(results[2]) == [0, 1, 2, 3]


@pytest.mark.parametrize("kwargs", [dict(frames=np.arange(3)), dict(frames=2.5), dict(fps=True), dict(fps=np.ones(2)),
                                    dict(max_side=0), dict(max_pixels=np.array([[1, 2], [3, 4]])), dict(path=3)])
def test_junk_arguments_are_one_line_errors(tmp_path, kwargs):
    from xmodal.features import video

    kwargs = {"path": write(tmp_path / "x.mp4", 2), **kwargs}
    with pytest.raises((ValueError, TypeError)) as info:
        video.decode_frames(**kwargs)
    assert "\n" not in str(info.value) and str(info.value).split(":")[0] in ("frames", "fps", "max_side", "max_pixels",
                                                                             "path")


# --- progress lines without a terminal ---------------------------------------------------------

def test_progress_lines_without_a_terminal(tmp_path, capsys, monkeypatch, mean_rgb):
    monkeypatch.setenv("XMODAL_PROGRESS_SECONDS", "0")  # a line per step instead of one every 30 s
    (tmp_path / "v").mkdir()
    for n in "ab":
        write(tmp_path / "v" / f"{n}.mp4", 6)
    args = ["encode", "videos", str(tmp_path / "v"), "--model", "mean-rgb", "--all-frames", "--batch-size", "4"]
    assert main([*args, "--out", str(tmp_path / "f")]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("encode videos: ")]
    assert lines and re.match(r"encode videos: 12/12 frames \(100%\), .* elapsed; 2/2 videos$", lines[-1]), lines
    assert "\r" not in err
    for quiet in (["--no-progress"], ["--quiet"]):
        assert main([*args, "--out", str(tmp_path / quiet[0])] + quiet) == 0
        out, err = capsys.readouterr()
        assert "encode videos: " not in err
        assert ("about 12 frames" in out) == (quiet == ["--no-progress"])  # --quiet: only the summary
