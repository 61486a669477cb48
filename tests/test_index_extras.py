"""The search page's other directions go through FAISS (issue 34.4): ``videos.npy`` / ``texts.npy`` are
float16 unless ``--store float32``; "more like this" searches the gallery's own index without its bias,
video -> text the captions' own ``texts.faiss``; each equals float32 brute force where the index is
exact. ``query --out`` prints a summary, not one table row per result (issue 34.6)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("faiss")

import xmodal  # noqa: E402
from xmodal.cli import main  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    root = tmp_path_factory.mktemp("extras")
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
    np.save(root / "t.npy", rng.standard_normal((400, 48)).astype(np.float32))
    (root / "captions.txt").write_text("".join(f"caption {i}\n" for i in range(400)))
    return root


def brute(matrix, q, k, exclude=None):
    s = matrix.astype(np.float64) @ q.astype(np.float64)
    rows = [j for j in np.lexsort((np.arange(len(s)), -s)) if j != exclude][:k]
    return s[rows], rows


def build(root, out, *extra):
    assert main(["index", "--run", str(root / "run"), "--video-features", str(root / "v.npy"), "--out", str(out),
                 *extra]) == 0


def test_stored_embeddings_are_float16_by_default_and_float32_on_request(run_dir, tmp_path, capsys):
    from xmodal.retrieval.search import IndexExtras

    build(run_dir, tmp_path / "h", "--kind", "ivf")
    build(run_dir, tmp_path / "f", "--kind", "ivf", "--store", "float32")
    capsys.readouterr()
    half, full = np.load(tmp_path / "h" / "videos.npy"), np.load(tmp_path / "f" / "videos.npy")
    assert half.dtype == np.float16 and full.dtype == np.float32
    assert (tmp_path / "h" / "videos.npy").stat().st_size < 0.55 * (tmp_path / "f" / "videos.npy").stat().st_size
    model = xmodal.load_model(run_dir / "run")
    want = model.encode_video(np.load(run_dir / "v.npy")).numpy()
    np.testing.assert_array_equal(full, want)
    np.testing.assert_array_equal(half, want.astype(np.float16))
    assert json.loads((tmp_path / "h" / "meta.json").read_text())["store"] == "float16"
    extras = IndexExtras(tmp_path / "h", num_items=3000, dim=16)
    assert extras.videos.dtype == np.float16


@pytest.mark.parametrize("normalizer", ["none", "dn"])
def test_more_like_this_goes_through_the_faiss_index(run_dir, tmp_path, monkeypatch, normalizer):
    from xmodal.retrieval import search
    from xmodal.serve.searcher import Searcher

    out = tmp_path / "idx"
    build(run_dir, out, "--kind", "flat", "--normalizer", normalizer)
    searcher = Searcher(out, text_encoder="none")
    monkeypatch.setattr(search, "top_k", lambda *a, **k: pytest.fail("brute force instead of the index"))
    videos = xmodal.load_model(run_dir / "run").encode_video(np.load(run_dir / "v.npy")).numpy()
    for item in (0, 17, 2999):
        body = searcher.search_video(str(item), 8)
        want_s, want_rows = brute(videos, np.load(out / "videos.npy")[item].astype(np.float32), 8, exclude=item)
        assert [r["item"] for r in body["results"]] == want_rows or normalizer == "dn"
        tol = 1e-5 if normalizer == "none" else 2e-3  # a DN fold's scores are rescored from float16 videos.npy
        np.testing.assert_allclose([r["score"] for r in body["results"]], want_s, atol=tol)
        assert body["exact"] is True and body["recall_at_10"] == 1.0


def test_an_approximate_index_answers_more_like_this_from_its_cells(run_dir, tmp_path):
    from xmodal.serve.searcher import Searcher

    out = tmp_path / "idx"
    build(run_dir, out, "--kind", "ivf", "--normalizer", "none")
    searcher = Searcher(out, text_encoder="none")
    body = searcher.search_video("5", 10)
    assert body["exact"] is False and body["recall_at_10"] is None
    assert body["search_params"] == json.loads((out / "meta.json").read_text())["search_params"]
    assert 5 not in [r["item"] for r in body["results"]] and len(body["results"]) == 10


def test_video_to_text_goes_through_the_captions_own_index(run_dir, tmp_path, monkeypatch, encoders_stub):
    from xmodal.retrieval import search
    from xmodal.serve.searcher import Searcher

    out = tmp_path / "idx"
    build(run_dir, out, "--kind", "hnsw", "--texts", str(run_dir / "captions.txt"), "--text-encoder", "stub-text")
    meta = json.loads((out / "meta.json").read_text())
    assert meta["texts_index"]["kind"] == "flat" and (out / "texts.faiss").is_file()  # 400 captions: exact
    monkeypatch.setattr(search, "top_k", lambda *a, **k: pytest.fail("brute force instead of texts.faiss"))
    searcher = Searcher(out, text_encoder="stub-text")
    texts = np.load(out / "texts.npy").astype(np.float32)
    q = np.load(out / "videos.npy")[3].astype(np.float32)
    body = searcher.search_video("3", 6, "v2t")
    want_s, want_rows = brute(texts, q, 6)
    assert [r["item"] for r in body["results"]] == want_rows
    np.testing.assert_allclose([r["score"] for r in body["results"]], want_s, atol=2e-3)
    assert body["exact"] is True


def test_a_large_caption_set_gets_an_approximate_index_of_the_videos_kind(run_dir):
    import torch

    from xmodal.retrieval.build import TEXTS_APPROXIMATE_FROM, _texts_index

    rng = np.random.default_rng(0)
    emb = rng.standard_normal((TEXTS_APPROXIMATE_FROM, 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    videos = torch.nn.functional.normalize(torch.randn(2000, 8), dim=-1)
    index, info = _texts_index(emb, videos, "ivf", None, 0)
    assert info["kind"] == "ivf" and info["recall_at_10"] >= 0.95 and info["curve"]
    assert _texts_index(emb[:50], videos, "ivf", None, 0)[1]["kind"] == "flat"


@pytest.fixture
def encoders_stub():
    from xmodal.features import encoders

    def text(inputs, *, batch_size, progress):
        rng = np.random.default_rng(len(inputs))
        return rng.standard_normal((len(inputs), 48)).astype(np.float32)

    encoders.register_encoder("stub-text", text, kind="text")
    yield
    del encoders.ENCODERS["stub-text"]


def test_query_out_prints_a_summary_not_a_row_per_result(run_dir, tmp_path, capsys):
    out = tmp_path / "idx"
    build(run_dir, out)
    capsys.readouterr()
    dest = tmp_path / "res.npy"
    assert main(["query", "--index", str(out), "--text-features", str(run_dir / "t.npy"), "--k", "5",
                 "--out", str(dest)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) <= 3 and "400 queries x top 5" in printed[0]
    assert np.load(dest).shape == (400, 5) and np.load(tmp_path / "res.scores.npy").shape == (400, 5)
