"""mir's exact tie bounds run only where a tie group mixes a hit with a graded item.

The rows needing mAP's exact order are found among the tied relevant items the fast
path sorts anyway; these tests check that the result is the same as running the exact
per-row programme on EVERY row (the previous implementation's values, whatever rows it
picked) and as the naive per-group loop of ``test_metrics_mir.ref_bounds``, with and
without ties, for many ties, all ties and float16 scores.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_metrics_mir import _mean_pct, epic_like, ref_bounds
from xmodal.metrics import mir
from xmodal.metrics.multi_instance import (_ap_extreme_row, _block_exact, _block_sparse,
                                           _mixed_tie_rows)


def every_row_exact(sim, rel, ties):
    """mAP with the exact tie programme on every row, nDCG from the full lexsort path."""
    s = np.asarray(sim).astype(np.float64)      # float16/32 widen exactly
    r = np.asarray(rel, np.float64)
    optimistic = ties == "optimistic"
    ap = np.array([_ap_extreme_row(s[i], r[i], optimistic) for i in range(s.shape[0])])
    _, dcg, idcg, n1 = _block_exact(s, r, optimistic)
    ndcg = np.divide(dcg, idcg, out=np.zeros_like(dcg), where=idcg > 0)
    return (100 * ap[n1 > 0].mean() if (n1 > 0).any() else 0.0,
            100 * ndcg[idcg > 0].mean() if (idcg > 0).any() else 0.0)


def naive_mixed_rows(sim, rel):
    """Loop: rows where some score is shared by a hit and an item with 0 < r < 1."""
    out = []
    for i, (s_row, r_row) in enumerate(zip(np.asarray(sim, np.float64) + 0.0, rel)):
        hit_scores = {float(s) for s, r in zip(s_row, r_row) if r == 1}
        if any(float(s) in hit_scores for s, r in zip(s_row, r_row) if 0 < r < 1):
            out.append(i)
    return out


def _case(kind, rng, q=40, g=23):
    rel = epic_like(rng, q, g, n_verbs=3, n_nouns=4)
    rel[1] = 0.0                                                  # an empty query
    if kind == "no ties":
        sim = rng.permutation(q * g).reshape(q, g).astype(np.float32) / (q * g)
    elif kind == "many ties":
        sim = (rng.integers(0, 3, (q, g)) / 3).astype(np.float32)
    elif kind == "all ties":
        sim = np.full((q, g), 0.25, np.float32)
        sim[2, :4] = -0.0
        sim[2, 4:] = 0.0                                          # -0.0 == +0.0
    elif kind == "float16":
        sim = (0.5 * rel + 0.02 * rng.standard_normal((q, g))).astype(np.float16)
    else:
        raise AssertionError(kind)
    return sim, rel


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic"])
@pytest.mark.parametrize("kind", ["no ties", "many ties", "all ties", "float16"])
@pytest.mark.parametrize("block_size", [None, 7])
def test_same_values_as_exact_programme_on_every_row_and_naive_loop(kind, ties, block_size):
    rng = np.random.default_rng(len(kind) + (block_size or 0))
    sim, rel = _case(kind, rng)
    out = mir(sim, rel, ties=ties, block_size=block_size)
    m, n = every_row_exact(sim, rel, ties)
    assert out["mAP"] == pytest.approx(m, abs=1e-9)
    assert out["nDCG"] == pytest.approx(n, abs=1e-9)
    aps, nds = ref_bounds(np.asarray(sim, np.float64), rel, ties)
    assert out["mAP"] == pytest.approx(_mean_pct(aps), abs=1e-9)
    assert out["nDCG"] == pytest.approx(_mean_pct(nds), abs=1e-9)


@pytest.mark.parametrize("kind", ["no ties", "many ties", "all ties", "float16"])
def test_detected_rows_match_a_naive_loop(kind):
    rng = np.random.default_rng(3)
    sim, rel = _case(kind, rng)
    s = np.asarray(sim, np.float32)
    expected = naive_mixed_rows(s, rel)
    assert _mixed_tie_rows(s, rel).tolist() == expected
    sparse = _block_sparse(s, rel, optimistic=False, max_collisions=s.size)
    assert sparse[4].tolist() == expected
    if kind in ("many ties", "all ties"):
        assert expected                                           # the cases do exercise it


def test_mixed_rows_are_exactly_the_rows_whose_bound_differs_from_sorting():
    """A mixed tie group can change AP (the exposing case); no other row is touched."""
    sim = np.array([[0.9, 0.8, 0.5, 0.5], [0.9, 0.8, 0.5, 0.5], [0.9, 0.8, 0.5, 0.5]], np.float32)
    rel = np.array([[0, 0, 1, 0.5], [0, 0.5, 1, 0], [0, 0, 1, 1]], np.float32)
    assert _mixed_tie_rows(sim, rel).tolist() == [0]
    assert _block_sparse(sim, rel, False)[4].tolist() == [0]


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_property_fast_equals_naive(data):
    q = data.draw(st.integers(1, 8))
    g = data.draw(st.integers(1, 30))
    levels = data.draw(st.sampled_from([1, 2, 3, 1000]))
    dtype = data.draw(st.sampled_from([np.float16, np.float32, np.float64]))
    sim = (np.array(data.draw(st.lists(st.integers(0, levels - 1), min_size=q * g, max_size=q * g)))
           .reshape(q, g) / levels).astype(dtype)
    rel = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.0, 0.25, 0.5, 0.75, 1.0]),
                                      min_size=q * g, max_size=q * g)), np.float32).reshape(q, g)
    block = data.draw(st.sampled_from([None, 1, 3]))
    for ties in ("pessimistic", "optimistic"):
        out = mir(sim, rel, ties=ties, block_size=block)
        aps, nds = ref_bounds(np.asarray(sim, np.float64), rel, ties)
        assert out["mAP"] == pytest.approx(_mean_pct(aps), abs=1e-9)
        assert out["nDCG"] == pytest.approx(_mean_pct(nds), abs=1e-9)
        m, n = every_row_exact(sim, rel, ties)
        assert out["mAP"] == pytest.approx(m, abs=1e-9)
        assert out["nDCG"] == pytest.approx(n, abs=1e-9)
