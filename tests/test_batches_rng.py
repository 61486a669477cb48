"""The batch loader leaves the global torch RNG alone (issue 35.4).

``iter(DataLoader)`` draws its workers' base seed; from the global RNG that shifted every later
dropout mask, so a flat run's trajectory changed when batches started to pass through a loader.
"""
import numpy as np
import pytest
import torch

from xmodal.training.batches import EpochBatches, batch_loader


def _dataset():
    rng = np.random.default_rng(0)
    text = rng.standard_normal((12, 4)).astype(np.float32)
    video = rng.standard_normal((6, 3)).astype(np.float32)
    return EpochBatches([np.arange(6), np.arange(6, 12)], text=text, text_mask=None, video=video,
                        video_mask=None, text_to_video=np.arange(12) % 6)


@pytest.mark.parametrize("workers", [0, 1])
def test_iterating_the_loader_draws_nothing_from_the_global_rng(workers):
    torch.manual_seed(123)
    expected = torch.rand(5)
    torch.manual_seed(123)
    batches = list(batch_loader(_dataset(), workers=workers, seed=7))
    got = torch.rand(5)
    assert len(batches) == 2
    assert torch.equal(got, expected)


def test_the_loaders_batches_are_the_datasets_items():
    ds = _dataset()
    for item, batch in zip((ds[0], ds[1]), batch_loader(ds, seed=3)):
        assert np.array_equal(item.rows, batch.rows)
        assert torch.equal(item.text, batch.text) and torch.equal(item.video, batch.video)


def test_seed_is_checked():
    with pytest.raises((TypeError, ValueError), match="seed"):
        batch_loader(_dataset(), seed=-1)
