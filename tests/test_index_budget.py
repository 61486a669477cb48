"""The bias column only when a bias is folded, old ``dim + 1`` files, the opq kind against FAISS's own
factory, and the memory budget (:mod:`xmodal.retrieval.budget`): never over, never worse for more."""

import numpy as np
import pytest

pytest.importorskip("faiss", reason="needs the [faiss] extra")

from xmodal.retrieval.budget import choose_index, parse_size, predicted_bytes  # noqa: E402
from xmodal.retrieval.index import BiasedIndex, _width, import_faiss  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """OPQ's training spins FAISS's OpenMP threads hundreds of times: one thread keeps it seconds on a
    shared machine (the answers do not depend on it)."""
    faiss = import_faiss()
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


def _data(n=1200, d=8, q=40, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((20, d))
    g = centres[rng.integers(0, 20, n)] + 0.6 * rng.standard_normal((n, d))
    g = (g / np.linalg.norm(g, axis=1, keepdims=True)).astype(np.float32)
    x = g[rng.integers(0, n, q)] + 0.3 * rng.standard_normal((q, d)).astype(np.float32)
    return g, x.astype(np.float32)


def _naive_topk(q, g, k, bias=None):
    """Explicit loops: each query's scores, best first (ties: the lower row)."""
    out = []
    for row in q:
        s = [float(np.dot(row.astype(np.float64), y.astype(np.float64))) + (0.0 if bias is None else float(bias[j]))
             for j, y in enumerate(g)]
        out.append(sorted(range(len(g)), key=lambda j: (-s[j], j))[:k])
    return np.array(out)


def test_unbiased_width_is_the_dim_and_scores_are_plain_inner_products():
    g, x = _data(n=400, d=16, q=8)
    for kind in ("flat", "ivf", "hnsw"):
        index = BiasedIndex(g, kind=kind, nlist=4 if kind == "ivf" else None, nprobe=4 if kind == "ivf" else None)
        assert index.width == 16 and index.index.d == 16 and not index.biased
    flat = BiasedIndex(g)
    scores, ids = flat.search(x, 5)
    np.testing.assert_array_equal(ids, _naive_topk(x, g, 5))
    np.testing.assert_allclose(scores, np.take_along_axis(x @ g.T, ids, 1), rtol=1e-5, atol=1e-6)
    b = np.linspace(-0.2, 0.2, 400).astype(np.float32)
    biased = BiasedIndex(g, b)
    assert biased.width == 17 and biased.biased
    np.testing.assert_array_equal(biased.search(x, 5)[1], _naive_topk(x, g, 5, b))
    assert _width(15, "ivfpq", False) == 16 and _width(15, "ivfpq", True) == 20 and _width(16, "opq", False) == 16


def test_an_old_file_with_a_zero_bias_column_still_loads_and_searches(tmp_path):
    faiss = import_faiss()
    g, x = _data(n=300, d=16, q=6)
    old = faiss.IndexFlatIP(17)  # what the previous code wrote for an unbiased gallery: [y, 0]
    old.add(np.hstack([g, np.zeros((300, 1), np.float32)]))
    faiss.write_index(old, str(tmp_path / "old.faiss"))
    loaded = BiasedIndex.load(tmp_path / "old.faiss", dim=16)
    assert loaded.biased and loaded.dim == 16 and loaded.width == 17
    np.testing.assert_array_equal(loaded.search(x, 7)[1], _naive_topk(x, g, 7))
    BiasedIndex(g).save(tmp_path / "new.faiss")
    new = BiasedIndex.load(tmp_path / "new.faiss", dim=16)
    assert not new.biased and new.width == 16
    np.testing.assert_array_equal(new.search(x, 7)[1], _naive_topk(x, g, 7))
    assert BiasedIndex.load(tmp_path / "new.faiss").dim == 16  # no dim: no bias column
    assert BiasedIndex.load(tmp_path / "old.faiss", biased=True).dim == 16
    with pytest.raises(ValueError, match="does not fit embeddings of size 12"):
        BiasedIndex.load(tmp_path / "new.faiss", dim=12)


def test_opq_searches_as_faiss_own_factory_of_the_same_string():
    faiss = import_faiss()
    g, x = _data()
    index = BiasedIndex(g, kind="opq", pq_m=4, nlist=16, nprobe=4)
    assert index.factory.startswith("OPQ4_8,IVF16,PQ4x") and index.width == 8
    ref = faiss.index_factory(8, index.factory, faiss.METRIC_INNER_PRODUCT)
    ivf = faiss.extract_index_ivf(ref)
    ivf.cp.niter, ivf.cp.seed = 10, 0
    pq = faiss.downcast_index(ivf).pq
    pq.cp.niter, pq.cp.seed = 10, 0
    ref.train(g)  # 1200 rows: fewer than the training sample, so the build trains on all of them, in order
    ref.add(g)
    ivf.nprobe = 4
    np.testing.assert_array_equal(index.search(x, 10)[1], ref.search(x, 10)[1])


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_rabitq_searches_as_faiss_own_factory_and_reloads_with_its_bits(bits, tmp_path):
    """``rabitq`` is FAISS's ``IVF{nlist},RaBitQ{b}`` trained on the same rows, with the queries quantised to
    ``RABITQ_QUERY_BITS`` bits; the file keeps the kind, the bits, the query bits and the answers."""
    from xmodal.retrieval.index import RABITQ_QUERY_BITS

    faiss = import_faiss()
    g, x = _data(n=3000, d=16)
    index = BiasedIndex(g, kind="rabitq", bits=bits, nlist=16, nprobe=4)
    assert index.factory == "IVF16,RaBitQ" + (str(bits) if bits > 1 else "") and index.width == 16
    ref = faiss.index_factory(16, index.factory, faiss.METRIC_INNER_PRODUCT)
    ivf = faiss.extract_index_ivf(ref)
    ivf.cp.niter, ivf.cp.seed = 10, 0
    ref.train(g)  # fewer rows than the training sample: all of them, in order
    ref.add(g)
    params = faiss.IVFRaBitQSearchParameters()
    params.nprobe, params.qb = 4, RABITQ_QUERY_BITS
    got = index.search(x, 10)
    np.testing.assert_array_equal(got[1], ref.search(x, 10, params=params)[1])
    index.save(tmp_path / "r.faiss")
    back = BiasedIndex.load(tmp_path / "r.faiss", dim=16)
    assert (back.kind, back.bits, back.search_params, back.biased) == ("rabitq", bits, {"nprobe": 4}, False)
    np.testing.assert_array_equal(back.search(x, 10)[1], got[1])
    with pytest.raises(ValueError, match="no search over it is exact"):
        back.search(x, 10, exact=True)


def test_rabitq_more_bits_more_recall_and_its_file_within_the_prediction(tmp_path):
    """Every cell probed, recall@10 (a naive count against naive exact search) grows with the bits; each
    written file is at most its predicted size and within 2% of it."""
    g, x = _data(n=4000, d=16, q=60, seed=3)
    exact = _naive_topk(x, g, 10)
    recalls = []
    for bits in (1, 2, 4, 8):
        index = BiasedIndex(g, kind="rabitq", bits=bits, nlist=32, nprobe=32)
        recalls.append(_recall(index.search(x, 10)[1], exact))
        index.save(tmp_path / "r.faiss")
        size, predicted = (tmp_path / "r.faiss").stat().st_size, predicted_bytes("rabitq", 4000, 16, 32, bits=bits)
        assert size <= predicted <= 1.02 * size + 4096
    assert recalls == sorted(recalls) and recalls[0] < 0.7 < 0.95 < recalls[-1]
    for bad in (0, 9):
        with pytest.raises(ValueError, match="bits"):
            BiasedIndex(g, kind="rabitq", bits=bad, nlist=8)
    with pytest.raises(ValueError, match="only the rabitq kind"):
        BiasedIndex(g, kind="ivfpq", bits=2, nlist=8)


def test_a_tight_budget_offers_a_code_over_fewer_cells_than_the_smallest_candidate():
    """Where a code's fewest candidate cells do not fit, the budget offers it over the most cells that do
    (down to MIN_NLIST_DIVISOR times fewer); the size grows with the cells, so one cell more would not fit."""
    from xmodal.retrieval.budget import MIN_NLIST_DIVISOR, candidates
    from xmodal.retrieval.index import nlist_candidates

    n, w = 33000, 384
    fewest = nlist_candidates(n)[0]
    two = predicted_bytes("rabitq", n, w, fewest, bits=2)
    budget = two - 40 * 4 * w  # 40 cells' centroids short
    extra = [c for c in candidates(n, w, False, budget=budget) if c["kind"] == "rabitq" and c["bits"] == 2
             and c["max_nlist"] < fewest]
    assert len(extra) == 1 and extra[0]["predicted_bytes"] <= budget
    cells = extra[0]["max_nlist"]
    assert cells >= fewest // MIN_NLIST_DIVISOR and predicted_bytes("rabitq", n, w, cells + 1, bits=2) > budget
    assert not [c for c in candidates(n, w, False) if c["max_nlist"] is not None and c["max_nlist"] < fewest]


def test_parse_size_and_one_line_errors():
    assert parse_size("22MB") == 22_000_000 and parse_size("1.5GB") == 1_500_000_000 and parse_size("1KiB") == 1024
    for bad in ("", "12 parsecs", "-3MB", "0"):
        with pytest.raises(ValueError, match="--max-memory"):
            parse_size(bad)


@pytest.fixture(scope="module")
def budgets():
    """One seeded gallery chosen at three budgets: just above the smallest opq, just above ivfpqr (all
    three compressed kinds fit) and above flat (the exact kinds)."""
    from xmodal.retrieval.budget import candidates

    g, x = _data()
    size = {(c["kind"], c["pq_m"]): c["predicted_bytes"] for c in candidates(len(g), g.shape[1], False)}
    out = {}
    for name, budget in (("opq", size[("opq", 4)] + 100), ("ivfpqr", size[("ivfpqr", None)] + 100),
                         ("flat", size[("flat", None)] + 100)):
        out[budget] = choose_index(g, max_bytes=budget, queries=x, next_up=name == "opq", seed=0)
    return g, x, out


def test_the_budget_is_never_exceeded_and_more_memory_is_never_worse(budgets, tmp_path):
    g, x, out = budgets
    recalls = []
    for frac, (index, record) in sorted(out.items()):
        index.save(tmp_path / "i.faiss")
        size = (tmp_path / "i.faiss").stat().st_size
        assert size <= record["max_bytes"] and size == record["chosen"]["bytes"]
        assert all(r["bytes"] <= record["max_bytes"] for r in record["measured"] if r["fits"])
        kept = max((r for r in record["measured"] if r["fits"]), key=lambda r: r["recall_at_10"])
        assert record["chosen"]["recall_at_10"] >= kept["recall_at_10"] - 0.005  # the best measured (ties: smaller)
        recalls.append(record["chosen"]["recall_at_10"])
    assert recalls == sorted(recalls)  # the candidate sets grow with the budget (module docstring)
    small, middle, large = (record for _, (_, record) in sorted(out.items()))
    assert large["chosen"]["kind"] == "flat" and large["chosen"]["recall_at_10"] == 1.0
    roomy = choose_index(g, max_bytes=10 ** 9, queries=x, next_up=False)[1]  # ivf and hnsw fit too
    assert [r["kind"] for r in roomy["measured"]] == ["flat"]  # exact and the smallest exact file: built alone
    assert small["chosen"]["kind"] in ("opq", "ivfpq", "rabitq")
    assert sorted(r["kind"] for r in middle["measured"]) == ["ivfpq", "ivfpqr", "opq", "rabitq"]  # the largest of each
    assert small["next_up"]["bytes"] > small["max_bytes"] and not small["next_up"]["fits"]


def test_a_budget_nothing_fits_names_the_smallest_size():
    g, x = _data()
    with pytest.raises(ValueError, match=r"--max-memory: .* is below the smallest index .* needs about"):
        choose_index(g, max_bytes=10_000, queries=x)
    assert predicted_bytes("flat", 1200, 8) > g.nbytes


def test_the_cli_keeps_the_choice_within_the_budget_and_says_so(tmp_path, capsys):
    import json

    from xmodal.cli import main
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    cfg = from_dict({
        "data": {"name": "synthetic", "synthetic": {"num_train": 300, "num_val": 60, "num_test": 60,
                                                     "num_concepts": 10}},
        "model": {"kind": "linear", "dim": 8},
        "loss": {"name": "infonce", "temperature": 0.05},
        "test_time": {"normalizers": ["none"], "bank_size": 100},
        "train": {"seed": 0, "epochs": 1, "batch_size": 32},
    })
    train(cfg, tmp_path / "run", resume=False, progress=False, verbose=False)
    np.save(tmp_path / "v.npy", np.random.default_rng(0).standard_normal((1200, 64)).astype(np.float32))
    flags = ["index", "--run", str(tmp_path / "run"), "--video-features", str(tmp_path / "v.npy"), "--threads", "1",
             "--normalizer", "none"]
    stale = tmp_path / ".idx.budget-killed"  # what a build killed while measuring candidates leaves
    stale.mkdir()
    (stale / "candidate.faiss").write_bytes(b"half")
    other = tmp_path / ".other.budget-x"  # another --out's scratch is not ours to remove
    other.mkdir()
    assert main([*flags, "--out", str(tmp_path / "idx"), "--max-memory", "25kB"]) == 0
    assert not stale.exists() and other.is_dir()
    assert not [p for p in tmp_path.iterdir() if ".budget" in p.name and p != other]
    out = capsys.readouterr().out
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    assert (tmp_path / "idx" / "index.faiss").stat().st_size <= 25_000 == meta["budget"]["max_bytes"]
    assert meta["kind"] == meta["budget"]["chosen"]["kind"] != "flat" and "budget 25.0 kB: chose" in out
    assert main([*flags, "--out", str(tmp_path / "none"), "--max-memory", "2kB"]) != 0
    err = capsys.readouterr().err
    assert "is below the smallest index" in err and "Traceback" not in err
    # --kind rabitq --bits B: FAISS's RaBitQ codes at B bits a value, the file says so when read back
    assert main([*flags, "--out", str(tmp_path / "rq"), "--kind", "rabitq", "--bits", "2", "--nlist", "8"]) == 0
    meta = json.loads((tmp_path / "rq" / "meta.json").read_text())
    assert meta["kind"] == "rabitq" and meta["factory"] == "IVF8,RaBitQ2" and 0 < meta["recall_at_10"] <= 1
    assert BiasedIndex.load(tmp_path / "rq" / "index.faiss", dim=meta["dim"]).bits == 2
    capsys.readouterr()
    for bad, says in ((["--kind", "ivf", "--bits", "2"], "--bits: only for --kind rabitq"),
                      (["--kind", "rabitq", "--bits", "9"], "--bits: must be in [1, 8]"),
                      (["--kind", "rabitq", "--bits", "2", "--max-memory", "1MB"], "--max-memory chooses")):
        assert main([*flags, "--out", str(tmp_path / "bad"), *bad]) != 0
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err


def test_a_tight_budget_bounds_the_cell_count_so_a_larger_code_fits():
    """The coarse centroids are in the file: where the largest code fits only with fewer cells, the build's
    cell-count choice is bounded (the 8% budget of the synthetic 50k bench chose 16-byte codes before this,
    24-byte codes after)."""
    from xmodal.retrieval.budget import _to_measure, candidates
    from xmodal.retrieval.index import nlist_candidates

    n, d = 50_000, 128
    cands = candidates(n, d, False, kinds=("opq",))
    caps = nlist_candidates(n)
    assert caps == [223, 447, 894]
    by = {(c["pq_m"], c["max_nlist"]): c["predicted_bytes"] for c in cands}
    # hand-computed from FAISS's layout (predicted_bytes' docstring): rotation d' x w, coarse, PQ, codes + ids
    w, m = 128, 24
    dp = 144
    for cap in caps:
        want = 4096 + 4 * dp * w + 4 * dp + 4 * dp * cap + 8 * cap + 4 * dp * 256 + n * (m + 8)
        assert by[(m, cap)] == want
    budget = 2_200_800  # 8% of the float32 size, as bench/ann_peer.py computes it
    assert by[(24, 894)] > budget >= by[(24, 447)]
    [chosen] = _to_measure(cands, budget)
    assert (chosen["pq_m"], chosen["max_nlist"]) == (24, 447)
    # a larger budget: the code first (32 bytes with the fewest cells beats 24 with the most), then cells
    [bigger] = _to_measure(cands, by[(24, 894)])
    assert by[(32, 223)] <= by[(24, 894)] < by[(32, 447)]
    assert (bigger["pq_m"], bigger["max_nlist"]) == (32, 223)


def test_max_nlist_bounds_the_measured_cell_count():
    g, x = _data(n=4000, d=8, q=40)
    free = BiasedIndex(g, kind="ivf", queries=x, seed=0)
    assert [r["nlist"] for r in free.nlist_choice] == [63, 102]  # min(f sqrt(N), N / 39)
    bounded = BiasedIndex(g, kind="ivf", queries=x, seed=0, max_nlist=80)
    assert [r["nlist"] for r in bounded.nlist_choice] == [63] and bounded.nlist == 63
    tiny = BiasedIndex(g, kind="ivf", queries=x, seed=0, max_nlist=10)
    assert tiny.nlist == 10 and [r["nlist"] for r in tiny.nlist_choice] == [10]
    given = BiasedIndex(g, kind="ivf", nlist=50, nprobe=4, max_nlist=10)  # a given cell count wins
    assert given.nlist == 50
    for bad, kind, match in ((0, "ivf", "max_nlist: "), (2.5, "ivf", "max_nlist: "), (10, "flat", "max_nlist: only")):
        with pytest.raises(ValueError, match=match):
            BiasedIndex(g, kind=kind, max_nlist=bad)


def test_the_next_budget_up_is_the_first_larger_candidate_that_measures_better(monkeypatch):
    """A larger file that measures no better is not what the next budget up buys: the line says so, and
    every candidate built over the budget is in the record."""
    import xmodal.retrieval.budget as budget

    g, x = _data(n=12000, d=16, q=40)
    fits = budget.candidates(12000, 16, False, kinds=("opq",))[0]["predicted_bytes"]  # the smallest opq
    record = choose_index(g, max_bytes=fits, queries=x, kinds=("opq",), seed=0)[1]
    over = record["over_budget"]
    assert over and all(not r["fits"] and r["bytes"] > fits for r in over)
    code = record["chosen"]["factory"].split(",")[0]  # OPQ{m}_{d'}: the same code over more cells is not tried
    assert [r["factory"].startswith(code + ",") for r in record["measured"] + over].count(True) == 1
    best = record["chosen"]["recall_at_10"]
    nxt = record["next_up"]
    if nxt is not None:  # the first larger candidate that measures better, and the last built
        assert nxt is over[-1] and nxt["recall_at_10"] > best + 0.005
        assert all(r["recall_at_10"] <= best + 0.005 for r in over[:-1])
        assert "the next budget up" in budget.budget_line(record)
    else:
        assert len(over) == budget.MAX_NEXT_BUILDS and all(r["recall_at_10"] <= best + 0.005 for r in over)
        assert "measure no higher recall@10" in budget.budget_line(record)
    # the line's wording when nothing built over the budget beats the choice, from a record
    worse = dict(record, next_up=None, over_budget=[dict(over[0], recall_at_10=0.0)])
    assert budget.budget_line(worse).endswith(
        f"; the 1 larger candidate built (up to {budget.format_size(over[0]['bytes'])}) measure no higher recall@10")


@pytest.mark.parametrize("kind, want", [("ivf", 40 * 8), ("ivfpq", 25_600), ("opq", 25_600)])
def test_compressed_kinds_ask_for_at_least_pq_train_rows(kind, want, monkeypatch):
    """The sub-quantisers train on 100 rows a centroid at least (``PQ_TRAIN_ROWS``), the cells on 40 a cell."""
    import xmodal.retrieval.recall as recall
    from xmodal.retrieval.index import PQ_TRAIN_ROWS

    assert PQ_TRAIN_ROWS == 100 * 256
    asked = []
    real = recall.sample_rows
    monkeypatch.setattr(recall, "sample_rows", lambda n, size, seed: asked.append(size) or real(n, size, seed))
    g, _ = _data(n=3000, d=16, q=4)
    BiasedIndex(g, kind=kind, nlist=8, nprobe=2)
    assert asked == [want]


def _recall(got, want):
    """Naive recall@10: the share of each query's exact top 10 returned, averaged."""
    return float(np.mean([len(set(a.tolist()) & set(b.tolist())) / len(b) for a, b in zip(got, want)]))


@pytest.mark.parametrize("kind, n", [("ivfpq", 12000), ("ivf", 4000), ("rabitq", 4000)])
def test_best_tuning_keeps_the_cheapest_setting_near_the_recall_the_index_can_reach(kind, n):
    """``target_recall="best"`` (a budget's default): the curve runs until the recall stops growing and
    the kept setting is within 0.005 of the best recall any setting reaches, counted here by a naive
    loop at every nprobe up to every cell."""
    from xmodal.retrieval.curve import dominating
    from xmodal.retrieval.index import BEST_TOLERANCE, RECALL_TOLERANCE

    g, x = _data(n=n, d=16, q=60, seed=1)
    exact = _naive_topk(x, g, 10)
    best = BiasedIndex(g, kind=kind, queries=x, seed=0, target_recall="best")
    assert best.tuned_to == "best" and best.target_met is None and best.target_recall == 0.95
    every = {p: _recall(best.search(x, 10, nprobe=p)[1], exact) for p in range(1, best.nlist + 1)}
    ceiling = max(every.values())
    (name, value), = best.search_params.items()
    assert name == "nprobe" and best.recall_at_10 == pytest.approx(every[value], abs=1e-9)
    assert best.recall_at_10 >= ceiling - 2 * RECALL_TOLERANCE
    top = max(r["recall_at_10"] for r in best.curve)
    kept = next(r for r in best.curve if r.get(name) == value)
    assert kept["recall_at_10"] >= top - BEST_TOLERANCE and dominating(kept, best.curve) is None
    # at a target it reaches, the kept setting is no larger: a target buys speed, "best" buys recall
    low = BiasedIndex(g, kind=kind, queries=x, seed=0, target_recall=0.5)
    assert low.tuned_to == "target" and low.target_met is True and low.search_params["nprobe"] <= value
    assert low.recall_at_10 <= best.recall_at_10 + 1e-9
    with pytest.raises(ValueError, match="target_recall"):
        BiasedIndex(g, kind=kind, queries=x, target_recall="most")


def test_the_budget_compares_candidates_at_their_best_not_at_a_target():
    """Without --target-recall each candidate is measured at the best recall it reaches, so a larger
    code that only ties at 0.95 can win on recall; with a target, the record says so."""
    g, x = _data(n=12000, d=16, q=60, seed=2)
    exact = _naive_topk(x, g, 10)
    from xmodal.retrieval.budget import candidates

    cands = candidates(12000, 16, False)
    budget = max(c["predicted_bytes"] for c in cands if c["kind"] == "opq") + 100
    pq_kinds = ("ivfpq", "ivfpqr", "opq")  # (rabitq's 1-bit codes, all that fit here, reach 0.41)
    index, record = choose_index(g, max_bytes=budget, queries=x, seed=0, next_up=False, kinds=pq_kinds)
    assert "within 0.001 of its best" in record["why"] and index.tuned_to == "best"
    ceiling = _recall(index.search(x, 10, nprobe=index.nlist)[1], exact) if index.nlist else 1.0
    assert record["chosen"]["recall_at_10"] >= ceiling - 0.01
    at = choose_index(g, max_bytes=budget, queries=x, seed=0, next_up=False, target_recall=0.5, kinds=pq_kinds)[1]
    assert "reaching 0.500" in at["why"]
    assert all(r["recall_at_10"] >= 0.5 for r in at["measured"])
    assert record["chosen"]["recall_at_10"] >= at["chosen"]["recall_at_10"] - 1e-9
