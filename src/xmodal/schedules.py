"""Temperature and margin schedules (TS++ eqs. 4.1-4.6; TS: Kukleva et al., ICLR 2023).

A schedule ``s`` maps a training step to a value, ``s(step) = base + corr(step)``:

* :class:`Constant`: ``corr = 0``.
* :class:`Cosine` (eq. 4.1): ``corr(t) = (alpha (1 + cos(2 pi t / T)) - alpha) / 2``,
  i.e. ``base +- alpha/2`` with period ``T``.
* :class:`Linear` (eq. 4.2): ``corr(t) = -alpha/2 + alpha t / t_max`` (``t`` clamped to
  ``[0, t_max]``), from ``base - alpha/2`` to ``base + alpha/2``.

Class-dependent values (eqs. 4.3-4.4): :class:`ClassTemperature` / :class:`ClassMargin`
interpolate linearly in the class count between a minimum and a maximum. Which end the
frequent classes get is the ``frequent`` argument, default ``"max"``: frequent (dense)
classes get the *high* temperature, rare classes the low one, as the thesis states
(sec. 4.1.2, "Temperature in the InfoNCE loss"): "frequent classes get higher temperatures
to better capture the local semantic structure and less frequent classes get the lower
temperatures to make their representations more separable" (eq. 4.3 maps the most
frequent class to ``tau_max``). Margins follow the same rule (eq. 4.4 maps it to
``m_max``); pass ``frequent="min"`` for the opposite.

The per-sample value is ``tau_i = tau(c_i) + corr(t)`` (eq. 4.5; ``m_i``: eq. 4.6) via
:meth:`ClassTemperature.per_sample`, passed to a loss as ``temperature=`` (or ``margin=``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from xmodal._validate import as_tensor, choice, flag, positive_number, short_repr

__all__ = ["Schedule", "Constant", "Cosine", "Linear", "ClassTemperature", "ClassMargin", "counts_from_labels"]


def _number(v, name: str) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of several values
        raise TypeError(f"{name}: expected a number, got {short_repr(v)}") from None
    if not math.isfinite(f):
        raise ValueError(f"{name}: must be finite, got {short_repr(v)}")
    return f


def _step(step) -> float:
    s = _number(step, "step")
    if s < 0:
        raise ValueError(f"step: must be >= 0, got {short_repr(step)}")
    return s


class Schedule:
    """Base: ``s(step) = base + correction(step)``; the value must stay > 0
    (``allow_zero=True``: >= 0, for margins)."""

    base: float = 0.0
    alpha: float = 0.0
    allow_zero: bool = False

    def correction(self, step) -> float:
        """The additive term ``corr(step)`` (0 for :class:`Constant`)."""
        return 0.0

    def _check_range(self) -> None:
        low = self.base - abs(self.alpha) / 2
        if low < 0 or (low == 0 and not self.allow_zero):
            raise ValueError(f"base/alpha: the schedule reaches {low} (base - |alpha|/2); "
                             f"values must stay {'>= 0' if self.allow_zero else '> 0'}")

    def __call__(self, step) -> float:
        return self.base + self.correction(step)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class Constant(Schedule):
    """``s(step) = v``."""

    def __init__(self, v: float, *, allow_zero: bool = False) -> None:
        self.base, self.alpha, self.allow_zero = _number(v, "v"), 0.0, flag(allow_zero, "allow_zero")
        self._check_range()


class Cosine(Schedule):
    """TS++ eq. 4.1: ``base + (alpha (1 + cos(2 pi t / period)) - alpha) / 2``.

    Examples:
        >>> s = Cosine(0.07, 0.06, 100)       # base 0.07, amplitude 0.06, period 100 steps
        >>> round(s(0), 3), round(s(25), 3), round(s(50), 3)
        (0.1, 0.07, 0.04)
    """

    def __init__(self, base: float, alpha: float, period: int, *, allow_zero: bool = False) -> None:
        self.base, self.alpha = _number(base, "base"), _number(alpha, "alpha")
        self.period = positive_number(period, "period")
        self.allow_zero = flag(allow_zero, "allow_zero")
        self._check_range()

    def correction(self, step) -> float:
        t = _step(step)
        return (self.alpha * (1.0 + math.cos(2.0 * math.pi * t / self.period)) - self.alpha) / 2.0


class Linear(Schedule):
    """TS++ eq. 4.2: ``base - alpha/2 + alpha t / total_steps`` (``t`` clamped to ``total_steps``)."""

    def __init__(self, base: float, alpha: float, total_steps: int, *, allow_zero: bool = False) -> None:
        self.base, self.alpha = _number(base, "base"), _number(alpha, "alpha")
        self.total_steps = positive_number(total_steps, "total_steps")
        self.allow_zero = flag(allow_zero, "allow_zero")
        self._check_range()

    def correction(self, step) -> float:
        t = min(_step(step), self.total_steps)
        return -self.alpha / 2.0 + self.alpha * t / self.total_steps


class ClassTemperature:
    """Per-class temperature linear in the class count (TS++ eq. 4.3), plus a schedule (eq. 4.5).

    ``tau(c) = lo + (hi - lo) * (n_c - n_min) / (n_max - n_min)`` with ``(lo, hi) =
    (t_min, t_max)`` when ``frequent="max"`` (the most frequent class gets ``t_max``,
    the rarest ``t_min``) and ``(t_max, t_min)`` when ``frequent="min"``. If every class
    has the same count, every class gets the midpoint ``(t_min + t_max) / 2``.

    Args:
        class_counts: ``[C]`` non-negative counts (e.g. ``xmodal.data.class_counts``).
        t_min, t_max: the range, ``0 < t_min <= t_max``.
        frequent: ``"max"`` or ``"min"``: the end the most frequent class gets.
        schedule: optional :class:`Schedule` whose ``correction(step)`` is added
            (eq. 4.5); its ``base`` is ignored.

    Shape:
        ``values``: ``[C]`` float64; ``per_sample(class_ids [B], step)`` -> ``[B]``.

    Examples:
        >>> ct = ClassTemperature([100, 10, 1], t_min=0.04, t_max=0.1)   # class 0 is the most frequent
        >>> [round(float(t), 4) for t in ct.values]
        [0.1, 0.0455, 0.04]
    """

    allow_zero = False
    _names = ("t_min", "t_max")

    def __init__(self, class_counts, t_min: float, t_max: float, *, frequent: str = "max",
                 schedule: Schedule | None = None) -> None:
        lo_name, hi_name = self._names
        lo, hi = _number(t_min, lo_name), _number(t_max, hi_name)
        if lo < 0 or (lo == 0 and not self.allow_zero):
            raise ValueError(f"{lo_name}: must be {'>= 0' if self.allow_zero else '> 0'}, got {short_repr(t_min)}")
        if hi < lo:
            raise ValueError(f"{hi_name}: must be >= {lo_name} ({lo}), got {short_repr(t_max)}")
        self.frequent = choice(frequent, "frequent", ("max", "min"))
        counts = as_tensor(class_counts, "class_counts").to(torch.float64)
        if counts.ndim != 1 or counts.numel() == 0:
            raise ValueError(f"class_counts: expected a non-empty 1-d array, got shape {tuple(counts.shape)}")
        if not bool(torch.isfinite(counts).all()) or bool((counts < 0).any()):
            raise ValueError("class_counts: must be finite and >= 0")
        if schedule is not None and not isinstance(schedule, Schedule):
            raise TypeError(f"schedule: expected a Schedule, got {type(schedule).__name__}")
        self.t_min, self.t_max, self.schedule = lo, hi, schedule
        span = float(counts.max() - counts.min())
        if span == 0:
            frac = torch.full_like(counts, 0.5)
        else:
            frac = (counts - counts.min()) / span
        if self.frequent == "min":
            frac = 1.0 - frac
        self.values = lo + (hi - lo) * frac

    def __call__(self, class_ids) -> torch.Tensor:
        """``tau(c_i)`` for each sample (no schedule term)."""
        return self.per_sample(class_ids, None)

    def per_sample(self, class_ids, step=None, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``tau(c_i) + corr(step)`` (TS++ eq. 4.5); ``step=None`` or no schedule: no correction.

        Raises:
            ValueError: class id out of range, or a resulting value not > 0 (>= 0 for margins).
        """
        ids = as_tensor(class_ids, "class_ids")
        if ids.is_floating_point() or ids.dtype == torch.bool:
            raise TypeError(f"class_ids: expected integers, got {ids.dtype}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.values.numel()):
            raise ValueError(f"class_ids: must lie in [0, {self.values.numel()})")
        out = self.values.to(ids.device)[ids.long()]
        if self.schedule is not None and step is not None:
            out = out + self.schedule.correction(step)
        low = float(out.min()) if out.numel() else 1.0
        if low < 0 or (low == 0 and not self.allow_zero):
            raise ValueError(f"step: the scheduled value reaches {low}; it must stay "
                             f"{'>= 0' if self.allow_zero else '> 0'} (lower alpha or raise the minimum)")
        return out.to(dtype)


class ClassMargin(ClassTemperature):
    """Per-class margin linear in the class count (TS++ eq. 4.4); see :class:`ClassTemperature`.

    ``0 <= m_min <= m_max``; margins may be 0.
    """

    allow_zero = True
    _names = ("m_min", "m_max")

    def __init__(self, class_counts, m_min: float, m_max: float, *, frequent: str = "max",
                 schedule: Schedule | None = None) -> None:
        super().__init__(class_counts, m_min, m_max, frequent=frequent, schedule=schedule)


def counts_from_labels(labels, num_classes: int | None = None) -> np.ndarray:
    """Class counts ``[C]`` from integer labels (:func:`xmodal.data.class_counts`: ids checked,
    memory bounded by the largest id); ``num_classes`` None or 0: ``max(labels) + 1``."""
    from xmodal.data.classes import class_counts

    arr = np.asarray(labels.detach().cpu() if isinstance(labels, torch.Tensor) else labels)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer) or (arr.size and arr.min() < 0):
        raise ValueError("labels: expected a 1-d array of non-negative integers")
    if num_classes is not None and (isinstance(num_classes, (bool, np.bool_))
                                    or not isinstance(num_classes, (int, np.integer)) or num_classes < 0):
        raise TypeError(f"num_classes: expected None or an integer >= 0, got {short_repr(num_classes)}")
    return class_counts(arr, int(max(num_classes or 0, arr.max(initial=-1) + 1)))
