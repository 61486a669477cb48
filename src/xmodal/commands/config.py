"""``xmodal config [CONFIG] [section.key=value ...]``: the resolved config, every key commented."""

from __future__ import annotations

import argparse

NAME = "config"
HELP = "print the complete resolved config as commented YAML (or the config reference as Markdown)"
DESCRIPTION = """Print the complete config a run would use: the defaults, then CONFIG, then the
overrides, with a comment on every key saying what it does. The output is itself a
valid config:

  xmodal config configs/synthetic.yaml loss.name=ncl > my.yaml
  xmodal train my.yaml --out runs/x

--markdown prints the reference page of every key (docs/config.md is this output)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("items", nargs="*", metavar="[CONFIG] section.key=value",
                        help="an optional YAML config file, then overrides (values parsed as YAML)")
    parser.add_argument("--set", dest="set_", action="append", default=[], metavar="section.key=value",
                        help="config override (repeatable)")
    parser.add_argument("--markdown", action="store_true",
                        help="print the reference of every key as Markdown (docs/config.md)")


def run(args: argparse.Namespace) -> int:
    from xmodal.config import load_config
    from xmodal.config.doc import to_markdown, to_yaml

    items = list(args.items)
    path = items.pop(0) if items and "=" not in items[0] else None
    if args.markdown:
        if path is not None or items or args.set_:
            raise ValueError("--markdown: documents the defaults; give no CONFIG or overrides with it")
        print(to_markdown(), end="")
        return 0
    print(to_yaml(load_config(path, items + list(args.set_))), end="")
    return 0
