"""``xmodal encode frames`` (issue 41.1): the source videos' SHA-256 recorded per video and checked on a re-run (a
changed or unrecorded video is decoded again, named in one line), the guarantees of ``encode videos`` (no
silent skips, bounded memory, ``--workers``, ``--shard K/N``, a stopped run resumed) checked on a frame store,
and ``data import`` of a store through the CLI with its identity, source hashes included, in the layout.

The references are independent: ``hashlib`` over each file's whole bytes, a one-process run, a clean run."""

from __future__ import annotations

import csv
import hashlib
import json
import tracemalloc

import numpy as np
import pytest

from hf_tiny import decoded_frames, write_video

pytest.importorskip("av")
S = 16


def _video(path, n, seed, h=24, w=40):
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, size=(n, h, w, 3), dtype=np.uint8)
    frames[:, 4:12, 8:20] = (200, 40, 40)
    return write_video(path, frames, rate=5)


def _folder(root, n=4):
    root.mkdir(parents=True, exist_ok=True)
    return [_video(root / f"v{i}.mp4", 4 + i, seed=i) for i in range(n)]


def _encode(src, out, *flags):
    from xmodal.cli import main

    return main(["encode", "frames", str(src), "--out", str(out), "--size", str(S), "--fps", "5", "--threads", "1",
                 "--no-progress", *flags])


def _store(out):
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*.npy"))}


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_each_video_s_sha256_is_recorded_as_a_sha256sum_line(tmp_path):
    paths = _folder(tmp_path / "videos", n=3)
    assert _encode(tmp_path / "videos", tmp_path / "fr") == 0
    for p in paths:
        line = (tmp_path / "fr" / ".sources" / f"{p.stem}.sha256").read_text()
        assert line == f"{_sha(p)}  {p.name}\n"  # what `sha256sum v0.mp4` prints in the videos' folder
    side = json.loads((tmp_path / "fr" / "encoder.json").read_text())
    assert side["sampling"] == {"frames": None, "fps": 5.0} and side["spec"] == f"frames:{S}"
    assert ".sources" in side["preprocessing"]["source_hashes"]


def test_a_changed_video_is_decoded_again_and_named(tmp_path, capsys):
    paths = _folder(tmp_path / "videos")
    assert _encode(tmp_path / "videos", tmp_path / "fr") == 0
    before = _store(tmp_path / "fr")
    _video(paths[1], 7, seed=99)  # edited in place: same name, other frames
    capsys.readouterr()
    assert _encode(tmp_path / "videos", tmp_path / "fr") == 0
    cap = capsys.readouterr()
    notes = [line for line in cap.err.splitlines() if "changed since its frames were stored" in line]
    assert len(notes) == 1 and notes[0].startswith("xmodal encode: note: v1.mp4: changed")
    assert "encoded 1 video(s)" in cap.out and "3 already there" in cap.out
    after = _store(tmp_path / "fr")
    assert {k for k in after if after[k] != before[k]} == {"v1.npy"}
    from xmodal.features.frames import crop_frame

    want = np.stack([crop_frame(f, S) for f in decoded_frames(paths[1])])
    assert np.array_equal(np.load(tmp_path / "fr" / "v1.npy"), want)  # the new video's frames, not the old
    assert (tmp_path / "fr" / ".sources" / "v1.sha256").read_text().split()[0] == _sha(paths[1])
    # a third run finds everything current: nothing decoded, nothing named
    assert _encode(tmp_path / "videos", tmp_path / "fr") == 0
    cap = capsys.readouterr()
    assert "changed" not in cap.err and "encoded 0 video(s)" in cap.out


def test_frames_without_a_recorded_hash_are_decoded_again(tmp_path, capsys):
    _folder(tmp_path / "videos", n=3)
    assert _encode(tmp_path / "videos", tmp_path / "fr") == 0
    (tmp_path / "fr" / ".sources" / "v2.sha256").unlink()
    (tmp_path / "fr" / ".sources" / "v0.sha256").write_text("not a sha256sum line\n")
    capsys.readouterr()
    assert _encode(tmp_path / "videos", tmp_path / "fr") == 0
    cap = capsys.readouterr()
    lines = [line for line in cap.err.splitlines() if "without a recorded source hash" in line]
    assert len(lines) == 1 and "2 stored video(s)" in lines[0] and "(v0, v2)" in lines[0]
    assert "encoded 2 video(s)" in cap.out
    assert all((tmp_path / "fr" / ".sources" / f"v{i}.sha256").is_file() for i in range(3))


def test_a_run_stopped_between_frames_and_hash_resumes_to_a_clean_run(tmp_path, monkeypatch):
    """A stop after the second video's frames but before its hash: the re-run decodes that video again and
    the store (frames and hashes) equals one written in one go."""
    from xmodal.features import sources

    _folder(tmp_path / "videos")
    assert _encode(tmp_path / "videos", tmp_path / "clean") == 0
    real, calls = sources.write_source, []

    def stop_at_the_second(out, vid, sha, name):
        calls.append(vid)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(out, vid, sha, name)

    monkeypatch.setattr(sources, "write_source", stop_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        _encode(tmp_path / "videos", tmp_path / "fr")
    monkeypatch.setattr(sources, "write_source", real)
    assert (tmp_path / "fr" / "v1.npy").is_file() and not (tmp_path / "fr" / ".sources" / "v1.sha256").exists()
    assert _encode(tmp_path / "videos", tmp_path / "fr") == 0
    assert _store(tmp_path / "fr") == _store(tmp_path / "clean")
    for i in range(4):
        name = f".sources/v{i}.sha256"
        assert (tmp_path / "fr" / name).read_text() == (tmp_path / "clean" / name).read_text()


def test_workers_and_shards_give_the_store_of_one_process(tmp_path, capsys):
    src = tmp_path / "videos"
    _folder(src, n=5)
    assert _encode(src, tmp_path / "one") == 0
    assert _encode(src, tmp_path / "workers", "--workers", "2") == 0
    for k in (1, 2):
        assert _encode(src, tmp_path / "shards", "--shard", f"{k}/2") == 0
    assert "the 2 shards cover the whole collection" in capsys.readouterr().out
    one = _store(tmp_path / "one")
    assert len(one) == 5 and _store(tmp_path / "workers") == one and _store(tmp_path / "shards") == one
    for out in ("workers", "shards"):
        for i in range(5):
            name = f".sources/v{i}.sha256"
            assert (tmp_path / out / name).read_text() == (tmp_path / "one" / name).read_text()


def test_nothing_is_skipped_silently(tmp_path, capsys):
    src = tmp_path / "videos"
    _folder(src, n=2)
    (src / "notes.txt").write_text("not a video\n")
    (src / "sub").mkdir()
    _video(src / "sub" / "s.mp4", 3, seed=5)
    (src / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(300))
    assert _encode(src, tmp_path / "fr") == 1  # a failed video is a failed run
    cap = capsys.readouterr()
    assert "broken.mp4" in cap.err
    assert "looked at 5 file(s)" in cap.out and "1 failed" in cap.out
    assert "not a video (notes.txt)" in cap.out and "subfolder" in cap.out
    assert not (tmp_path / "fr" / ".sources" / "broken.sha256").exists()  # nothing stored, nothing vouched for


def test_memory_follows_the_stored_size_not_the_file(tmp_path):
    """A 40-frame 1024 x 768 video stored at short side 16: the frames are streamed through the crop, never all
    held at the file's resolution."""
    from xmodal.features.encoders import iter_encode_videos

    rng = np.random.default_rng(0)
    path = write_video(tmp_path / "big.mp4", rng.integers(0, 256, (40, 768, 1024, 3), dtype=np.uint8), rate=10)
    tracemalloc.start()
    try:
        (_, frames), = list(iter_encode_videos([path], model=f"frames:{S}", batch_size=4))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert frames.shape == (40, S * S * 3) and frames.dtype == np.uint8
    whole = 40 * 1024 * 768 * 3
    assert peak < whole / 8, f"traced peak {peak / 2**20:.1f} MiB against {whole / 2**20:.1f} MiB of frames"


def _pairs(path, ids):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["video_id", "caption", "split"])
        w.writerows((v, f"a clip called {v}", "train" if i < 3 else "val") for i, v in enumerate(ids))


def _digest(paths):
    """The layout's ``sources_sha256``, computed independently: the sha256sum lines (``HASH  VIDEO_ID``)."""
    lines = "".join(f"{_sha(p)}  {p.stem}\n" for p in sorted(paths, key=lambda p: p.stem))
    return hashlib.sha256(lines.encode()).hexdigest()


@pytest.mark.parametrize("features", ["folder", "glob"])
def test_data_import_takes_a_store_where_it_takes_features(tmp_path, capsys, features):
    from xmodal.cli import main
    from xmodal.data import load_paired_split

    paths = _folder(tmp_path / "videos")
    assert _encode(tmp_path / "videos", tmp_path / "fr") == 0
    _pairs(tmp_path / "pairs.csv", [p.stem for p in paths])
    np.save(tmp_path / "text.npy", np.zeros((4, 2), np.float32))
    given = str(tmp_path / "fr") if features == "folder" else str(tmp_path / "fr" / "*.npy")
    assert main(["data", "import", str(tmp_path / "pairs.csv"), "--features", given, "--out", str(tmp_path / "data"),
                 "--text-features", str(tmp_path / "text.npy"), "--dtype", "float16"]) == 0
    s = load_paired_split(tmp_path / "data", "train")
    assert s.video.dtype == np.uint8 and s.video.shape == (3, 6, S * S * 3)  # uint8 whatever --dtype says
    np.testing.assert_array_equal(s.video[2, :6], np.load(tmp_path / "fr" / "v2.npy"))
    rec = json.loads((tmp_path / "data" / "encoders.json").read_text())["video"]
    assert rec["spec"] == f"frames:{S}" and rec["dim"] == S * S * 3 and rec["sampling"] == {"frames": None, "fps": 5.0}
    assert rec["sources_sha256"] == _digest(paths)
    # another video under the same name: the store follows it, and the layout's identity says so
    _video(paths[3], 5, seed=42)
    assert _encode(tmp_path / "videos", tmp_path / "fr") == 0
    assert main(["data", "import", str(tmp_path / "pairs.csv"), "--features", given, "--out", str(tmp_path / "data2"),
                 "--text-features", str(tmp_path / "text.npy")]) == 0
    rec2 = json.loads((tmp_path / "data2" / "encoders.json").read_text())["video"]
    assert rec2["sources_sha256"] == _digest(paths) != rec["sources_sha256"]


def test_a_store_without_recorded_sources_imports_without_a_digest(tmp_path):
    from xmodal.data.importer import import_pairs

    paths = _folder(tmp_path / "videos", n=4)
    assert _encode(tmp_path / "videos", tmp_path / "fr") == 0
    (tmp_path / "fr" / ".sources" / "v0.sha256").unlink()
    _pairs(tmp_path / "pairs.csv", [p.stem for p in paths])
    np.save(tmp_path / "text.npy", np.zeros((4, 2), np.float32))
    import_pairs(tmp_path / "pairs.csv", features=tmp_path / "fr", out=tmp_path / "data",
                 text_features=tmp_path / "text.npy")
    rec = json.loads((tmp_path / "data" / "encoders.json").read_text())["video"]
    assert rec["spec"] == f"frames:{S}" and rec.get("sources_sha256") is None  # never a digest of a part
