"""Video files decoded in worker processes for one encoder (``xmodal encode videos --workers N``).

Decoding usually costs more than encoding: a 30 s video at 30 fps sampled at 1 frame per second decodes
900 frames for 30 encoded ones. With ``workers`` N >= 2, N processes decode (PyAV, each with its own
FFmpeg threads) while this process runs the image encoder on batches of frames:

- video ``i`` of the list goes to worker ``i % N``, which decodes its videos in list order and sends each
  video's *events* through a queue of its own: the sampled frames as RGB ``uint8 [H, W, 3]`` (already
  scaled to ``max_side``, as the in-process path converts them), a restart mark when the frame count was
  guessed wrong, and the end (with a truncation note) or the error that stopped the video;
- this process reads the events video by video in list order, so the frames reach the encoder in the
  same order and in the same batches as with ``workers=1`` (decoding here): the features are bit-identical
  (``tests/test_video_workers.py``);
- memory is bounded by the settings: each queue holds at most ``prefetch`` events (frames of at most
  ``max_side`` x ``max_side`` pixels), whatever the videos' lengths, and each worker's FFmpeg runs
  ``min(2, cores // N)`` threads (at least one), so N workers do not multiply the decoders' frames;
- a worker that dies (a decoder crash, the kernel's OOM killer) fails the video it was decoding, named,
  and a new worker takes over the rest of its share: one bad file never stops the others.

Workers are started with ``spawn`` (a clean interpreter: they import numpy and PyAV, never torch) and
ignore Ctrl-C, which the encoding process handles by stopping them.
"""

from __future__ import annotations

import os
import queue as queue_module
import signal
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["video_events", "FRAME", "RESTART", "END"]

#: Event kinds of one video: a sampled RGB frame, "the frames so far were chosen on a wrong count", the end.
FRAME, RESTART, END = "frame", "restart", "end"
_ERROR, _FATAL = "error", "fatal"  # a failure of this video / of the whole run (a missing extra)


def video_events(path: Any, *, frames: int | None, fps: float | None, max_side: int | None,
                 max_pixels: int, max_decoded: int | None = None) -> Iterator[tuple[str, Any]]:
    """The events of one video decoded in this process: ``(FRAME, rgb)``, ``(RESTART, None)``, and last
    ``(END, truncation note or None)``; a file that cannot be decoded raises (a ValueError naming it).

    >>> next(video_events("missing.mp4", frames=4, fps=None, max_side=None, max_pixels=100))
    Traceback (most recent call last):
    ...
    ValueError: missing.mp4: video file not found
    """
    from xmodal.features import video

    stream = video._sampled(video._path(path), frames=frames, fps=fps, max_pixels=int(max_pixels),
                            max_decoded=max_decoded)
    while True:
        try:
            item = next(stream)
        except StopIteration as stop:
            yield END, stop.value[1]
            return
        if item is video.RESTART:
            yield RESTART, None
        else:
            yield FRAME, video.to_rgb(item[1], max_side)


def _work(jobs: list[tuple[Any, str]], events: Any, settings: dict, threads: int) -> None:
    """A worker: decode ``jobs`` (path, name) in order, every event into ``events``, with ``threads``
    FFmpeg threads."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the encoding process stops the workers
    from xmodal.features import video

    video.DECODE_THREADS = threads  # this process's decoder only

    for path, name in jobs:
        try:
            for event in video_events(path, **settings):
                events.put(event)
        except ImportError as exc:  # no PyAV: the run's problem, not a file's
            events.put((_FATAL, str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - one bad file never stops the others
            events.put((_ERROR, str(video._named(exc, name))))


class Decoders:
    """``workers`` decoding processes over ``paths``; :meth:`events` gives video ``i``'s events in list order.

    Args:
        paths: the video files.
        names: the name of each file in messages.
        workers: processes (>= 1).
        prefetch: events each worker may have queued ahead (frames in memory: ``workers * prefetch``).
        frames, fps, max_side, max_pixels, max_decoded: the sampling and limits of :func:`video_events`.

    Use as a context manager (the workers are stopped at exit, also on an error or Ctrl-C).
    """

    def __init__(self, paths: Sequence[Any], names: Sequence[str], *, workers: int, prefetch: int,
                 frames: int | None, fps: float | None, max_side: int | None, max_pixels: int,
                 max_decoded: int | None = None) -> None:
        from xmodal._validate import short_repr, whole_number

        if isinstance(paths, (str, os.PathLike)) or not isinstance(paths, Sequence):
            raise TypeError(f"paths: expected a list of video files, got {short_repr(paths)}")
        if isinstance(names, str) or not isinstance(names, Sequence) or len(names) != len(paths) \
                or not all(isinstance(n, str) for n in names):
            raise TypeError(f"names: expected one name (a string) per path, got {short_repr(names)}")
        self.workers = whole_number(workers, "workers", minimum=1)
        self.prefetch = whole_number(prefetch, "prefetch", minimum=1)
        self.settings = {"frames": frames, "fps": fps, "max_side": max_side, "max_pixels": int(max_pixels),
                         "max_decoded": max_decoded}
        self.paths, self.names = list(paths), list(names)
        from xmodal.features.video import DECODE_THREADS

        # FFmpeg threads per worker: the cores shared out, at most DECODE_THREADS (which bounds the frames
        # a decoder holds), at least one; N workers on N cores decode one thread each
        self.threads = max(1, min(DECODE_THREADS, (os.cpu_count() or 1) // self.workers))
        import multiprocessing

        self._ctx = multiprocessing.get_context("spawn")
        self._procs: list[Any] = [None] * self.workers
        self._queues: list[Any] = [None] * self.workers
        for w in range(min(self.workers, len(self.paths))):
            self._start(w, w)

    def _start(self, w: int, first: int) -> None:
        """Worker ``w`` decoding its share (videos ``w, w + N, ...``) from video ``first`` on."""
        jobs = [(os.fspath(self.paths[i]) if isinstance(self.paths[i], os.PathLike) else self.paths[i],
                 self.names[i]) for i in range(first, len(self.paths), self.workers)]
        q = self._ctx.Queue(maxsize=self.prefetch)
        p = self._ctx.Process(target=_work, args=(jobs, q, self.settings, self.threads), name=f"xmodal-decoder-{w}",
                              daemon=True)
        p.start()
        self._procs[w], self._queues[w] = p, q

    def events(self, i: int) -> Iterator[tuple[str, Any]]:
        """Video ``i``'s events, as :func:`video_events` yields them (videos must be read in list order)."""
        w = i % self.workers
        while True:
            kind, value = self._get(w, i)
            if kind == _ERROR:
                raise ValueError(value)
            if kind == _FATAL:
                raise ModuleNotFoundError(value)
            yield kind, value
            if kind == END:
                return

    def _get(self, w: int, i: int) -> tuple[str, Any]:
        proc, q = self._procs[w], self._queues[w]
        while True:
            try:
                return q.get(timeout=0.5)
            except queue_module.Empty:
                if proc.is_alive():
                    continue
            except (EOFError, OSError, ValueError):  # a message cut off by the worker's death
                pass
            try:  # the worker is gone: what it sent before it died comes first
                return q.get(timeout=0.2)
            except (queue_module.Empty, EOFError, OSError, ValueError):
                pass
            code = proc.exitcode
            self._drop(w)
            if i + self.workers < len(self.paths):
                self._start(w, i + self.workers)  # the rest of its share
            how = f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"
            raise ValueError(f"{self.names[i]}: the decoding process died while decoding it ({how})")

    def _drop(self, w: int) -> None:
        p, q = self._procs[w], self._queues[w]
        if p is not None:
            if p.is_alive():
                p.terminate()
            p.join(timeout=5)
        if q is not None:
            q.cancel_join_thread()
            q.close()
        self._procs[w], self._queues[w] = None, None

    def close(self) -> None:
        for w in range(self.workers):
            self._drop(w)

    def __enter__(self) -> "Decoders":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
