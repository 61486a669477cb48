"""Small things of issue 16: ``index --normalizer selected`` on a run that selected a
normaliser an index cannot hold; report plots (legend placement, integer epoch ticks,
image/video wording)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from xmodal.cli import main
from xmodal.config import from_dict
from xmodal.training.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("wb_small")
    cfg = from_dict({
        "data": {"name": "synthetic", "synthetic": {"num_train": 120, "num_val": 60, "num_test": 60,
                                                     "num_concepts": 10}},
        "model": {"kind": "linear", "dim": 16}, "loss": {"name": "infonce", "temperature": 0.05},
        "test_time": {"normalizers": ["none", "dn", "sinkhorn", "qbnorm"], "bank_size": 100},
        "train": {"seed": 0, "epochs": 3, "batch_size": 32, "device": "cpu"},
    })
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    train(cfg, root / "run", resume=False, progress=False, verbose=False)
    torch.set_num_threads(before)
    return root / "run"


def _as_if_selected(run_dir, tmp_path, name: str, boost: str):
    """A copy of the run whose stored choice on val is ``name`` (as when QB-Norm wins on val),
    with ``boost``'s val R@1 raised so the fallback is not trivially ``none``."""
    payload = torch.load(run_dir / "model.pt", weights_only=True)
    payload["model"]["test_time"]["selected"] = name
    payload["model"]["test_time"]["val"][boost]["t2v"]["R@1"] += 50.0
    # a run written before the trainer recorded its index normaliser (issue 28): the former fallback rule;
    # the recorded one is tests/test_compare.py::test_index_folds_the_normaliser_the_runs_summary_names
    payload["model"]["test_time"]["selection"] = {}
    out = tmp_path / "qb_run"
    out.mkdir()
    torch.save(payload, out / "model.pt")
    return out, payload


def test_index_selected_falls_back_to_best_foldable_and_says_so(run_dir, tmp_path, capsys):
    pytest.importorskip("faiss")
    from xmodal.retrieval.evaluate import score

    run, payload = _as_if_selected(run_dir, tmp_path, "qbnorm", boost="dn")
    val = payload["model"]["test_time"]["val"]
    metric = payload["config"]["train"]["metric"]
    foldable = [n for n in ("none", "dn", "sinkhorn") if n in val]
    expected = max(foldable, key=lambda n: (score(val[n], metric), n == "none"))  # independent pick
    feats = tmp_path / "v.npy"
    in_dim = payload["model"]["architecture"]["video"]["in_dim"]
    np.save(feats, np.random.default_rng(0).standard_normal((30, in_dim)).astype(np.float32))
    assert main(["index", "--run", str(run), "--video-features", str(feats), "--out", str(tmp_path / "idx"),
                 "--normalizer", "selected"]) == 0  # the run's own choice (the default, auto, measures first)
    out = capsys.readouterr()
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    assert meta["normalizer"] == expected == "dn" and meta["fallback_from"] == "qbnorm"
    assert "qbnorm" in out.err and f"using {expected}" in out.err and "cannot be folded" in out.err
    # naming qbnorm explicitly still refuses (the user asked for it)
    assert main(["index", "--run", str(run), "--video-features", str(feats), "--out", str(tmp_path / "i2"),
                 "--normalizer", "qbnorm"]) == 2


# --------------------------------------------------------------------------- plots

def _log(n_epochs: int = 7) -> list[dict]:
    return [{"epoch": e, "step": 10 * e, "train_loss": 3.0 / e, "lr": 1e-3 / e, "temperature": 0.05,
             "scheduled": 0.03 + 0.01 * (e % 3), "val": {"t2v": {"R@1": 10.0 + e}, "v2t": {"R@1": 12.0 + 2 * e}},
             "val_rsum": 60.0 + 5 * e, "best_epoch": e, "loss_terms": {"t2v": 1.5 / e, "v2t": 1.4 / e},
             "modality_gap": 0.8 - 0.1 * e} for e in range(1, n_epochs + 1)]


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _assert_legends_clear(fig):
    """Every legend lies outside every plotting area (so it covers no curve)."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    assert legends
    for leg in legends:
        box = leg.get_window_extent(r)
        for ax in fig.axes:
            assert not _overlaps(box, ax.get_window_extent(r)), (leg.get_texts()[0].get_text(), ax.get_title())


@pytest.mark.parametrize("n_epochs", [3, 7, 40])
def test_curves_legends_clear_and_integer_epoch_ticks(n_epochs):
    from xmodal.reporting.plots import _plt, curves_figure

    fig = curves_figure(_log(n_epochs))
    _assert_legends_clear(fig)
    for ax in fig.axes:
        if ax.get_xlabel() == "epoch":
            lo, hi = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
            assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
    _plt().close(fig)


def test_mass_and_fn_fp_legends_clear_and_wording():
    from xmodal.reporting.plots import _plt, fn_fp_figure, retrieval_mass_figure

    rng = np.random.default_rng(0)
    masses = {n: rng.lognormal(0, s, 200) for n, s in (("none", 1.0), ("dn", 0.8), ("sinkhorn", 0.2))}
    fig = retrieval_mass_figure(masses, 1.0, title="t", item="image")
    _assert_legends_clear(fig)
    assert fig.axes[0].get_xlabel() == "retrieval mass per image (log scale)" and fig.axes[0].get_ylabel() == "images"
    _plt().close(fig)
    res = {n: {"expected_mass": 1.0, "k": 1, "mean_mass": [0.5, 1.0, 2.0], "fn_rate": [90.0, 50.0, 10.0],
               "fp_rate": [5.0, 20.0, 60.0]} for n in masses}
    fig = fn_fp_figure(res, title="t")
    _assert_legends_clear(fig)
    _plt().close(fig)


def test_gallery_item_follows_the_data_names(tmp_path):
    from xmodal.reporting.plots import gallery_item

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        np.save(tmp_path / f"{split}_image_features.npy", rng.standard_normal((4, 3)).astype(np.float32))
        np.save(tmp_path / f"{split}_caption_features.npy", rng.standard_normal((4, 3)).astype(np.float32))
        np.save(tmp_path / f"{split}_caption_to_image.npy", np.arange(4))
    cfg = from_dict({"data": {"name": "paired", "root": str(tmp_path), "test_split": ""}})
    assert gallery_item(cfg) == "image"
    assert gallery_item(from_dict({})) == "video"  # synthetic data speaks of videos
    for split in ("train", "val"):
        (tmp_path / f"{split}_image_features.npy").rename(tmp_path / f"{split}_video_features.npy")
    assert gallery_item(cfg) == "video"
