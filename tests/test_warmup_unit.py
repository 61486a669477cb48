"""``optim.warmup_unit``: the LR warm-up per step (xmodal's default) or per epoch, as the CrossCLR
release (github amazon-science/crossmodal-contrastive-learning, commit 060674e) warms up: its
``trainer/optimizer.py`` ``ReduceLROnPlateauWarmup`` sets one LR before each epoch,
``base * epoch / warmup_epochs`` for epochs 1..W, then hands over to ``ReduceLROnPlateau`` on the
validation score; ``trainer/trainer.py`` calls ``step_rop`` once after every epoch. Below, a literal
transcription of both drives the reference LRs, fed the validation scores of an xmodal run; xmodal's
LR of every optimiser step must equal the release's LR of that step's epoch.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch.optim.lr_scheduler import ReduceLROnPlateau

import xmodal.training.loop as loop_module
from xmodal.config import from_dict
from xmodal.training.loop import train
from xmodal.training.parts import cosine_lr

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------- the release, transcribed


class RefReduceLROnPlateauWarmup(ReduceLROnPlateau):  # trainer/optimizer.py, the file's last class
    def __init__(self, optimizer, warmup_epochs, **kwargs):
        self.warmup_epochs = warmup_epochs
        super().__init__(optimizer, **kwargs)
        self.base_lrs = []
        for group in optimizer.param_groups:
            self.base_lrs.append(group["lr"])
        self.step_rop(self.mode_worse, False, None)
        self.current_lr = self.base_lrs[0]

    def step_rop(self, metrics, do_eval, epoch=None):
        assert epoch is None
        epoch = self.last_epoch + 1

        if epoch <= self.warmup_epochs:
            factor = epoch / self.warmup_epochs
            self.last_epoch = epoch
            self.current_lr = self.base_lrs[0] * factor
            for i, param_group in enumerate(self.optimizer.param_groups):
                param_group['lr'] = self.base_lrs[i] * factor
        elif not do_eval:
            pass
        else:
            super().step(metrics, epoch=epoch)


def release_lrs(base_lr, warmup_epochs, patience, cooldown, val_scores, steps_per_epoch):
    """The LR of every step of the release's train_loop (trainer/trainer.py: the scheduler built in
    __init__, ``step_rop(det_best_field_current, True)`` after each epoch's validation)."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base_lr)
    scheduler = RefReduceLROnPlateauWarmup(optimizer, warmup_epochs, mode="max", patience=patience,
                                           cooldown=cooldown)
    lrs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation of step(metrics, epoch=...)
        for score in val_scores:
            lrs += [optimizer.param_groups[0]["lr"]] * steps_per_epoch
            scheduler.step_rop(score, True)
    return lrs


# ------------------------------------------------------------- xmodal


TINY = {"num_train": 120, "num_val": 60, "num_test": 60, "num_concepts": 10}


def tiny_config(**optim):
    return from_dict({
        "data": {"name": "synthetic", "synthetic": dict(TINY)},
        "model": {"kind": "linear", "dim": 16},
        "loss": {"name": "infonce", "temperature": 0.1},
        "optim": {"name": "adam", "lr": 3e-3, "warmup_epochs": 3, "scheduler": "plateau", "plateau_patience": 1,
                  "plateau_cooldown": 1, **optim},
        "test_time": {"normalizers": ["none"], "bank_size": 50},
        "train": {"seed": 3, "epochs": 9, "batch_size": 40, "patience": 0, "progress": False, "device": "cpu"}})


def run_recording_lrs(cfg, out, monkeypatch):
    """Train ``cfg``; the LR of every optimiser step (a step pre-hook) and the log's records."""
    lrs: list[float] = []
    make = loop_module.make_optimizer

    def recording(*args, **kwargs):
        optimizer = make(*args, **kwargs)
        optimizer.register_step_pre_hook(lambda opt, a, k: lrs.append(opt.param_groups[0]["lr"]))
        return optimizer

    monkeypatch.setattr(loop_module, "make_optimizer", recording)
    train(cfg, out)
    records = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    return lrs, [r for r in records if "epoch" in r]


def test_epoch_warmup_and_plateau_follow_the_release_step_by_step(tmp_path, monkeypatch):
    cfg = tiny_config(warmup_unit="epoch")
    lrs, records = run_recording_lrs(cfg, tmp_path / "epoch", monkeypatch)
    steps_per_epoch = records[0]["step"]
    assert len(records) == 9 and steps_per_epoch > 1 and len(lrs) == 9 * steps_per_epoch
    scores = [r["val_rsum"] for r in records]
    want = release_lrs(3e-3, 3, 1, 1, scores, steps_per_epoch)
    assert lrs == pytest.approx(want, rel=1e-12, abs=0)
    # the run exercised both halves: three warm-up levels, then at least one plateau reduction
    assert want[0] == pytest.approx(1e-3) and want[steps_per_epoch] == pytest.approx(2e-3)
    assert min(want) < 3e-3 / 2

    # the default (per step) rises inside each warm-up epoch instead: the release's LRs differ there
    step_lrs, _ = run_recording_lrs(tiny_config(), tmp_path / "step", monkeypatch)
    assert step_lrs[:3] == pytest.approx([3e-3 * (s + 1) / (3 * steps_per_epoch) for s in range(3)])
    assert step_lrs[:3] != pytest.approx(want[:3])


def test_epoch_warmup_then_cosine_against_a_loop():
    base, spe, w, total = 2.0, 5, 3, 40
    for step in range(total):
        epoch = step // spe
        if epoch < w:
            expected = base * (epoch + 1) / w
        else:
            import math

            expected = base * 0.5 * (1 + math.cos(math.pi * (step - w * spe) / (total - w * spe)))
        got = cosine_lr(step, base_lr=base, warmup_steps=w * spe, total_steps=total, epoch_steps=spe)
        assert got == pytest.approx(expected, rel=1e-12)
    # per step (epoch_steps 0) is unchanged: (step + 1) / warmup_steps
    assert [cosine_lr(s, base_lr=1.0, warmup_steps=4, total_steps=8) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]


def test_warmup_unit_is_validated_and_documented():
    from xmodal.config.doc import to_markdown

    assert from_dict({}).optim.warmup_unit == "step"
    with pytest.raises(ValueError, match="optim.warmup_unit: unknown value 'epochs'"):
        from_dict({"optim": {"warmup_unit": "epochs"}})
    with pytest.raises(ValueError, match="optim.warmup_epochs: must be a whole number with optim.warmup_unit"):
        from_dict({"optim": {"warmup_unit": "epoch", "warmup_epochs": 1.5}})
    assert from_dict({"optim": {"warmup_unit": "epoch", "warmup_epochs": 4}}).optim.warmup_unit == "epoch"
    text = to_markdown()
    assert "warmup_unit" in text and "ReduceLROnPlateauWarmup" in text


def test_doctests_of_the_lr_schedule():
    import doctest

    import xmodal.training.parts

    result = doctest.testmod(xmodal.training.parts)
    assert result.attempted > 0 and result.failed == 0
