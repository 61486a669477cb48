"""How a model is trained.

- :mod:`~xmodal.training.loop`: ``train(config, out)``, the epoch loop and its wiring (read top to bottom).
- :mod:`~xmodal.training.inmemory`: ``fit(config, splits)``, training on in-memory PairedSplits
  (``xmodal.training.fit``).
- :mod:`~xmodal.training.runlog` / :mod:`~xmodal.training.provenance`: what a run reports
  (epoch line, ``log.jsonl``/``log.csv``/TensorBoard) and records (``provenance.json``).
- :mod:`~xmodal.training.parts`: the loss built from a config, learning-rate schedule, gradient averaging.
- :mod:`~xmodal.training.schedule_plan`: temperature / margin schedules per step (TS++).
- :mod:`~xmodal.training.sampling`: epoch batches (class-balanced and multi-caption sampling).

May import: config, data, losses, models, retrieval, runs, dist (never commands or reporting).
"""

__all__ = ["fit"]


def __getattr__(name: str):
    if name == "fit":  # lazy: importing the package stays cheap
        from xmodal.training.inmemory import fit

        return fit
    raise AttributeError(f"module 'xmodal.training' has no attribute {name!r}")
