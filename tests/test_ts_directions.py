"""TS++ asymmetric schedules (thesis sec. 5.6.4: ``schedule.directions``) against a hand
computation of the two InfoNCE directions, and the exact / mini-batch k-means switch."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

import xmodal.data as xdata
import xmodal.data.classes as classes
from xmodal.config import from_dict
from xmodal.losses import build_loss
from xmodal.training.parts import loss_extras
from xmodal.training.schedule_plan import TemperaturePlan

BASE = 0.07


def _cfg(directions, loss="infonce"):
    return from_dict({"data": {"name": "synthetic"},
                      "loss": {"name": loss, "temperature": BASE},
                      "train": {"epochs": 4, "batch_size": 8},
                      "schedule": {"kind": "cosine", "alpha": 0.06, "cycles": 3, "directions": directions}})


def _hand_infonce(v, t, tau_t2v, tau_v2t):
    """Both InfoNCE directions by loops: s_ij = t_i . v_j of unit rows (float64)."""
    unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
    v, t = unit(v), unit(t)
    n = len(v)
    s = [[float(np.dot(t[i], v[j])) for j in range(n)] for i in range(n)]
    t2v = sum(-(s[i][i] / tau_t2v) + math.log(sum(math.exp(s[i][j] / tau_t2v) for j in range(n)))
              for i in range(n)) / n
    v2t = sum(-(s[j][j] / tau_v2t) + math.log(sum(math.exp(s[i][j] / tau_v2t) for i in range(n)))
              for j in range(n)) / n
    return (t2v + v2t) / 2


@pytest.mark.parametrize("directions", ["t2v", "v2t", "both"])
def test_one_direction_schedule_leaves_the_other_at_the_base_temperature(directions):
    cfg = _cfg(directions)
    train = xdata.synthetic(num_train=40, num_val=10, num_test=10, seed=0)["train"]
    loss = build_loss("infonce", temperature=BASE)
    plan = TemperaturePlan(cfg, loss, train, steps_per_epoch=5)
    rng = np.random.default_rng(1)
    v, t = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
    ids = torch.arange(6)
    for step in (0, 3, 7):  # 7: a low-temperature phase of the 3-cycle cosine
        tau_s = plan(step, np.arange(6))
        assert tau_s != pytest.approx(BASE) or step == 0
        extra = loss_extras(loss, ids=ids, video_in=torch.zeros(6, 2), text_in=torch.zeros(6, 2),
                            scheduled=tau_s, keyword=plan.keyword)
        got = float(loss(torch.from_numpy(v), torch.from_numpy(t), **extra))
        tau_t2v = tau_s if directions in ("t2v", "both") else BASE
        tau_v2t = tau_s if directions in ("v2t", "both") else BASE
        assert got == pytest.approx(_hand_infonce(v, t, tau_t2v, tau_v2t), rel=1e-12)
        if directions != "both" and step == 7:  # and it differs from scheduling both
            assert got != pytest.approx(_hand_infonce(v, t, tau_s, tau_s), rel=1e-6)


def test_directions_refused_for_losses_without_per_direction_temperatures():
    with pytest.raises(ValueError, match="schedule.directions"):
        _cfg("sideways")
    cfg = _cfg("t2v", loss="ntxent")
    train = xdata.synthetic(num_train=40, num_val=10, num_test=10, seed=0)["train"]
    with pytest.raises(ValueError, match="schedule.directions"):
        TemperaturePlan(cfg, build_loss("ntxent", temperature=BASE), train, steps_per_epoch=5)


def test_kmeans_exact_up_to_the_threshold_minibatch_above_and_logged(monkeypatch, caplog):
    from sklearn.cluster import KMeans

    assert classes.EXACT_KMEANS_MAX >= 100_000
    monkeypatch.setattr(classes, "EXACT_KMEANS_MAX", 60)
    x = np.random.default_rng(0).normal(size=(61, 4)).astype(np.float32)
    with caplog.at_level(logging.INFO, logger="xmodal.data.classes"):
        exact = classes.kmeans_classes(x[:60], k=4, seed=0)
        classes.kmeans_classes(x, k=4, seed=0)
    msgs = [r.getMessage() for r in caplog.records]
    assert "exact KMeans over 60" in msgs[0] and "MiniBatchKMeans (approximate) over 61" in msgs[1]
    unit = x[:60] / np.linalg.norm(x[:60], axis=1, keepdims=True)
    np.testing.assert_array_equal(exact, KMeans(n_clusters=4, random_state=0, n_init=1).fit_predict(unit))
