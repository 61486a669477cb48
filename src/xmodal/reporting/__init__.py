"""What a person reads: the self-contained HTML report (:mod:`~xmodal.reporting.report`), the plots
(:mod:`~xmodal.reporting.plots`) and the objectives x normalisers grid (:mod:`~xmodal.reporting.benchgrid`).

May import anything below the CLI (training, retrieval, features, models, metrics, data); never ``commands``.
"""

from __future__ import annotations

import importlib

_EXPORTS = {"build_report": "report", "run_report": "report", "bench_report": "report",
            "plot_run": "plots", "run_grid": "benchgrid"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"xmodal.reporting.{_EXPORTS[name]}"), name)
    if name in ("report", "plots", "benchgrid"):
        return importlib.import_module(f"xmodal.reporting.{name}")
    raise AttributeError(f"module 'xmodal.reporting' has no attribute {name!r}")
