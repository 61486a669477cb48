"""What a training run reports while it runs: the epoch line, ``log.jsonl``, ``log.csv``,
TensorBoard scalars and the MLflow / W&B trackers (``train.log_to``).

- stdout: one line per epoch (loss, val R@1 both ways, the selection metric, time per
  epoch, ETA), flushed at once, whether or not stdout is a terminal, so a run under
  ``nohup``, SLURM or ``| tee`` shows its epochs live. Progress bars are the loop's,
  on a terminal only.
- ``log.jsonl`` (always) and ``log.csv`` (``csv``): rewritten from the checkpointed
  history every epoch (temporary file + rename), so after a kill and a resume they
  hold each epoch exactly once and match the checkpoint.
- ``tensorboard/events.out.tfevents.*`` (``tensorboard``): per step (at the step's 0-based
  index) ``train/loss``, ``train/lr``, ``train/temperature`` and ``train/terms/<term>`` for each
  loss term; per epoch (at the number of steps done, ``log.jsonl``'s ``step``) ``epoch/train_loss``, ``epoch/lr``, ``epoch/temperature``,
  ``epoch/modality_gap``, ``epoch/terms/<term>``, ``val/<direction>/<metric>`` and
  ``val/<selection metric>``; at the end ``final/<split>/<normaliser>/<direction>/<metric>``
  for every fitted test-time normaliser. A resumed run opens a new event file with
  ``purge_step`` at its first step, so TensorBoard drops what the killed process wrote
  after its last checkpoint, and writes the last checkpointed epoch's scalars again. The config and the
  provenance are text summaries ``config`` / ``provenance`` at a fresh start.
- ``mlflow`` / ``wandb``: the same scalars under the same tags at the same steps, the config, the
  provenance, the final tables and the run's export folder as its model, sent after each epoch's
  checkpoint, exactly once across kills and full disks (:mod:`xmodal.training.trackers`).

A checkpoint inside an epoch (``train.checkpoint_minutes``, :mod:`xmodal.training.checkpoints`) is
followed by the same sending: the per-step scalars of the steps before it are flushed to the event file
and journalled and sent to the trackers (the epoch's own scalars and ``log.jsonl`` wait for the epoch's
end). A run resumed from it purges TensorBoard from its step on, reopens the trackers' runs even in the
first epoch and sends what the journal holds but a tracker lacks, so no step is sent twice or lost.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from pathlib import Path
from typing import Any

from xmodal.config import LOG_TARGETS  # noqa: F401,E402  (re-exported; the list lives beside the config)
from xmodal.training.trackers import JOURNAL_FILE, TRACKERS_FILE, Trackers
TB_DIR = "tensorboard"


def _flat(prefix: str, value: Any, out: dict[str, Any]) -> dict[str, Any]:
    """Nested dict of numbers -> ``{"a/b/c": number}`` (non-numbers skipped)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}/{k}" if prefix else str(k), v, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out[prefix] = value
    return out


def epoch_scalars(record: dict, metric: str) -> dict[str, float]:
    """The TensorBoard scalars of one ``log.jsonl`` record, ``{tag: value}``."""
    out = {"epoch/train_loss": record["train_loss"], "epoch/lr": record["lr"],
           "epoch/temperature": record["temperature"], "epoch/time_s": record["epoch_time"]}
    if record.get("modality_gap") is not None:
        out["epoch/modality_gap"] = record["modality_gap"]
    if record.get("scheduled") is not None:
        out["epoch/scheduled"] = record["scheduled"]
    _flat("epoch/terms", record.get("loss_terms") or {}, out)
    _flat("val", record["val"], out)
    out[f"val/{metric}"] = record[f"val_{metric}"]
    return {k: float(v) for k, v in out.items()}


def csv_row(record: dict) -> dict[str, Any]:
    """One ``log.csv`` row: the record's numbers, nested keys joined by ``/``."""
    return _flat("", {k: v for k, v in record.items()}, {})


def csv_text(history: list[dict]) -> str:
    rows = [csv_row(r) for r in history]
    columns = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def epoch_line(record: dict, *, epochs: int, metric: str, improved: bool, history: list[dict]) -> str:
    """``epoch   3/20  loss 1.2345  val t2v R@1 12.34  v2t R@1 11.00  rsum 123.45 *  2.1 s/epoch  ETA 0:00:36``.

    ETA: the mean time of the epochs so far times the epochs left (an upper bound when
    early stopping ends the run sooner).
    """
    from xmodal.metrics import format_metric as fm

    val = record["val"]
    mir = f"  t2v mAP {fm('mAP', val['t2v']['mAP'])}" if "mAP" in val["t2v"] else ""
    times = [r["epoch_time"] for r in history if "epoch_time" in r] or [record["epoch_time"]]
    per = sum(times) / len(times)
    left = max(0, epochs - record["epoch"])
    return (f"epoch {record['epoch']:3d}/{epochs}  loss {record['train_loss']:.4f}  "
            f"val t2v R@1 {fm('R@1', val['t2v']['R@1'])}  v2t R@1 {fm('R@1', val['v2t']['R@1'])}{mir}  "
            f"{metric} {fm(metric, record[f'val_{metric}'])}{' *' if improved else '  '}  "
            f"{record['epoch_time']:.1f} s/epoch  ETA {_clock(per * left)}")


class RunLog:
    """The run's logs; every method is a no-op on ranks other than 0 (``enabled=False``).

    Args:
        out: the run directory.
        log_to: ``train.log_to`` (a subset of ``("csv", "tensorboard", "mlflow", "wandb")``).
        metric: the selection metric (``train.metric``).
        epochs: ``train.epochs`` (for the ETA).
        history: the checkpointed epoch records (a resumed run's; empty on a fresh start).
        enabled: write anything at all (rank 0).
        echo: print the epoch line on stdout.
        resume_step: the step of the checkpoint a run resumes from when it lies inside an epoch
            (after ``history[-1]["step"]``); None when resuming from an epoch's end or starting.
    """

    def __init__(self, out: Path, *, log_to: tuple = (), metric: str = "rsum", epochs: int = 1,
                 history: list[dict] | None = None, enabled: bool = True, echo: bool = True,
                 resume_step: int | None = None) -> None:
        self.out, self.metric, self.epochs = Path(out), metric, epochs
        self.enabled, self.echo = enabled, echo and enabled
        self.csv = enabled and "csv" in log_to
        self.writer = None
        self.history = list(history or [])
        first_step = history[-1]["step"] if history else 0
        inside = resume_step is not None and resume_step > first_step  # resumed inside an epoch
        first_step = resume_step if inside else first_step
        if enabled and first_step == 0:  # a fresh start: logs of an overwritten run go
            for name in ("log.jsonl", "log.csv", TRACKERS_FILE, JOURNAL_FILE):
                (self.out / name).unlink(missing_ok=True)
        if enabled and "tensorboard" in log_to:
            self.writer = _summary_writer(self.out / TB_DIR, first_step)
            if history and not inside:  # purged with the steps from the epoch's end on: written again
                self._epoch_scalars(history[-1])
        self.trackers = Trackers(self.out, tuple(log_to) if enabled else (), history=self.history,
                                 start_step=first_step)

    @property
    def per_step(self) -> bool:
        """Whether :meth:`step` records anything (the loop skips its host syncs otherwise)."""
        return self.writer is not None or bool(self.trackers)

    def describe(self, config: dict, provenance: dict) -> None:
        """The run's config and provenance (at the start): TensorBoard text summaries on a fresh start,
        the trackers' params / config / artifacts."""
        if not self.enabled:
            return
        if self.writer is not None and not self.trackers.resumed:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=1) + "\n```", 0)
            self.writer.add_text("provenance", "```\n" + json.dumps(provenance, indent=1) + "\n```", 0)
        # the trackers open here: their runs are found again by the provenance's start time
        self.trackers.open(config, provenance, [(r["step"], self._finite(epoch_scalars(r, self.metric)))
                                                for r in self.history])

    def step(self, step: int, *, loss: float, lr: float, temperature: float | None = None,
             terms: dict | None = None) -> None:
        """Per-step scalars of the step with 0-based index ``step``."""
        if not self.per_step:
            return
        values = {"train/loss": loss, "train/lr": lr}
        if temperature is not None:
            values["train/temperature"] = temperature
        for k, v in (terms or {}).items():
            values[f"train/terms/{k}"] = float(v)
        if self.writer is not None:
            for tag, v in values.items():
                self.writer.add_scalar(tag, v, step)
        self.trackers.add(self._finite(values), step)

    def epoch(self, history: list[dict], *, improved: bool) -> None:
        """After the checkpoint of an epoch: rewrite the files, add its scalars, print its line."""
        if not self.enabled:
            return
        from xmodal.runs import atomic_write_text

        record = history[-1]
        atomic_write_text(self.out / "log.jsonl", "".join(json.dumps(r) + "\n" for r in history))
        if self.csv:
            atomic_write_text(self.out / "log.csv", csv_text(history))
        if self.writer is not None:
            self._epoch_scalars(record)
        if self.trackers:  # after the checkpoint: a killed run never sent steps past it
            self.trackers.add(self._finite(epoch_scalars(record, self.metric)), record["step"], journal=False)
            self.trackers.flush(len(history), record["step"])
        if self.echo:
            print(epoch_line(record, epochs=self.epochs, metric=self.metric, improved=improved,
                             history=history), flush=True)

    def checkpoint(self, epochs: int) -> None:
        """After a checkpoint inside an epoch (``epochs``: the whole epochs it holds): the per-step scalars
        so far go to the event file and the trackers."""
        if not self.enabled:
            return
        if self.writer is not None:
            self.writer.flush()
        if self.trackers:
            self.trackers.flush(epochs)

    @staticmethod
    def _finite(values: dict) -> dict[str, float]:
        return {k: float(v) for k, v in values.items() if math.isfinite(float(v))}

    def _epoch_scalars(self, record: dict) -> None:
        for tag, v in epoch_scalars(record, self.metric).items():
            if math.isfinite(v):
                self.writer.add_scalar(tag, v, record["step"], walltime=time.time())
        self.writer.flush()

    def final(self, summary: dict, step: int) -> None:
        """The per-normaliser val/test metrics of the selected model, at the last step."""
        values = {tag: float(v) for split in ("val", "test")
                  for tag, v in _flat(f"final/{split}", {k: r for k, r in (summary.get(split) or {}).items()
                                                         if k != "protocol"}, {}).items()
                  if math.isfinite(float(v))}
        if self.writer is not None:
            for tag, v in values.items():
                self.writer.add_scalar(tag, v, step)
        if self.trackers:
            self.trackers.final(summary, values, step, model_dir=self.out)
        self.close(finished=True)

    def close(self, finished: bool = False) -> None:
        """Close the event file and the trackers (``finished``: the run ended, not stopped to resume later)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        self.trackers.close(finished)


def _summary_writer(folder: Path, first_step: int):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ValueError("train.log_to: 'tensorboard' needs the tensorboard package "
                         "(pip install 'xmodal[tensorboard]')") from None
    if first_step == 0 and folder.is_dir():  # a fresh start replaces the old run's event files
        for f in folder.glob("events.out.tfevents.*"):
            f.unlink()
    _quiet_event_thread()
    return SummaryWriter(str(folder), purge_step=first_step or None)


def _quiet_event_thread() -> None:
    """TensorBoard writes its event file from a thread of its own; on a full disk that thread dies with a
    traceback on the terminal while the training's own write fails with one line (``xmodal train: error:
    no space left on device``). Its OSError is kept off the terminal (the main thread reports the disk);
    every other thread's exception goes to the previous hook."""
    import threading

    try:
        from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread
    except ImportError:  # another tensorboard layout: nothing to quiet
        return
    previous = threading.excepthook
    if getattr(previous, "_xmodal_quiet", False):
        return

    def hook(args) -> None:
        if isinstance(args.thread, _AsyncWriterThread) and issubclass(args.exc_type, OSError):
            return
        previous(args)

    hook._xmodal_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = hook

