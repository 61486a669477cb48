"""How a model is trained.

- :mod:`~xmodal.training.loop`: ``train(config, out)``, the epoch loop and its wiring (read top to bottom).
- :mod:`~xmodal.training.parts`: the loss built from a config, learning-rate schedule, gradient averaging.
- :mod:`~xmodal.training.schedule_plan`: temperature / margin schedules per step (TS++).
- :mod:`~xmodal.training.sampling`: epoch batches (class-balanced and multi-caption sampling).

The former modules ``xmodal.train``, ``xmodal.trainparts``, ``xmodal.schedule_plan`` and
``xmodal.sampling`` remain importable and are these very modules.
"""
