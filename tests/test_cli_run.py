"""Applying a trained run from the CLI: ``eval --run``, ``eval --labels``, ``index`` + ``query``.

The reference for the run's scores is written here in float64 from the run's own
embeddings and stored query banks (DN eq. 7 literally; NCL/Sinkhorn as score + b_j).
``model.similarity`` (API.md) is used when the model has it; until then the CLI falls
back to ``xmodal.training.loop.normalized_similarities`` (a stand-in, re-checked after merge).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("faiss")

import xmodal  # noqa: E402
from xmodal.cli import main  # noqa: E402
from xmodal.data.synthetic import synthetic  # noqa: E402
from xmodal.metrics import text_video  # noqa: E402
from xmodal.normalize import SinkhornBias  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("run")
    cfg = from_dict({
        "data": {"name": "synthetic", "synthetic": {"num_train": 120, "num_val": 60, "num_test": 60,
                                                     "num_concepts": 10}},
        "model": {"kind": "linear", "dim": 16},
        "loss": {"name": "ncl", "temperature": 0.05, "kwargs": {"queue_size": 256}},
        "test_time": {"normalizers": ["none", "dn", "sinkhorn", "ncl", "qbnorm"], "bank_size": 100},
        "train": {"seed": 0, "epochs": 2, "batch_size": 32},
    })
    train(cfg, root / "run", resume=False, progress=False)
    torch.set_num_threads(before)
    return root / "run"


@pytest.fixture(scope="module")
def feats(run_dir, tmp_path_factory):
    split = synthetic(num_train=10, num_val=10, num_test=50, num_concepts=10, seed=7)["test"]
    root = tmp_path_factory.mktemp("feats")
    paths = {}
    for name, arr in {"video": split.video, "text": split.text, "t2v": split.text_to_video,
                      "labels": split.video_labels}.items():
        paths[name] = str(root / f"{name}.npy")
        np.save(paths[name], arr)
    return paths, split


def reference_scores(model, text_features, video_features, name):
    """[T, V] float64 text -> video scores of the run's normaliser ``name`` (independent code)."""
    tt = model.test_time
    x = model.encode_text(text_features).double()
    y = model.encode_video(video_features).double()
    if name == "none":
        return (x @ y.T).numpy()
    hp = tt.hparams
    if name == "dn":
        def sample_mean(bank, seed):  # DN: mean of 100 seeded samples (Zhou et al. 2023, eq. 7)
            bank = bank.double().numpy()
            if len(bank) <= 100:
                return bank.mean(0)
            rows = np.sort(np.random.default_rng(seed).choice(len(bank), 100, replace=False))
            return bank[rows].mean(0)
        lam = hp["lam"]
        text_bank, video_bank = tt.banks["train"]
        mu_x, mu_y = sample_mean(text_bank, 0), sample_mean(video_bank, 1)
        xs, ys = x.numpy() - lam * mu_x, y.numpy() - lam * mu_y
        return np.array([[float(xi @ yj) for yj in ys] for xi in xs])
    bank = tt.banks["ncl" if name == "ncl" else "train"][0]
    bias = SinkhornBias(tt.temperature, iters=hp["iters"]).fit(bank.double(), y).bias
    return (x @ y.T + bias[None, :]).numpy()


def assert_same_topk(got_i, got_s, ref, k, atol=1e-4):
    """Top-k indices equal brute force, up to items whose scores tie within ``atol``."""
    for row in range(ref.shape[0]):
        order = np.argsort(-ref[row], kind="stable")[:k]
        np.testing.assert_allclose(got_s[row], ref[row, order], atol=atol)
        for col in range(k):
            if got_i[row, col] != order[col]:
                assert abs(ref[row, got_i[row, col]] - ref[row, order[col]]) < atol


@pytest.mark.parametrize("name", ["none", "dn", "sinkhorn", "ncl"])
def test_index_query_equals_brute_force(run_dir, feats, tmp_path, capsys, name):
    paths, split = feats
    out = tmp_path / "idx"
    assert main(["index", "--run", str(run_dir), "--video-features", paths["video"], "--out", str(out),
                 "--normalizer", name]) == 0
    assert f"normaliser {name} folded in" in capsys.readouterr().out
    assert main(["query", "--index", str(out), "--text-features", paths["text"], "--k", "7", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    got_i, got_s = np.array(res["indices"]), np.array(res["scores"])
    model = xmodal.load_model(run_dir)
    ref = reference_scores(model, split.text, split.video, name)
    assert got_i.shape == (split.text.shape[0], 7)
    assert_same_topk(got_i, got_s, ref, 7)
    # the run's own similarity (what eval --run scores) is the same matrix
    np.testing.assert_allclose(model.similarity(split.text, split.video, normalizer=name).double().numpy(),
                               ref, atol=1e-4)


def test_index_selected_and_refusals(run_dir, feats, tmp_path, capsys):
    paths, _ = feats
    model = xmodal.load_model(run_dir)
    selected = model.test_time.selected
    out = tmp_path / "idx"
    assert main(["index", "--run", str(run_dir), "--video-features", paths["video"], "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["normalizer"] == selected and meta["num_items"] == 50
    capsys.readouterr()
    # an existing index is not overwritten silently; QB-Norm cannot be folded; unknown names
    for argv, needle in [([], "--overwrite"), (["--normalizer", "qbnorm", "--overwrite"], "qbnorm"),
                         (["--normalizer", "nope", "--overwrite"], "--normalizer")]:
        assert main(["index", "--run", str(run_dir), "--video-features", paths["video"], "--out", str(out),
                     *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("xmodal index: error:") and needle in err and len(err.splitlines()) == 1
    assert main(["index", "--run", str(tmp_path / "nothing"), "--video-features", paths["video"],
                 "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.startswith("xmodal index: error: --run")
    assert main(["query", "--index", str(tmp_path), "--text-features", paths["text"]]) == 2
    assert "meta.json" in capsys.readouterr().err
    assert main(["query", "--index", str(out), "--text-features", paths["video"]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("xmodal query: error: --text-features") and len(err.splitlines()) == 1


def test_query_captions_through_registered_encoder(run_dir, feats, tmp_path, capsys):
    from xmodal.features import encoders

    paths, split = feats
    captions = ["a dog runs", "two people cook", "a red car"]
    table = {c: split.text[i] for i, c in enumerate(captions)}
    encoders.register_encoder("test-lookup", lambda xs, batch_size, progress: np.stack([table[x] for x in xs]),
                              overwrite=True)
    try:
        out = tmp_path / "idx"
        assert main(["index", "--run", str(run_dir), "--video-features", paths["video"], "--out", str(out),
                     "--text-encoder", "test-lookup", "--normalizer", "ncl"]) == 0
        capsys.readouterr()
        assert main(["query", "--index", str(out), "--captions", *captions, "--k", "3", "--json"]) == 0
        by_caption = json.loads(capsys.readouterr().out)
        np.save(tmp_path / "t.npy", split.text[:3])
        assert main(["query", "--index", str(out), "--text-features", str(tmp_path / "t.npy"), "--k", "3",
                     "--json"]) == 0
        by_features = json.loads(capsys.readouterr().out)
        assert by_caption["indices"] == by_features["indices"]
        assert main(["query", "--index", str(out), "--captions", *captions, "--k", "2"]) == 0
        text = capsys.readouterr().out
        assert "| query | rank | video | score |" in text and "a dog runs" in text
    finally:
        encoders.ENCODERS.pop("test-lookup", None)


def reference_v2t_scores(model, text_features, video_features, name):
    """[V, T] video -> text scores of the run's normaliser ``name`` fitted for that direction
    (independent float64 code; the transpose of the t2v scores for none / dn)."""
    if name in ("none", "dn"):
        return reference_scores(model, text_features, video_features, name).T
    tt = model.test_time
    x = model.encode_text(text_features).double()
    y = model.encode_video(video_features).double()
    bank = tt.banks["ncl" if name == "ncl" else "train"][1]
    bias = SinkhornBias(tt.temperature, iters=tt.hparams["iters"]).fit(bank.double(), x).bias
    return (y @ x.T + bias[None, :]).numpy()


@pytest.mark.parametrize("name", ["selected", "none", "dn", "sinkhorn", "ncl", "qbnorm"])
@pytest.mark.parametrize("v2t_scores", ["normalized", "transpose"])
def test_eval_run_matches_similarity_then_text_video(run_dir, feats, capsys, name, v2t_scores):
    """Default: each direction scored by the normaliser fitted for it (the trainer's metrics.json);
    ``--v2t-scores transpose``: v2t ranks the t2v scores transposed (metrics.text_video of them)."""
    paths, split = feats
    assert main(["eval", "--run", str(run_dir), "--video-features", paths["video"], "--text-features",
                 paths["text"], "--text-to-video", paths["t2v"], "--normalizer", name, "--json",
                 "--v2t-scores", v2t_scores]) == 0
    out = json.loads(capsys.readouterr().out)
    model = xmodal.load_model(run_dir)
    resolved = model.test_time.selected if name == "selected" else name
    if resolved == "qbnorm":  # QB-Norm: the library's scores (tests/test_testtime.py checks them)
        sim = model.similarity(split.text, split.video, "qbnorm").double().numpy()
        sim_v2t = model.similarity(split.text, split.video, "qbnorm", direction="v2t").double().numpy()
    else:
        sim = reference_scores(model, split.text, split.video, resolved)
        sim_v2t = reference_v2t_scores(model, split.text, split.video, resolved)
    want = text_video(sim, split.text_to_video)
    if v2t_scores == "normalized":
        want["v2t"] = text_video(np.ascontiguousarray(sim_v2t.T), split.text_to_video)["v2t"]
    assert out["t2v"] == pytest.approx(want["t2v"], abs=1e-6)
    assert out["v2t"] == pytest.approx(want["v2t"], abs=1e-6)
    assert out["info"]["texts"] == 150 and out["info"]["videos"] == 50
    assert out["info"]["v2t"] == "all-captions" and f"normaliser {resolved}" in out["info"]["scores"]


def test_eval_prints_counts_kind_and_protocol(run_dir, feats, capsys):
    paths, _ = feats
    assert main(["eval", "--run", str(run_dir), "--video-features", paths["video"], "--text-features",
                 paths["text"], "--text-to-video", paths["t2v"]]) == 0
    text = capsys.readouterr().out
    assert "| direction |" in text and "texts: 150" in text and "videos: 50" in text
    assert "v2t: all-captions" in text and "cosine" in text
    assert main(["eval", "--run", str(run_dir), "--video-features", paths["video"], "--text-features",
                 paths["text"], "--text-to-video", paths["t2v"], "--l2"]) == 2
    assert "--l2" in capsys.readouterr().err


def naive_label_retrieval(sim, labels, ks):
    """Each item queries the others (itself removed); pessimistic rank of the best same-label item."""
    ranks = []
    for i in range(len(labels)):
        others = [j for j in range(len(labels)) if j != i]
        pos = [j for j in others if labels[j] == labels[i]]
        if not pos:
            continue
        best = max(sim[i, j] for j in pos)
        ranks.append(sum(1 for j in others if sim[i, j] >= best and not (labels[j] == labels[i] and sim[i, j] == best))
                     + 1)
    ranks = np.array(ranks, dtype=np.float64)
    out = {f"R@{k}": 100.0 * float(np.mean(ranks <= k)) for k in ks}
    out.update(MdR=float(np.median(ranks)), MnR=float(ranks.mean()))
    return out, len(ranks)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_label_retrieval_matches_naive(seed):
    from xmodal.metrics.ranking import label_retrieval_from_sim as label_retrieval

    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 30))
    labels = rng.integers(0, 4, n)
    labels[0] = 99  # a singleton class: no positive, left out
    sim = rng.integers(-3, 4, (n, n)).astype(np.float64)  # many ties
    want, count = naive_label_retrieval(sim, labels, (1, 3, 5))
    got = label_retrieval(sim, labels, ks=(1, 3, 5), block_size=int(rng.integers(1, 8)))
    assert got.pop("num_queries") == count
    assert got == pytest.approx(want)


def test_eval_labels_cli(run_dir, feats, tmp_path, capsys):
    paths, split = feats
    v = split.video.astype(np.float64)
    np.save(tmp_path / "v.npy", v)
    assert main(["eval", "--video", str(tmp_path / "v.npy"), "--labels", paths["labels"], "--l2", "--json",
                 "--ks", "1,5"]) == 0
    out = json.loads(capsys.readouterr().out)
    vn = v / np.linalg.norm(v, axis=1, keepdims=True)
    want, count = naive_label_retrieval(vn @ vn.T, split.video_labels, (1, 5))
    assert out["v2v"] == pytest.approx(want) and out["info"]["scored queries"] == count
    assert main(["eval", "--run", str(run_dir), "--video-features", paths["video"], "--labels",
                 paths["labels"], "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    e = xmodal.load_model(run_dir).encode_video(split.video).double().numpy()
    assert out["v2v"] == pytest.approx(naive_label_retrieval(e @ e.T, split.video_labels, (1, 5, 10, 50))[0])


def test_docstring_examples_run():
    import doctest

    import xmodal.metrics.formatting
    import xmodal.metrics.ranking

    for mod in (xmodal.metrics.formatting, xmodal.metrics.ranking):
        res = doctest.testmod(mod)
        assert res.attempted > 0 and res.failed == 0, mod.__name__
