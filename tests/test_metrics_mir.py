"""mir (EPIC-KITCHENS-100 mAP / nDCG) against hand computations, the official
argsort-based code (re-typed) and the loop definition with tie rules."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from test_metrics_naive import official_map, official_ndcg
from xmodal.metrics import mir
from xmodal.metrics.multi_instance import _block_exact, _block_packed


def epic_like(rng, q, g, n_verbs=12, n_nouns=20):
    """Relevancy = mean of verb IoU and noun IoU with long-tailed single classes."""
    pv = 1.0 / np.arange(1, n_verbs + 1)
    pn = 1.0 / np.arange(1, n_nouns + 1)
    vq, vg = rng.choice(n_verbs, q, p=pv / pv.sum()), rng.choice(n_verbs, g, p=pv / pv.sum())
    nq, ng = rng.choice(n_nouns, q, p=pn / pn.sum()), rng.choice(n_nouns, g, p=pn / pn.sum())
    rel = 0.5 * (vq[:, None] == vg[None, :]) + 0.5 * (nq[:, None] == ng[None, :])
    return rel.astype(np.float32)


def _ap_dcg(ranked, kq):
    """Official definitions on one ranked relevancy list (loops)."""
    total, hits, prec = 0.0, 0, 0.0
    for k, r in enumerate(ranked, start=1):
        total += r
        if r == 1:
            hits += 1
            prec += total / k
    dcg = sum(ranked[k - 1] / math.log2(k + 1) for k in range(1, kq + 1))
    return (prec / hits if hits else None), dcg


def brute_bounds(sim, rel, ties):
    """Per query, min (pessimistic) or max (optimistic) of AP and nDCG over EVERY order
    of the gallery consistent with the scores (all permutations; small galleries only)."""
    pick = min if ties == "pessimistic" else max
    aps, nds = [], []
    for s_row, r_row in zip(np.asarray(sim, np.float64), np.asarray(rel, np.float64)):
        g = len(s_row)
        kq = int(sum(r > 0 for r in r_row))
        ideal = sorted(r_row, reverse=True)
        idcg = sum(ideal[k - 1] / math.log2(k + 1) for k in range(1, kq + 1))
        vals = [_ap_dcg([r_row[j] for j in p], kq) for p in itertools.permutations(range(g))
                if all(s_row[p[k]] >= s_row[p[k + 1]] for k in range(g - 1))]
        ap = [a for a, _ in vals]
        aps.append(None if ap[0] is None else pick(ap))
        nds.append(pick(d for _, d in vals) / idcg if idcg > 0 else None)
    return aps, nds


def _group_ap_extreme(before_sum, before_n, values, pick):
    """Best / worst sum of hit precisions over the orders of one tie group: a DP over how
    many items of each distinct relevancy are placed (equal relevancies interchangeable)."""
    distinct = sorted(set(values))
    counts = tuple(values.count(v) for v in distinct)
    memo = {}

    def go(used):
        if used == counts:
            return 0.0
        if used in memo:
            return memo[used]
        placed = sum(used)
        acc = before_sum + sum(u * v for u, v in zip(used, distinct))
        options = []
        for k, v in enumerate(distinct):
            if used[k] < counts[k]:
                nxt = used[:k] + (used[k] + 1,) + used[k + 1:]
                gain = (acc + v) / (before_n + placed + 1) if v == 1 else 0.0
                options.append(gain + go(nxt))
        memo[used] = pick(options)
        return memo[used]

    return go(tuple(0 for _ in distinct))


def ref_bounds(sim, rel, ties):
    """Same bounds for larger galleries: AP per tie group by the multiset DP (a group's
    order changes only its own hits' precision); nDCG less (more) relevant first."""
    pick = min if ties == "pessimistic" else max
    aps, nds = [], []
    for s_row, r_row in zip(np.asarray(sim, np.float64) + 0.0, np.asarray(rel, np.float64)):
        scores = sorted(set(s_row.tolist()), reverse=True)
        ranked, total, n, prec, hits = [], 0.0, 0, 0.0, 0
        for sc in scores:
            grp = sorted((float(r) for s_, r in zip(s_row, r_row) if s_ == sc),
                         reverse=(ties == "optimistic"))
            prec += _group_ap_extreme(total, n, grp, pick)
            hits += grp.count(1.0)
            total += sum(grp)
            n += len(grp)
            ranked += grp
        kq = sum(1 for r in ranked if r > 0)
        aps.append(prec / hits if hits else None)
        ideal = sorted(ranked, reverse=True)
        idcg = sum(ideal[k - 1] / math.log2(k + 1) for k in range(1, kq + 1))
        nds.append(_ap_dcg(ranked, kq)[1] / idcg if idcg > 0 else None)
    return aps, nds


def _mean_pct(xs):
    d = [x for x in xs if x is not None]
    return 100 * float(np.mean(d)) if d else 0.0


def test_less_relevant_first_is_not_the_worst_order_for_map():
    """The exposing case: two zeros, then a hit tied with a 0.5 item. Hit first: 1/3;
    0.5 first: 1.5/4 = 0.375. Pessimistic must be the smaller, optimistic the larger."""
    sim = np.array([[0.9, 0.8, 0.5, 0.5]], dtype=np.float32)
    rel = np.array([[0.0, 0.0, 1.0, 0.5]], dtype=np.float32)
    assert mir(sim, rel, ties="pessimistic")["mAP"] == pytest.approx(100 / 3, abs=1e-9)
    assert mir(sim, rel, ties="optimistic")["mAP"] == pytest.approx(37.5, abs=1e-9)
    # a 7-item case: the hit among graded items after a weak prefix
    sim = np.array([[3, 2, 1, 1, 1, 1, 1]], dtype=np.float32)
    rel = np.array([[0, 0, 1, 0.5, 0.5, 0.25, 0]], dtype=np.float32)
    aps_p, nds_p = brute_bounds(sim, rel, "pessimistic")
    aps_o, nds_o = brute_bounds(sim, rel, "optimistic")
    pess, opt = mir(sim, rel, ties="pessimistic"), mir(sim, rel, ties="optimistic")
    assert pess["mAP"] == pytest.approx(100 * aps_p[0], abs=1e-9) and pess["mAP"] < opt["mAP"]
    assert opt["mAP"] == pytest.approx(100 * aps_o[0], abs=1e-9)
    assert pess["nDCG"] == pytest.approx(100 * nds_p[0], abs=1e-9)
    assert opt["nDCG"] == pytest.approx(100 * nds_o[0], abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_tie_rules_are_the_bounds_over_all_tie_orders(data):
    """Brute force: every order of the tied items; pessimistic = min, optimistic = max,
    per query and per metric (so also a bound of every tie-breaking's mean)."""
    q = data.draw(st.integers(1, 3))
    g = data.draw(st.integers(1, 6))
    sim = np.array(data.draw(st.lists(st.integers(0, 2), min_size=q * g, max_size=q * g)),
                   dtype=np.float32).reshape(q, g)
    rel = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]),
                                      min_size=q * g, max_size=q * g)), dtype=np.float32).reshape(q, g)
    for ties in ("pessimistic", "optimistic"):
        aps, nds = brute_bounds(sim, rel, ties)
        out = mir(sim, rel, ties=ties)
        assert out["mAP"] == pytest.approx(_mean_pct(aps), abs=1e-9)
        assert out["nDCG"] == pytest.approx(_mean_pct(nds), abs=1e-9)
        ref = ref_bounds(sim, rel, ties)      # the reference used for larger cases
        assert _mean_pct(ref[0]) == pytest.approx(_mean_pct(aps), abs=1e-12)
        assert _mean_pct(ref[1]) == pytest.approx(_mean_pct(nds), abs=1e-12)
    lo, hi = mir(sim, rel), mir(sim, rel, ties="optimistic")
    assert lo["mAP"] <= hi["mAP"] + 1e-9 and lo["nDCG"] <= hi["nDCG"] + 1e-9


def test_hand_computed_no_ties():
    # ranking by score: items 0,1,2,3 with relevancy 0.5, 1, 0, 1
    # cumulative graded relevancy 0.5, 1.5, 1.5, 2.5; hits (rel == 1) at positions 2 and 4
    # AP = (1.5/2 + 2.5/4) / 2 = (0.75 + 0.625) / 2 = 0.6875
    # k_q = 3 items with rel > 0; DCG = 0.5/log2(2) + 1/log2(3) + 0/log2(4)
    # IDCG (sorted 1, 1, 0.5) = 1/log2(2) + 1/log2(3) + 0.5/log2(4) = 1 + 1/log2(3) + 0.25
    sim = np.array([[0.9, 0.8, 0.7, 0.6]], dtype=np.float32)
    rel = np.array([[0.5, 1.0, 0.0, 1.0]], dtype=np.float32)
    out = mir(sim, rel)
    assert out["mAP"] == pytest.approx(68.75, abs=1e-9)
    ndcg = (0.5 + 1 / math.log2(3)) / (1 + 1 / math.log2(3) + 0.25)
    assert out["nDCG"] == pytest.approx(100 * ndcg, abs=1e-9)


def test_hand_computed_ties():
    # items 0 (rel 1) and 1 (rel 0) tie at 0.5, item 2 (rel 0.5) scores 0.1
    # pessimistic order 1, 0, 2: hit at position 2 with cumulative relevancy 0 + 1 -> AP 1/2
    #   DCG over k_q = 2: 0/1 + 1/log2(3); IDCG = 1 + 0.5/log2(3)
    # optimistic order 0, 1, 2: hit at position 1 -> AP 1; DCG = 1/1 + 0/log2(3) = 1,
    #   IDCG as above -> nDCG = 1 / (1 + 0.5/log2(3))
    sim = np.array([[0.5, 0.5, 0.1]], dtype=np.float32)
    rel = np.array([[1.0, 0.0, 0.5]], dtype=np.float32)
    pess = mir(sim, rel)
    assert pess["mAP"] == pytest.approx(50.0)
    assert pess["nDCG"] == pytest.approx(100 * (1 / math.log2(3)) / (1 + 0.5 / math.log2(3)))
    opt = mir(sim, rel, ties="optimistic")
    assert opt == pytest.approx({"mAP": 100.0, "nDCG": 100 / (1 + 0.5 / math.log2(3))})


def test_empty_queries():
    # row 0: AP 1 and nDCG 1 (its only relevant item first); row 1: nothing relevant;
    # row 2: relevancy 0.5 only -> no AP (no item with relevancy 1), nDCG defined (= 1)
    sim = np.array([[0.9, 0.1], [0.3, 0.2], [0.8, 0.7]], dtype=np.float32)
    rel = np.array([[1.0, 0.0], [0.0, 0.0], [0.5, 0.0]], dtype=np.float32)
    assert mir(sim, rel) == {"mAP": 100.0, "nDCG": 100.0}           # skip: undefined rows left out
    zero = mir(sim, rel, empty="zero")
    assert zero["mAP"] == pytest.approx(100 / 3) and zero["nDCG"] == pytest.approx(200 / 3)
    with pytest.raises(ValueError, match="relevancy"):
        mir(sim, rel, empty="error")
    none = mir(sim, np.zeros_like(rel))
    assert none == {"mAP": 0.0, "nDCG": 0.0}
    assert not any(math.isnan(v) for v in none.values())


@pytest.mark.parametrize("shape", [(40, 30), (7, 1), (1, 50), (64, 64)])
def test_matches_official_code_without_ties(shape):
    rng = np.random.default_rng(sum(shape))
    q, g = shape
    sim = rng.standard_normal(shape).astype(np.float32)
    rel = epic_like(rng, q, g)
    rel[np.arange(q), rng.integers(0, g, q)] = 1.0  # every query defined, as in EPIC
    out = mir(sim, rel)
    assert out["mAP"] / 100 == pytest.approx(official_map(sim, rel), abs=1e-6)
    assert out["nDCG"] / 100 == pytest.approx(official_ndcg(sim, rel), abs=1e-6)
    both = mir(sim, rel, directions="both")
    cols_defined = (rel == 1).any(0).all()
    if cols_defined:
        assert both["mAP_cols"] / 100 == pytest.approx(official_map(sim.T, rel.T), abs=1e-6)
    assert both["nDCG_rows"] == out["nDCG"]
    assert both["mAP"] == pytest.approx((both["mAP_rows"] + both["mAP_cols"]) / 2)


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic"])
@pytest.mark.parametrize("levels", [2, 3, 50])
def test_matches_loop_definition_with_ties(ties, levels):
    rng = np.random.default_rng(levels)
    q, g = 25, 13
    sim = (rng.integers(0, levels, (q, g)) / levels).astype(np.float32)
    rel = epic_like(rng, q, g, n_verbs=3, n_nouns=4)
    rel[0] = 0.0                                  # an empty query
    aps, nds = ref_bounds(sim, rel, ties)
    out = mir(sim, rel, ties=ties)
    assert out["mAP"] == pytest.approx(_mean_pct(aps), abs=1e-9)
    assert out["nDCG"] == pytest.approx(_mean_pct(nds), abs=1e-9)


@pytest.mark.parametrize("optimistic", [False, True])
def test_fast_and_exact_paths_agree(optimistic):
    rng = np.random.default_rng(7)
    sim = (rng.integers(-4, 5, (30, 17)) / 4).astype(np.float32)
    sim[3] = 0.0
    sim[4, :5] = -0.0                              # -0.0 and +0.0 are the same score
    rel = epic_like(rng, 30, 17, 3, 3)
    rel[5] = 0.0
    a = _block_packed(sim, rel + np.float32(0), optimistic)
    b = _block_exact(sim.astype(np.float64), rel.astype(np.float64), optimistic)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-12)


def test_float64_and_torch_inputs():
    rng = np.random.default_rng(8)
    sim = rng.standard_normal((20, 15))              # float64 that float32 would round
    rel = epic_like(rng, 20, 15).astype(np.float64)
    rel[np.arange(15), np.arange(15)] = 1.0
    rel[15:, 0] = 1.0
    want = {"mAP": 100 * official_map(sim, rel), "nDCG": 100 * official_ndcg(sim, rel)}
    assert mir(sim, rel) == pytest.approx(want, abs=1e-9)
    assert mir(torch.from_numpy(sim), torch.from_numpy(rel)) == pytest.approx(want, abs=1e-9)
    s16 = sim.astype(np.float16)
    aps, nds = ref_bounds(s16.astype(np.float64), rel, "pessimistic")
    got = mir(torch.from_numpy(s16), rel.astype(np.float32))
    assert got["mAP"] == pytest.approx(100 * np.mean(aps), abs=1e-9)
    assert got["nDCG"] == pytest.approx(100 * np.mean(nds), abs=1e-9)


@pytest.mark.parametrize("block_size", [1, 4, 500])
def test_block_size_does_not_matter(block_size):
    rng = np.random.default_rng(9)
    sim = (rng.integers(0, 4, (21, 11)) / 4).astype(np.float32)
    rel = epic_like(rng, 21, 11, 3, 3)
    assert mir(sim, rel, block_size=block_size) == pytest.approx(mir(sim, rel), abs=1e-12)


def test_errors():
    sim = np.zeros((2, 3), dtype=np.float32)
    with pytest.raises(ValueError, match="relevancy"):
        mir(sim, np.zeros((3, 2)))
    with pytest.raises(ValueError, match="relevancy"):
        mir(sim, -np.ones((2, 3)))
    with pytest.raises(ValueError, match="relevancy"):
        mir(sim, np.full((2, 3), np.nan))
    with pytest.raises(ValueError, match="sim"):
        mir(np.full((2, 3), np.inf), np.ones((2, 3)))
    with pytest.raises(ValueError, match="ties"):
        mir(sim, np.ones((2, 3)), ties="average")
    with pytest.raises(ValueError, match="empty"):
        mir(sim, np.ones((2, 3)), empty="nan")


def test_does_not_mutate_inputs():
    rng = np.random.default_rng(10)
    sim = rng.standard_normal((5, 6)).astype(np.float32)
    rel = epic_like(rng, 5, 6)
    s0, r0 = sim.copy(), rel.copy()
    mir(sim, rel, directions="both")
    assert np.array_equal(sim, s0) and np.array_equal(rel, r0)


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_gallery_permutation_invariance(data):
    q = data.draw(st.integers(1, 5))
    g = data.draw(st.integers(1, 7))
    sim = np.array(data.draw(st.lists(st.lists(st.integers(0, 2), min_size=g, max_size=g),
                                      min_size=q, max_size=q)), dtype=np.float32).reshape(q, g)
    rel = np.array(data.draw(st.lists(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]),
                                               min_size=g, max_size=g), min_size=q, max_size=q)),
                   dtype=np.float32).reshape(q, g)
    perm = np.array(data.draw(st.permutations(range(g))), dtype=int)
    ties = data.draw(st.sampled_from(["pessimistic", "optimistic"]))
    a = mir(sim, rel, ties=ties)
    b = mir(sim[:, perm], rel[:, perm], ties=ties)
    assert a == pytest.approx(b, abs=1e-9)
    aps, nds = ref_bounds(sim, rel, ties)
    assert a["mAP"] == pytest.approx(_mean_pct(aps), abs=1e-9)


def _ulp_neighbours(rng, q, g):
    """Scores one float32 step apart (keys that differ only in their lowest bit)."""
    base = np.float32(rng.standard_normal())
    away = np.where(rng.random((q, g)) < 0.5, np.float32(-10), np.float32(10))
    sim = np.nextafter(np.full((q, g), base, np.float32), away.astype(np.float32))
    sim[:, ::3] = base
    return sim


@pytest.mark.parametrize("optimistic", [False, True])
def test_sparse_path_matches_exact_path(optimistic):
    # the 32-bit-key path (rank of relevant items only) against the full lexsort, on
    # ties, -0.0, 1-ulp neighbours (collisions counted exactly), empty rows, sub-blocks
    from xmodal.metrics.multi_instance import _block_sparse

    rng = np.random.default_rng(11)
    for it in range(60):
        q, g = int(rng.integers(1, 25)), int(rng.integers(1, 30))
        if it % 3 == 0:
            sim = rng.standard_normal((q, g)).astype(np.float32)
        elif it % 3 == 1:
            sim = (rng.integers(-3, 4, (q, g)) / 3).astype(np.float32)
            sim[:, : min(g, 3)] = -0.0
        else:
            sim = _ulp_neighbours(rng, q, g)
        rel = rng.choice(np.array([0, 0, 0, 0.25, 0.5, 0.9, 1], np.float32), (q, g))
        rel[rng.random(q) < 0.2] = 0.0
        got = _block_sparse(sim, rel, optimistic, sub_elems=int(rng.integers(1, 100)),
                            max_collisions=10 ** 9)
        want = _block_exact(sim.astype(np.float64), rel.astype(np.float64), optimistic)
        for x, y in zip(got, want):
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-9)


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic"])
def test_many_collisions_fall_back(ties):
    # more 1-ulp collisions than rows: the block takes the 64-bit path, same values
    from xmodal.metrics.multi_instance import _block_sparse

    rng = np.random.default_rng(12)
    sim = _ulp_neighbours(rng, 10, 40)
    rel = epic_like(rng, 10, 40, 3, 3)
    assert _block_sparse(sim, rel, ties == "optimistic") is None
    aps, nds = ref_bounds(sim, rel, ties)
    out = mir(sim, rel, ties=ties)
    assert out["mAP"] == pytest.approx(_mean_pct(aps), abs=1e-9)
    assert out["nDCG"] == pytest.approx(_mean_pct(nds), abs=1e-9)
