"""Experiment trackers of ``train.log_to``: ``mlflow`` and ``wandb`` (optional extras of those names).

They get what TensorBoard gets (:mod:`xmodal.training.runlog`): the per-step and per-epoch scalars under
the same tags at the same steps, the config and the provenance at the start (paths relative to the run),
the final per-normaliser tables at the end, and the run's model: the folder ``xmodal export`` writes, as
an MLflow model artifact (``model/``, with an ``MLmodel`` file and a tensor signature) and a W&B artifact
of type ``model``. The backends live in :mod:`xmodal.training.tracker_backends`.

Exactly once, across kills and full disks:

- ``RUN/trackers.jsonl`` (the journal): every per-step row is appended as it is recorded, and synced to
  disk before anything is sent. Scalars are held back until the epoch's checkpoint is written and sent
  right after it, so no tracker ever holds a step past the last checkpoint.
- ``RUN/trackers.json``: each tracker's run (MLflow run id and store, W&B run id), written after a send.
  On resume it is advisory only: each tracker's series are read back from the tracker itself (MLflow's
  store, W&B's ``.wandb`` files, :mod:`xmodal.training.wandb_file`) and compared with the journal and
  ``log.jsonl``; every missing point is sent again. W&B keeps a run's steps increasing, so a point below
  the last step W&B holds cannot be sent again: the resume names how many were lost (one warning).
- A lost or garbled ``trackers.json`` finds the existing runs: the run's identity is derived from its
  ``provenance.json`` (start time, folder name; :func:`run_uid`); MLflow's run carries it as the tag
  ``xmodal.run_uid``, W&B's id is its first 8 characters. The old MLflow run is continued, never left
  RUNNING beside a new one.
- A tracker that fails (a server that stops answering, a full disk) is one warning line and is dropped;
  training goes on. The tracker packages' own log lines and tracebacks are kept off the terminal.
- A W&B stream torn by a kill or a full disk is cut back to its last whole record on resume.

Seed groups: runs of one config that differ only in ``train.seed`` share a group (W&B ``group``, MLflow tag
``xmodal.seed_group``), :func:`seed_group`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

TRACKERS_FILE = "trackers.json"
JOURNAL_FILE = "trackers.jsonl"
TRACKERS = ("mlflow", "wandb")
#: What a fresh run removes from its folder besides the TensorBoard event files (``xmodal.runs``).
TRACKER_FILES = ("mlflow.db", TRACKERS_FILE, JOURNAL_FILE)
TRACKER_DIRS = ("mlartifacts", "wandb")
#: A line of the journal longer than this is not one xmodal wrote (skipped on resume).
MAX_JOURNAL_LINE = 1 << 20
#: Loggers of the tracker packages, kept at CRITICAL while xmodal calls them (their tracebacks on a full
#: disk were 79 lines around xmodal's one).
QUIET = ("mlflow", "alembic", "sqlalchemy", "wandb", "urllib3", "git")

from xmodal.training.tracker_backends import flat_params, mlflow_key  # noqa: E402 (public here too)


def run_uid(provenance: Any, out: Path) -> str:
    """The run's identity for its trackers: SHA-256 of ``provenance.json``'s ``started`` (kept across
    resumes) and the run folder's name; 32 hex characters. Derived, so a lost ``trackers.json`` finds the
    same tracker runs again."""
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out: expected a run directory, got {type(out).__name__}")
    prov = provenance if isinstance(provenance, dict) else {}
    key = json.dumps([str(prov.get("started")), Path(out).resolve().name], sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def seed_group(config: Any) -> str:
    """The group of runs that differ only in ``train.seed`` (and where the data lies): ``xmodal-`` + 10 hex
    characters of the config's SHA-256 without those keys.

    >>> a = seed_group({"train": {"seed": 1, "epochs": 3}, "data": {"root": "/a", "name": "paired"}})
    >>> a == seed_group({"train": {"seed": 2, "epochs": 3}, "data": {"root": "/b", "name": "paired"}})
    True
    """
    try:
        cfg = json.loads(json.dumps(config if isinstance(config, dict) else {}, default=str))
    except (TypeError, ValueError, RecursionError):  # keys json cannot write, a cycle
        raise TypeError("config: expected a plain config dict (xmodal.config.to_dict)") from None
    for section, key in (("train", "seed"), ("data", "root"), ("train", "device"), ("train", "log_to"),
                         ("train", "progress")):
        if isinstance(cfg.get(section), dict):
            cfg[section].pop(key, None)
    return "xmodal-" + hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:10]


def read_state(out: Path) -> dict:
    """``trackers.json`` as a dict; a missing, garbled, oversized or foreign file gives ``{}``."""
    from xmodal._files.jsonfile import read_json_file

    try:
        state = read_json_file(Path(out) / TRACKERS_FILE, max_bytes=1 << 20, max_depth=8, max_values=10_000)
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def write_state(out: Path, state: dict) -> None:
    from xmodal.runs import atomic_write_text

    atomic_write_text(Path(out) / TRACKERS_FILE, json.dumps(state, indent=1) + "\n")


def read_journal(out: Path, before: int) -> list[tuple[int, dict[str, float]]]:
    """The journal's rows of steps ``< before``, in order; a torn or foreign line is skipped."""
    from xmodal._validate import integer

    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out: expected a run directory, got {type(out).__name__}")
    before = integer(before, "before", minimum=0)
    rows = []
    path = Path(out) / JOURNAL_FILE
    if not path.is_file():
        return rows
    with open(path, "rb") as f:
        while True:
            line = f.readline(MAX_JOURNAL_LINE + 1)
            if not line:
                break
            if len(line) > MAX_JOURNAL_LINE or not line.endswith(b"\n"):
                continue
            if not line.startswith(b'{"s":'):  # xmodal's own lines only (a deep '[[[...' never reaches json)
                continue
            try:
                row = json.loads(line)
                step, values = int(row["s"]), row["v"]
            except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
                continue
            if 0 <= step < before and isinstance(values, dict) and all(
                    isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                    for k, v in values.items()):
                rows.append((step, {k: float(v) for k, v in values.items()}))
    return rows


class Trackers:
    """The trackers of ``log_to``, fed by :class:`~xmodal.training.runlog.RunLog`.

    Args:
        out: the run directory.
        log_to: ``train.log_to``; the trackers among it are opened by :meth:`open`.
        history: the checkpointed epoch records (a resumed run's; empty on a fresh start).
        start_step: the first step this process trains (default: the last record's ``step``, or 0); the
            journal keeps the rows before it.
    """

    def __init__(self, out: Path, log_to: tuple, *, history: list[dict], start_step: int | None = None) -> None:
        from xmodal._validate import short_repr
        from xmodal.training import tracker_backends

        if not isinstance(out, (str, os.PathLike)):
            raise TypeError(f"out: expected a run directory, got {short_repr(out)}")
        if isinstance(log_to, str) or not isinstance(log_to, (list, tuple)) or \
                not all(isinstance(n, str) for n in log_to):
            raise TypeError(f"log_to: expected a list of log names, got {short_repr(log_to)}")
        if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
            raise TypeError(f"history: expected a list of epoch records, got {short_repr(history)}")
        self.out = Path(out)
        self.names = [n for n in TRACKERS if n in log_to]
        for n in self.names:  # a missing package is refused before the first epoch
            tracker_backends.BACKENDS[n].check_installed()
        self.start_step = int(history[-1]["step"]) if start_step is None and history else int(start_step or 0)
        self.resumed = self.start_step > 0
        self.trackers: list[Any] = []
        self.pending: list[tuple[int, dict[str, float]]] = []
        self.epochs_sent = 0
        self._journal: int | None = None
        self._raise_exceptions = logging.raiseExceptions

    def __bool__(self) -> bool:
        return bool(self.trackers)

    # ------------------------------------------------------------------ start
    def open(self, config: dict, provenance: dict, epoch_rows: list[tuple[int, dict[str, float]]]) -> None:
        """Open (or find again) each tracker's run, describe a new one, and on resume send every point of
        the journal and of ``epoch_rows`` (the checkpointed epochs' scalars) that the tracker lacks."""
        from xmodal._files.paths import relative_paths
        from xmodal.training import tracker_backends

        if not self.names:
            return
        logging.raiseExceptions = False  # a tracker's log handler on a full disk: no "--- Logging error ---"
        state = read_state(self.out) if self.resumed else {}
        uid, group = run_uid(provenance, self.out), seed_group(config)
        self._open_journal()
        for n in self.names:
            try:
                with _quiet():
                    tracker = tracker_backends.BACKENDS[n](self.out, state.get(n), uid=uid, group=group)
            except ValueError:
                raise
            except Exception as exc:  # noqa: BLE001 - a server that does not answer, a store it cannot open
                raise ValueError(f"train.log_to: {n} could not start ({_first_line(exc)})") from None
            self.trackers.append(tracker)
        self.epochs_sent = len(epoch_rows)
        new = [t for t in self.trackers if t.created]
        if new:
            self._each("describe", relative_paths(config, self.out), relative_paths(provenance, self.out), only=new)
        if self.resumed:
            self._reconcile(epoch_rows)
        self._save()

    def _open_journal(self) -> None:
        from xmodal.runs import atomic_write_text

        path = self.out / JOURNAL_FILE
        if self.resumed:  # the rows of steps this process trains again go
            rows = read_journal(self.out, self.start_step)
            atomic_write_text(path, "".join(_journal_line(s, v) for s, v in rows))
        else:
            path.unlink(missing_ok=True)
        self._journal = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)

    def _reconcile(self, epoch_rows: list[tuple[int, dict[str, float]]]) -> None:
        """Send each tracker the journal's and the epochs' points it lacks (W&B: those above its last step)."""
        want: dict[str, dict[int, float]] = {}
        for step, values in [*read_journal(self.out, self.start_step), *epoch_rows]:
            for k, v in values.items():
                want.setdefault(k, {})[step] = v
        for t in list(self.trackers):
            try:
                with _quiet():
                    have = t.steps(list(want))
            except Exception as exc:  # noqa: BLE001
                self._drop(t, exc)
                continue
            floor = max((max(s) for s in have.values() if s), default=-1) if t.increasing else -1
            rows: dict[int, dict[str, float]] = {}
            lost = 0
            for key, points in want.items():
                for step, v in points.items():
                    if step in have.get(key, ()):
                        continue
                    if step <= floor:
                        lost += 1
                    else:
                        rows.setdefault(step, {})[key] = v
            if rows:
                self._each("scalars", sorted(rows.items()), only=[t])
            if lost:
                print(f"xmodal train: warning: {t.name}: {lost} point(s) below step {floor} were lost with the "
                      f"killed process and cannot be sent again ({t.name} keeps a run's steps increasing)",
                      file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ while training
    def add(self, values: dict[str, float], step: int, *, journal: bool = True) -> None:
        """Hold ``values`` at ``step`` until :meth:`flush`; a per-step row is appended to the journal now."""
        if not self.trackers:
            return
        self.pending.append((int(step), dict(values)))
        if journal and self._journal is not None:
            _write_all(self._journal, _journal_line(step, values).encode(), self.out / JOURNAL_FILE)

    def flush(self, epochs: int, step: int | None = None) -> None:
        """Send what was held back (the journal synced first); ``epochs``: the checkpointed epochs it covers."""
        if not self.trackers:
            self.pending = []
            return
        if self._journal is not None:
            os.fsync(self._journal)
        if self.pending:
            self._each("scalars", self.pending)
        self.pending = []
        self.epochs_sent = epochs
        self._save(step)

    def final(self, summary: dict, values: dict[str, float], step: int, model_dir: Path | None = None) -> None:
        """The final tables, and the run's export folder as the model (``model_dir``: the run directory)."""
        self.flush(self.epochs_sent, step)
        self._each("final", summary, values, step)
        if model_dir is not None and self.trackers:
            self._log_model(model_dir)

    def _log_model(self, run: Path) -> None:
        import tempfile

        # the export command's own writer: the artifact is exactly the folder 'xmodal export RUN' writes
        from xmodal.commands.export import write_export
        from xmodal.models.io import load_model

        try:
            with tempfile.TemporaryDirectory(prefix="xmodal-model-") as tmp, _quiet():
                model = load_model(run)
                write_export(model, run, Path(tmp))
                self._each("log_model", Path(tmp), model)
        except Exception as exc:  # noqa: BLE001 - the model artifact never ends the run
            print(f"xmodal train: warning: the model artifact was not logged ({_first_line(exc)})", file=sys.stderr,
                  flush=True)

    def close(self, finished: bool) -> None:
        self._each("close", finished)
        self.trackers = []
        if self._journal is not None:
            os.close(self._journal)
            self._journal = None
        logging.raiseExceptions = self._raise_exceptions

    # ------------------------------------------------------------------ helpers
    def _save(self, step: int | None = None) -> None:
        if not self.trackers:
            return
        state = {"version": 2, "epochs_sent": self.epochs_sent, **{t.name: t.state for t in self.trackers}}
        if step is not None:
            state["sent_step"] = int(step)
        try:
            write_state(self.out, state)
        except OSError as exc:  # the trackers hold the points; trackers.json is advisory on resume
            print(f"xmodal train: warning: {TRACKERS_FILE} not written ({_first_line(exc)})", file=sys.stderr,
                  flush=True)

    def _drop(self, t: Any, exc: BaseException) -> None:
        print(f"xmodal train: warning: {t.name} logging failed ({_first_line(exc)}); training goes on without it",
              file=sys.stderr, flush=True)
        if t in self.trackers:
            self.trackers.remove(t)
        try:
            with _quiet():
                t.abandon()
        except Exception:  # noqa: BLE001 - already failing
            pass

    def _each(self, method: str, *args: Any, only: list | None = None) -> None:
        for t in list(only if only is not None else self.trackers):
            if t not in self.trackers:
                continue
            try:
                with _quiet():
                    getattr(t, method)(*args)
            except Exception as exc:  # noqa: BLE001 - a tracker's failure must not end the training
                self._drop(t, exc)


def _journal_line(step: int, values: dict[str, float]) -> str:
    return json.dumps({"s": int(step), "v": values}, separators=(",", ":")) + "\n"


def _write_all(fd: int, data: bytes, path: Path) -> None:
    import errno

    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise OSError(errno.ENOSPC, f"no space left on device while writing {path}") from None
        raise


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


class _quiet:
    """The tracker packages' loggers at CRITICAL while xmodal calls them (MLflow's database errors with their
    tracebacks, W&B's banners and thread errors), restored afterwards."""

    def __init__(self, *names: str) -> None:
        self.loggers = [logging.getLogger(n) for n in (names or QUIET)]

    def __enter__(self) -> None:
        self.levels = [lg.level for lg in self.loggers]
        for lg in self.loggers:
            lg.setLevel(logging.CRITICAL)

    def __exit__(self, *exc: Any) -> None:
        for lg, level in zip(self.loggers, self.levels):
            lg.setLevel(level)


def __getattr__(name: str) -> Any:  # the backends' names where they used to live
    if name in ("MlflowTracker", "WandbTracker", "_free_stream_second", "_forget_cached_store"):
        from xmodal.training import tracker_backends

        return getattr(tracker_backends, name)
    raise AttributeError(name)


__all__ = ["Trackers", "TRACKERS", "TRACKERS_FILE", "JOURNAL_FILE", "TRACKER_FILES", "TRACKER_DIRS", "run_uid",
           "seed_group", "read_journal", "mlflow_key", "flat_params"]
