"""Features that stay on disk (issue 24): memory-mapped float16 layouts train to the same
weights as the data held in memory, are accepted by every command, and are read in blocks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import mark_done, spawn_gloo
from xmodal.cli import main
from xmodal.config import from_dict
from xmodal.data import load_paired_split
from xmodal.data.npyfile import load_array
from xmodal.models import build_model
from xmodal.models.towers import Standardize
from xmodal.training.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")


def write_layout(root, *, n=96, frames=3, dv=10, dt=8, seed=0):
    """A float16 layout: clustered videos with a frame axis (padded, masked), two captions per
    video, splits train / val / test."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((6, 5))
    wv, wt = rng.standard_normal((5, dv)), rng.standard_normal((5, dt))
    root.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", n), ("val", n // 2), ("test", n // 2)):
        z = centres[rng.integers(6, size=count)] + 0.3 * rng.standard_normal((count, 5))
        video = (z[:, None, :] + 0.2 * rng.standard_normal((count, frames, 5))) @ wv
        mask = np.arange(frames)[None, :] < rng.integers(1, frames + 1, size=count)[:, None]
        video[~mask] = 0
        t2v = np.repeat(np.arange(count), 2)
        text = (z[t2v] + 0.4 * rng.standard_normal((2 * count, 5))) @ wt
        np.save(root / f"{split}_video_features.npy", video.astype(np.float16))
        np.save(root / f"{split}_video_mask.npy", mask)
        np.save(root / f"{split}_text_features.npy", text.astype(np.float16))
        np.save(root / f"{split}_text_to_video.npy", t2v.astype(np.int32))
    return root


def config(root, normalizers=("none", "dn", "sinkhorn"), **train):
    return from_dict({
        "data": {"name": "paired", "root": str(root), "train_split": "train", "val_split": "val",
                 "test_split": "test"},
        "model": {"kind": "meanp", "dim": 8},
        "loss": {"name": "infonce", "temperature": 0.1, "learnable": True},
        "optim": {"name": "adam", "lr": 3e-3, "warmup_epochs": 1},
        "test_time": {"normalizers": list(normalizers), "bank_size": 50},
        "train": {"seed": 1, "epochs": 2, "batch_size": 16, "patience": 0, "progress": False, "device": "cpu",
                  **train},
    })


def weights(run):
    return torch.load(run / "model.pt", weights_only=True)["model"]["state_dict"]


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    return write_layout(tmp_path_factory.mktemp("f16") / "data")


def test_split_opens_memory_mapped_in_its_dtype_and_never_copies(layout):
    s = load_paired_split(layout, "train")
    assert isinstance(s.video, np.memmap) and s.video.dtype == np.float16 and not s.video.flags.writeable
    assert isinstance(s.text, np.memmap) and s.text.dtype == np.float16
    feats, mask = s.video_input()
    assert feats is s.video and mask.dtype == np.bool_  # views: nothing upcast
    rows = np.array([5, 0, 5])
    np.testing.assert_array_equal(s.video_input(rows)[0], np.load(layout / "train_video_features.npy")[rows])


def test_memory_mapped_float16_training_equals_in_memory_float32(layout, tmp_path):
    """The trainer gathers float16 rows from the files and upcasts them; the same data loaded as
    float32 arrays in memory (the former path: upcast everything first) gives bit-identical
    weights and metrics, and so does gathering in a DataLoader worker."""
    cfg = config(layout, epochs=1)
    train(cfg, tmp_path / "mapped", verbose=False)
    splits = {k: load_paired_split(layout, k, mmap=False) for k in ("train", "val", "test")}
    assert splits["train"].video.dtype == np.float32 and not isinstance(splits["train"].video, np.memmap)
    train(cfg, tmp_path / "memory", verbose=False, splits=splits)
    a, b = weights(tmp_path / "mapped"), weights(tmp_path / "memory")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ma = json.loads((tmp_path / "mapped" / "metrics.json").read_text())
    mb = json.loads((tmp_path / "memory" / "metrics.json").read_text())
    assert ma["val"] == mb["val"] and ma["test"] == mb["test"]
    train(config(layout, ("none",), workers=1, epochs=1), tmp_path / "worker", verbose=False)
    train(config(layout, ("none",), epochs=1), tmp_path / "inline", verbose=False)
    a, b = weights(tmp_path / "worker"), weights(tmp_path / "inline")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_float16_layout_is_accepted_by_every_command(layout, tmp_path, capsys):
    pytest.importorskip("faiss", reason="needs the [faiss] extra")
    run = tmp_path / "run"
    assert main(["data", "check", str(layout)]) == 0
    assert main(["train", "--out", str(run), "--threads", "1", "--no-plots", "--quiet", *_config_args(layout)]) == 0
    capsys.readouterr()
    assert main(["eval", "--run", str(run), "--data", str(layout), "--split", "test", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    stored = json.loads((run / "metrics.json").read_text())["test"]
    selected = json.loads((run / "metrics.json").read_text())["normalizer"]
    assert got["t2v"]["R@1"] == stored[selected]["t2v"]["R@1"]
    np.save(tmp_path / "v16.npy", np.load(layout / "test_video_features.npy"))  # float16 --video-features
    answers = []
    for i, args in enumerate((["--data", str(layout), "--split", "test"],
                              ["--video-features", str(tmp_path / "v16.npy"), "--video-mask",
                               str(layout / "test_video_mask.npy")])):
        out = tmp_path / f"idx{i}"
        assert main(["index", "--run", str(run), "--out", str(out), *args]) == 0
        capsys.readouterr()
        assert main(["query", "--index", str(out), "--text-features", str(layout / "test_text_features.npy"),
                     "--k", "3", "--json"]) == 0
        answers.append(json.loads(capsys.readouterr().out))
    assert answers[0]["indices"] == answers[1]["indices"] and answers[0]["recall_at_10"] == 1.0


def _config_args(root):
    import yaml

    path = root.parent / "cfg.yaml"
    cfg = config(root, epochs=1)
    from xmodal.config import to_dict

    path.write_text(yaml.safe_dump(to_dict(cfg)))
    return [str(path)]


def test_encoding_a_memory_mapped_array_streams_blocks_with_the_same_numbers(layout):
    s = load_paired_split(layout, "train")
    torch.manual_seed(0)
    model = build_model(video_dim=10, text_dim=8, kind="meanp", dim=6)
    whole_v = model.encode_video(torch.from_numpy(np.array(s.video, np.float32)),
                                 torch.from_numpy(np.array(s.video_mask)), batch_size=7)
    streamed_v = model.encode_video(s.video, s.video_mask, batch_size=7)  # 96 rows: 14 blocks
    assert torch.equal(whole_v, streamed_v)
    whole_t = model.encode_text(torch.from_numpy(np.array(s.text, np.float32)), batch_size=5)
    assert torch.equal(whole_t, model.encode_text(s.text, batch_size=5))


def test_standardisation_statistics_read_blocks_and_match_float64_numpy():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((50, 4, 3)) * [1, 10, 100] + [0, 5, -7]).astype(np.float16)
    mask = rng.random((50, 4)) < 0.6
    mask[:, 0] = True
    real = x[mask].astype(np.float64)
    for block_rows in (None, 1, 7):
        st = Standardize(3).fit(x, mask, block_rows=block_rows)
        np.testing.assert_allclose(st.mean.numpy(), real.mean(0), rtol=1e-6)
        np.testing.assert_allclose(st.std.numpy(), real.std(0), rtol=1e-6)
    st_t = Standardize(3).fit(torch.from_numpy(x.astype(np.float32)), torch.from_numpy(mask))
    assert torch.equal(st_t.mean, Standardize(3).fit(x, mask).mean)


def test_mapped_arrays_skip_the_memory_check_only(tmp_path, monkeypatch):
    import xmodal.data.npyfile as npyfile

    np.save(tmp_path / "a.npy", np.ones((64, 4), np.float16))
    monkeypatch.setattr(npyfile, "memory_limit", lambda: 100)  # "a machine of 100 bytes"
    with pytest.raises(ValueError, match="more than this machine's memory"):
        load_array(tmp_path / "a.npy")
    mapped = load_array(tmp_path / "a.npy", mmap=True)
    assert isinstance(mapped, np.memmap) and mapped.shape == (64, 4)
    (tmp_path / "b.npy").write_bytes((tmp_path / "a.npy").read_bytes()[:-10])  # truncated: still refused
    with pytest.raises(ValueError, match="truncated"):
        load_array(tmp_path / "b.npy", mmap=True)


def test_checks_read_blocks_and_name_the_right_rows(tmp_path, monkeypatch):
    import xmodal.data.types as types

    root = write_layout(tmp_path / "d", n=40)
    v = np.load(root / "train_video_features.npy")
    m = np.load(root / "train_video_mask.npy")
    v[33, 0] = np.nan  # a real frame (frame 0 is always real)
    v[12, -1] = np.inf if not m[12, -1] else v[12, -1]
    np.save(root / "train_video_features.npy", v)
    monkeypatch.setattr(types, "BLOCK_ELEMENTS", 30)  # one row (3 frames x 10) per block
    with pytest.raises(ValueError, match=r"NaN/inf value\(s\) in real frames in rows \[33\]"):
        load_paired_split(root, "train")


DDP_ROOT = "XMODAL_TEST_SCALE_ROOT"


def test_ddp_on_a_memory_mapped_layout_equals_single_process(layout, tmp_path):
    """2-process gloo: each rank gathers only its half of every global batch from the mapped
    files; the weights equal the single-process run's."""
    import os

    cfg = config(layout, ("none",), epochs=1)
    train(cfg, tmp_path / "single", verbose=False)
    os.environ[DDP_ROOT] = str(layout)
    try:
        spawn_gloo(_ddp_worker, 2, str(tmp_path / "init"), str(tmp_path / "ddp"))
    finally:
        os.environ.pop(DDP_ROOT, None)
    a, b = weights(tmp_path / "single"), weights(tmp_path / "ddp")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def _ddp_worker(rank: int, init_file: str, out: str) -> None:
    import os

    import torch.distributed as tdist

    from pathlib import Path

    tdist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        train(config(Path(os.environ[DDP_ROOT]), ("none",), epochs=1), out, verbose=False)
        mark_done(init_file, rank)
        tdist.barrier()
    finally:
        tdist.destroy_process_group()


def test_each_rank_gathers_only_its_rows_of_every_global_batch(layout):
    """The DistributedSampler idea: rank r of w reads rows [r b, (r + 1) b) of each global batch."""
    from xmodal.training.batches import EpochBatches, batch_loader
    from xmodal.training.sampling import epoch_batches

    s = load_paired_split(layout, "train")
    batches = epoch_batches(0, seed=0, text_to_video=s.text_to_video, batch_size=12)
    video, vmask = s.video_input()
    text, tmask = s.text_input()
    seen = []
    for rank in range(3):
        ds = EpochBatches(batches, text=text, text_mask=tmask, video=video, video_mask=vmask,
                          text_to_video=s.text_to_video, rank=rank, local_batch=4)
        for i, item in enumerate(batch_loader(ds)):
            np.testing.assert_array_equal(item.rows, batches[i][4 * rank:4 * (rank + 1)])
            assert item.text.dtype == torch.float32 and item.video.shape == (4, 3, 10)
            np.testing.assert_array_equal(item.text.numpy(), np.asarray(s.text[item.rows], np.float32))
            np.testing.assert_array_equal(item.video_mask.numpy(), s.video_mask[s.text_to_video[item.rows]])
            seen.append(item.rows)
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.sort(np.concatenate(batches)))
