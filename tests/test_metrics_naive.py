"""Independent naive reference implementations for the metrics tests (explicit loops).

Kept apart from the library on purpose: they sort explicit Python lists or enumerate
tie orders, never the count-against-the-correct-score trick the library uses.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np


def rank_lists(sim, positives):
    """Per query: (list of scores, set of correct indices) as Python objects."""
    sim = np.asarray(sim, dtype=np.float64)
    out = []
    for i in range(sim.shape[0]):
        row = [float(v) for v in sim[i]]
        p = np.asarray(positives[i])
        correct = {int(j) for j in np.flatnonzero(p)} if p.ndim == 1 else {int(p)}
        out.append((row, correct))
    return out


def first_correct_position(order, correct):
    for pos, j in enumerate(order, start=1):
        if j in correct:
            return pos
    raise AssertionError("no correct item")


def naive_rank(row, correct, ties):
    """Deterministic ranks by sorting; for "average" (expected rank, {K: P(rank<=K)})
    by enumerating every order of the items tied with the best correct score (small
    groups) or by the sequential draw probabilities (loops)."""
    g = len(row)
    if ties == "pessimistic":  # incorrect items first among equal scores
        order = sorted(range(g), key=lambda j: (-row[j], j in correct))
        return first_correct_position(order, correct)
    if ties == "optimistic":
        order = sorted(range(g), key=lambda j: (-row[j], j not in correct))
        return first_correct_position(order, correct)
    best = max(row[j] for j in correct)
    above = [j for j in range(g) if row[j] > best]
    group = [j for j in range(g) if row[j] == best]
    lo = len(above)
    if len(group) <= 6:
        dist = {}
        perms = list(itertools.permutations(group))
        for perm in perms:
            r = lo + first_correct_position(list(perm), correct)
            dist[r] = dist.get(r, 0) + Fraction(1, len(perms))
        return dist
    n = sum(1 for j in group if j not in correct)
    p = len(group) - n
    dist = {}
    miss = Fraction(1)
    for t in range(n + 1):  # first correct at group slot t + 1
        dist[lo + t + 1] = miss * Fraction(p, n + p - t)
        miss *= Fraction(n - t, n + p - t)
    return dist


def naive_retrieval(sim, positives, ks, ties):
    ranks = []
    hits = {k: [] for k in ks}
    for row, correct in rank_lists(sim, positives):
        r = naive_rank(row, correct, ties)
        if isinstance(r, dict):
            ranks.append(float(sum(k * v for k, v in r.items())))
            for k in ks:
                hits[k].append(float(sum(v for rr, v in r.items() if rr <= k)))
        else:
            ranks.append(float(r))
            for k in ks:
                hits[k].append(1.0 if r <= k else 0.0)
    out = {f"R@{k}": 100.0 * sum(hits[k]) / len(ranks) for k in ks}
    srt = sorted(ranks)
    mid = len(srt) // 2
    out["MdR"] = srt[mid] if len(srt) % 2 else (srt[mid - 1] + srt[mid]) / 2
    out["MnR"] = sum(ranks) / len(ranks)
    return out


def naive_text_video(sim_tv, t2v, ks, ties, v2t):
    sim_tv = np.asarray(sim_tv, dtype=np.float64)
    nt, nv = sim_tv.shape
    out = {"t2v": naive_retrieval(sim_tv, list(t2v), ks, ties)}
    if v2t == "all-captions":
        mask = np.zeros((nv, nt), dtype=bool)
        for t in range(nt):
            mask[t2v[t], t] = True
        out["v2t"] = naive_retrieval(sim_tv.T, mask, ks, ties)
    else:
        grouped = np.full((nv, nv), -np.inf)
        for v in range(nv):
            for t in range(nt):
                u = t2v[t]
                grouped[v, u] = max(grouped[v, u], sim_tv[t, v])
        out["v2t"] = naive_retrieval(grouped, list(range(nv)), ks, ties)
    return out


def official_map(sim, rel):
    """The EPIC-KITCHENS-100 official calculate_mAP, re-typed (argsort-based)."""
    order = np.argsort(-sim, axis=1)
    ranked = rel[np.arange(rel.shape[0])[:, None], order]
    cum = np.cumsum(ranked, axis=1)
    cum[ranked != 1] = 0
    div = np.arange(ranked.shape[1]) + 1
    n = np.sum(ranked == 1, axis=1)
    return np.mean(np.sum(cum / div, axis=1) / n)


def official_ndcg(sim, rel):
    """The EPIC-KITCHENS-100 official calculate_nDCG with per-query k_counts, re-typed."""
    k_counts = (np.sort(rel)[:, ::-1] > 0).astype(int)

    def dcg(s, r):
        x, y = s.shape
        ranks = np.argsort(s)[:, ::-1]
        div = np.log2(np.arange(y) + 2)[None, :]
        return np.sum(r[np.arange(x)[:, None], ranks] * k_counts / div, axis=1)

    return np.mean(dcg(sim, rel) / dcg(rel, rel))


def loop_mir(sim, rel, ties="pessimistic"):
    """mAP and nDCG per query from the written definitions with explicit loops.

    Ties: within equal scores, less relevant first (pessimistic) or more (optimistic).
    Returns per-query lists (None where undefined)."""
    sim = np.asarray(sim, dtype=np.float64)
    rel = np.asarray(rel, dtype=np.float64)
    aps, ndcgs = [], []
    for i in range(sim.shape[0]):
        g = sim.shape[1]
        sign = 1 if ties == "pessimistic" else -1
        order = sorted(range(g), key=lambda j: (-sim[i, j], sign * rel[i, j]))
        ranked = [rel[i, j] for j in order]
        total, hits, prec = 0.0, 0, 0.0
        for k, r in enumerate(ranked, start=1):
            total += r
            if r == 1:
                hits += 1
                prec += total / k
        aps.append(prec / hits if hits else None)
        kq = sum(1 for r in ranked if r > 0)
        dcg = sum(ranked[k - 1] / math.log2(k + 1) for k in range(1, kq + 1))
        ideal = sorted(ranked, reverse=True)
        idcg = sum(ideal[k - 1] / math.log2(k + 1) for k in range(1, kq + 1))
        ndcgs.append(dcg / idcg if idcg > 0 else None)
    return aps, ndcgs


# The reference implementations check themselves on cases worked out by hand.
def test_naive_rank_hand_cases():
    row = [0.5, 0.9, 0.5, 0.5]          # correct item 0 tied with items 2, 3; item 1 above
    assert naive_rank(row, {0}, "pessimistic") == 4
    assert naive_rank(row, {0}, "optimistic") == 2
    dist = naive_rank(row, {0}, "average")  # uniform over ranks 2, 3, 4
    assert dist == {2: Fraction(1, 3), 3: Fraction(1, 3), 4: Fraction(1, 3)}
    # two correct items among 4 tied: first correct at slot 1 w.p. 1/2, 2 w.p. 1/3, 3 w.p. 1/6
    dist = naive_rank([1.0] * 4, {0, 1}, "average")
    assert dist == {1: Fraction(1, 2), 2: Fraction(1, 3), 3: Fraction(1, 6)}


def test_naive_large_group_matches_enumeration():
    # the sequential-draw branch (groups > 6) agrees with enumeration on a 6-group
    row = [0.0] * 6
    enum = naive_rank(row, {1, 4}, "average")
    n, p = 4, 2
    seq, miss = {}, Fraction(1)
    for t in range(n + 1):
        seq[t + 1] = miss * Fraction(p, n + p - t)
        miss *= Fraction(n - t, n + p - t)
    assert enum == seq


def test_official_ndcg_example():
    # the example shipped with the official EPIC-KITCHENS-100 nDCG code (its self-test)
    sim = np.array([[1.0, 0.7, 0.4, 0.0], [0.3, 0.9, 0.6, 0.1], [0.2, 0.5, 0.8, 0.4]])
    rel = np.array([[1.0, 0.5, 0.25, 0.0], [0.0, 1.0, 0.4, 0.0], [0.5, 0.3, 1.0, 0.0]])
    assert abs(official_ndcg(sim, rel) - 0.9371789900735429) < 1e-12
    _, nd = loop_mir(sim, rel)
    assert abs(np.mean(nd) - 0.9371789900735429) < 1e-12
