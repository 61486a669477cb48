"""The MLflow and W&B runs behind :class:`xmodal.training.trackers.Trackers` (one class per tracker).

Each backend opens its tracker's run (or finds it again: by the recorded id, else by the run's identity),
reads back which steps of which series it holds (:meth:`steps`, for the resume's comparison), and sends
scalars, the final tables and the model. Every call may raise; :class:`Trackers` turns a failure into one
warning and drops the tracker.

- ``mlflow``: MLflow's own default store, kept inside the run: ``RUN/mlflow.db`` (SQLite, MLflow 3's
  default backend; artifacts in ``RUN/mlartifacts/``); ``MLFLOW_TRACKING_URI`` overrides (a server, another
  store), ``MLFLOW_EXPERIMENT_NAME`` names the experiment (default ``xmodal``). MLflow's metric names
  refuse ``@``, so a tag's ``@`` is written ``_at_`` (``val/t2v/R@1`` -> ``val/t2v/R_at_1``). MLflow
  stores artifact locations as absolute URIs; in the run's own store they are written relative to the
  run (``mlartifacts/...``) whenever the tracker closes and made absolute again when it opens, so a
  copied run folder holds no path of the machine it trained on (``cd RUN && mlflow ui --backend-store-uri
  sqlite:///mlflow.db`` shows it, with the ``[mlflow-ui]`` extra).
- ``wandb``: offline mode in ``RUN/wandb/`` (``wandb sync RUN/wandb/offline-run-*`` uploads it later)
  unless ``WANDB_MODE`` says otherwise; ``WANDB_PROJECT`` names the project (default ``xmodal``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import time
from pathlib import Path
from typing import Any

_MLFLOW_RUN_ID = re.compile(r"[0-9a-f]{32}")
_WANDB_ID = re.compile(r"[a-z0-9]{1,64}")


def mlflow_key(tag: str) -> str:
    """A TensorBoard tag as an MLflow metric name (``@`` -> ``_at_``; other refused characters -> ``_``).

    >>> mlflow_key("val/t2v/R@10")
    'val/t2v/R_at_10'
    """
    if not isinstance(tag, str):
        raise TypeError(f"tag: expected a TensorBoard tag, got {type(tag).__name__}")
    return re.sub(r"[^\w.\- :/]", "_", tag.replace("@", "_at_"))


def flat_params(config: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as ``{"section.key": "value"}`` (MLflow params are strings)."""
    if not isinstance(config, dict) or not isinstance(prefix, str):
        raise TypeError(f"config: expected a nested dict (and prefix a string), got {type(config).__name__}")
    out: dict[str, str] = {}
    for k, v in config.items():
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flat_params(v, name))
        else:
            out[name] = json.dumps(v) if isinstance(v, (dict, list, tuple, type(None), bool)) else str(v)
    return out


class MlflowTracker:
    """One MLflow run of an ``xmodal train`` run: the recorded one, else the one tagged with the run's
    identity, else a new one."""

    name = "mlflow"
    increasing = False  # MLflow takes a point at any step

    @staticmethod
    def check_installed() -> None:
        try:
            import mlflow.tracking  # noqa: F401
        except ImportError:
            raise ValueError("train.log_to: 'mlflow' needs MLflow (pip install 'xmodal[mlflow]')") from None

    def __init__(self, out: Path, previous: Any, *, uid: str, group: str) -> None:
        from mlflow.tracking import MlflowClient

        previous = previous if isinstance(previous, dict) else {}
        env_uri = os.environ.get("MLFLOW_TRACKING_URI")
        store = previous.get("store") if previous.get("store") in ("run", "uri") else ("uri" if env_uri else "run")
        self.out, self.own = Path(out), store == "run"
        db = self.out / "mlflow.db"
        if self.own:
            uri = "sqlite:///" + str(db.resolve())
            # MLflow keeps one engine per URI for the process: a file replaced since (a fresh run, a copy put in
            # its place) would be written through a connection to the old one ("readonly database")
            _forget_cached_store(uri)
            if db.exists():
                relocate_artifacts(db, self.out, absolute=True)  # a copied or moved run: this folder's
        else:
            uri = previous.get("tracking_uri") if isinstance(previous.get("tracking_uri"), str) else env_uri
            if not uri:
                raise ValueError("train.log_to: mlflow: this run logged to MLFLOW_TRACKING_URI, which is not set now")
        self.client = MlflowClient(tracking_uri=uri)
        run_id = previous.get("run_id") if isinstance(previous.get("run_id"), str) and \
            _MLFLOW_RUN_ID.fullmatch(previous["run_id"]) else None
        if run_id is not None:
            try:
                self.client.get_run(run_id)
            except Exception:  # noqa: BLE001 - not in this store: found by the run's identity instead
                run_id = None
        run_id = run_id or self._find(uid)
        self.created = run_id is None
        if run_id is not None:  # a resumed run continues its MLflow run
            self.client.update_run(run_id, status="RUNNING")
        else:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "xmodal"
            exp = self.client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(
                name, artifact_location=(self.out / "mlartifacts").resolve().as_uri() if self.own else None)
            run_id = self.client.create_run(exp_id, run_name=self.out.resolve().name,
                                            tags={"xmodal.run_uid": uid, "xmodal.seed_group": group,
                                                  "xmodal.run": self.out.resolve().name}).info.run_id
        self.run_id = run_id
        self.state = {"store": store, "run_id": run_id, **({} if self.own else {"tracking_uri": uri})}

    def _find(self, uid: str) -> str | None:
        """The newest run tagged with the run's identity (a lost ``trackers.json``), or None."""
        ids = [e.experiment_id for e in self.client.search_experiments()]
        if not ids:
            return None
        runs = self.client.search_runs(ids, filter_string=f"tags.`xmodal.run_uid` = '{uid}'", max_results=1,
                                       order_by=["attributes.start_time DESC"])
        return runs[0].info.run_id if runs else None

    def describe(self, config: dict, provenance: dict) -> None:
        from mlflow.entities import Param, RunTag

        params = [Param(k[:250], v[:6000]) for k, v in flat_params(config).items()]
        tags = [RunTag("xmodal.command", str(provenance.get("command", ""))[:5000]),
                RunTag("mlflow.source.git.commit", str(provenance.get("git_revision") or ""))]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i:i + 100], tags=tags if i == 0 else [])
        self.client.log_dict(self.run_id, config, "config.json")
        self.client.log_dict(self.run_id, provenance, "provenance.json")

    def steps(self, keys: list[str]) -> dict[str, set[int]]:
        return {k: {int(m.step) for m in self.client.get_metric_history(self.run_id, mlflow_key(k))} for k in keys}

    def scalars(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_key(k), float(v), now, int(step)) for step, values in rows for k, v in values.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def final(self, summary: dict, values: dict[str, float], step: int) -> None:
        self.scalars([(step, values)])
        self.client.log_dict(self.run_id, summary, "metrics.json")

    def log_model(self, folder: Path, model: Any) -> None:
        """The export folder as the run's ``model/`` artifact, with an ``MLmodel`` file (flavor ``xmodal``,
        a tensor signature) as MLflow's ``log_model`` writes one."""
        from xmodal.models.export import _version

        mlmodel = {
            "artifact_path": "model", "run_id": self.run_id,
            "utc_time_created": time.strftime("%Y-%m-%d %H:%M:%S.000000", time.gmtime()),
            "flavors": {"xmodal": {"format": "xmodal-export", "xmodal_version": _version(),
                                   "loader": "xmodal.load_model(path)", "data": "model.safetensors"}},
            "signature": mlflow_signature(model)}
        import yaml

        (folder / "MLmodel").write_text(yaml.safe_dump(mlmodel, sort_keys=False))
        self.client.log_artifacts(self.run_id, str(folder), "model")
        self.client.set_tag(self.run_id, "mlflow.log-model.history", json.dumps([mlmodel]))

    def close(self, finished: bool) -> None:
        try:  # stopped or killed: not left RUNNING; a resume sets it RUNNING again
            self.client.set_terminated(self.run_id, "FINISHED" if finished else "KILLED")
        finally:
            if self.own and (self.out / "mlflow.db").exists():
                relocate_artifacts(self.out / "mlflow.db", self.out, absolute=False)

    def abandon(self) -> None:
        self.close(False)


def mlflow_signature(model: Any) -> dict:
    """An MLflow tensor signature of ``model.similarity``: text and video features in, scores out (the form
    ``mlflow.models.ModelSignature.to_dict`` writes into ``MLmodel``)."""
    text, video = model.text_tower.spec, model.architecture()["video"]
    text_shape = [-1, -1, text.in_dim] if text.tokens else [-1, text.in_dim]

    def spec(name: str, shape: list[int], dtype: str = "float32") -> dict:
        return {"type": "tensor", "tensor-spec": {"dtype": dtype, "shape": shape}, "name": name}

    inputs = [spec("text_features", text_shape), spec("video_features", [-1, -1, int(video["in_dim"])]),
              spec("video_mask", [-1, -1], "bool")]
    return {"inputs": json.dumps(inputs), "outputs": json.dumps([spec("similarity", [-1, -1])]), "params": None}


def relocate_artifacts(db: Path, out: Path, *, absolute: bool) -> None:
    """Rewrite the artifact locations of the run's own MLflow store: under ``RUN/mlartifacts`` as this
    folder's absolute URI (``absolute``; MLflow's client writes through it) or relative to the run
    (``mlartifacts/...``, at rest). MLflow's ``Default`` experiment (``./mlruns/0`` of the working directory
    it was created in, never written to by xmodal) is put under ``mlartifacts`` too; other locations are
    left as they are."""
    import sqlite3

    base = (Path(out) / "mlartifacts").resolve().as_uri() if absolute else "mlartifacts"
    con = sqlite3.connect(str(db), timeout=30)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri"),
                              ("logged_models", "artifact_location")):
            if table not in tables:
                continue
            for rowid, loc in con.execute(f"SELECT rowid, {column} FROM {table}").fetchall():
                if not isinstance(loc, str):
                    continue
                # ours under mlartifacts; MLflow's own Default experiment under ./mlruns of the working directory
                marker = next((m for m in ("mlartifacts", "mlruns") if re.search(rf"(^|/){m}(/|$)", loc)), None)
                if marker is None:
                    continue
                cut = re.search(rf"(^|/){marker}(/|$)", loc).end(1)
                new = base + loc[cut + len(marker):]
                if new != loc:
                    con.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", (new, rowid))
        con.commit()
    finally:
        con.close()


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
    """One W&B run (offline by default): the recorded id, else the one derived from the run's identity."""

    name = "wandb"
    increasing = True  # W&B keeps a run's steps increasing: a lower step is dropped

    @staticmethod
    def check_installed() -> None:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ValueError("train.log_to: 'wandb' needs wandb (pip install 'xmodal[wandb]')") from None

    def __init__(self, out: Path, previous: Any, *, uid: str, group: str) -> None:
        import wandb

        from xmodal.training.wandb_file import repair, streams

        previous = previous if isinstance(previous, dict) else {}
        self.out = Path(out)
        mode = os.environ.get("WANDB_MODE") or "offline"
        run_id = previous["id"] if isinstance(previous.get("id"), str) and _WANDB_ID.fullmatch(previous["id"]) \
            else uid[:8]
        old = streams(self.out / "wandb", run_id)
        self.created = not old
        for path in old:  # a kill or a full disk tore the last record: cut back to the whole ones
            repair(path)
        _free_stream_second(self.out / "wandb", run_id)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "xmodal", dir=str(self.out), mode=mode,
                              id=run_id, resume="allow", name=self.out.resolve().name, group=group,
                              job_type="train", reinit="create_new",
                              settings=wandb.Settings(console="off", silent=True, x_disable_stats=True,
                                                      disable_git=True, save_code=False))
        self.run_id = run_id
        self.state = {"id": run_id, "mode": mode}

    def describe(self, config: dict, provenance: dict) -> None:
        self.run.config.update({**config, "provenance": provenance}, allow_val_change=True)

    def steps(self, keys: list[str]) -> dict[str, set[int]]:
        from xmodal.training.wandb_file import history, streams

        wanted = set(keys)
        have: dict[str, set[int]] = {k: set() for k in keys}
        for path in streams(self.out / "wandb", self.run_id):
            for step, key, _ in history(path):
                if key in wanted:
                    have[key].add(int(step))
        return have

    def scalars(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        merged: dict[int, dict[str, float]] = {}
        for step, values in rows:  # one history row per step, steps ascending (W&B's rule)
            merged.setdefault(int(step), {}).update(values)
        for step in sorted(merged):
            self.run.log(merged[step], step=step)

    def final(self, summary: dict, values: dict[str, float], step: int) -> None:
        self.run.summary.update(values)

    def log_model(self, folder: Path, model: Any) -> None:
        """The export folder as an artifact of type ``model`` (staged inside ``RUN/wandb``)."""
        import wandb

        from xmodal.models.export import _version

        if self.state["mode"] == "disabled":
            return
        before = os.environ.get("WANDB_DATA_DIR")
        os.environ["WANDB_DATA_DIR"] = str(self.out / "wandb" / "data")  # the staged copy stays in the run
        try:
            art = wandb.Artifact(f"model-{self.run_id}", type="model",
                                 metadata={"format": "xmodal-export", "xmodal_version": _version(),
                                           "loader": "xmodal.load_model(path)"})
            with contextlib.redirect_stderr(io.StringIO()):  # W&B prints "Adding directory to artifact ..."
                art.add_dir(str(folder))
                self.run.log_artifact(art, aliases=["latest"])
        finally:
            if before is None:
                os.environ.pop("WANDB_DATA_DIR", None)
            else:
                os.environ["WANDB_DATA_DIR"] = before

    def close(self, finished: bool) -> None:
        self.run.finish(exit_code=0 if finished else 1)

    def abandon(self) -> None:
        self.run.finish(exit_code=1)


def _free_stream_second(folder: Path, run_id: str) -> None:
    """Wait (at most about a second) until this second names no stream of ``run_id`` yet.

    W&B names an offline stream folder by the local second its process started
    (``offline-run-YYYYMMDD_HHMMSS-ID``, ``Settings._start_datetime``): a resume started within the same second
    as the stream before it would write that folder's file again and lose the earlier steps.
    """
    from datetime import datetime

    for _ in range(40):
        stamp = datetime.fromtimestamp(time.time()).strftime("%Y%m%d_%H%M%S")
        if not any((folder / f"{kind}-{stamp}-{run_id}").exists() for kind in ("offline-run", "run")):
            return
        time.sleep(0.05)


BACKENDS = {"mlflow": MlflowTracker, "wandb": WandbTracker}

__all__ = ["BACKENDS"]  # the classes open real tracker runs: used through xmodal.training.trackers.Trackers
