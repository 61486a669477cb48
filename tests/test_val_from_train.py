"""data.val_from_train: validation carved out of the training split (issue 18 item 7)."""

import dataclasses

import numpy as np
import pytest

import xmodal.data as xdata
from xmodal.config import Config, validate
from xmodal.training.loop import carve_validation, load_splits


def _split(n=20, k=3, seed=0):
    rng = np.random.default_rng(seed)
    return xdata.PairedSplit.from_arrays(video=rng.standard_normal((n, 4)).astype(np.float32),
                                         text=rng.standard_normal((n * k, 5)).astype(np.float32),
                                         text_to_video=np.repeat(np.arange(n), k))


def test_carve_is_a_partition_with_every_text_following_its_video():
    split = _split()
    train, val = carve_validation(split, 6)
    assert (train.num_videos, val.num_videos) == (14, 6)
    assert (train.num_texts, val.num_texts) == (42, 18)
    # Naive check: every original video row lands in exactly one side, with its own texts.
    rows = {tuple(v): i for i, v in enumerate(split.video.tolist())}
    seen = []
    for part in (train, val):
        for j, v in enumerate(part.video.tolist()):
            i = rows[tuple(v)]
            seen.append(i)
            mine = part.text[part.text_to_video == j]
            np.testing.assert_array_equal(mine, split.text[split.text_to_video == i])
    assert sorted(seen) == list(range(split.num_videos))


def test_carve_is_fixed_across_training_seeds_and_bad_sizes_are_named():
    a = carve_validation(_split(), 5)[1].video
    b = carve_validation(_split(), 5)[1].video
    np.testing.assert_array_equal(a, b)
    for bad in (0, 20, 25):
        with pytest.raises(ValueError, match="data.val_from_train"):
            carve_validation(_split(), bad)


def test_load_splits_uses_the_carved_split_and_leaves_test_alone():
    cfg = Config()
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, val_from_train=10))
    splits = load_splits(cfg)
    full = load_splits(Config())
    assert splits["val"].num_videos == 10
    assert splits["train"].num_videos == full["train"].num_videos - 10
    np.testing.assert_array_equal(splits["test"].video, full["test"].video)
    with pytest.raises(ValueError, match="data.val_from_train"):
        validate(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, name="paired", root=".",
                                                                   val_from_train=-1)))
