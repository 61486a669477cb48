"""``xmodal`` command line: one subcommand per module in :mod:`xmodal.commands`.

Each module in ``xmodal/commands/`` defines ``NAME`` (the subcommand), ``HELP``
(one line), ``add_arguments(parser)`` and ``run(args) -> int``. Config objects
stop here: subcommands turn flags into explicit keyword arguments.

Flags shared by several commands come from :func:`add_common_args` so that they
have one name and one meaning everywhere: ``--threads N``, ``--ks 1,5,10``,
``--progress/--no-progress`` (default: only when stderr is a terminal; ``--quiet``
is a hidden alias of ``--no-progress``) and ``--l2`` (``--normalize`` is a hidden
alias). Tables are Markdown (:func:`markdown_table`). Every error, argparse's
included, is one line ``xmodal CMD: error: ...``.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from typing import Any, Sequence

import xmodal
from xmodal import commands as _commands


class UsageError(Exception):
    """A command-line error: reported as one line ``PROG: error: MESSAGE``."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
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
        progress: add ``--progress/--no-progress`` (+ hidden ``--quiet``).
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
                       help="progress bars on stderr (default: only when stderr is a terminal)")
        g.add_argument("--quiet", dest="progress", action="store_const", const=False,
                       help=argparse.SUPPRESS)
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
    """``--progress``/``--no-progress`` as given, else whether stderr is a terminal."""
    flag = getattr(args, "progress", None)
    return bool(sys.stderr.isatty()) if flag is None else bool(flag)


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


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """The house table: Markdown, first column left-aligned, the others right-aligned.

    >>> print(markdown_table(["direction", "R@1"], [["t2v", "50.00"]]))
    | direction | R@1 |
    |---|---:|
    | t2v | 50.00 |
    """
    lines = ["| " + " | ".join(map(str, header)) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines)


def _command_modules():
    for info in sorted(pkgutil.iter_modules(_commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        yield importlib.import_module(f"xmodal.commands.{info.name}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="xmodal",
        description=(
            "Cross-modal (video/image <-> text) contrastive learning and retrieval on "
            "pre-extracted features: train two-tower heads with any of the InfoNCE / "
            "NT-Xent / MaxMargin / MIL-NCE / DCL / CrossCLR / NCL / Cali-NCE objectives, "
            "evaluate R@K, MdR, MnR, mAP and nDCG exactly, and apply test-time "
            "normalisation (DN, NCL Sinkhorn biases, QB-Norm, IS, DSL)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run 'xmodal COMMAND --help' for the options of one command.",
    )
    parser.add_argument("--version", action="version", version=f"xmodal {xmodal.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _command_modules():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # name the subcommand whose flags were wrong, not the top-level parser
            prog = f"xmodal {args.command}" if getattr(args, "command", None) else "xmodal"
            raise UsageError(prog, f"unrecognized arguments: {' '.join(extra)} (see '{prog} --help')")
    except UsageError as exc:
        print(f"{exc.prog}: error: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 0
    try:
        apply_threads(args)
        return int(args._run(args) or 0)
    except BrokenPipeError:
        return _stdout_gone()
    except UsageError as exc:
        print(f"{exc.prog}: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, FileNotFoundError, ImportError) as exc:
        # One-line errors for bad input; tracebacks are for bugs.
        print(f"xmodal {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, an unwritable folder: one line, exit status 1
        print(f"xmodal {args.command}: error: {os_error_text(exc)}", file=sys.stderr)
        return 1


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


def os_error_text(exc: OSError) -> str:
    """``OSError`` as one line: "no space left on device while writing FILE", "Permission denied: FILE"."""
    import errno

    what = exc.strerror or _one_line(exc)
    where = exc.filename
    if exc.errno == errno.ENOSPC:
        if what.startswith("no space left on device while writing"):
            return what
        return "no space left on device" + (f" while writing {where}" if where is not None else "")
    return f"{what}: {where}" if where is not None else what


def _stdout_gone() -> int:
    """The reader of stdout went away (``xmodal ... | head``): end quietly, as a command
    killed by SIGPIPE does, with nothing more written to the closed pipe (Python would
    otherwise print a BrokenPipeError while flushing stdout at exit)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 141  # 128 + SIGPIPE, the shell's status for a writer whose reader left


if __name__ == "__main__":
    sys.exit(main())
