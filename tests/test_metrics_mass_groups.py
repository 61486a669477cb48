"""Retrieval mass / FN-FP by mass (NCL Sec. 3.2, Fig. 3) and per-group breakdowns,
against naive loops written here."""
import doctest
from pathlib import Path

import numpy as np
import pytest
import torch

import xmodal.metrics as M
from xmodal.metrics import groups as groups_mod
from xmodal.metrics import mass as mass_mod

EPIC = Path(__file__).resolve().parents[2] / "shared" / "data" / "epic100"


def _naive_mass(sim, tau):
    q, g = sim.shape
    out = np.zeros(g)
    for i in range(q):
        e = [np.exp(sim[i, j] / tau) for j in range(g)]
        z = sum(e)
        for j in range(g):
            out[j] += e[j] / z
    return out


def _naive_counts(sim, pos, k):
    q, g = sim.shape
    npos, fn, nret, fp = (np.zeros(g, int) for _ in range(4))
    for i in range(q):
        for j in range(g):
            rank = sum(1 for l in range(g) if sim[i, l] >= sim[i, j])  # pessimistic
            top = rank <= k
            npos[j] += pos[i, j]
            fn[j] += pos[i, j] and not top
            nret[j] += top
            fp[j] += top and not pos[i, j]
    return npos, fn, nret, fp


@pytest.mark.parametrize("seed,q,g,k", [(0, 12, 7, 1), (1, 9, 9, 3), (2, 5, 11, 2)])
def test_mass_and_counts_match_naive(seed, q, g, k):
    rng = np.random.default_rng(seed)
    sim = np.round(rng.normal(size=(q, g)), 1)          # rounding makes ties
    pos = np.zeros((q, g), bool)
    pos[np.arange(q), rng.integers(0, g, q)] = True
    pos |= rng.random((q, g)) < 0.1
    tau = 0.3
    np.testing.assert_allclose(M.retrieval_mass(sim, tau), _naive_mass(sim, tau), rtol=1e-10)
    assert M.retrieval_mass(torch.tensor(sim, dtype=torch.float32), tau).sum() == pytest.approx(q, rel=1e-5)
    c = M.item_error_counts(sim, pos, k)
    for got, want in zip((c["num_positive_pairs"], c["false_negatives"], c["num_retrieved"],
                          c["false_positives"]), _naive_counts(sim, pos, k)):
        np.testing.assert_array_equal(got, want)


def test_fn_fp_by_mass_bins_match_naive():
    rng = np.random.default_rng(3)
    q = g = 40
    sim = rng.normal(size=(q, g)) + 2 * np.eye(g)
    sim[:, :5] += 1.0                                     # hubs
    t2v = np.arange(q)
    tau = 0.5
    edges = [0.0, 0.5, 1.0, 2.0, 100.0]
    r = M.fn_fp_by_mass(sim, t2v, tau, bins=edges)
    mass = _naive_mass(sim, tau)
    pos = np.eye(q, dtype=bool)
    npos, fn, nret, fp = _naive_counts(sim, pos, 1)
    for b in range(4):
        lo, hi = edges[b], edges[b + 1]
        items = [j for j in range(g) if lo <= mass[j] < hi or (b == 3 and mass[j] == hi)]
        assert r["num_items"][b] == len(items)
        if items:
            assert r["mean_mass"][b] == pytest.approx(np.mean(mass[items]))
        n, f = sum(npos[items]), sum(fn[items])
        assert r["fn_rate"][b] == (pytest.approx(100 * f / n) if n else None)
        n, f = sum(nret[items]), sum(fp[items])
        assert r["fp_rate"][b] == (pytest.approx(100 * f / n) if n else None)
    assert r["expected_mass"] == 1.0
    # quantile bins: every item in exactly one bin, roughly equal counts
    rq = M.fn_fp_by_mass(sim, t2v, tau, bins=4)
    assert sum(rq["num_items"]) == g and min(rq["num_items"]) >= 9
    # NCL Fig. 3's claim on this hubby gallery: high-mass items have more false positives
    assert rq["fp_rate"][-1] > (rq["fp_rate"][0] or 0.0)


def test_mass_bad_input():
    with pytest.raises(ValueError, match="temperature"):
        M.retrieval_mass(np.zeros((2, 2)), 0.0)
    with pytest.raises(ValueError, match="k"):
        M.fn_fp_by_mass(np.zeros((2, 2)), np.array([0, 1]), 1.0, k=0)
    with pytest.raises(ValueError, match="bins"):
        M.fn_fp_by_mass(np.zeros((2, 2)), np.array([0, 1]), 1.0, bins=[1.0, 0.5])
    with pytest.raises(ValueError, match="positives"):
        M.fn_fp_by_mass(np.zeros((2, 2)), np.array([0, 5]), 1.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_retrieval_by_group_matches_subsets(seed):
    rng = np.random.default_rng(seed)
    q, g = 30, 12
    sim = np.round(rng.normal(size=(q, g)), 1)
    pos = rng.integers(0, g, q)
    labels = rng.choice(["head", "tail", "mid"], q)
    out = M.retrieval_by_group(sim, pos, labels, ks=(1, 5))
    assert sorted(out) == sorted(set(labels))
    for lab, res in out.items():
        rows = np.flatnonzero(labels == lab)
        ranks = [sum(1 for j in range(g) if sim[i, j] >= sim[i, pos[i]]) for i in rows]
        assert res["num_queries"] == len(rows)
        assert res["R@1"] == pytest.approx(100 * np.mean(np.array(ranks) <= 1))
        assert res["R@5"] == pytest.approx(100 * np.mean(np.array(ranks) <= 5))
        assert res["MdR"] == pytest.approx(np.median(ranks))
        assert res["MnR"] == pytest.approx(np.mean(ranks))
    ints = M.retrieval_by_group(sim, pos, rng.integers(0, 3, q), ks=(1,))
    assert all(isinstance(k, int) for k in ints)


def _naive_ap_ndcg(s, r):
    order = sorted(range(len(s)), key=lambda j: (-s[j], r[j]))   # pessimistic ties
    rel = [r[j] for j in order]
    hits = [k for k in range(len(rel)) if rel[k] == 1]
    ap = np.mean([sum(rel[:k + 1]) / (k + 1) for k in hits]) if hits else None
    kq = sum(1 for x in rel if x > 0)
    dcg = sum(rel[k] / np.log2(k + 2) for k in range(kq))
    ideal = sorted(r, reverse=True)
    idcg = sum(ideal[k] / np.log2(k + 2) for k in range(kq))
    return ap, (dcg / idcg if idcg > 0 else None)


def test_mir_by_group_matches_naive():
    rng = np.random.default_rng(5)
    q, g = 16, 10
    sim = rng.normal(size=(q, g))
    rel = rng.choice([0.0, 0.5, 1.0], size=(q, g), p=[0.6, 0.2, 0.2])
    rel[np.arange(q), rng.integers(0, g, q)] = 1.0
    groups = rng.integers(0, 2, q)
    out = M.mir_by_group(sim, rel, groups)
    for lab in (0, 1):
        rows = np.flatnonzero(groups == lab)
        vals = [_naive_ap_ndcg(sim[i], rel[i]) for i in rows]
        assert out[lab]["mAP"] == pytest.approx(100 * np.mean([v[0] for v in vals]))
        assert out[lab]["nDCG"] == pytest.approx(100 * np.mean([v[1] for v in vals]))
        assert out[lab]["num_queries"] == len(rows)


def test_head_tail_groups():
    ids = np.array([0] * 50 + [1] * 30 + [2] * 10 + [3] * 6 + [4] * 4)
    # head = most frequent classes covering >= 80 %: 0 and 1 hold exactly 80
    g = M.head_tail_groups(ids, head_mass=0.8)
    assert (g[ids <= 1] == "head").all() and (g[ids >= 2] == "tail").all()
    g = M.head_tail_groups(ids, head_mass=0.81)
    assert (g[ids <= 2] == "head").all() and (g[ids >= 3] == "tail").all()
    # counts from training, applied to other samples; unseen / -1 ids are tail
    g = M.head_tail_groups(np.array([3, 0, -1]), class_counts=np.array([1, 1, 1, 97]), head_mass=0.5)
    assert g.tolist() == ["head", "tail", "tail"]
    g = M.head_tail_groups(np.array([3, 0, 2]), tail_classes={0, 2})
    assert g.tolist() == ["head", "tail", "tail"]
    with pytest.raises(ValueError, match="head_mass"):
        M.head_tail_groups(ids, head_mass=0)
    with pytest.raises(TypeError, match="class_ids"):
        M.head_tail_groups(np.array([0.5]))


@pytest.mark.skipif(not EPIC.is_dir(), reason="../shared/data/epic100 absent (real EPIC-100 annotations)")
def test_epic_tail_lists():
    verbs, nouns = M.epic_tail_classes(EPIC, "verb"), M.epic_tail_classes(EPIC, "noun")
    assert len(verbs) == 86 and len(nouns) == 228
    assert max(verbs) < 97 and max(nouns) < 300
    with pytest.raises(ValueError, match="kind"):
        M.epic_tail_classes(EPIC, "action")


@pytest.mark.parametrize("mod", [mass_mod, groups_mod])
def test_docstring_examples(mod):
    assert doctest.testmod(mod).failed == 0
