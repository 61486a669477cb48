"""Paired tests (xmodal.metrics.paired): against scipy.stats.bootstrap / permutation_test, analytic
cases, uniform p-values under a true null, ~95% coverage; per-query ranks against naive loops."""

from __future__ import annotations

import doctest
import itertools

import numpy as np
import pytest
import torch
from scipy import stats

from xmodal.metrics import (holm, mir, mir_per_query, paired_strata_test, paired_test, query_ranks, retrieval,
                            text_video, text_video_ranks)


def test_doctests_of_the_comparison_modules():
    import xmodal.metrics.paired
    import xmodal.metrics.ranking
    import xmodal.retrieval.evaluate
    import xmodal.retrieval.perquery

    for mod in (xmodal.metrics.paired, xmodal.metrics.ranking, xmodal.retrieval.evaluate, xmodal.retrieval.perquery):
        assert doctest.testmod(mod).failed == 0, mod.__name__


# ----------------------------------------------------------------------------- per-query values


def _naive_ranks(sim: np.ndarray, positives: np.ndarray) -> np.ndarray:
    """Pessimistic rank of the best-ranked positive, by explicit loops."""
    out = []
    for q in range(sim.shape[0]):
        pos = [j for j in range(sim.shape[1]) if positives[q, j]]
        best = max(sim[q, j] for j in pos)
        out.append(sum(1 for j in range(sim.shape[1]) if sim[q, j] > best)
                   + sum(1 for j in range(sim.shape[1]) if sim[q, j] == best and not positives[q, j]) + 1)
    return np.array(out)


@pytest.mark.parametrize("seed", [0, 1])
def test_query_ranks_match_a_naive_loop_and_reproduce_the_metrics(seed):
    g = np.random.default_rng(seed)
    sim = g.integers(0, 5, size=(30, 12)).astype(np.float32)  # many ties
    t2v = np.concatenate([np.arange(12), g.integers(0, 12, 18)])
    own = t2v[:, None] == np.arange(12)[None, :]
    ranks = query_ranks(sim, t2v)
    assert ranks.tolist() == _naive_ranks(sim, own).tolist()
    m = retrieval(sim, t2v, ks=(1, 5, 10))
    for k in (1, 5, 10):
        assert 100 * np.mean(ranks <= k) == pytest.approx(m[f"R@{k}"])
    assert np.mean(ranks) == pytest.approx(m["MnR"]) and np.median(ranks) == m["MdR"]
    both = text_video_ranks(sim, t2v)
    assert both["t2v"].tolist() == ranks.tolist()
    assert both["v2t"].tolist() == _naive_ranks(sim.T, own.T).tolist()
    tv = text_video(sim, t2v, ks=(1, 10))
    assert 100 * np.mean(both["v2t"] <= 10) == pytest.approx(tv["v2t"]["R@10"])
    opt = query_ranks(sim, t2v, ties="optimistic")
    assert (opt <= ranks).all()
    assert 100 * np.mean(opt <= 1) == pytest.approx(retrieval(sim, t2v, ties="optimistic")["R@1"])


def test_mir_per_query_means_are_mir():
    g = np.random.default_rng(3)
    sim = g.normal(size=(20, 15)).astype(np.float32)
    rel = np.round(g.uniform(size=(20, 15)) * 2) / 2 * (g.uniform(size=(20, 15)) < 0.4)
    rel[0] = 0  # a query without relevant items: NaN, skipped as mir's empty="skip"
    per = mir_per_query(sim, rel)
    assert np.isnan(per["ap"][0]) and np.isnan(per["ndcg"][0])
    m = mir(sim, rel)
    assert np.nanmean(per["ap"]) == pytest.approx(m["mAP"]) and np.nanmean(per["ndcg"]) == pytest.approx(m["nDCG"])


# ----------------------------------------------------------------------------- the tests


def test_identical_results_give_zero_with_an_interval_containing_zero():
    ranks = np.random.default_rng(0).integers(1, 300, 1000)
    for metric in ("R@1", "R@5", "R@10", "MdR", "MnR"):
        r = paired_test(ranks, ranks.copy(), metric=metric, n_boot=500)
        assert r["diff"] == 0 and r["ci_low"] <= 0 <= r["ci_high"] and r["p_value"] == 1.0, metric
    seeds = [ranks, np.roll(ranks, 1), np.roll(ranks, 2)]
    r = paired_test(seeds, [s.copy() for s in seeds], metric="R@10", n_boot=500)
    assert r["diff"] == 0 and r["ci_low"] <= 0 <= r["ci_high"]


def test_a_planted_shift_is_found_with_its_sign_and_covered():
    g = np.random.default_rng(1)
    n = 4000
    a = g.normal(50, 20, n)
    b = a + 2.0 + g.normal(0, 5, n)  # mAP-like per-query values, B better by 2 points
    r = paired_test(a, b, metric="mAP", n_boot=2000)
    assert r["diff"] > 0 and r["ci_low"] < 2.0 < r["ci_high"] and r["ci_low"] > 0 and r["p_value"] < 0.001
    r = paired_test(b, a, metric="mAP", n_boot=2000)
    assert r["diff"] < 0 and r["ci_high"] < 0
    # ranks: B's queries 3 places better -> MnR -3 (lower is better)
    ra = g.integers(5, 200, n)
    r = paired_test(ra, ra - 3, metric="MnR", n_boot=2000)
    assert r["diff"] == pytest.approx(-3.0) and r["ci_high"] < 0 and r["lower_is_better"]
    # R@1: 5 % of the queries move from rank 2 to rank 1
    ra = np.full(n, 2)
    rb = ra.copy()
    rb[: n // 20] = 1
    r = paired_test(ra, rb, metric="R@1", n_boot=2000)
    assert r["diff"] == pytest.approx(5.0) and r["ci_low"] > 0 and r["p_value"] < 0.001


def test_under_a_true_null_the_p_values_are_uniform():
    """Kolmogorov-Smirnov over 200 synthetic nulls: each query's two values are exchangeable."""
    g = np.random.default_rng(2)
    ps = []
    for _ in range(200):
        pairs = g.integers(1, 2000, size=(2, 300))  # near-continuous mean rank: p-values near-continuous
        ps.append(paired_test(pairs[0], pairs[1], metric="MnR", n_boot=100, n_perm=2000, seed=int(g.integers(1e6)))
                  ["p_value"])
    ps = np.asarray(ps)
    assert stats.kstest(ps, "uniform").pvalue > 0.01
    assert 0.01 <= np.mean(ps < 0.05) <= 0.10  # the nominal 5 % level holds


def test_the_bootstrap_interval_covers_the_true_difference_about_95_percent():
    """200 replications of 500 queries from a known joint law of (R@1 hit of A, hit of B)."""
    g = np.random.default_rng(4)
    law = np.array([0.55, 0.10, 0.15, 0.20])  # P(a=0,b=0), P(1,0), P(0,1), P(1,1)
    true = 100 * (law[2] - law[1])  # +5 R@1 points
    covered = 0
    for _ in range(200):
        cell = g.choice(4, size=500, p=law)
        ra = np.where(np.isin(cell, (1, 3)), 1, 2)
        rb = np.where(np.isin(cell, (2, 3)), 1, 2)
        r = paired_test(ra, rb, metric="R@1", n_boot=1000, seed=int(g.integers(1e6)))
        covered += r["ci_low"] <= true <= r["ci_high"]
    assert 0.90 <= covered / 200 <= 0.99


def test_matches_scipy_bootstrap_and_permutation_test_on_a_small_case():
    g = np.random.default_rng(5)
    a = g.normal(0, 1, 12)
    b = a + g.normal(0.4, 1, 12)
    mine = paired_test(a, b, metric="mAP", n_boot=40000)
    stat = lambda x, y, axis=-1: y.mean(axis) - x.mean(axis)  # noqa: E731
    ref = stats.bootstrap((a, b), stat, paired=True, method="percentile", n_resamples=40000, random_state=0)
    width = mine["ci_high"] - mine["ci_low"]
    assert mine["ci_low"] == pytest.approx(ref.confidence_interval.low, abs=0.03 * width)
    assert mine["ci_high"] == pytest.approx(ref.confidence_interval.high, abs=0.03 * width)
    perm = stats.permutation_test((a, b), stat, permutation_type="samples", n_resamples=10000)
    assert mine["exact"] and mine["p_value"] == pytest.approx(perm.pvalue, abs=1e-12)  # both enumerate 2^12
    # a larger case: both Monte-Carlo, within their sampling error
    a, b = g.normal(0, 1, 60), g.normal(0.3, 1, 60)
    mine = paired_test(a, b, metric="mAP", n_boot=1000, n_perm=20000)
    perm = stats.permutation_test((a, b), stat, permutation_type="samples", n_resamples=20000, random_state=1)
    assert not mine["exact"] and mine["p_value"] == pytest.approx(perm.pvalue, abs=0.01)


def test_the_median_rank_swap_test_against_a_naive_enumeration():
    a = np.array([3, 8, 1, 6, 9, 2, 7])
    b = np.array([2, 4, 1, 5, 3, 2, 6])
    r = paired_test(a, b, metric="MdR")
    observed = np.median(b) - np.median(a)
    hits, total = 0, 0
    for swap in itertools.product([False, True], repeat=7):
        s = np.array(swap)
        aa, bb = np.where(s, b, a), np.where(s, a, b)
        hits += abs(np.median(bb) - np.median(aa)) >= abs(observed) - 1e-12
        total += 1
    assert r["diff"] == observed and r["p_value"] == pytest.approx(hits / total)


def test_seeds_are_clusters_and_the_run_labels_give_their_own_p_value():
    g = np.random.default_rng(6)
    base = g.integers(1, 50, 2000)
    a = [np.maximum(1, base + g.integers(-3, 4, 2000) + s) for s in (0, 2, 4)]  # seed effects shift whole runs
    b = [np.maximum(1, base + g.integers(-3, 4, 2000) + s) for s in (1, 3, 5)]
    many = paired_test(a, b, metric="MnR", n_boot=2000)
    one = paired_test(a[0], b[0], metric="MnR", n_boot=2000)
    assert many["seeds_a"] == many["seeds_b"] == 3
    assert (many["ci_high"] - many["ci_low"]) > 2 * (one["ci_high"] - one["ci_low"])  # the seed spread counts
    assert many["diff"] == pytest.approx(np.mean([x.mean() for x in b]) - np.mean([x.mean() for x in a]))
    # run labels: C(6, 3) = 20 splits; the observed one and its mirror are the extremes only if separated
    sep = paired_test([np.full(10, 5)] * 3, [np.full(10, 1)] * 3, metric="MnR", n_boot=200)
    assert sep["p_value_seeds"] == pytest.approx(0.1) and sep["p_value_seeds_min"] == pytest.approx(0.1)
    assert "p_value_seeds" not in one


def test_strata_test_is_the_sum_of_its_parts():
    g = np.random.default_rng(7)
    a1, b1 = g.integers(0, 2, 400) * 100.0, g.integers(0, 2, 400) * 100.0
    a2, b2 = g.integers(0, 2, 100) * 100.0, g.integers(0, 2, 100) * 100.0
    t = paired_strata_test([(a1, b1, 0.5), (a2, b2, 0.5)], n_boot=4000)
    assert t["diff"] == pytest.approx(0.5 * (b1 - a1).mean() + 0.5 * (b2 - a2).mean())
    one = paired_strata_test([(a1, b1, 1.0)], n_boot=4000, n_perm=20000)
    ref = stats.bootstrap((a1, b1), lambda x, y, axis=-1: y.mean(axis) - x.mean(axis), paired=True,
                          method="percentile", n_resamples=4000, random_state=0).confidence_interval
    assert one["ci_low"] == pytest.approx(ref.low, abs=1.0) and one["ci_high"] == pytest.approx(ref.high, abs=1.0)
    exact = stats.binomtest(int(((b1 - a1) > 0).sum()), int(((b1 - a1) != 0).sum())).pvalue  # McNemar's exact test
    assert one["p_value"] == pytest.approx(exact, abs=0.01)


def test_holm_against_a_naive_loop():
    g = np.random.default_rng(8)
    p = g.uniform(0, 0.2, 9).tolist()
    order = sorted(range(9), key=lambda i: p[i])
    naive, running = [0.0] * 9, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (9 - rank) * p[i]))
        naive[i] = running
    assert holm(p) == pytest.approx(naive)


@pytest.mark.parametrize("bad, match", [
    (dict(a=np.array([1, 2]), b=np.array([1, 2, 3])), "same queries"),
    (dict(a=np.array([0, 2]), b=np.array([1, 2])), "1-based"),
    (dict(a=np.array([1, 2]), b=np.array([1, 2]), metric="R@0"), "metric"),
    (dict(a=[np.array([1, 2]), np.array([1])], b=np.array([1, 2])), "different numbers of queries"),
    (dict(a=np.array([1, 2]), b=np.array([1, 2]), n_boot=0), "n_boot"),
    (dict(a="x", b=np.array([1, 2])), "a:"),
])
def test_bad_input_is_one_line_naming_the_argument(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        paired_test(**bad)


def test_query_results_reproduce_retrieval_metrics_with_directional_scores():
    from xmodal.retrieval.evaluate import query_results, retrieval_metrics

    g = torch.Generator().manual_seed(0)
    t2v = np.array([0, 0, 1, 2, 2, 3])
    s1, s2 = torch.randn(6, 4, generator=g), torch.randn(4, 6, generator=g)
    rel = (np.random.default_rng(0).uniform(size=(6, 4)) < 0.5).astype(np.float32)
    rel[np.arange(6), t2v] = 1
    for v2t in ("all-captions", "max-over-captions"):
        m = retrieval_metrics(s1, s2, t2v, rel, v2t=v2t)
        q = query_results(s1, s2, t2v, rel, v2t=v2t)
        for d in ("t2v", "v2t"):
            assert q[d]["rank"].dtype == np.int32
            assert 100 * np.mean(q[d]["rank"] <= 1) == pytest.approx(m[d]["R@1"])
            assert np.mean(q[d]["rank"]) == pytest.approx(m[d]["MnR"])
            assert np.nanmean(q[d]["ap"]) == pytest.approx(m[d]["mAP"], rel=1e-6)


@pytest.mark.parametrize("which", ["query_results", "retrieval_metrics"])
def test_directional_scores_with_a_scalar_map_are_one_line_errors(which):
    """Found by tests/test_fuzz_public.py: a 0-d sim_v2t / text_to_video raised IndexError."""
    import xmodal.retrieval.evaluate as ev

    f = getattr(ev, which)
    with pytest.raises((ValueError, TypeError), match="text_to_video"):
        f(torch.ones(3, 2), torch.ones(2, 3), torch.tensor(1))
    with pytest.raises(ValueError, match="sim_v2t"):
        f(torch.ones(3, 2), torch.tensor(1.0), np.array([0, 1, 1]))
