"""The ``xmodal`` subcommands: one module per command (``NAME``, ``HELP``, ``add_arguments(parser)``,
``run(args) -> int``), and here what they share: the flags every command spells the same way
(:func:`add_common_args`), one-line errors, Markdown tables and reading the files that flags name.

May import anything in xmodal; a command module imports no other command module (what two commands
share lives here or in the library). :mod:`xmodal.cli` collects the modules into one parser.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from xmodal.metrics.formatting import markdown_table  # noqa: F401  (the commands' one table format)


class UsageError(Exception):
    """A command-line error: reported as one line ``PROG: error: MESSAGE``."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        # argparse prints the whole usage block and exits; one line names the problem.
        raise UsageError(self.prog, f"{message} (see '{self.prog} --help')")


MAX_THREADS = 1024


def _threads(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if not 1 <= value <= MAX_THREADS:
        raise argparse.ArgumentTypeError(f"must be in [1, {MAX_THREADS}], got {value}")
    return value


def add_common_args(parser: argparse.ArgumentParser, *, threads: int | None | bool = 1,
                    progress: bool = True, ks: str | None = None, l2: bool = False) -> None:
    """Add the flags every command spells the same way.

    Args:
        parser: the subcommand's parser.
        threads: default of ``--threads`` (an int, or None for torch's choice);
            False leaves the flag out.
        progress: add ``--progress/--no-progress`` and ``--quiet``.
        ks: default of ``--ks`` (e.g. ``"1,5,10"``); None leaves the flag out.
        l2: add ``--l2`` (+ hidden alias ``--normalize``).
    """
    g = parser.add_argument_group("common options")
    if threads is not False:
        default = "torch's choice" if threads is None else threads
        g.add_argument("--threads", type=_threads, default=threads, metavar="N",
                       help=f"torch CPU threads (default {default}; small heads gain nothing "
                            "from more, and spinning threads slow down badly on a busy machine)")
        parser.set_defaults(_common_threads=True)
    if progress:
        g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="progress on stderr: by default a bar on a terminal, else a line every 30 s "
                            "(XMODAL_PROGRESS_SECONDS); --progress: a bar anyway; --no-progress: neither")
        g.add_argument("--quiet", action="store_true",
                       help="print only errors, warnings and the final summary (no progress, no per-epoch "
                            "or plan lines)")
    if ks is not None:
        g.add_argument("--ks", default=ks, metavar="K,K,...",
                       help=f"recall cut-offs, comma separated (default {ks})")
    if l2:
        g.add_argument("--l2", action="store_true",
                       help="L2-normalise the embeddings first (cosine similarity)")
        g.add_argument("--normalize", dest="l2", action="store_true", help=argparse.SUPPRESS)


def apply_threads(args: argparse.Namespace) -> None:
    """``torch.set_num_threads(args.threads)`` for commands whose ``--threads`` comes from
    :func:`add_common_args` (validated there); others set their own."""
    n = getattr(args, "threads", None)
    if n is not None and getattr(args, "_common_threads", False):
        import torch

        torch.set_num_threads(int(n))


def progress_enabled(args: argparse.Namespace) -> bool:
    """Progress bars: ``--progress``/``--no-progress`` as given (``--quiet``: none), else whether stderr is
    a terminal."""
    if getattr(args, "quiet", False):
        return False
    flag = getattr(args, "progress", None)
    return bool(sys.stderr.isatty()) if flag is None else bool(flag)


def progress_choice(args: argparse.Namespace) -> bool | None:
    """The ``show`` of :func:`xmodal.progress.progress`: None (neither flag: a bar on a terminal, else a
    line every 30 s), True (``--progress``) or False (``--no-progress`` / ``--quiet``)."""
    if getattr(args, "quiet", False):
        return False
    flag = getattr(args, "progress", None)
    return None if flag is None else bool(flag)


def parse_ks(text: str, flag: str = "--ks") -> tuple[int, ...]:
    """``"1,5,10"`` -> ``(1, 5, 10)``; anything else is a ValueError naming the flag."""
    parts = [p for p in str(text).replace(" ", "").split(",") if p]
    try:
        ks = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated positive integers, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise ValueError(f"{flag}: expected comma-separated positive integers, got {text!r}")
    return ks




def one_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


def os_error_text(exc: OSError) -> str:
    """``OSError`` as one line: "no space left on device while writing FILE", "Permission denied: FILE"."""
    import errno

    what = exc.strerror or one_line(exc)
    where = exc.filename
    if exc.errno == errno.ENOSPC:
        if what.startswith("no space left on device while writing"):
            return what
        return "no space left on device" + (f" while writing {where}" if where is not None else "")
    return f"{what}: {where}" if where is not None else what




def read_caption_file(path: str, flag: str) -> list[str]:
    """The captions of a text file given with ``flag`` (one a line, :func:`xmodal.data.loaders.read_captions`);
    an unreadable or empty file is one ValueError naming ``flag``."""
    from xmodal.data.loaders import read_captions

    try:
        captions = read_captions(path)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None
    if not captions:
        raise ValueError(f"{flag}: {path} holds no captions")
    return captions


def load_npy(path: str | None, flag: str, *, mmap: bool = False) -> np.ndarray:
    """A ``.npy`` of numbers (or bools) given by ``flag``; the header is checked before any allocation
    (:func:`xmodal.data.npyfile.load_array`); an ``.npz``, a corrupt file or an array of strings
    is one line naming both. ``mmap``: memory-mapped read-only in its stored dtype (large features)."""
    from xmodal.data.npyfile import load_array

    if path is None:
        raise ValueError(f"{flag}: required")
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag}: {path} is a directory, not a .npy file")
    if not p.is_file():
        raise FileNotFoundError(f"{flag}: no such file: {path}")
    x = load_array(p, f"{flag}: {path}", mmap=mmap)
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_) or np.issubdtype(x.dtype, np.complexfloating):
        raise ValueError(f"{flag}: {path} holds {x.dtype} values, not real numbers")
    return x


def load_run(path: str, flag: str = "--run"):
    """``xmodal.load_model(path)``; a missing/corrupt/foreign run is a ValueError naming ``flag``."""
    import xmodal

    try:
        return xmodal.load_model(path)
    except (FileNotFoundError, ValueError, TypeError) as exc:
        msg = str(exc)
        if msg.startswith("path: "):
            msg = msg[len("path: "):]
        raise ValueError(f"{flag}: {msg}") from None
