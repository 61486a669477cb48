"""Each loss's declaration (accepts / scheduled / registered model keywords) is true of the
loss, and the trainer, bench grid and config read it (no probing, no name lists)."""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from xmodal.losses import LOSSES, build_loss, loss_spec


def _batch(spec, n=6, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    v, t = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    extra = {}
    if "ids" in spec.accepts:
        extra["ids"] = torch.tensor([0, 0, 1, 2, 3, 4])
    if "video_input" in spec.accepts:
        extra["video_input"], extra["text_input"] = v.clone(), t.clone()
    if "relevancy" in spec.accepts:
        extra["relevancy"] = torch.eye(n)
    return v, t, extra


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_declaration_is_true(name):
    spec = loss_spec(name)
    init = inspect.signature(LOSSES[name].__init__).parameters
    fwd = inspect.signature(LOSSES[name].forward).parameters
    assert all(k in fwd for k in spec.accepts), spec
    assert all(k in init for k in spec.model_kwargs), spec
    kw = {"embed_dim": 8} if "embed_dim" in spec.model_kwargs else {}
    if spec.keyword is None:
        return
    assert spec.keyword in spec.accepts and spec.keyword in init
    loss = build_loss(name, **kw)
    v, t, extra = _batch(spec)
    base = 0.2 if spec.keyword == "margin" else 0.07
    assert torch.isfinite(loss(v, t, **extra, **{spec.keyword: base}))
    per = torch.linspace(base, 2 * base, 6)
    if spec.per_sample:
        assert torch.isfinite(loss(v, t, **extra, **{spec.keyword: per}))
    else:
        with pytest.raises((ValueError, TypeError)):
            loss(v, t, **extra, **{spec.keyword: per})


def test_bench_grid_follows_the_declaration():
    from xmodal.reporting.benchgrid import Cell, cell_config

    assert cell_config(Cell("synthetic", "ncl", True, 0)).schedule.class_temperature is False
    assert cell_config(Cell("synthetic", "infonce", True, 0)).schedule.class_temperature is True
    mm = cell_config(Cell("synthetic", "maxmargin", True, 0))
    assert mm.schedule.t_min == 0.1  # margin values
    assert cell_config(Cell("synthetic", "ncl", False, 0)).loss.kwargs["queue_size"] == 16384


def test_margin_on_a_temperature_loss_and_learnable_without_support_fail(tmp_path):
    from xmodal.config import from_dict
    from xmodal.training.loop import build_loss_from_config

    with pytest.raises(ValueError, match="loss.margin"):
        build_loss_from_config(from_dict({"loss": {"name": "infonce", "margin": 0.2}}))
    with pytest.raises(ValueError, match="loss.learnable"):
        build_loss_from_config(from_dict({"loss": {"name": "ntxent", "learnable": True}}))
    loss = build_loss_from_config(from_dict({"loss": {"name": "calince"}, "model": {"dim": 12}}),
                                  video_dim=5, text_dim=7)
    assert loss.generator is not None


@pytest.mark.usefixtures("one_thread")
def test_loss_terms_are_logged_when_exposed(tmp_path):
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    cfg = from_dict({
        "data": {"name": "synthetic", "synthetic": {"num_train": 120, "num_val": 60, "num_test": 60,
                                                    "num_concepts": 10}},
        "model": {"dim": 16}, "loss": {"name": "calince", "temperature": 0.1}, "optim": {"lr": 3e-3},
        "test_time": {"normalizers": ["none"], "bank_size": 100, "oracle": False},
        "train": {"seed": 0, "epochs": 1, "batch_size": 32, "patience": 0, "progress": False}})
    train(cfg, tmp_path)
    rec = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[0])
    # Cali-NCE exposes its terms in last_terms (key names belong to the loss)
    assert len(rec["loss_terms"]) >= 2
    assert all(isinstance(x, float) for x in rec["loss_terms"].values())
