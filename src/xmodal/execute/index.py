"""Index shards as tasks on a Dask cluster: shard K of N of a gallery added into a copy of a trained empty
index (:func:`xmodal.retrieval.ondisk.add_shard`), one task per shard, retried like every shard
(:func:`xmodal.execute.cluster.run_shards`); :func:`xmodal.retrieval.ondisk.merge_shards` joins them after."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

__all__ = ["add_index_shards", "add_shard_task", "PeakAnon"]


class PeakAnon:
    """The peak of this process's anonymous memory (``RssAnon`` of ``/proc/self/status``, kB), sampled
    every ``every`` seconds by a thread while in the ``with`` block (Linux; 0 elsewhere)."""

    def __init__(self, every: float = 0.02) -> None:
        self.every, self.peak_kb = every, 0
        self._stop = threading.Event()

    def _read(self) -> int:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.peak_kb = max(self.peak_kb, self._read())

    def __enter__(self) -> "PeakAnon":
        self.peak_kb = self._read()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_kb = max(self.peak_kb, self._read())


def add_shard_task(*, shard: tuple[int, int], topic: str | None, trained: str, rows: str, bias: str | None,
                   out_dir: str, threads: int | None = 1) -> dict:
    """One shard's task (on a worker): the gallery ``rows`` (``.npy``, memory-mapped) and ``bias`` (``.npy``
    or None) of shard ``shard`` added to a copy of ``trained``; ``{"path", "rows", "peak_anon_kb", "pid", "cpu_s"}``
    (``cpu_s``: this process's CPU seconds for the task, all its threads)."""
    import numpy as np

    from xmodal.execute.cluster import report_item
    from xmodal.retrieval.index import import_faiss
    from xmodal.retrieval.ondisk import add_shard, shard_rows

    if threads is not None:
        from xmodal._validate import whole_number

        import_faiss().omp_set_num_threads(whole_number(threads, "threads", minimum=1))
    cpu = time.process_time()
    with PeakAnon() as peak:
        gallery = np.load(rows, mmap_mode="r", allow_pickle=False)
        b = None if bias is None else np.load(bias, mmap_mode="r", allow_pickle=False)
        path = add_shard(trained, gallery, shard, out_dir, bias=b)
    start, stop = shard_rows(int(gallery.shape[0]), shard)
    report_item(topic, items=stop - start)
    return {"path": str(path), "rows": stop - start, "peak_anon_kb": peak.peak_kb, "pid": os.getpid(),
            "cpu_s": time.process_time() - cpu}


def add_index_shards(trained: str | os.PathLike, rows: str | os.PathLike, out_dir: str | os.PathLike, *, shards: int,
                     cluster: str, bias: str | os.PathLike | None = None, threads: int | None = 1,
                     progress: bool | None = None, retries: int | None = None) -> dict[int, dict]:
    """Add the ``shards`` shards of the gallery ``rows`` (a ``.npy`` every worker can read) on ``cluster``
    (``local:N`` or a scheduler address); ``{K: task result}``. Progress counts gallery rows."""
    import numpy as np

    from xmodal.execute import cluster as engine
    from xmodal.progress import progress as progress_bar

    spec = engine.parse_cluster(cluster)
    n = int(np.load(rows, mmap_mode="r", allow_pickle=False).shape[0])
    kwargs = dict(trained=str(Path(trained).resolve()), rows=str(Path(rows).resolve()),
                  bias=None if bias is None else str(Path(bias).resolve()), out_dir=str(Path(out_dir).resolve()),
                  threads=threads)
    retries = engine.DEFAULT_RETRIES if retries is None else retries
    with engine.connect(spec, retries=retries) as client:
        with progress_bar(total=n, desc=f"index shards ({shards})", unit="video", show=progress) as bar:
            return engine.run_shards(client, add_shard_task, shards, kwargs=kwargs, retries=retries, bar=bar)
