"""The per-step (and per-sample) temperature or margin a run feeds its loss (TS++ ch. 4).

Which quantity is scheduled, and whether it may be per-sample, comes from the loss's
declaration (:func:`xmodal.losses.loss_spec`), nowhere else.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from xmodal.config import Config


def base_value(cfg: Config, loss: nn.Module) -> float:
    """The scheduled quantity's base: the margin for margin losses, else the temperature."""
    from xmodal.losses import loss_spec

    if loss_spec(cfg.loss.name).keyword == "margin":
        return float(cfg.loss.margin if cfg.loss.margin is not None else getattr(loss, "margin", 0.2))
    return float(cfg.loss.temperature if cfg.loss.temperature is not None else 0.05)


def loss_temperature(cfg: Config, loss: nn.Module) -> float:
    """The temperature the trained model uses at test time (the learned one if any)."""
    t = getattr(loss, "temperature", None)
    try:
        if t is not None and (not isinstance(t, torch.Tensor) or t.numel() == 1):
            return float(t.detach()) if isinstance(t, torch.Tensor) else float(t)
    except (TypeError, ValueError):
        pass
    return float(cfg.loss.temperature if cfg.loss.temperature is not None else 0.05)


def text_classes(cfg: Config, train) -> np.ndarray:
    """A class id per training text for TS++ class temperatures: dataset labels, or
    k-means over the training caption features (TS++ sec. 4.1.2)."""
    import xmodal.data as xdata

    s = cfg.schedule
    if s.classes == "labels":
        if train.text_labels is not None:
            return np.asarray(train.text_labels)
        if train.video_labels is not None:
            return np.asarray(train.video_labels)[train.text_to_video]
        raise ValueError("schedule.classes: 'labels' but the training split has no class labels; use kmeans")
    return np.asarray(xdata.kmeans_classes(train.text, k=min(s.k, train.num_texts), seed=cfg.train.seed))


def cosine_period(*, cycles: int, period_epochs: float, steps_per_epoch: int, epochs: int) -> float:
    """The period ``T`` (in steps) of the cyclic cosine schedule (TS++ eq. 4.1).

    ``cycles > 0``: ``(total_steps - 1) / cycles`` with ``total_steps = epochs *
    steps_per_epoch``, so steps ``0`` and ``total_steps - 1`` (the last update) both sit
    at a peak ``cos(2 pi t / T) = 1`` and ``cycles`` whole cycles lie between (sec. 4.1.1:
    3-5 complete cycles, training ends at the peak). Otherwise ``period_epochs *
    steps_per_epoch`` rounded to whole steps.

    >>> cosine_period(cycles=3, period_epochs=10, steps_per_epoch=10, epochs=31)
    103.0
    """
    if cycles > 0:
        return max(1, epochs * steps_per_epoch - 1) / cycles
    return float(max(1, int(round(period_epochs * steps_per_epoch))))


class TemperaturePlan:
    """Per-step (and optionally per-sample) temperature or margin for the loss (TS++).

    Without class values: ``s(step)`` of a ``Constant``/``Cosine`` (eq. 4.1)/``Linear``
    (eq. 4.2) schedule around the loss's base value. With class values (eqs. 4.3/4.4):
    ``value_i = v(c_i) + corr(step)`` (eqs. 4.5/4.6) for the class ``c_i`` of each text,
    ``v`` between ``schedule.t_min``/``t_max`` (temperatures) or ``schedule.m_min``/``m_max``
    (margins). The cosine period: :func:`cosine_period`. With ``schedule.directions``
    ``t2v`` / ``v2t`` the values go to the loss's ``t2v_temperature`` /
    ``v2t_temperature`` keyword only (``keyword``), so the other direction keeps the
    base temperature (thesis sec. 5.6.4, asymmetric TS).
    Inactive (the loss keeps its own value) when nothing is scheduled.
    """

    def __init__(self, cfg: Config, loss: nn.Module, train, steps_per_epoch: int) -> None:
        from xmodal.losses import loss_spec

        s = cfg.schedule
        spec = loss_spec(cfg.loss.name)
        self.keyword = spec.keyword or "temperature"
        wanted = s.kind != "constant" or s.class_temperature
        if s.directions != "both" and wanted:
            # thesis sec. 5.6.4: the schedule drives one InfoNCE direction, the other keeps the
            # loss's base temperature (the loss's own ``temperature``)
            self.keyword = f"{s.directions}_temperature"
            if self.keyword not in spec.accepts:
                raise ValueError(f"schedule.directions: loss {cfg.loss.name!r} has no per-direction "
                                 f"temperature (use infonce or dcl, or directions: both)")
        if wanted and spec.keyword is None:
            raise ValueError(f"schedule.kind: loss {cfg.loss.name!r} has no temperature or margin to schedule")
        if s.class_temperature and not spec.per_sample:
            raise ValueError(f"schedule.class_temperature: loss {cfg.loss.name!r} takes one {self.keyword} "
                             f"per step, not per-sample values")
        if wanted and cfg.loss.learnable:
            raise ValueError("schedule.kind: a temperature schedule is not combinable with loss.learnable")
        self.active = wanted
        self.base = base_value(cfg, loss)
        self.schedule = None
        self.classes: torch.Tensor | None = None
        self.class_values: np.ndarray | None = None
        self.class_counts: np.ndarray | None = None
        self.per_class = None
        if not self.active:
            return
        import xmodal.schedules as sch

        margin = self.keyword == "margin"
        try:
            if s.kind == "cosine":
                period = cosine_period(cycles=s.cycles, period_epochs=s.period_epochs,
                                       steps_per_epoch=steps_per_epoch, epochs=cfg.train.epochs)
                self.schedule = sch.Cosine(self.base, s.alpha, period, allow_zero=margin)
            elif s.kind == "linear":
                self.schedule = sch.Linear(self.base, s.alpha, max(1, cfg.train.epochs * steps_per_epoch),
                                           allow_zero=margin)
            else:
                self.schedule = sch.Constant(self.base, allow_zero=margin)
        except ValueError as exc:
            raise ValueError(f"schedule.alpha: {exc}") from None
        if s.class_temperature:
            import xmodal.data as xdata

            _, inverse = np.unique(text_classes(cfg, train), return_inverse=True)
            counts = np.asarray(xdata.class_counts(inverse), dtype=np.float64)
            cls = sch.ClassMargin if margin else sch.ClassTemperature
            low, high = (s.m_min, s.m_max) if margin else (s.t_min, s.t_max)
            self.per_class = cls(counts, low, high, schedule=self.schedule)
            self.class_counts = counts
            self.class_values = self.per_class.values.numpy()
            self.classes = torch.as_tensor(inverse, dtype=torch.long)
            self.per_class.per_sample(torch.arange(len(counts)), 0)  # fail early on a non-positive value

    def __call__(self, step: int, text_idx: np.ndarray) -> float | torch.Tensor | None:
        if not self.active:
            return None
        if self.per_class is None:
            return float(self.schedule(step))
        return self.per_class.per_sample(self.classes[torch.as_tensor(text_idx)], step)

    def mean_value(self, step: int) -> float:
        """The scheduled value at ``step`` (averaged over training texts with class values)."""
        if self.per_class is None:
            return float(self.schedule(step))
        return float(self.per_class.values[self.classes].mean() + self.schedule.correction(step))
