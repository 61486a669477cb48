"""Progress on stderr that also reaches a log file: a tqdm bar on a terminal, and without one a plain
line every ``XMODAL_PROGRESS_SECONDS`` seconds (default 30) and a last line at the end.

Every long command (``encode``, ``data import``, ``index``, ``report``, ``bench``) reports through
:func:`progress`, so a run under ``nohup`` / a scheduler / ``2> log`` says where it is::

    encode videos: 120/423 videos (28%), 3.1 videos/s, 40 s elapsed, about 1 min 38 s left

``show``: None (the default of every command: a bar on a terminal, lines otherwise), True (a bar even
without a terminal, ``--progress``) or False (nothing: ``--no-progress`` / ``--quiet``).

May import: the standard library and tqdm; nothing of xmodal (every layer may use it).

>>> import io
>>> out = io.StringIO()
>>> with progress(total=4, desc="demo", unit="file", show=None, file=out, every=0) as bar:
...     for _ in range(4):
...         bar.update(1)
>>> out.getvalue().splitlines()[-1].split(",")[0]
'demo: 4/4 files (100%)'
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

__all__ = ["progress", "Lines", "interval", "say", "Stages"]

#: Seconds between two progress lines without a terminal (``XMODAL_PROGRESS_SECONDS`` overrides).
DEFAULT_SECONDS = 30.0


def interval() -> float:
    """Seconds between progress lines: ``XMODAL_PROGRESS_SECONDS`` when it is a number >= 0, else 30."""
    try:
        value = float(os.environ.get("XMODAL_PROGRESS_SECONDS", DEFAULT_SECONDS))
    except ValueError:
        return DEFAULT_SECONDS
    return value if math.isfinite(value) and value >= 0 else DEFAULT_SECONDS


def _duration(seconds: float) -> str:
    """``7 s``, ``1 min 38 s``, ``2 h 05 min``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _plural(unit: str, n: float) -> str:
    if n == 1 or not unit or unit.endswith("s"):
        return unit
    if len(unit) > 1 and unit.endswith("y") and unit[-2] not in "aeiou":
        return unit[:-1] + "ies"  # queries, not querys
    return unit + ("es" if unit.endswith(("ch", "sh", "x")) else "s")  # batches, not batchs


class Lines:
    """The subset of tqdm's interface the commands use (``update``, ``write``, ``close``, iteration,
    ``with``), printing one line at most every ``every`` seconds and one at :meth:`close`."""

    def __init__(self, iterable: Iterable | None = None, *, total: int | None = None, desc: str = "",
                 unit: str = "it", file: IO[str] | None = None, every: float | None = None,
                 enabled: bool = True) -> None:
        _check(total, desc, unit, None, file, every)
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total, self.desc, self.unit = total, desc, unit
        self.file = file
        self.every = interval() if every is None else float(every)
        self.enabled = enabled
        self.n = 0
        self.start = self.last = time.monotonic()
        self.closed = False
        self.extra = ""
        self.printed = None  # (count, postfix) of the last line printed

    def _out(self) -> IO[str]:
        return self.file if self.file is not None else sys.stderr

    def line(self) -> str:
        """The progress line as it would be printed now."""
        elapsed = time.monotonic() - self.start
        what = _plural(self.unit, self.total if self.total is not None else self.n)
        done = f"{self.n}/{self.total} {what}" if self.total else f"{self.n} {what}"
        if self.total:
            done += f" ({100 * self.n / self.total:.0f}%)"
        parts = [f"{self.desc}: {done}" if self.desc else done]
        if self.n and elapsed > 0:
            rate = self.n / elapsed
            shown = f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"
            parts.append(f"{shown} {_plural(self.unit, 2)}/s" if rate >= 1 else
                         f"{_duration(1 / rate)} per {self.unit or 'item'}")
        parts.append(f"{_duration(elapsed)} elapsed")
        if self.total and self.n and self.n < self.total:
            parts.append(f"about {_duration(elapsed / self.n * (self.total - self.n))} left")
        return ", ".join(parts) + (f"; {self.extra}" if self.extra else "")

    def _print(self) -> None:
        try:
            print(self.line(), file=self._out(), flush=True)
        except (OSError, ValueError):  # a closed or broken stderr never stops the work
            self.enabled = False
        self.last, self.printed = time.monotonic(), (self.n, self.extra)

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.enabled and time.monotonic() - self.last >= self.every:
            self._print()

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:  # noqa: ARG002 - tqdm's name
        self.extra = str(text)

    def write(self, text: str, file: IO[str] | None = None) -> None:
        print(text, file=file if file is not None else self._out(), flush=True)

    def close(self) -> None:
        """The last line, when the work took at least one interval (a quick step prints nothing)."""
        long = self.printed is not None or time.monotonic() - self.start >= self.every
        if not self.closed and self.enabled and self.n and long and self.printed != (self.n, self.extra):
            self._print()
        self.closed = True

    def __iter__(self) -> Iterator:
        for item in self.iterable or ():
            yield item
            self.update(1)

    def __enter__(self) -> "Lines":
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is not None:  # a failure: its own message is the last line, not a progress line
            self.closed = True
        self.close()


def _check(total: Any, desc: Any, unit: Any, show: Any, file: Any, every: Any) -> None:
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
        raise ValueError(f"total: expected an integer >= 0 or None, got {type(total).__name__}")
    for name, v in (("desc", desc), ("unit", unit)):
        if not isinstance(v, str):
            raise TypeError(f"{name}: expected a string, got {type(v).__name__}")
    if show is not None and not isinstance(show, bool):
        raise TypeError(f"show: expected True, False or None, got {type(show).__name__}")
    if file is not None and not callable(getattr(file, "write", None)):
        raise TypeError(f"file: expected a text stream, got {type(file).__name__}")
    if every is not None and (isinstance(every, bool) or not isinstance(every, (int, float))
                              or not math.isfinite(every) or every < 0):
        raise ValueError(f"every: expected a number of seconds >= 0, got {type(every).__name__}")


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "", unit: str = "it",
             show: bool | None = None, file: IO[str] | None = None, every: float | None = None) -> Any:
    """A progress reporter over ``iterable`` (or ``total`` steps counted with ``update``).

    Args:
        iterable: what to iterate over (optional).
        total: the number of steps (``len(iterable)`` by default).
        desc: what is being done (``"encode videos"``).
        unit: the thing counted (``"video"``; pluralised by appending ``s``).
        show: None: a tqdm bar on a terminal, else plain lines; True: a tqdm bar anyway; False: silent.
        file: where to print (default ``sys.stderr`` at print time).
        every: seconds between lines (default :func:`interval`).

    Returns:
        a ``tqdm`` object or a :class:`Lines`; both have ``update``, ``write``, ``close`` and iterate.
    """
    _check(total, desc, unit, show, file, every)
    if iterable is not None and not isinstance(iterable, Iterable):
        raise TypeError(f"iterable: expected an iterable or None, got {type(iterable).__name__}")
    stream = file if file is not None else sys.stderr
    tty = bool(getattr(stream, "isatty", lambda: False)())
    if show is True or (show is None and tty):
        from tqdm.auto import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, file=stream, dynamic_ncols=True)
    return Lines(iterable, total=total, desc=desc, unit=unit, file=file, every=every, enabled=show is None)


def say(text: str, *, show: bool | None = None, file: IO[str] | None = None) -> None:
    """One stage line on stderr (``index: fitting the Sinkhorn bias on 5,000 queries``), unless ``show``
    is False (``--no-progress`` / ``--quiet``)."""
    if not isinstance(text, str):
        raise TypeError(f"text: expected a string, got {type(text).__name__}")
    _check(None, "", "", show, file, None)
    if show is False:
        return
    try:
        print(text, file=file if file is not None else sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class Stages:
    """Where a command with few long steps is (``index``, ``report``): call the object with each stage's
    line; without a terminal the current stage is printed every ``every`` seconds while it runs (a
    command done sooner prints nothing), with ``show=True`` (or ``every`` 0) each stage at once.

    >>> import io
    >>> out = io.StringIO()
    >>> with Stages(show=True, file=out) as stage:
    ...     stage("index: building the flat index")
    >>> out.getvalue().splitlines()
    ['index: building the flat index']
    """

    def __init__(self, *, show: bool | None = None, file: IO[str] | None = None, every: float | None = None) -> None:
        _check(None, "", "", show, file, every)
        self.show, self.file = show, file
        self.every = interval() if every is None else float(every)
        self.current: str | None = None
        self.start = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"text: expected a string, got {type(text).__name__}")
        self.current = text
        if self.show is True or (self.show is None and self.every == 0):
            say(text, file=self.file)

    def clear(self) -> None:
        """No current stage: nothing is repeated until the next one (another reporter, e.g. a
        training epoch's own progress lines, speaks meanwhile)."""
        self.current = None

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            if self.current is not None:
                say(f"{self.current}; {_duration(time.monotonic() - self.start)} elapsed", file=self.file)

    def __enter__(self) -> "Stages":
        if self.show is None and self.every > 0:
            self._thread = threading.Thread(target=self._tick, name="xmodal-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)
