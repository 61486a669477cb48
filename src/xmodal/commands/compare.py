"""``xmodal compare``: is B better than A, on the same queries, under the same protocol?"""

from __future__ import annotations

import argparse
import json

NAME = "compare"
MAX_N_BOOT = 100_000
HELP = "paired test of two runs or seed groups: difference, bootstrap interval and p-value per metric"
DESCRIPTION = """Compare two results on the same queries: for R@1, R@5, R@10, MdR, MnR (and mAP
where the split has a relevancy), per direction, the difference B - A with a paired
bootstrap confidence interval (queries resampled, the same ones on both sides; with several
seeds on a side, its seeds resampled as clusters too), a p-value and a verdict, Holm-corrected
over each table's rows.

  xmodal compare runs/infonce runs/ncl                        two runs: heads alone, and as deployed
  xmodal compare --a 'runs/infonce_s*' --b 'runs/ncl_s*'      two groups of seeds (quote the globs)
  xmodal compare runs/x runs/x --normalizer none --normalizer-b sinkhorn    a normaliser's gain

What is compared is said: by default the heads alone (none vs none) and, when some run
selected a normaliser, each run as deployed (its own selected normaliser, named per run).
One run per side: McNemar's exact test for R@K, the paired sign flip otherwise; the verdict is
about these two runs on these queries. Several runs on a side: the run is the unit; the
p-value is the permutation of the run labels (exact up to 100,000 labellings, Monte-Carlo
beyond), and a table whose smallest attainable p-value cannot pass Holm says "cannot be
decided with N + M seeds" (3 + 3 seeds: p >= 0.1 whatever the runs score).

A and B are run directories written by 'xmodal train' (their per_query.npz, checked against
their metrics.json) or per-query files written by 'xmodal eval --run ... --per-query FILE.npz'.
Queries are paired by their stored identity in every direction (t2v, v2t, p2v, v2p); a file
written before a direction had ids is paired by position there only when the split files are
identical, and the header names those directions (never by position across different split files).
Results are paired only when their protocol cards agree (split files, query and gallery
counts, caption policy, tie rule, and whether the normaliser saw the test queries); otherwise
compare names the fields that differ and stops, unless --force. On val, the header says that
val also chose each run's epoch and normaliser."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("A", nargs="?", help="run directory, per-query .npz, or a quoted glob of them (seeds)")
    parser.add_argument("B", nargs="?", help="the same for the other side")
    parser.add_argument("--a", dest="glob_a", metavar="GLOB", help="side A as a glob of runs (seeds), e.g. 'runs/x_s*'")
    parser.add_argument("--b", dest="glob_b", metavar="GLOB", help="side B as a glob of runs (seeds)")
    parser.add_argument("--split", default=None, help="split compared (default: test when every run has it, else val)")
    parser.add_argument("--normalizer", default=None, metavar="NAME",
                        help="normaliser of A's results (and B's unless --normalizer-b): selected (each run's own "
                             "choice on val), none, dn, sinkhorn, ncl, qbnorm, ... (default: two tables, none vs "
                             "none and each run as deployed)")
    parser.add_argument("--normalizer-b", default=None, metavar="NAME", help="normaliser of B's results")
    parser.add_argument("--metrics", default=None, metavar="M,M",
                        help="metrics compared (default R@1,R@5,R@10,MdR,MnR,mAP; mAP only where the split has a "
                             "relevancy); any R@K, MdR, MnR, mAP, nDCG")
    parser.add_argument("--directions", default=None, metavar="D,D",
                        help="t2v, v2t, p2v, v2p, v2c (default: every one all runs have)")
    parser.add_argument("--n-boot", type=int, default=10000, help="bootstrap resamples and random sign patterns "
                        f"or labellings (default 10000, at most {MAX_N_BOOT})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the resampling (default 0)")
    parser.add_argument("--level", type=float, default=0.95, help="confidence level of the intervals (default 0.95)")
    parser.add_argument("--force", action="store_true",
                        help="compare even when the protocol cards differ (they are still listed)")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")


def _names(text: str, flag: str, allowed: tuple[str, ...] | None = None) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ValueError(f"{flag}: empty list")
    if allowed is not None:
        bad = [x for x in items if x not in allowed]
        if bad:
            raise ValueError(f"{flag}: unknown {', '.join(bad)}; expected {', '.join(allowed)}")
    return items


def _plain(x):
    """JSON-safe: NaN (the spread of a single seed) becomes null."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, float) and x != x:
        return None
    return x


def run(args: argparse.Namespace) -> int:
    from xmodal.reporting.compare import DIRECTIONS, compare, expand, load_result, markdown

    if not 100 <= args.n_boot <= MAX_N_BOOT:
        raise ValueError(f"--n-boot: must lie in [100, {MAX_N_BOOT}], got {args.n_boot}")
    if args.seed < 0:
        raise ValueError(f"--seed: must be >= 0, got {args.seed}")
    if not 0.5 <= args.level < 1:
        raise ValueError(f"--level: must lie in [0.5, 1), got {args.level}")
    sides = []
    for pos, flag_value, flag in ((args.A, args.glob_a, "--a"), (args.B, args.glob_b, "--b")):
        if pos is not None and flag_value is not None:
            raise ValueError(f"{flag}: give side {flag[-1].upper()} once (positionally or with {flag})")
        pattern = pos if pos is not None else flag_value
        if pattern is None:
            raise ValueError(f"{flag}: required (xmodal compare A B, or --a GLOB --b GLOB)")
        sides.append([load_result(p) for p in expand(pattern, flag)])
    from xmodal.metrics.paired import _metric

    metrics = _names(args.metrics, "--metrics") if args.metrics else None
    for m in metrics or ():
        try:
            _metric(m)
        except ValueError:
            raise ValueError(f"--metrics: unknown metric {m!r}; expected R@K, MdR, MnR, mAP or nDCG") from None
    directions = _names(args.directions, "--directions", DIRECTIONS) if args.directions else None
    try:
        out = compare(sides[0], sides[1], split=args.split, normalizer=args.normalizer,
                      normalizer_b=args.normalizer_b, metrics=metrics, directions=directions, n_boot=args.n_boot,
                      seed=args.seed, level=args.level, force=args.force)
    finally:
        for r in (*sides[0], *sides[1]):
            if r.source is not None:
                r.source.close()
    if args.json:
        print(json.dumps(_plain(out), indent=1, allow_nan=False))
    else:
        print(markdown(out))
    return 0
