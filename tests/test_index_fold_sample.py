"""``--normalizer auto`` decides on a sample of the gallery and fits the candidate on the whole gallery
only when it folds it (issue 43 item 2).

References: the full-gallery decision (:func:`choose_fold` on every row, the candidate fitted on every
row) and each caption's best-scoring videos by an explicit loop over the gallery."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("faiss")

from xmodal.retrieval import foldcheck  # noqa: E402
from xmodal.retrieval.foldcheck import choose_fold, choose_on_sample, fold_sample  # noqa: E402
from xmodal.retrieval.index import gallery_bias  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def scenario(helps: bool, n: int = 6000, d: int = 32, m: int = 120, seed: int = 0):
    """Captions with their own videos (added to the gallery) and, near each caption, a distractor video in
    the gallery. The bank's queries keep retrieving the distractors (``helps``: Sinkhorn lowers their bias,
    the captions' own videos rise) or the captions' own videos (the fold lowers them)."""
    rng = np.random.default_rng(seed)
    own = unit(rng.standard_normal((m, d)))
    cap = unit(own + 0.5 / d ** 0.5 * rng.standard_normal((m, d)))
    hubs = unit(cap + 0.45 / d ** 0.5 * rng.standard_normal((m, d)))
    g = np.vstack([unit(rng.standard_normal((n - m, d))), hubs])[rng.permutation(n)]
    popular = hubs if helps else own
    bank = unit(np.repeat(popular, 3, 0) + 0.1 / d ** 0.5 * rng.standard_normal((3 * m, d)))
    return (torch.from_numpy(x) for x in (g, bank, cap, own))


@pytest.mark.parametrize("helps", [True, False])
def test_the_sample_decision_equals_the_full_gallery_decision(helps):
    g, bank, cap, own = scenario(helps)
    fitted_on = []

    def fit(rows, extra):
        fitted_on.append(int(rows.shape[0]))
        b, xb = gallery_bias("sinkhorn", rows, bank, extra=extra, temperature=0.05, iters=20)
        return {"normalizer": "sinkhorn", "bias": b, "extra_bias": xb, "query_shift": None}

    t2v = len(g) + np.arange(len(own))
    full = choose_fold(g, fit(g, own), cap, t2v, extra=own, n_boot=2000)
    assert full["chosen"] == ("sinkhorn" if helps else "none")  # the answer is clear either way
    assert (full["test"]["ci_low"] > 0) if helps else (full["test"]["ci_high"] < 0)
    fitted_on.clear()
    rec, folded = choose_on_sample(g, fit, cap, t2v, extra=own, size=600, n_boot=2000)
    assert rec["chosen"] == full["chosen"] and folded is None
    assert fitted_on == [600] and rec["sample_rows"] == 600 and rec["near_rows"] > 0
    # none's ranks at the top are exact on the sample: every video outranking a caption's own is among its near
    assert rec["none"] == full["none"]
    # a uniform sample alone thins out the distractors and calls the helpful fold unclear
    alone, _ = choose_on_sample(g, fit, cap, t2v, extra=own, size=600, neighbours=0, n_boot=2000)
    if helps:
        assert alone["chosen"] == "none"


def test_fold_sample_holds_each_captions_nearest_videos_and_its_own():
    rng = np.random.default_rng(1)
    g = torch.from_numpy(unit(rng.standard_normal((500, 8))))
    q = torch.from_numpy(unit(rng.standard_normal((7, 8))))
    t2v = rng.choice(500, 7)
    uniform, near, mapped = fold_sample(g, q, t2v, added=False, size=50, neighbours=20, seed=3)
    measured = np.concatenate([uniform, near])
    assert len(uniform) == 50 and len(set(measured.tolist())) == len(measured)
    np.testing.assert_array_equal(measured[mapped], t2v)  # each caption's own video, renumbered
    s = (q @ g.T).numpy()
    for i in range(7):  # by loops: the sample's 2nd best score (20 * 50 / 500) and every video reaching it
        threshold = sorted((s[i, j] for j in uniform), reverse=True)[1]
        reaching = [j for j in range(500) if s[i, j] >= threshold]
        assert set(reaching) <= set(measured.tolist())
        assert max(range(500), key=lambda j: s[i, j]) in reaching  # the best video always
    assert fold_sample(g, q, t2v, added=False, size=500) is None  # the whole gallery


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from conftest import sinkhorn_run_and_gallery

    return sinkhorn_run_and_gallery(tmp_path_factory.mktemp("foldsample"))


@pytest.mark.parametrize("verdict", ["none", "candidate"])
def test_the_whole_gallery_is_fitted_only_when_the_fold_is_kept(run_dir, tmp_path, monkeypatch, capsys, verdict):
    from xmodal.cli import main
    from xmodal.retrieval import index as index_module

    run, feats = run_dir
    real_fold, real_choose = index_module.fold_run_normalizer, foldcheck.choose_fold
    sizes = []

    def counting(model, rows, normalizer="selected", **kw):
        sizes.append((normalizer, int(rows.shape[0])))
        return real_fold(model, rows, normalizer, **kw)

    def decided(*args, **kw):  # the measurement as it is, its verdict forced
        rec = real_choose(*args, **kw)
        rec["chosen"] = "none" if verdict == "none" else rec["candidate"]
        rec["test"]["clear"] = verdict != "none"
        return rec

    monkeypatch.setattr(index_module, "fold_run_normalizer", counting)
    monkeypatch.setattr(foldcheck, "choose_fold", decided)
    monkeypatch.setattr(foldcheck, "SAMPLE_ROWS", 300)
    out = tmp_path / "idx"
    assert main(["index", "--run", str(run), "--video-features", str(feats), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    choice = meta["normalizer_choice"]
    assert choice["candidate"] == "sinkhorn" and choice["sample_rows"] == 300 and choice["gallery"] == 900
    assert "a seeded sample of 300 of the 900 gallery videos" in printed
    fits = [s for s in sizes if s[0] == "sinkhorn"]
    assert fits[0] == ("sinkhorn", 300)  # measured on the sample
    assert fits[1:] == ([] if verdict == "none" else [("sinkhorn", 900)])  # the gallery: only when folded
    assert meta["normalizer"] == ("none" if verdict == "none" else "sinkhorn")
