"""retrieval / text_video against the loop references in test_metrics_naive.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from test_metrics_naive import naive_retrieval, naive_text_video
from xmodal.metrics import retrieval, text_video

TIES = ("pessimistic", "optimistic", "average")
KS = (1, 2, 3, 5, 10)


def assert_same(got, want, tol=1e-9):
    assert set(got) == set(want)
    for key in want:
        assert got[key] == pytest.approx(want[key], abs=tol), key


def tied_scores(rng, q, g, levels=3):
    """Scores from a few levels, so ties are everywhere."""
    return rng.integers(0, levels, size=(q, g)).astype(np.float32) / levels


@pytest.mark.parametrize("ties", TIES)
@pytest.mark.parametrize("kind", ["random", "tied", "all_equal", "single_item"])
def test_single_positive_matches_naive(ties, kind):
    rng = np.random.default_rng(0)
    q, g = 23, 7
    if kind == "random":
        sim = rng.standard_normal((q, g)).astype(np.float32)
    elif kind == "tied":
        sim = tied_scores(rng, q, g)
    elif kind == "all_equal":
        sim = np.full((q, g), 0.25, dtype=np.float32)
    else:
        g = 1
        sim = rng.standard_normal((q, 1)).astype(np.float32)
    pos = rng.integers(0, g, size=q)
    assert_same(retrieval(sim, pos, ks=KS, ties=ties), naive_retrieval(sim, pos, KS, ties))


@pytest.mark.parametrize("ties", TIES)
@pytest.mark.parametrize("levels", [2, 4, 1000])
def test_multi_positive_matches_naive(ties, levels):
    rng = np.random.default_rng(1)
    q, g = 19, 6
    sim = tied_scores(rng, q, g, levels)
    mask = rng.random((q, g)) < 0.35
    mask[np.arange(q), rng.integers(0, g, q)] = True
    assert_same(retrieval(sim, mask, ks=KS, ties=ties), naive_retrieval(sim, mask, KS, ties))


def test_average_large_tie_group_matches_naive():
    # 9 tied items exercise the sequential-draw branch of the reference
    rng = np.random.default_rng(2)
    sim = np.zeros((5, 9), dtype=np.float32)
    sim[:, 0] = 1.0
    mask = rng.random((5, 9)) < 0.3
    mask[:, 3] = True
    ks = (1, 2, 4, 9)
    assert_same(retrieval(sim, mask, ks=ks, ties="average"),
                naive_retrieval(sim, mask, ks, "average"))


@pytest.mark.parametrize("block_size", [1, 3, 1000])
@pytest.mark.parametrize("ties", TIES)
def test_block_size_does_not_matter(block_size, ties):
    rng = np.random.default_rng(3)
    sim = tied_scores(rng, 17, 8)
    pos = rng.integers(0, 8, 17)
    mask = rng.random((17, 8)) < 0.3
    mask[:, 0] = True
    assert retrieval(sim, pos, ks=KS, ties=ties, block_size=block_size) == \
        retrieval(sim, pos, ks=KS, ties=ties)
    assert retrieval(sim, mask, ks=KS, ties=ties, block_size=block_size) == \
        retrieval(sim, mask, ks=KS, ties=ties)


def test_input_types_agree():
    rng = np.random.default_rng(4)
    sim16 = rng.standard_normal((12, 9)).astype(np.float16)   # float16 quantisation: ties
    pos = rng.integers(0, 9, 12)
    want = naive_retrieval(sim16.astype(np.float64), pos, KS, "pessimistic")
    for s in (sim16, torch.from_numpy(sim16), sim16.astype(np.float32),
              torch.from_numpy(sim16).double()):
        for p in (pos, torch.from_numpy(pos), pos.astype(np.int32)):
            assert_same(retrieval(s, p, ks=KS), want)
    out = retrieval(sim16, pos, ks=KS)
    assert all(type(v) is float for v in out.values())


def test_does_not_mutate_inputs():
    rng = np.random.default_rng(5)
    sim = rng.standard_normal((6, 5)).astype(np.float32)
    mask = rng.random((6, 5)) < 0.5
    mask[:, 1] = True
    s0, m0 = sim.copy(), mask.copy()
    retrieval(sim, mask, ties="average")
    assert np.array_equal(sim, s0) and np.array_equal(mask, m0)


def test_hand_computed():
    # query 0: correct item 1 scores 0.5; item 0 (0.9) is above, item 2 ties -> ranks 3/2/2.5
    # query 1: correct item 0 is the unique best -> rank 1 under every rule
    sim = np.array([[0.9, 0.5, 0.5], [0.7, 0.1, 0.2]], dtype=np.float32)
    pos = np.array([1, 0])
    pess = retrieval(sim, pos, ks=(1, 2))
    assert pess == {"R@1": 50.0, "R@2": 50.0, "MdR": 2.0, "MnR": 2.0}
    opt = retrieval(sim, pos, ks=(1, 2), ties="optimistic")
    assert opt == {"R@1": 50.0, "R@2": 100.0, "MdR": 1.5, "MnR": 1.5}
    avg = retrieval(sim, pos, ks=(1, 2), ties="average")
    # expected ranks 2.5 and 1; P(rank <= 2) for query 0 is 1/2
    assert avg == pytest.approx({"R@1": 50.0, "R@2": 75.0, "MdR": 1.75, "MnR": 1.75})


def test_errors_name_the_argument():
    sim = np.zeros((3, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="positives"):
        retrieval(sim, [0, 1])
    with pytest.raises(ValueError, match="positives"):
        retrieval(sim, [0, 1, 4])
    with pytest.raises(ValueError, match="positives"):
        retrieval(sim, [0, -1, 2])
    with pytest.raises(TypeError, match="positives"):
        retrieval(sim, np.array([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="positives"):
        retrieval(sim, np.zeros((3, 4), dtype=bool))
    with pytest.raises(ValueError, match="positives"):
        retrieval(sim, np.ones((3, 3), dtype=bool))
    bad = sim.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="sim"):
        retrieval(bad, [0, 1, 2])
    bad[1, 2] = np.inf
    with pytest.raises(ValueError, match="sim"):
        retrieval(bad, [0, 1, 2])
    with pytest.raises(ValueError, match="sim"):
        retrieval(np.zeros((0, 4)), np.zeros(0, dtype=int))
    with pytest.raises(ValueError, match="sim"):
        retrieval(np.zeros(4), [0])
    with pytest.raises(ValueError, match="ties"):
        retrieval(sim, [0, 1, 2], ties="random")
    with pytest.raises(ValueError, match="ks"):
        retrieval(sim, [0, 1, 2], ks=(0, 5))
    with pytest.raises(TypeError, match="sim"):
        retrieval("abc", [0])


@pytest.mark.parametrize("v2t", ["all-captions", "max-over-captions"])
@pytest.mark.parametrize("ties", TIES)
def test_text_video_matches_naive(v2t, ties):
    rng = np.random.default_rng(6)
    nv = 5
    t2v = np.concatenate([np.arange(nv), rng.integers(0, nv, 9)])  # 1..several captions
    rng.shuffle(t2v)
    sim = tied_scores(rng, len(t2v), nv, levels=4)
    got = text_video(sim, t2v, ks=KS, ties=ties, v2t=v2t)
    want = naive_text_video(sim, t2v, KS, ties, v2t)
    assert_same(got["t2v"], want["t2v"])
    assert_same(got["v2t"], want["v2t"])
    assert text_video(sim, t2v, ks=KS, ties=ties, v2t=v2t, block_size=2) == got


def test_text_video_errors():
    sim = np.zeros((4, 3), dtype=np.float32)
    with pytest.raises(ValueError, match="text_to_video"):
        text_video(sim, [0, 1, 1, 0])          # video 2 has no caption
    with pytest.raises(ValueError, match="text_to_video"):
        text_video(sim, [0, 1, 2])
    with pytest.raises(ValueError, match="v2t"):
        text_video(sim, [0, 1, 2, 0], v2t="mean")


scores = st.integers(0, 3).map(lambda v: v / 3.0)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_gallery_permutation_invariance(data):
    q = data.draw(st.integers(1, 6))
    g = data.draw(st.integers(1, 6))
    sim = np.array(data.draw(st.lists(st.lists(scores, min_size=g, max_size=g),
                                      min_size=q, max_size=q)), dtype=np.float32)
    mask = np.array(data.draw(st.lists(st.lists(st.booleans(), min_size=g, max_size=g),
                                       min_size=q, max_size=q)), dtype=bool).reshape(q, g)
    mask[:, data.draw(st.integers(0, g - 1))] = True
    perm = np.array(data.draw(st.permutations(range(g))), dtype=int)
    ties = data.draw(st.sampled_from(TIES))
    a = retrieval(sim, mask, ks=(1, 2, 5), ties=ties)
    b = retrieval(sim[:, perm], mask[:, perm], ks=(1, 2, 5), ties=ties)
    assert a == pytest.approx(b, abs=1e-9)
    pos = mask.argmax(1)
    inv = np.argsort(perm)
    assert retrieval(sim, pos, ties=ties) == pytest.approx(
        retrieval(sim[:, perm], inv[pos], ties=ties), abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_recall_monotone_in_k(data):
    q = data.draw(st.integers(1, 5))
    g = data.draw(st.integers(1, 8))
    sim = np.array(data.draw(st.lists(st.lists(scores, min_size=g, max_size=g),
                                      min_size=q, max_size=q)), dtype=np.float32)
    pos = np.array(data.draw(st.lists(st.integers(0, g - 1), min_size=q, max_size=q)))
    ties = data.draw(st.sampled_from(TIES))
    ks = tuple(range(1, g + 2))
    out = retrieval(sim, pos, ks=ks, ties=ties)
    vals = [out[f"R@{k}"] for k in ks]
    assert all(a <= b + 1e-9 for a, b in zip(vals, vals[1:]))
    assert vals[-1] == pytest.approx(100.0)
    assert 1.0 <= out["MdR"] <= g and 1.0 <= out["MnR"] <= g


def test_float64_is_not_rounded():
    # 1 + 1e-12 and 1 are equal in float32 but not in float64: no tie may be invented
    sim = np.array([[1.0, 1.0 + 1e-12]])
    assert retrieval(sim, [1], ks=(1,)) == {"R@1": 100.0, "MdR": 1.0, "MnR": 1.0}
    assert retrieval(sim.astype(np.float32), [1], ks=(1,))["MdR"] == 2.0
