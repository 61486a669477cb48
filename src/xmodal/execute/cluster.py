"""Shards of an embarrassingly parallel command run as tasks on a Dask cluster (``--cluster``).

The work is split into exactly the shards ``--shard K/N`` makes (:mod:`xmodal.features.shards`), one
task per shard; each task writes what one process given ``--shard K/N`` writes, so the result is the
bytes a single process writes. The engine is Dask ``distributed`` (extra ``[cluster]``): a pure-Python
dependency of a few MB that users already run on a laptop (``LocalCluster``), on SLURM/PBS
(``dask-jobqueue``), Kubernetes or YARN, with retries and rescheduling built in (docs/scale.md says why
not Ray). Its scheduler gives:

- retries: a task that raises is run again up to ``retries`` times (``Client.submit(retries=)``); a task
  whose worker process dies (SIGKILL, out of memory, a lost machine) is rescheduled on another worker
  (``distributed.scheduler.allowed-failures``, set to ``retries`` for a local cluster), and a shard
  re-run skips the videos its killed attempt finished;
- progress: tasks send one event per item to the client (``Worker.log_event`` / ``Client.subscribe_topic``),
  which shows one progress line across all workers.

``local:N`` starts a ``LocalCluster`` of N worker *processes* of one thread each (torch keeps its own
``--threads``); any other value is a scheduler address (``tcp://host:8786``) of a running cluster whose
workers see the same paths (a shared file system) and have xmodal installed.

May import: the standard library, :mod:`xmodal.progress`; ``distributed`` lazily.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["parse_cluster", "connect", "run_shards", "report_item", "kill_once", "DEFAULT_RETRIES", "KILL_ONCE_ENV"]

#: Attempts after the first for a shard whose task fails or whose worker dies.
DEFAULT_RETRIES = 3
#: Largest ``local:N``.
MAX_LOCAL_WORKERS = 256
#: Test hook: a path; the first task to call :func:`kill_once` creates it (O_EXCL) and SIGKILLs its own worker
#: process, so the tests see a worker die mid-shard exactly once.
KILL_ONCE_ENV = "XMODAL_TEST_KILL_WORKER_ONCE"


def kill_once() -> None:
    """From inside a task, after an item: the test hook of :data:`KILL_ONCE_ENV` (a no-op when unset)."""
    marker = os.environ.get(KILL_ONCE_ENV)
    if not marker:
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def parse_cluster(text: Any, flag: str = "--cluster") -> tuple[str, Any]:
    """``"local:N"`` -> ``("local", N)``; a scheduler address -> ``("address", text)``.

    >>> parse_cluster("local:2"), parse_cluster("tcp://10.0.0.5:8786")
    (('local', 2), ('address', 'tcp://10.0.0.5:8786'))
    """
    from xmodal._validate import short_repr, text_label

    flag = text_label(flag, "flag")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{flag}: expected local:N or a scheduler address (tcp://HOST:PORT), got {short_repr(text)}")
    text = text.strip()
    if text.startswith("local"):
        m = re.fullmatch(r"local:(\d{1,4})", text)
        if m is None or not 1 <= int(m[1]) <= MAX_LOCAL_WORKERS:
            raise ValueError(f"{flag}: expected local:N with 1 <= N <= {MAX_LOCAL_WORKERS}, got {short_repr(text)}")
        return "local", int(m[1])
    if not re.fullmatch(r"([a-z]+://)?[\w.\-\[\]:]+(:\d{1,5})?", text):
        raise ValueError(f"{flag}: expected local:N or a scheduler address (tcp://HOST:PORT), got {short_repr(text)}")
    return "address", text


def _distributed():
    try:
        import distributed
    except ModuleNotFoundError:
        raise ModuleNotFoundError("--cluster needs Dask distributed: pip install 'xmodal[cluster]'") from None
    return distributed


@contextmanager
def connect(spec: tuple[str, Any], *, retries: int = DEFAULT_RETRIES) -> Iterator[Any]:
    """A ``distributed.Client`` of :func:`parse_cluster`'s ``spec`` (a local cluster is closed after)."""
    distributed = _distributed()
    import dask

    kind, value = spec
    if kind == "local":
        # the scheduler runs in this process: a worker killed mid-task is rescheduled up to `retries` times;
        # its HTTP server on a free port (":0"), never a warning about a busy 8787
        with dask.config.set({"distributed.scheduler.allowed-failures": retries}):
            cluster = distributed.LocalCluster(n_workers=value, threads_per_worker=1, processes=True,
                                               dashboard_address=":0", silence_logs=40)
            try:
                with distributed.Client(cluster) as client:
                    yield client
            finally:
                try:
                    cluster.close()
                except TimeoutError:
                    # a worker restarted after a kill may still be starting: its nanny kills it, but the wait
                    # for its exit can time out; the shards' results are already in
                    pass
        return
    try:
        client = distributed.Client(value, timeout="30s")
    except (OSError, TimeoutError) as exc:
        raise ValueError(f"--cluster: no Dask scheduler answers at {value} ({str(exc)[:160]})") from None
    with client:
        yield client


def report_item(topic: str | None, **fields: Any) -> None:
    """From inside a task: tell the client one item is done (its progress line); a no-op outside a worker."""
    if topic is None:
        return
    try:
        from distributed import get_worker

        get_worker().log_event(topic, fields)
    except (ImportError, ValueError):  # not on a Dask worker: nothing to tell
        pass


def run_shards(client: Any, task: Callable[..., dict], n: int, *, kwargs: dict, retries: int = DEFAULT_RETRIES,
               bar: Any = None, on_result: Callable[[int, dict], None] | None = None,
               shard_kwargs: Callable[[int], dict] | None = None) -> dict[int, dict]:
    """Run ``task(shard=(K, n), topic=TOPIC, **kwargs, **shard_kwargs(K))`` for K = 1..n on ``client``;
    ``{K: result}``.

    Args:
        client: a ``distributed.Client`` (:func:`connect`).
        task: a module-level function (workers import it by name), returning a picklable dict.
        n: the number of shards.
        kwargs: the task's other keyword arguments (the same for every shard).
        retries: attempts after the first for a task that raises.
        bar: a progress bar (:func:`xmodal.progress.progress`) that each :func:`report_item` advances by its
            ``items`` field (default 1).
        on_result: called in this thread with ``(K, result)`` as each shard finishes.
        shard_kwargs: shard K's own keyword arguments (its share of a list of items), sent to its task only.

    Raises:
        ValueError: one line naming the shard when a task still fails (or its worker keeps dying) after the
            retries.
    """
    distributed = _distributed()
    from xmodal._validate import duck, positive_int, short_repr, whole_number

    duck(client, "client", "a distributed.Client", methods=("submit", "subscribe_topic"))
    if not callable(task):
        raise TypeError(f"task: expected a module-level function, got {short_repr(task)}")
    n = positive_int(n, "n")
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise TypeError(f"kwargs: expected a dict of keyword arguments, got {short_repr(kwargs)}")
    retries = whole_number(retries, "retries")
    for name, fn in (("on_result", on_result), ("shard_kwargs", shard_kwargs)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name}: expected a function of the shard number, got {short_repr(fn)}")
    own = shard_kwargs or (lambda k: {})
    topic = f"xmodal-progress-{uuid.uuid4().hex[:12]}"
    lock = threading.Lock()

    def advance(event: Any) -> None:
        msg = event[1] if isinstance(event, tuple) and len(event) == 2 else event
        if bar is not None and isinstance(msg, dict):
            with lock:
                bar.update(int(msg.get("items", 1)))

    client.subscribe_topic(topic, advance)
    futures = {client.submit(task, shard=(k, n), topic=topic, **kwargs, **own(k), key=f"xmodal-shard-{k}-of-{n}-{topic}",
                             retries=retries, pure=False): k for k in range(1, n + 1)}
    results: dict[int, dict] = {}
    try:
        for future in distributed.as_completed(list(futures)):
            k = futures[future]
            try:
                results[k] = future.result()
            except distributed.KilledWorker:
                raise ValueError(f"shard {k}/{n}: its worker died {retries + 1} times (killed or out of memory); "
                                 f"re-run to resume (finished items are kept)") from None
            except (ValueError, OSError, ModuleNotFoundError) as exc:
                raise ValueError(f"shard {k}/{n}: {exc}") from None
            if on_result is not None:
                on_result(k, results[k])
    finally:
        for future in futures:
            future.cancel()
        try:
            client.unsubscribe_topic(topic)
        except (KeyError, ValueError):
            pass
    return results
