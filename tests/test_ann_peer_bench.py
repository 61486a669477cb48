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
