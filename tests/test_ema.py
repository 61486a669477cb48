"""``optim.ema``: the weights validated, snapshotted and written to ``model.pt`` are the
exponential moving average of the optimiser's weights, checked against a naive loop over
the weights recorded after every optimisation step."""

from __future__ import annotations

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from test_train import tiny_config
from xmodal.config import from_dict, to_dict
from xmodal.training.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")


def _model_weights(path):
    return torch.load(path, weights_only=True)["model"]["state_dict"]


@pytest.mark.parametrize("decay", [0.5, 0.9])
def test_model_pt_holds_the_naive_ema_of_every_step(tmp_path, decay):
    cfg = tiny_config(model={"kind": "mlp", "dim": 16, "width": 32, "dropout": 0.2},
                      optim={"ema": decay}, train={"epochs": 2})
    steps: list[list[torch.Tensor]] = []
    handle = register_optimizer_step_post_hook(
        lambda opt, args, kwargs: steps.append([p.detach().clone() for g in opt.param_groups for p in g["params"]]))
    try:
        summary = train(cfg, tmp_path / "run", verbose=False)
    finally:
        handle.remove()
    assert len(steps) > 4
    # the naive average: the first step copies, then avg <- d avg + (1 - d) w after every step
    avg = [w.clone() for w in steps[0]]
    per_epoch = len(steps) // 2
    history = []
    for i, ws in enumerate(steps[1:], start=1):
        avg = [decay * a + (1 - decay) * w for a, w in zip(avg, ws)]
        if (i + 1) % per_epoch == 0:
            history.append([a.clone() for a in avg])
    best = history[summary["best_epoch"] - 1]
    saved = _model_weights(tmp_path / "run" / "model.pt")
    params = [k for k in saved if k.endswith((".weight", ".bias")) and "standardize" not in k]
    assert 0 < len(params) <= len(best)  # the optimiser holds the model's parameters first, then the loss's
    for name, ref in zip(params, best):
        torch.testing.assert_close(saved[name], ref, rtol=1e-6, atol=1e-7, msg=name)
    # and it is not the optimiser's last weights
    assert not all(torch.allclose(saved[n], w) for n, w in zip(params, steps[-1]))


def test_ema_changes_what_is_validated(tmp_path):
    plain = train(tiny_config(train={"epochs": 2}), tmp_path / "plain", verbose=False)
    ema = train(tiny_config(train={"epochs": 2}, optim={"ema": 0.9}), tmp_path / "ema", verbose=False)
    assert plain["val"] != ema["val"]


@pytest.mark.parametrize("bad", [1.0, -0.1, 2, "0.9"])
def test_ema_outside_0_1_is_refused_before_training(bad):
    d = to_dict(tiny_config())
    d["optim"]["ema"] = bad
    with pytest.raises((ValueError, TypeError), match="optim.ema"):
        from_dict(d)


def test_keep_last_saves_the_final_epoch_not_the_best(tmp_path):
    """``train.keep: last``: model.pt holds the last epoch's weights (the checkpoint's). The same
    config under the default ``best`` keeps an earlier epoch (val peaks at epoch 5 of 6), so the
    test tells the two apart."""
    sections = dict(train={"epochs": 6, "patience": 0}, optim={"lr": 0.1})
    best = train(tiny_config(**sections), tmp_path / "best", verbose=False)
    assert best["best_epoch"] < best["epochs_run"] == 6
    sections["train"]["keep"] = "last"
    summary = train(tiny_config(**sections), tmp_path / "last", verbose=False)
    assert summary["best_epoch"] == summary["epochs_run"] == 6
    last = torch.load(tmp_path / "last" / "checkpoint.pt", weights_only=True)["model"]["state_dict"]
    saved = _model_weights(tmp_path / "last" / "model.pt")
    assert saved.keys() == last.keys()
    for k in saved:
        assert torch.equal(saved[k], last[k]), k
    kept_best = _model_weights(tmp_path / "best" / "model.pt")
    assert not all(torch.equal(kept_best[k], saved[k]) for k in saved)


def test_keep_last_with_patience_is_refused():
    d = to_dict(tiny_config())
    d["train"].update(keep="last", patience=3)
    with pytest.raises(ValueError, match="train.keep"):
        from_dict(d)
    d["train"].update(keep="newest", patience=0)
    with pytest.raises(ValueError, match="train.keep"):
        from_dict(d)
