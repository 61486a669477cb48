"""``xmodal index --train-only`` / ``--shard K/N`` / ``--merge`` / ``--cluster`` (issue 46.2): an index folder built
in shards and merged on disk answers ``query`` with the ids and scores of the same trained index filled in one
process, its normaliser folded unchanged; a shard given twice or missing is one line; a folder not merged yet
is refused by query in one line."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

pytest.importorskip("faiss")

from xmodal.cli import main  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    root = tmp_path_factory.mktemp("shards")
    cfg = from_dict({
        "data": {"name": "synthetic", "synthetic": {"num_train": 300, "num_val": 60, "num_test": 60,
                                                     "num_concepts": 10}},
        "model": {"kind": "linear", "dim": 16},
        "loss": {"name": "infonce", "temperature": 0.05},
        "test_time": {"normalizers": ["none", "dn"], "bank_size": 100},
        "train": {"seed": 0, "epochs": 1, "batch_size": 32},
    })
    train(cfg, root / "run", resume=False, progress=False, verbose=False)
    rng = np.random.default_rng(0)
    np.save(root / "v.npy", rng.standard_normal((3000, 64)).astype(np.float32))
    np.save(root / "t.npy", rng.standard_normal((40, 48)).astype(np.float32))
    return root


def _index(*flags) -> int:
    return main(["index", *flags])


def _trained(run_dir, out, capsys):
    assert _index("--run", str(run_dir / "run"), "--video-features", str(run_dir / "v.npy"), "--out", str(out),
                  "--kind", "ivf", "--nlist", "16", "--normalizer", "dn", "--train-only") == 0
    capsys.readouterr()


def _reference(out, queries):
    """The same trained index with every folded row added in one process, searched by FAISS directly."""
    import faiss

    ref = faiss.read_index(str(out / "trained.faiss"))
    rows, bias = np.load(out / "gallery.npy"), np.load(out / "gallery_bias.npy")
    column = ref.d == rows.shape[1] + 1  # a bias column only when a bias is folded
    ref.add((np.hstack([rows, bias[:, None]]) if column else rows).astype(np.float32))
    meta = json.loads((out / "meta.json").read_text())
    faiss.extract_index_ivf(ref).nprobe = meta["search_params"]["nprobe"]
    shift = np.load(out / "query_shift.npy")
    q = queries - shift[None, :]
    q = (np.hstack([q, np.ones((len(queries), 1), np.float32)]) if column else q).astype(np.float32)
    return ref.search(q, 10)


def test_shards_by_hand_merge_to_the_one_process_index(run_dir, tmp_path, capsys):
    from xmodal.retrieval.search import SearchIndex

    out = tmp_path / "idx"
    _trained(run_dir, out, capsys)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["normalizer"] == "dn" and meta["ondisk"]["stage"] == "trained"
    assert np.abs(np.load(out / "query_shift.npy")).sum() > 0  # DN's shift is folded, as in one process
    # the fold is the one-process build's: a flat index of the same run and normaliser stores y_j - shift
    # (DN folds no bias: no bias column, and the trained index has none either)
    assert _index("--run", str(run_dir / "run"), "--video-features", str(run_dir / "v.npy"), "--out",
                  str(tmp_path / "flat"), "--normalizer", "dn") == 0
    import faiss

    flat = faiss.read_index(str(tmp_path / "flat" / "index.faiss"))
    assert not np.load(out / "gallery_bias.npy").any() and faiss.read_index(str(out / "trained.faiss")).d == 16
    np.testing.assert_array_equal(flat.reconstruct_n(0, flat.ntotal), np.load(out / "gallery.npy"))
    np.testing.assert_array_equal(np.load(tmp_path / "flat" / "query_shift.npy"), np.load(out / "query_shift.npy"))
    with pytest.raises(ValueError, match="trained but holds no video yet"):
        SearchIndex(out)
    for k in (1, 2, 3):
        assert _index("--run", str(run_dir / "run"), "--out", str(out), "--shard", f"{k}/3") == 0
    assert _index("--run", str(run_dir / "run"), "--out", str(out), "--merge") == 0
    text = capsys.readouterr().out
    assert "merged from 3 shards" in text and "recall@10" in text
    index = SearchIndex(out)
    feats = np.load(run_dir / "t.npy")
    emb = index.model.encode_text(feats).cpu().numpy().astype(np.float32)
    scores, ids = index.search(feats, 10)
    ref_scores, ref_ids = _reference(out, emb)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(scores, ref_scores)
    assert not list((out / "shards").glob("*.faiss"))  # merged shards removed
    assert main(["query", "--index", str(out), "--text-features", str(run_dir / "t.npy"), "--k", "5"]) == 0


def test_a_shard_given_twice_or_missing_is_one_line(run_dir, tmp_path, capsys):
    out = tmp_path / "idx"
    _trained(run_dir, out, capsys)
    for k in (1, 2):
        assert _index("--run", str(run_dir / "run"), "--out", str(out), "--shard", f"{k}/3") == 0
    capsys.readouterr()
    assert _index("--run", str(run_dir / "run"), "--out", str(out), "--merge") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "shard: missing 3/3" in err[0], err
    one = str(out / "shards" / "shard-1-of-3.faiss")
    assert _index("--run", str(run_dir / "run"), "--out", str(out), "--merge", one, one) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "shard: 1/3 given twice" in err[0], err


@pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="needs the extra [cluster]")
def test_cluster_adds_the_shards_and_merges(run_dir, tmp_path, capsys):
    out = tmp_path / "idx"
    _trained(run_dir, out, capsys)
    assert _index("--run", str(run_dir / "run"), "--out", str(out), "--cluster", "local:2", "--cluster-shards", "4",
                  "--no-progress") == 0
    assert "merged from 4 shards" in capsys.readouterr().out
    from xmodal.retrieval.search import SearchIndex

    feats = np.load(run_dir / "t.npy")
    index = SearchIndex(out)
    scores, ids = index.search(feats, 10)
    ref_scores, ref_ids = _reference(out, index.model.encode_text(feats).cpu().numpy().astype(np.float32))
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(scores, ref_scores)


def test_more_like_this_searches_the_merged_lists(run_dir, tmp_path, capsys):
    """serve's "more like this" goes through the merged index (its lists on disk): the videos it finds are
    those the same trained index filled in one process finds for the video's embedding without the bias."""
    import faiss

    from xmodal.serve.searcher import Searcher

    out = tmp_path / "idx"
    _trained(run_dir, out, capsys)
    for k in (1, 2):
        assert _index("--run", str(run_dir / "run"), "--out", str(out), "--shard", f"{k}/2") == 0
    assert _index("--run", str(run_dir / "run"), "--out", str(out), "--merge") == 0
    searcher = Searcher(out)
    assert "OnDisk" in type(faiss.downcast_InvertedLists(faiss.extract_index_ivf(searcher.index.index.index).invlists)
                            ).__name__
    got = {r["item"] for r in searcher.search_video("7", 5)["results"]}
    ref = faiss.read_index(str(out / "trained.faiss"))
    rows = np.load(out / "gallery.npy")
    column = ref.d == rows.shape[1] + 1  # a bias column only when a bias is folded
    ref.add((np.hstack([rows, np.load(out / "gallery_bias.npy")[:, None]]) if column else rows).astype(np.float32))
    faiss.extract_index_ivf(ref).nprobe = json.loads((out / "meta.json").read_text())["search_params"]["nprobe"]
    emb = np.load(out / "videos.npy")[7].astype(np.float32)
    found = ref.search((np.hstack([emb, [0.0]]) if column else emb)[None, :].astype(np.float32), 6)[1][0]
    assert got == {int(j) for j in found if j != 7} and len(got) == 5


def test_train_rows_is_checked_in_one_line(run_dir, tmp_path, capsys):
    def flags(out):
        return ["--run", str(run_dir / "run"), "--video-features", str(run_dir / "v.npy"), "--out", str(out),
                "--kind", "ivf", "--nlist", "16"]

    base = flags(tmp_path / "i")
    assert _index(*base, "--train-rows", "100") == 2  # without --train-only
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--train-rows: only with --train-only" in err[0], err
    assert _index(*base, "--train-only", "--train-rows", "10") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--train-rows: 10 sampled rows cannot train 16 cells" in err[0], err
    assert _index(*base, "--train-only", "--train-rows", "640") == 0  # 40 a cell: the default sample, the same bytes
    assert _index(*flags(tmp_path / "j"), "--train-only") == 0
    assert (tmp_path / "i" / "trained.faiss").read_bytes() == (tmp_path / "j" / "trained.faiss").read_bytes()


def test_train_only_without_nlist_measures_the_cell_count_and_prints_its_table(run_dir, tmp_path, capsys):
    out = tmp_path / "idx"
    assert _index("--run", str(run_dir / "run"), "--video-features", str(run_dir / "v.npy"), "--out", str(out),
                  "--kind", "ivf", "--normalizer", "none", "--train-only") == 0
    text = capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    chosen = [c for c in meta["nlist_choice"] if c["chosen"]]
    assert len(meta["nlist_choice"]) >= 2 and len(chosen) == 1 and f"IVF{chosen[0]['nlist']}," in meta["factory"]
    assert "vectors compared per query" in text and f"{chosen[0]['nlist']} (chosen)" in text
    for k in (1, 2):
        assert _index("--run", str(run_dir / "run"), "--out", str(out), "--shard", f"{k}/2") == 0
    assert _index("--run", str(run_dir / "run"), "--out", str(out), "--merge") == 0
    text = capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    assert "queries/s" in text and meta["curve_rate"].startswith("best of") and "kind_advice" in meta
