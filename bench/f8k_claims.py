"""The Flickr8k paper-table claims as paired tests (issues 28, 35): one `xmodal compare` per claim.

Each claim of docs/results/index.md's "The papers' methods on Flickr8k" table and of the paper tables
(``docs/results/flickr8k_paper_tables.md``) compares two columns of
seed groups (runs of ``bench/f8k_sweep.py --variants bench/f8k_paper_variants.yaml --seeds 0,1,2``)
on the dev queries: t2i (t2v) R@1 difference B - A, its 95 % bootstrap interval (queries
resampled, each side's seeds resampled as clusters), and the seed-level p-value the verdict rests
on: the exact permutation of the run labels (the recipe as the unit; 0.10 is the smallest 3 + 3
seeds allow), or for two normalisers of the same runs the sign flip over the paired runs (0.25 for
3 runs); Holm over the claims shown; the verdict says "cannot be decided with N + M seeds" (or "with
N paired runs" for the same runs under two normalisers) when that floor cannot pass Holm. Beside it, the sign-flip p-value of the seed-averaged per-query ranks
(these runs held fixed: are these runs different on these queries?). The same numbers as

    xmodal compare --a 'RUNS/A_s*' --b 'RUNS/B_s*' --normalizer NA --normalizer-b NB --split val \\
        --metrics R@1 --directions t2v

Usage:
    python bench/f8k_claims.py --runs runs/paper [--only NAME,NAME] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: name -> (A variant, A normaliser, B variant, B normaliser, the claim in words)
CLAIMS = {
    "ncl_vs_infonce_sinkhorn": ("infonce", "sinkhorn", "ncl", "ncl",
                                "NCL loss + its queue biases vs InfoNCE + Sinkhorn (train bank)"),
    "ncl_vs_infonce_none": ("infonce", "none", "ncl", "none", "the NCL loss alone (no normaliser)"),
    "ncl_vs_infonce_plain": ("infonce", "none", "ncl", "ncl", "NCL (loss + test time) vs plain InfoNCE"),
    "ncl_queue_vs_train_bank": ("ncl", "sinkhorn", "ncl", "ncl", "NCL runs: queue bank vs a random train bank"),
    "ncl_queue_vs_oracle": ("ncl", "sinkhorn_oracle", "ncl", "ncl",
                            "NCL runs: queue bank vs the oracle (dev queries; protocol differs, --force)"),
    "ts_vs_infonce_none": ("infonce", "none", "ts_class", "none", "TS++ schedule + class temperatures, no normaliser"),
    "ts_vs_infonce_sinkhorn": ("infonce", "sinkhorn", "ts_class", "sinkhorn", "TS++, both with Sinkhorn"),
    "contra_corr_vs_contra_none": ("infonce", "none", "calince_contra_corr", "none",
                                   "Cali-NCE Contra. + Corr. vs Contra. (= InfoNCE), no normaliser"),
    "contra_corr_vs_contra_sinkhorn": ("infonce", "sinkhorn", "calince_contra_corr", "sinkhorn",
                                       "Contra. + Corr. vs Contra., both with Sinkhorn"),
    "calibrated_vs_contra_corr_none": ("calince_contra_corr", "none", "calince_calibrated", "none",
                                       "Cali-NCE calibration vs co-training, no normaliser"),
}


def main(argv: list[str] | None = None) -> int:
    from xmodal.metrics.formatting import markdown_table
    from xmodal.metrics.paired import format_diff, format_p, holm
    from xmodal.reporting.compare import compare, expand, load_result

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", required=True, help="folder of the sweep's runs (NAME_s0, NAME_s1, ...)")
    p.add_argument("--only", default="", help="comma-separated claim names (default: every claim whose runs exist)")
    p.add_argument("--n-boot", type=int, default=10000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    names = [n for n in (args.only.split(",") if args.only else CLAIMS) if n]
    rows, out = [], {}
    for name in names:
        va, na, vb, nb, words = CLAIMS[name]
        try:
            a = [load_result(x) for x in expand(str(Path(args.runs) / f"{va}_s*"), "--a")]
            b = [load_result(x) for x in expand(str(Path(args.runs) / f"{vb}_s*"), "--b")]
        except (ValueError, FileNotFoundError) as exc:
            if args.only:
                raise
            print(f"skipped {name}: {exc}", file=sys.stderr)
            continue
        res = compare(a, b, split="val", normalizer=na, normalizer_b=nb, metrics=["R@1"], directions=["t2v"],
                      n_boot=args.n_boot, force="oracle" in na + nb)
        r = res["rows"][0]
        out[name] = {**r, "paired_seeds": res["paired_seeds"], "claim": words, "side_a": f"{va} ({na})", "side_b": f"{vb} ({nb})",
                     "protocol_differences": res["protocol_differences"]}
        rows.append(name)
    adjusted = holm([out[n]["p_value"] for n in rows]) if rows else []
    alpha = 0.05
    reachable = len(rows) * min((out[n]["p_value_min"] for n in rows), default=0.0) <= alpha
    for n, q in zip(rows, adjusted):
        r = out[n]
        r["p_holm"] = q
        gain, lo, hi = r["diff"], r["ci_low"], r["ci_high"]
        if r["unit"] == "seeds" and (not reachable or r["p_value_min"] > alpha):
            r["verdict"] = (f"cannot be decided with {r['seeds_a']} paired runs" if r["paired_seeds"]  # same runs
                            else f"cannot be decided with {r['seeds_a']} + {r['seeds_b']} seeds")
        else:
            r["verdict"] = ("B better" if q < alpha and lo > 0 and gain > 0 else
                            "A better" if q < alpha and hi < 0 and gain < 0 else "no clear difference")
    if args.json:
        print(json.dumps(out, indent=1, default=str))
        return 0
    table = [[out[n]["claim"], out[n]["side_a"], out[n]["side_b"], _mean(out[n], "a"), _mean(out[n], "b"),
              format_diff(out[n]["diff"], 2, (out[n]["ci_low"], out[n]["ci_high"])),
              "[" + ", ".join(format_diff(x, 2, (out[n]["diff"],)) for x in (out[n]["ci_low"], out[n]["ci_high"]))
              + "]",
              f"{format_p(out[n]['p_value'], out[n]['p_floor'])} (min {out[n]['p_value_min']:.2f})",
              format_p(out[n]["p_holm"], out[n]["p_floor"]),
              format_p(out[n]["p_value_queries"], out[n].get("p_floor_queries", False))
              if "p_value_queries" in out[n] else "–", out[n]["verdict"]] for n in rows]
    print(markdown_table(["claim", "A", "B", "A t2i R@1", "B t2i R@1", "B − A", "95% CI", "p (seeds)",
                          "p (Holm)", "p, these runs (queries)", "verdict"], table))
    tests = sorted({out[n]["test"] for n in rows})
    if tests:
        print("\np (seeds): " + "; ".join(tests) + ".")
    forced = [n for n in rows if out[n]["protocol_differences"]]
    if forced:
        print(f"\n--force: {', '.join(forced)} pair(s) a normaliser that uses the dev queries (uses_test_queries) "
              "with one that does not; the protocol differs on purpose (an oracle bound).")
    return 0


def _mean(row: dict, side: str) -> str:
    """``mean ± sample std`` of one side, as every table prints it."""
    from xmodal.metrics import format_metric

    std = row[f"std_{side}"]
    return format_metric("R@1", row[side], None if std != std else std)


if __name__ == "__main__":
    raise SystemExit(main())
