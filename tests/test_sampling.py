"""Batch sampling, in particular MIL-NCE's k_captions (B/K videos x K of their captions)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xmodal.training.sampling import epoch_batches


def _naive_check(batches, t2v, k):
    """Every batch: B/K distinct videos, each a contiguous run of K texts of that video."""
    seen = []
    for b in batches:
        vids = t2v[b].reshape(-1, k)
        assert (vids == vids[:, :1]).all()                  # K texts of one video, contiguous
        assert len(set(vids[:, 0].tolist())) == len(vids)   # B/K distinct videos
        seen += vids[:, 0].tolist()
        for row in np.asarray(b).reshape(-1, k):
            n_caps = int((t2v == t2v[row[0]]).sum())
            assert len(set(row.tolist())) == min(k, n_caps)  # distinct when the video has K captions
    assert len(seen) == len(set(seen))                       # each video at most once per epoch
    return seen


@pytest.mark.parametrize("seed, k, batch", [(0, 2, 8), (1, 3, 9), (2, 5, 10), (3, 1, 4)])
def test_k_captions_batches(seed, k, batch):
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 7, size=40)                    # 1..6 captions per video
    t2v = rng.permutation(np.repeat(np.arange(40), counts))
    b = epoch_batches(seed, seed=7, text_to_video=t2v, batch_size=batch, sampling="k_captions",
                      captions_per_video=k)
    seen = _naive_check(b, t2v, k)
    assert len(b) == 40 // (batch // k) and len(seen) == len(b) * batch // k
    again = epoch_batches(seed, seed=7, text_to_video=t2v, batch_size=batch, sampling="k_captions",
                          captions_per_video=k)
    assert all(np.array_equal(x, y) for x, y in zip(b, again))
    other = epoch_batches(seed + 1, seed=7, text_to_video=t2v, batch_size=batch, sampling="k_captions",
                          captions_per_video=k)
    assert not all(np.array_equal(x, y) for x, y in zip(b, other))


def test_k_captions_bad_k():
    t2v = np.repeat(np.arange(10), 3)
    with pytest.raises(ValueError, match="captions_per_video"):
        epoch_batches(0, seed=0, text_to_video=t2v, batch_size=8, sampling="k_captions", captions_per_video=3)
    with pytest.raises(ValueError, match="sampling"):
        epoch_batches(0, seed=0, text_to_video=t2v, batch_size=8, sampling="clips")


def test_config_k_captions_checks_batch_size():
    from xmodal.config import from_dict

    with pytest.raises(ValueError, match="captions_per_video"):
        from_dict({"train": {"sampling": "k_captions", "captions_per_video": 3, "batch_size": 32}})
    cfg = from_dict({"train": {"sampling": "k_captions", "captions_per_video": 4, "batch_size": 32}})
    assert cfg.train.captions_per_video == 4


@pytest.mark.usefixtures("one_thread")
def test_milnce_trains_with_k_captions_and_logs_gap(tmp_path):
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    cfg = from_dict({
        "data": {"name": "synthetic", "synthetic": {"num_train": 120, "num_val": 60, "num_test": 60,
                                                    "num_concepts": 10}},
        "model": {"dim": 16}, "loss": {"name": "milnce", "temperature": 0.1}, "optim": {"lr": 3e-3},
        "test_time": {"normalizers": ["none"], "bank_size": 100, "oracle": False},
        "train": {"seed": 0, "epochs": 2, "batch_size": 24, "patience": 0, "progress": False,
                  "sampling": "k_captions", "captions_per_video": 3}})
    summary = train(cfg, tmp_path)
    log = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert log[0]["step"] == 120 // 8                        # 120 videos, 8 videos per batch
    assert all(0 <= r["modality_gap"] <= 2 for r in log)
    assert summary["val"]["none"]["t2v"]["R@1"] > 100 / 60   # above chance
