"""class_counts / kmeans_classes for TS++ class frequencies."""

from pathlib import Path

import numpy as np
import pytest
import torch

from xmodal.data import class_counts, epic_train_classes, kmeans_classes, synthetic

EPIC = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "epic100"


def test_class_counts_matches_loop():
    rng = np.random.default_rng(0)
    lab = rng.integers(0, 7, 200)
    naive = [sum(1 for v in lab if v == c) for c in range(7)]
    np.testing.assert_array_equal(class_counts(lab), naive)
    np.testing.assert_array_equal(class_counts(torch.tensor(lab)), naive)
    np.testing.assert_array_equal(class_counts(lab, num_classes=9), naive + [0, 0])
    assert class_counts(np.array([], np.int64)).shape == (0,)


@pytest.mark.parametrize("bad, exc, name", [
    (np.array([0, -1]), ValueError, "labels"), (np.array([[0, 1]]), ValueError, "labels"),
    (np.array([0.5, 1.0]), TypeError, "labels"), ("abc", TypeError, "labels"),
])
def test_class_counts_errors(bad, exc, name):
    with pytest.raises(exc, match=name):
        class_counts(bad)
    with pytest.raises(ValueError, match="num_classes"):
        class_counts(np.array([0, 5]), num_classes=3)


def test_kmeans_recovers_clusters_and_is_seeded():
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((5, 16)) * 5
    truth = np.repeat(np.arange(5), 40)
    x = centres[truth] + 0.1 * rng.standard_normal((200, 16))
    before = x.copy()
    lab = kmeans_classes(x, k=5, seed=0)
    np.testing.assert_array_equal(x, before)  # input untouched
    assert lab.dtype == np.int64 and lab.shape == (200,)
    # A perfect clustering up to relabelling: each true cluster maps to one k-means id.
    for c in range(5):
        assert len(set(lab[truth == c])) == 1
    assert len(set(lab)) == 5
    np.testing.assert_array_equal(lab, kmeans_classes(torch.tensor(x), k=5, seed=0))
    np.testing.assert_array_equal(kmeans_classes(x, k=5, seed=0, minibatch=True),
                                  kmeans_classes(x, k=5, seed=0, minibatch=True))


def test_kmeans_on_synthetic_long_tail_gives_unequal_clusters():
    d = synthetic(num_train=600, num_val=10, num_test=10, num_concepts=10, zipf_exponent=1.5,
                  caption_noise=0.2, feature_noise=0.05)
    lab = kmeans_classes(d["train"].text, k=10, seed=0)
    counts = np.sort(class_counts(lab, num_classes=10))[::-1]
    assert counts[0] > 4 * counts[-1]


def test_kmeans_errors():
    with pytest.raises(ValueError, match="k"):
        kmeans_classes(np.zeros((3, 2), np.float32), k=5)
    with pytest.raises(ValueError, match="embeddings"):
        kmeans_classes(np.array([[np.nan, 1.0]]), k=1)
    with pytest.raises(ValueError, match="embeddings"):
        kmeans_classes(np.zeros(4), k=1)


@pytest.mark.skipif(not EPIC.is_dir(), reason=f"EPIC-KITCHENS-100 CSVs not available at {EPIC}")
def test_epic_train_class_counts():
    c = epic_train_classes(EPIC)
    verbs = class_counts(c["verb"], num_classes=97)
    nouns = class_counts(c["noun"], num_classes=300)
    assert verbs.sum() == nouns.sum() == 15989
    assert verbs.max() > 100 * max(1, np.sort(verbs)[len(verbs) // 4])
