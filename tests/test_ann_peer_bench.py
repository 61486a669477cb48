"""bench/ann_peer.py's helpers: the budget parser and the vectors-compared count (issue 43)."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location("ann_peer", Path(__file__).resolve().parents[1] / "bench" / "ann_peer.py")
ann_peer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ann_peer)


@pytest.mark.parametrize("text, expected", [("16G", 16 * 1024 ** 3), ("22MB", 22 * 1024 ** 2), ("1.5K", 1536),
                                            ("4096B", 4096), ("4096", 4096), ("0.5gb", 512 * 1024 ** 2)])
def test_parse_size_reads_autofaiss_units(text, expected):
    # autofaiss.utils.cast.cast_memory_to_bytes: units of 1024, "B" optional after the unit
    assert ann_peer.parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "G", "12 parsecs", "-3M", "1e6"])
def test_parse_size_refuses_in_one_line(bad):
    with pytest.raises(ValueError, match="size: expected"):
        ann_peer.parse_size(bad)


def test_vectors_compared_equals_a_naive_count():
    rng = np.random.default_rng(0)
    sizes = rng.integers(0, 50, size=30)
    probed = rng.integers(-1, 30, size=(40, 5))
    naive = 0
    for row in probed:
        naive += 7 + 3 + sum(int(sizes[c]) for c in row if c >= 0)
    assert ann_peer.vectors_compared(probed, sizes, coarse=7, refine=3) == pytest.approx(naive / len(probed))


def test_compared_per_query_equals_faiss_own_counter():
    """The count read from an IVF index's probed lists equals FAISS's count of the codes it scanned."""
    faiss = pytest.importorskip("faiss")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3000, 16)).astype(np.float32)
    q = rng.standard_normal((50, 16)).astype(np.float32)
    index = faiss.index_factory(16, "IVF20,Flat", faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    index.add(x)
    faiss.extract_index_ivf(index).nprobe = 4
    faiss.omp_set_num_threads(1)
    faiss.cvar.indexIVF_stats.reset()
    index.search(q, 10)
    scanned = faiss.cvar.indexIVF_stats.ndis / len(q)
    assert ann_peer.compared_per_query(index, q) == pytest.approx(20 + scanned)


def test_budget_kind_fits_its_estimate():
    for n, d in ((50000, 128), (33000, 384), (500000, 128)):
        for _, budget in ann_peer.budgets(n, d):
            kind = ann_peer.kind_for_budget(budget, n, d)
            fits = ann_peer.estimated_bytes(kind, n, d, int(4 * np.sqrt(n))) <= budget
            assert fits or kind == ann_peer.FALLBACK_KINDS[-1]  # nothing fits: the smallest kind
    # at 500k x 128 each budget has its own kind (the centroids no longer dominate the compressed sizes)
    assert [ann_peer.kind_for_budget(b, 500000, 128) for _, b in ann_peer.budgets(500000, 128)] == \
        ["ivf", "ivfpqr", "ivfpq"]
    assert ann_peer.kind_for_budget(10 ** 12, 1000, 8) == "ivf"
    assert ann_peer.kind_for_budget(1, 1000, 8) == "ivfpq"


def test_equal_recall_nprobe_is_the_first_setting_reaching_the_target_on_a_real_ivf_index():
    faiss = pytest.importorskip("faiss")
    rng = np.random.default_rng(0)
    g = rng.standard_normal((4000, 16)).astype(np.float32)
    tune = rng.standard_normal((60, 16)).astype(np.float32)
    flat = faiss.IndexFlatIP(16)
    flat.add(g)
    exact = flat.search(tune, 10)[1]
    ivf = faiss.index_factory(16, "IVF64,Flat", faiss.METRIC_INNER_PRODUCT)
    ivf.train(g)
    ivf.add(g)

    def search(q, p):
        return ivf.search(q, 10, params=faiss.SearchParametersIVF(nprobe=p))[1]

    def recall(p):  # a naive count: true neighbours found, over all
        got = search(tune, p)
        return sum(len(set(a) & set(b)) for a, b in zip(got, exact)) / exact.size

    target = recall(12)
    p, r = ann_peer.equal_recall_nprobe(search, tune, exact, 2, 64, target)
    assert r == recall(p) >= target
    steps = [2]
    while steps[-1] < p:
        steps.append(min(64, max(steps[-1] + 1, int(steps[-1] * 1.25))))
    assert steps[-1] == p and all(recall(s) < target for s in steps[:-1])
    # unreachable: every cell, and says what it reached
    assert ann_peer.equal_recall_nprobe(search, tune, exact, 2, 64, 1.1) == (64, recall(64))
