"""``xmodal`` command line: one subcommand per module in :mod:`xmodal.commands`.

Each module in ``xmodal/commands/`` defines ``NAME`` (the subcommand), ``HELP``
(one line), ``add_arguments(parser)`` and ``run(args) -> int``. Config objects
stop here: subcommands turn flags into explicit keyword arguments.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import xmodal
from xmodal import commands as _commands


def _command_modules():
    for info in sorted(pkgutil.iter_modules(_commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        yield importlib.import_module(f"xmodal.commands.{info.name}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 0
    try:
        return int(args._run(args) or 0)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        # One-line errors for bad input; tracebacks are for bugs.
        print(f"xmodal {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
