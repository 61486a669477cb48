"""``xmodal report``: one self-contained HTML page of a run or bench directory."""

from __future__ import annotations

import argparse

NAME = "report"
HELP = "write a self-contained HTML report of a run or bench directory"
DESCRIPTION = """Write one self-contained HTML file (PNGs inline, no external links) for
an `xmodal train` run directory (summary, config, results per normaliser, training
curves, schedule, retrieval mass and FN/FP plots, head/tail breakdown, example rankings)
or an `xmodal bench` directory (grid tables, best cell per column marked).

  xmodal report runs/flickr --images ../shared/data/flickr8k/dev_images --out flickr.html
  xmodal report runs/ncl --compare runs/infonce       the page also holds 'xmodal compare runs/ncl runs/infonce'"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="RUN_OR_BENCH_DIR", help="run directory or bench directory")
    p.add_argument("--out", default=None, help="HTML file to write (default: DIR/report.html)")
    p.add_argument("--images", default=None, metavar="DIR",
                   help="folder of the val split's images or videos for thumbnails, found as NAME or "
                        "NAME.<ext>; videos show their middle frame (Flickr8k: dev_images/)")
    p.add_argument("--data", default=None, metavar="DIR",
                   help="the run's data folder, when it moved since training (overrides data.root)")
    p.add_argument("--examples", type=int, default=8, help="number of example queries (default 8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the example queries (default 0)")
    p.add_argument("--compare", default=None, metavar="B",
                   help="also compare this run (A) with B, as 'xmodal compare RUN B' does: a run directory, a "
                        "per-query .npz or a quoted glob of runs (seeds); the tables go into the page")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    from xmodal.commands import add_common_args

    add_common_args(p, threads=False, progress=True)


def run(args: argparse.Namespace) -> int:
    import torch

    from xmodal.commands import progress_choice
    from xmodal.progress import Stages
    from xmodal.reporting.report import build_report

    if args.examples < 0:
        raise ValueError(f"--examples: must be >= 0, got {args.examples}")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads: must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    others = None
    if args.compare is not None:
        from xmodal.reporting.compare import expand

        others = expand(args.compare, "--compare")
    with Stages(show=progress_choice(args)) as stage:  # without a terminal: the stage every 30 s
        path = build_report(args.path, out=args.out, images=args.images, data=args.data,
                            num_examples=args.examples, seed=args.seed, log=stage, compare=others)
    print(path)
    return 0
