"""An IVF index built in shards and merged with its lists on disk (issue 46.2): the merged index returns the
ids and scores of the same index filled in one process (same trained quantisers), its lists are FAISS
on-disk lists memory-mapped from ``lists.ivfdata``, a shard missing or given twice is one line, and the merge
measures recall@10 against exact search as a one-process build does."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("faiss") is None, reason="needs the extra [faiss]")


@pytest.fixture(scope="module")
def gallery():
    rng = np.random.default_rng(46)
    rows = rng.standard_normal((3000, 16)).astype(np.float16)  # the float16 layout's rows
    bias = (0.1 * rng.standard_normal(3000)).astype(np.float32)  # a folded normaliser's b_j
    queries = rng.standard_normal((50, 16)).astype(np.float32)
    return rows, bias, queries


def _built(tmp_path, rows, bias, kind, n_shards):
    from xmodal.retrieval.ondisk import add_shard, merge_shards, train_empty

    trained = tmp_path / "trained.faiss"
    train_empty(rows, trained, bias=bias, kind=kind, nlist=20, seed=0)
    shards = [add_shard(trained, rows, (k, n_shards), tmp_path / "shards", bias=bias) for k in range(1, n_shards + 1)]
    return trained, shards, merge_shards(trained, shards[::-1], tmp_path / "idx")  # any order


@pytest.mark.parametrize("kind", ["ivf", "ivfpq"])
def test_merged_on_disk_index_equals_one_process_fill(tmp_path, gallery, kind):
    import faiss

    from xmodal.retrieval.index import BiasedIndex, _place, _width

    rows, bias, queries = gallery
    trained, _, meta = _built(tmp_path, rows, bias, kind, 3)
    assert meta["num_items"] == 3000 and meta["shards"] == 3
    merged = BiasedIndex.load(tmp_path / "idx" / "index.faiss", dim=16)
    lists = faiss.extract_index_ivf(merged.index).invlists
    assert "OnDisk" in type(faiss.downcast_InvertedLists(lists)).__name__  # the lists live on disk, mmapped
    # the reference: the same trained index, every row added in one process, searched by FAISS directly
    ref = faiss.read_index(str(trained))
    width = _width(16, kind)
    if kind == "ivf":  # [y_j, b_j] and [x, 1], written out by hand
        g, q = np.hstack([rows.astype(np.float32), bias[:, None]]), np.hstack([queries, np.ones((50, 1), np.float32)])
    else:  # PQ: the bias in a sub-vector of its own (BiasedIndex's layout)
        g, q = _place(rows.astype(np.float32), bias, width), _place(queries, np.ones(50, np.float32), width)
    ref.add(np.ascontiguousarray(g))
    faiss.extract_index_ivf(ref).nprobe = 5
    ref_scores, ref_ids = ref.search(np.ascontiguousarray(q), 10)
    scores, ids = merged.search(queries, 10, nprobe=5)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(scores, ref_scores)


def test_a_shard_missing_or_given_twice_is_one_line(tmp_path, gallery):
    from xmodal.retrieval.ondisk import add_shard, merge_shards

    rows, bias, _ = gallery
    trained, shards, _ = _built(tmp_path, rows, bias, "ivf", 3)
    with pytest.raises(ValueError, match=r"^shard: missing 2/3 \(each of the 3 shards exactly once\)$"):
        merge_shards(trained, [shards[0], shards[2]], tmp_path / "bad")
    with pytest.raises(ValueError, match=r"^shard: 1/3 given twice"):
        merge_shards(trained, [shards[0], *shards], tmp_path / "bad")
    other = add_shard(trained, rows, (1, 2), tmp_path / "other", bias=bias)
    with pytest.raises(ValueError, match=r"^shard: .* is shard 1 of 2, the others of 3$"):
        merge_shards(trained, [*shards, other], tmp_path / "bad")
    assert not (tmp_path / "bad" / "index.faiss").exists()


def test_merge_measures_recall_against_exact_search(tmp_path, gallery):
    from xmodal.retrieval.index import BiasedIndex
    from xmodal.retrieval.ondisk import add_shard, merge_shards, train_empty

    rows, bias, queries = gallery
    trained = tmp_path / "trained.faiss"
    train_empty(rows, trained, bias=bias, kind="ivf", nlist=20, seed=0)
    shards = [add_shard(trained, rows, (k, 2), tmp_path, bias=bias) for k in (1, 2)]
    meta = merge_shards(trained, shards, tmp_path / "idx", queries=queries, rows=rows, bias=bias, target_recall=0.9)
    # naive reference: exact top 10 by a full score matrix, recall counted by a loop
    exact = np.argsort(-(queries @ rows.astype(np.float32).T + bias[None, :]), axis=1, kind="stable")[:, :10]
    index = BiasedIndex.load(tmp_path / "idx" / "index.faiss", dim=16)
    got = index.search(queries, 10)[1]
    recall = np.mean([len(set(got[i]) & set(exact[i])) / 10 for i in range(len(queries))])
    assert meta["search_params"] == index.search_params  # the chosen nprobe is saved with the index
    assert meta["recall_at_10"] == pytest.approx(recall, abs=1e-6) and meta["recall_queries"] == 50
    assert meta["target_met"] == (recall >= 0.9)


@pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="needs the extra [cluster]")
def test_shards_added_on_a_local_cluster_merge_to_the_one_process_shards(tmp_path, gallery):
    """The executor's shards (2 worker processes) are the files one process writes, and merge the same."""
    from xmodal.execute.index import add_index_shards
    from xmodal.retrieval.ondisk import add_shard, train_empty

    rows, bias, _ = gallery
    np.save(tmp_path / "rows.npy", rows)
    np.save(tmp_path / "bias.npy", bias)
    trained = tmp_path / "trained.faiss"
    train_empty(rows, trained, bias=bias, kind="ivf", nlist=20, seed=0)
    done = add_index_shards(trained, tmp_path / "rows.npy", tmp_path / "cluster", shards=3, cluster="local:2",
                            bias=tmp_path / "bias.npy", progress=False)
    assert sorted(done) == [1, 2, 3] and sum(r["rows"] for r in done.values()) == 3000
    for k in (1, 2, 3):
        one = add_shard(trained, rows, (k, 3), tmp_path / "one", bias=bias)
        assert (tmp_path / "cluster" / one.name).read_bytes() == one.read_bytes()


def test_train_rows_sets_the_sample_the_coarse_quantiser_is_trained_on(tmp_path, gallery):
    """``train_rows``: the k-means runs on that many seeded rows; the reference trains FAISS's IVF directly on
    the same rows (the fold written out: the row, then the bias)."""
    import faiss

    from xmodal.retrieval.ondisk import train_empty
    from xmodal.retrieval.recall import sample_rows

    rows, bias, _ = gallery
    n, d = rows.shape
    info = train_empty(rows, tmp_path / "t.faiss", bias=bias, kind="ivf", nlist=20, seed=3, train_rows=300)
    assert info["train_rows"] == 300
    pick = sample_rows(n, 300, 3)
    ref = faiss.index_factory(d + 1, "IVF20,Flat", faiss.METRIC_INNER_PRODUCT)
    ivf = faiss.extract_index_ivf(ref)
    ivf.cp.niter, ivf.cp.seed = 10, 3
    ref.train(np.hstack([rows[pick], bias[pick, None]]).astype(np.float32))
    loaded = faiss.read_index(str(tmp_path / "t.faiss"))  # kept alive: the IVF view points into it
    got = faiss.extract_index_ivf(loaded)
    centroids = lambda index: faiss.downcast_index(index.quantizer).reconstruct_n(0, 20)  # noqa: E731
    np.testing.assert_array_equal(centroids(got), centroids(ivf))
    default = train_empty(rows, tmp_path / "d.faiss", bias=bias, kind="ivf", nlist=20, seed=3)
    assert default["train_rows"] == min(n, 800)  # 40 a cell
    with pytest.raises(ValueError, match="train_rows: 10 sampled rows cannot train 20 cells"):
        train_empty(rows, tmp_path / "x.faiss", kind="ivf", nlist=20, train_rows=10)


@pytest.mark.parametrize("biased", [True, False])
def test_train_only_measures_the_cell_count_as_one_process_does(tmp_path, gallery, biased):
    """Without ``nlist`` but with recall queries, ``train_empty`` measures the cell count: the same table and the
    same trained cells as a one-process :class:`BiasedIndex` with the same rows, bias, queries and seed."""
    import faiss

    from xmodal.retrieval.index import BiasedIndex
    from xmodal.retrieval.ondisk import train_empty

    rows, bias, queries = gallery
    bias = bias if biased else None
    info = train_empty(rows, tmp_path / "t.faiss", bias=bias, kind="ivf", seed=2, queries=queries, target_recall=0.9)
    one = BiasedIndex(rows.astype(np.float32), bias=bias, kind="ivf", queries=queries, target_recall=0.9, seed=2)
    assert info["nlist_choice"] and info["nlist_choice"] == one.nlist_choice
    assert info["nlist"] == one.nlist == next(c["nlist"] for c in one.nlist_choice if c["chosen"])
    # the empty index's cells are the chosen candidate's: FAISS's quantiser holds the same centroids
    read = faiss.read_index(str(tmp_path / "t.faiss"))  # held: the quantiser lives inside it
    mine = faiss.extract_index_ivf(read).quantizer
    ref = faiss.extract_index_ivf(one.index).quantizer
    np.testing.assert_array_equal(mine.reconstruct_n(0, mine.ntotal), ref.reconstruct_n(0, ref.ntotal))
    # given nlist, nothing is measured
    assert train_empty(rows, tmp_path / "n.faiss", bias=bias, kind="ivf", nlist=20, queries=queries)["nlist_choice"] == []
