"""``xmodal`` command line: one subcommand per module in :mod:`xmodal.commands`.

Each module in ``xmodal/commands/`` defines ``NAME`` (the subcommand), ``HELP``
(one line), ``add_arguments(parser)`` and ``run(args) -> int``. Config objects
stop here: subcommands turn flags into explicit keyword arguments.

Flags shared by several commands come from :func:`xmodal.commands.add_common_args` so that they
have one name and one meaning everywhere: ``--threads N``, ``--ks 1,5,10``,
``--progress/--no-progress`` (default: only when stderr is a terminal; ``--quiet``
is a hidden alias of ``--no-progress``) and ``--l2`` (``--normalize`` is a hidden
alias). Tables are Markdown (:func:`xmodal.commands.markdown_table`). Every error, argparse's
included, is one line ``xmodal CMD: error: ...``.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import xmodal
from xmodal import commands as _commands
from xmodal.commands import Parser, UsageError, apply_threads, one_line, os_error_text


def _command_modules():
    for info in sorted(pkgutil.iter_modules(_commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        yield importlib.import_module(f"xmodal.commands.{info.name}")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
        print(f"xmodal {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, an unwritable folder: one line, exit status 1
        print(f"xmodal {args.command}: error: {os_error_text(exc)}", file=sys.stderr)
        return 1
    except MemoryError as exc:  # an input past this machine's memory: one line, exit status 1
        what = one_line(exc) if str(exc) else "an allocation failed"
        print(f"xmodal {args.command}: error: out of memory ({what})", file=sys.stderr)
        return 1


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
