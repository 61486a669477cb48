"""Experiment trackers of ``train.log_to``: ``mlflow`` and ``wandb`` (optional extras of those names).

They get what TensorBoard gets (:mod:`xmodal.training.runlog`): the per-step and per-epoch scalars under
the same tags at the same steps, the config and the provenance at the start, the final per-normaliser
tables at the end.

- ``mlflow``: MLflow's own default store, kept inside the run: ``RUN/mlflow.db`` (SQLite, MLflow 3's
  default backend; artifacts in ``RUN/mlartifacts/``); ``MLFLOW_TRACKING_URI`` overrides (a server, another
  store), ``MLFLOW_EXPERIMENT_NAME`` names the experiment (default ``xmodal``). MLflow's metric names
  refuse ``@``, so a tag's ``@`` is written ``_at_`` (``val/t2v/R@1`` -> ``val/t2v/R_at_1``,
  :func:`mlflow_key`). Scalars are metrics, the flattened config is params (``model.kind`` ...),
  ``config.json`` / ``provenance.json`` / ``metrics.json`` are artifacts, the code revision a tag.
- ``wandb``: offline mode in ``RUN/wandb/`` (``wandb sync RUN/wandb/offline-run-*`` uploads it later)
  unless ``WANDB_MODE`` says otherwise; ``WANDB_PROJECT`` names the project (default ``xmodal``). Scalars
  are history rows at the step, the config is the run's config (the provenance under ``provenance``),
  the final tables the run's summary.

Resume: ``RUN/trackers.json`` records each tracker's run (MLflow run id and store, W&B run id) and how
many epochs were sent. Scalars are held back until the epoch's checkpoint is written and sent right
after it, so a killed run never sent steps past its checkpoint; a resumed run reopens the same tracker
run (W&B: a new offline stream of the same run id) and sends the last checkpointed epoch's scalars
only if they were not sent before. A kill in the moment between the checkpoint and the send loses that
epoch's per-step scalars (its per-epoch ones are sent on resume).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Any

TRACKERS_FILE = "trackers.json"
TRACKERS = ("mlflow", "wandb")
#: What a fresh run removes from its folder besides the TensorBoard event files (``xmodal.runs``).
TRACKER_FILES = ("mlflow.db", TRACKERS_FILE)
TRACKER_DIRS = ("mlartifacts", "wandb")


def mlflow_key(tag: str) -> str:
    """A TensorBoard tag as an MLflow metric name (``@`` -> ``_at_``; other refused characters -> ``_``).

    >>> mlflow_key("val/t2v/R@10")
    'val/t2v/R_at_10'
    """
    return re.sub(r"[^\w.\- :/]", "_", tag.replace("@", "_at_"))


def flat_params(config: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as ``{"section.key": "value"}`` (MLflow params are strings)."""
    out: dict[str, str] = {}
    for k, v in config.items():
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flat_params(v, name))
        else:
            out[name] = json.dumps(v) if isinstance(v, (dict, list, tuple, type(None), bool)) else str(v)
    return out


def read_state(out: Path) -> dict:
    try:
        state = json.loads((out / TRACKERS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return state if isinstance(state, dict) else {}


def write_state(out: Path, state: dict) -> None:
    from xmodal.runs import atomic_write_text

    atomic_write_text(out / TRACKERS_FILE, json.dumps(state, indent=1) + "\n")


class MlflowTracker:
    """One MLflow run of an ``xmodal train`` run (created, or reopened from ``previous`` on resume)."""

    name = "mlflow"

    def __init__(self, out: Path, previous: dict | None = None) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise ValueError("train.log_to: 'mlflow' needs MLflow (pip install 'xmodal[mlflow]')") from None
        previous = previous or {}
        own = previous.get("store", "run" if not os.environ.get("MLFLOW_TRACKING_URI") else "uri") == "run"
        uri = ("sqlite:///" + str((out / "mlflow.db").resolve())) if own else \
            previous.get("tracking_uri") or os.environ["MLFLOW_TRACKING_URI"]
        if own and not (out / "mlflow.db").exists():
            _forget_cached_store(uri)  # a fresh run replaced the file an earlier run of this process opened
        with _quiet("mlflow", "alembic"):
            self.client = MlflowClient(tracking_uri=uri)
            run_id = previous.get("run_id")
            if run_id:  # a resumed run continues its MLflow run
                self.client.update_run(run_id, status="RUNNING")
            else:
                name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "xmodal"
                exp = self.client.get_experiment_by_name(name)
                exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(
                    name, artifact_location=(out / "mlartifacts").resolve().as_uri() if own else None)
                run_id = self.client.create_run(exp_id, run_name=out.resolve().name,
                                                tags={"xmodal.run_dir": str(out.resolve())}).info.run_id
        self.run_id = run_id
        self.state = {"store": "run" if own else "uri", "run_id": run_id, **({} if own else {"tracking_uri": uri})}

    def describe(self, config: dict, provenance: dict) -> None:
        from mlflow.entities import Param, RunTag

        params = [Param(k[:250], v[:6000]) for k, v in flat_params(config).items()]
        tags = [RunTag("xmodal.command", str(provenance.get("command", ""))[:5000]),
                RunTag("mlflow.source.git.commit", str(provenance.get("git_revision") or ""))]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i:i + 100], tags=tags if i == 0 else [])
        self.client.log_dict(self.run_id, config, "config.json")
        self.client.log_dict(self.run_id, provenance, "provenance.json")

    def scalars(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_key(k), float(v), now, int(step)) for step, values in rows for k, v in values.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def final(self, summary: dict, values: dict[str, float], step: int) -> None:
        self.scalars([(step, values)])
        self.client.log_dict(self.run_id, summary, "metrics.json")

    def close(self, finished: bool) -> None:
        if finished:
            self.client.set_terminated(self.run_id, "FINISHED")


def _forget_cached_store(uri: str) -> None:
    """Drop what MLflow caches per process for ``uri`` (its tracking store, its SQLAlchemy engine): they keep
    a connection to the ``RUN/mlflow.db`` a fresh run has since removed ("attempt to write a readonly
    database"). MLflow's private caches, so each step is skipped where this MLflow has no such cache."""
    try:
        from mlflow.tracking._tracking_service.registry import TrackingStoreRegistry

        TrackingStoreRegistry._get_store_with_resolved_uri.cache_clear()
    except (ImportError, AttributeError):
        pass
    try:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        engine = SqlAlchemyStore._engine_map.pop(uri, None)
        if engine is not None:
            engine.dispose()
    except (ImportError, AttributeError):
        pass


class WandbTracker:
    """One W&B run (offline by default), reopened by its id on resume."""

    name = "wandb"

    def __init__(self, out: Path, previous: dict | None = None) -> None:
        try:
            import wandb
        except ImportError:
            raise ValueError("train.log_to: 'wandb' needs wandb (pip install 'xmodal[wandb]')") from None
        previous = previous or {}
        mode = os.environ.get("WANDB_MODE") or "offline"
        run_id = previous.get("id") or secrets.token_hex(4)  # W&B's own ids: 8 lower-case characters
        _free_stream_second(out / "wandb", run_id)
        with _quiet("wandb"):
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "xmodal", dir=str(out), mode=mode,
                                  id=run_id, resume="allow", name=out.resolve().name, reinit="create_new",
                                  settings=wandb.Settings(console="off", silent=True, x_disable_stats=True,
                                                          disable_git=True, save_code=False))
        self.state = {"id": run_id, "mode": mode}

    def describe(self, config: dict, provenance: dict) -> None:
        self.run.config.update({**config, "provenance": provenance}, allow_val_change=True)

    def scalars(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        merged: dict[int, dict[str, float]] = {}
        for step, values in rows:  # one history row per step, steps ascending (W&B's rule)
            merged.setdefault(int(step), {}).update(values)
        for step in sorted(merged):
            self.run.log(merged[step], step=step)

    def final(self, summary: dict, values: dict[str, float], step: int) -> None:
        self.run.summary.update(values)

    def close(self, finished: bool) -> None:
        with _quiet("wandb"):
            self.run.finish(exit_code=0 if finished else 1)


def _free_stream_second(folder: Path, run_id: str) -> None:
    """Wait (at most about a second) until this second names no stream of ``run_id`` yet.

    W&B names an offline stream folder by the local second its process started
    (``offline-run-YYYYMMDD_HHMMSS-ID``, ``Settings._start_datetime``): a resume started within the same second
    as the stream before it would write that folder's file again and lose the earlier steps.
    """
    import time
    from datetime import datetime

    for _ in range(40):
        stamp = datetime.fromtimestamp(time.time()).strftime("%Y%m%d_%H%M%S")
        if not any((folder / f"{kind}-{stamp}-{run_id}").exists() for kind in ("offline-run", "run")):
            return
        time.sleep(0.05)


_CLASSES = {"mlflow": MlflowTracker, "wandb": WandbTracker}


class Trackers:
    """The trackers of ``log_to``, fed by :class:`~xmodal.training.runlog.RunLog`: scalars are held
    until :meth:`flush` (after the epoch's checkpoint); a tracker that fails later is warned about once
    and dropped, so training goes on."""

    def __init__(self, out: Path, log_to: tuple, *, history: list[dict], resumed: bool | None = None) -> None:
        from xmodal._validate import short_repr

        if not isinstance(out, (str, os.PathLike)):
            raise TypeError(f"out: expected a run directory, got {short_repr(out)}")
        if isinstance(log_to, str) or not isinstance(log_to, (list, tuple)) or \
                not all(isinstance(n, str) for n in log_to):
            raise TypeError(f"log_to: expected a list of log names, got {short_repr(log_to)}")
        if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
            raise TypeError(f"history: expected a list of epoch records, got {short_repr(history)}")
        self.out = Path(out)
        names = [n for n in TRACKERS if n in log_to]
        if resumed is not None and not isinstance(resumed, bool):
            raise TypeError(f"resumed: expected True, False or None, got {short_repr(resumed)}")
        self.pending: list[tuple[int, dict[str, float]]] = []
        # resumed: from a checkpoint (with history, or one inside the first epoch): reopen the tracker runs
        resumed = bool(history) if resumed is None else bool(resumed)
        state = read_state(self.out) if resumed else {}
        self.epochs_sent = int(state.get("epochs_sent", 0)) if resumed else 0
        self.trackers = []
        for n in names:
            try:
                self.trackers.append(_CLASSES[n](self.out, state.get(n) if resumed else None))
            except ValueError:
                raise
            except Exception as exc:  # noqa: BLE001 - a server that does not answer, a store it cannot open
                first = str(exc).splitlines()[0] if str(exc) else ""
                raise ValueError(f"train.log_to: {n} could not start ({type(exc).__name__}: {first})") from None
        self.resumed = resumed
        if self.trackers:
            self._save()

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def _save(self) -> None:
        write_state(self.out, {"epochs_sent": self.epochs_sent, **{t.name: t.state for t in self.trackers}})

    def _each(self, method: str, *args: Any) -> None:
        for t in list(self.trackers):
            try:
                getattr(t, method)(*args)
            except Exception as exc:  # noqa: BLE001 - a tracker's failure must not end the training
                print(f"xmodal train: warning: {t.name} logging failed ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0] if str(exc) else ''}); training goes on without it",
                      file=sys.stderr, flush=True)
                self.trackers.remove(t)

    def describe(self, config: dict, provenance: dict) -> None:
        if not self.resumed:  # MLflow params are immutable: set once, at the fresh start
            self._each("describe", config, provenance)

    def add(self, values: dict[str, float], step: int) -> None:
        if self.trackers:
            self.pending.append((int(step), dict(values)))

    def flush(self, epochs: int) -> None:
        """Send what was held back; ``epochs``: the checkpointed epochs it covers."""
        if self.trackers and self.pending:
            self._each("scalars", self.pending)
        self.pending = []
        if self.trackers:
            self.epochs_sent = epochs
            self._save()

    def final(self, summary: dict, values: dict[str, float], step: int) -> None:
        self.flush(self.epochs_sent)
        self._each("final", summary, values, step)

    def close(self, finished: bool) -> None:
        self._each("close", finished)
        self.trackers = []


class _quiet:
    """Loggers of a tracker package at ERROR while it starts (MLflow's database migration lines, W&B's banners)."""

    def __init__(self, *names: str) -> None:
        self.loggers = [logging.getLogger(n) for n in names]

    def __enter__(self) -> None:
        self.levels = [lg.level for lg in self.loggers]
        for lg in self.loggers:
            lg.setLevel(logging.ERROR)

    def __exit__(self, *exc: Any) -> None:
        for lg, level in zip(self.loggers, self.levels):
            lg.setLevel(level)


__all__ = ["Trackers", "TRACKERS", "TRACKERS_FILE", "TRACKER_FILES", "TRACKER_DIRS"]
