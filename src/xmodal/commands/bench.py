"""``xmodal bench``: the objectives x TS++ x normalisers x seeds grid, as tables."""

from __future__ import annotations

import argparse

from xmodal.commands import add_common_args, progress_choice

NAME = "bench"
HELP = "grid of objectives x TS++ x test-time normalisers x seeds -> Markdown/CSV tables"
DESCRIPTION = """Train every objective (InfoNCE, NT-Xent, MaxMargin, MIL-NCE, DCL, CrossCLR,
NCL, Cali-NCE), each with and without the TS++ temperature (margin) schedule + class
temperatures, over several seeds, on the synthetic default and/or Flickr8k
(../shared/data/flickr8k, selected and reported on dev), then evaluate each under
the test-time normalisers none / DN / NCL bank / Sinkhorn (train-query bank) /
QB-Norm. Writes OUT/results.md and OUT/results.csv (mean +- std over seeds of t2v and
v2t R@1/5/10, MdR, MnR, and train time). Finished runs are reused, a killed grid
resumes.

Budget on a 2-core CPU machine, one thread per run (measured: a synthetic run takes
about 3-8 s, a Flickr8k linear run 30-60 s, both stopping early):
  --quick                      synthetic, 4 objectives x 2 x 2 seeds, small  ~1-2 min
  synthetic, full (48 runs)                                                 ~5-8 min
  flickr8k, full (48 runs)                                                  ~40-60 min
  --noise 0.1,0.3,0.5          InfoNCE vs Cali-NCE x 4 noise levels x seeds  (synthetic ~2 min)
  --ncl-queue-sizes 1024,4096,16384   NCL Fig. 5: t2v R@1 none vs ncl per train query queue size
                               (one NCL run per seed with the largest queue)
OUT/report.html renders the tables (xmodal report)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--datasets", default="synthetic,flickr8k", help="synthetic and/or flickr8k")
    parser.add_argument("--objectives", default=None, help="comma-separated (default: all eight)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1,2; --quick: 0,1)")
    parser.add_argument("--ts", choices=("both", "off", "on"), default="both",
                        help="TS++ schedule/class temperature variants to run (default both)")
    parser.add_argument("--noise", default=None, metavar="P1,P2,...",
                        help="noise-robustness grid instead: shuffle these fractions of the training pairs "
                             "(plus 0), InfoNCE vs Cali-NCE unless --objectives is given, TS++ off")
    parser.add_argument("--epochs", type=int, default=None, help="override the epochs of every run")
    parser.add_argument("--quick", action="store_true",
                        help="reduced grid for CI: synthetic (800 train videos), infonce/ncl/crossclr/calince, "
                             "seeds 0,1, 6 epochs")
    parser.add_argument("--out", default="runs/bench", help="output directory (default runs/bench)")
    parser.add_argument("--ncl-queue-sizes", default=None, metavar="K1,K2,...",
                        help="NCL Fig. 5 instead: t2v R@1 without and with the NCL test-time biases "
                             "from train query queues of these sizes (e.g. 1024,4096,16384)")
    add_common_args(parser, threads=1, progress=True)


def _list(s: str, name: str, cast=str) -> list:
    try:
        out = [cast(x.strip()) for x in s.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{name}: cannot parse {s!r}") from None
    if not out:
        raise ValueError(f"{name}: empty list")
    return out


def run(args: argparse.Namespace) -> int:
    from xmodal.reporting.benchgrid import DATASETS, OBJECTIVES, run_grid
    from xmodal.losses import LOSSES

    if args.epochs is not None and args.epochs < 1:
        raise ValueError(f"--epochs: must be >= 1, got {args.epochs}")
    datasets = _list(args.datasets, "--datasets")
    for d in datasets:
        if d not in DATASETS:
            raise ValueError(f"--datasets: unknown dataset {d!r}; expected one of {', '.join(DATASETS)}")
    objectives = _list(args.objectives, "--objectives") if args.objectives else list(OBJECTIVES)
    seeds = _list(args.seeds or ("0,1" if args.quick else "0,1,2"), "--seeds", int)
    ts = {"both": (False, True), "off": (False,), "on": (True,)}[args.ts]
    epochs, synthetic = args.epochs, None
    noise = (0.0,)
    if args.quick:
        datasets = ["synthetic"]
        objectives = args.objectives and objectives or ["infonce", "ncl", "crossclr", "calince"]
        epochs = 6 if epochs is None else epochs
        synthetic = {"num_train": 800, "num_val": 300, "num_test": 300}
    if args.noise:
        noise = tuple(sorted({0.0, *_list(args.noise, "--noise", float)}))
        if any(not 0 <= p < 1 for p in noise):
            raise ValueError(f"--noise: fractions must lie in [0, 1), got {args.noise!r}")
        objectives = _list(args.objectives, "--objectives") if args.objectives else ["infonce", "calince"]
        ts = (False,)
    progress = progress_choice(args)  # a bar on a terminal, else a line every 30 s
    if args.ncl_queue_sizes:
        from xmodal.reporting.benchgrid import queue_markdown, run_queue_sweep

        if args.noise:
            raise ValueError("--ncl-queue-sizes: cannot be combined with --noise")
        sizes = _list(args.ncl_queue_sizes, "--ncl-queue-sizes", int)
        if min(sizes) < 1:
            raise ValueError(f"--ncl-queue-sizes: sizes must be >= 1, got {args.ncl_queue_sizes!r}")
        rows = run_queue_sweep(datasets=datasets, sizes=sizes, seeds=seeds, out=args.out, epochs=epochs,
                               synthetic=synthetic, progress=progress)
        text = queue_markdown(rows)
    else:
        unknown = [o for o in objectives if o not in LOSSES]
        if unknown:
            raise ValueError(f"--objectives: unknown objective(s) {', '.join(unknown)}")
        rows = run_grid(datasets=datasets, objectives=objectives, seeds=seeds, ts_variants=ts, noise=noise,
                        out=args.out, epochs=epochs, synthetic=synthetic, progress=progress)
        from xmodal.reporting.benchgrid import markdown

        text = markdown(rows)
    from xmodal.reporting.report import build_report

    page = build_report(args.out)
    print(text)
    print(f"\nwritten: {args.out}/results.md, {args.out}/results.csv, {page}")
    return 0
