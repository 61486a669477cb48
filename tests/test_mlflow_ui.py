"""The documented ``mlflow ui`` command works on a run's own store (issue 35.3): ``cd RUN && mlflow ui
--backend-store-uri sqlite:///mlflow.db`` is started for real on 127.0.0.1, its page and API answer, and an
artifact the run logged is served through the run's relative artifact location.

``mlflow ui`` needs the full ``mlflow`` package (the ``[mlflow-ui]`` extra: its server and page), not the
``mlflow-skinny`` client of the ``[mlflow]`` extra; without it the test skips, naming the extra. The
environment variable ``XMODAL_MLFLOW_UI`` may name an ``mlflow`` executable of another environment.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_workbench_logs import tiny  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _mlflow_ui() -> list[str]:
    """The command that starts ``mlflow ui``, or a skip naming the extra."""
    given = os.environ.get("XMODAL_MLFLOW_UI")
    if given:
        return [given]
    try:
        import mlflow
    except ImportError:
        pytest.skip("MLflow is not installed (pip install 'xmodal[mlflow-ui]')")
    if not (Path(mlflow.__file__).parent / "server" / "js" / "build" / "index.html").is_file():
        pytest.skip("mlflow ui needs the full mlflow package, this environment has mlflow-skinny "
                    "(pip install 'xmodal[mlflow-ui]')")
    exe = Path(sys.executable).with_name("mlflow")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "mlflow"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=120) as r:  # noqa: S310 - 127.0.0.1 only
        return r.status, r.read()


def test_mlflow_ui_serves_a_run_and_its_artifacts(tmp_path):
    pytest.importorskip("mlflow.tracking", reason="the [mlflow] extra is not installed (pip install 'xmodal[mlflow]')")
    command = _mlflow_ui()
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    run = tmp_path / "run"
    train(from_dict(tiny(train={"log_to": ["mlflow"], "epochs": 2})), run, verbose=False)
    copy = tmp_path / "copied" / "run"  # a copied run folder: its artifacts are found where it now lies
    shutil.copytree(run, copy)
    shutil.rmtree(run)
    port = _free_port()
    proc = subprocess.Popen([*command, "ui", "--backend-store-uri", "sqlite:///mlflow.db", "--host", "127.0.0.1",
                             "--port", str(port)], cwd=copy, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, env={k: v for k, v in os.environ.items()
                                                         if not k.startswith("MLFLOW_")})
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(240):  # the server starts in seconds; a busy machine may take a minute
            try:
                status, page = _get(base + "/")
                break
            except OSError:
                if proc.poll() is not None:
                    raise AssertionError(f"mlflow ui exited: {proc.stderr.read().decode()[-2000:]}") from None
                time.sleep(0.5)
        else:
            raise AssertionError("mlflow ui did not answer within 2 minutes")
        assert status == 200 and b"<html" in page.lower()
        state = json.loads((copy / "trackers.json").read_text())["mlflow"]
        status, body = _get(f"{base}/ajax-api/2.0/mlflow/runs/get?run_id={state['run_id']}")
        info = json.loads(body)["run"]["info"]
        assert status == 200 and info["status"] == "FINISHED" and not info["artifact_uri"].startswith(("/", "file:"))
        status, body = _get(f"{base}/get-artifact?path=config.json&run_uuid={state['run_id']}")
        assert status == 200 and json.loads(body)["model"]["kind"] == "linear"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
