"""Which normaliser-selection rule generalises? Measured on a test split carved off Flickr8k train (issue 35.5).

Flickr8k's official test split is held back and dev is the split the documented configs select on
(the epoch and the test-time normaliser), so neither can say whether a selection rule picks a
normaliser that holds up on unseen data. This script carves a test split off *train* (``--carve``
images with all their captions, a fixed seed; dev is never touched), trains each documented config
on the remaining train images with dev as its validation split (as documented: dev picks the epoch
and the normaliser candidates are scored on dev), for several seeds, and then applies each rule to
the same runs offline (the rule only reads the val per-query results every run stores):

* ``paired@L``: :func:`xmodal.retrieval.selection.select_normalizer` with ``rule="paired"`` at
  confidence level ``L`` (a candidate replaces ``none`` only when the lower end of its paired
  bootstrap interval on val is above 0; the default is 0.95);
* ``best``: the highest val score (``rule="best"``, the rule before issue 26).

For each rule the table gives what it selected per seed and the carved-test score of that choice
(``train.metric`` = rsum, and t2v R@1), beside the carved-test score of every normaliser. The rule
that generalises is the one whose choices score best on the carved split across configs and seeds;
the per-seed gain of each rule over ``none`` on the carved split is tested with the seed-level
sign-flip test of :func:`xmodal.metrics.paired.seed_test` over the (config, seed) runs (``paired=True``:
each run's gain against 0), and where two rules choose differently the table of the runs says which
choice scored higher on the carved split.

Usage (2-core shared CPU; one thread a run; ``--work`` holds the carved layout and the runs):
    python bench/selection_rule.py --work /tmp/claims-sel --configs best,infonce_linear,ncl --seeds 0,1,2
    python bench/selection_rule.py --work /tmp/claims-sel --table-only    # tabulate the finished runs
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "flickr8k"
CARVE_SEED = 35  # the carved test split is the same for every run (paired across runs and rules)
LEVELS = (0.95, 0.8, 0.5)


def carve(work: Path, data: Path, num_images: int) -> Path:
    """``work/data``: train minus ``num_images`` seeded images (with their captions), ``test`` = those
    images, ``dev`` = Flickr8k dev unchanged. Idempotent (an existing layout is reused)."""
    from xmodal.data import load_paired_split
    from xmodal.training.loop import carved_rows

    root = work / "data"
    done = root / "carve.json"
    if done.is_file():
        return root
    train = load_paired_split(data, "train")
    keep, held = carved_rows(train.num_videos, num_images, seed=CARVE_SEED)
    train.subset(keep).save(root, "train")
    train.subset(held).save(root, "test")
    load_paired_split(data, "dev").save(root, "dev")
    names = (data / "train_images.txt").read_text().split()
    done.write_text(json.dumps({"source": str(data), "seed": CARVE_SEED, "train_images": int(keep.size),
                                "test_images": int(held.size), "test_rows": held.tolist(),
                                "first_test_names": [names[i] for i in held[:5]]}, indent=1))
    return root


def train_one(work: Path, root: Path, config: str, seed: int, extra: list[str]) -> tuple[str, float, int]:
    name = f"{config}_s{seed}"
    out = work / "runs" / name
    if (out / "metrics.json").is_file():
        return name, 0.0, 0
    cmd = [sys.executable, "-m", "xmodal", "train", str(REPO / "configs" / "flickr8k" / f"{config}.yaml"),
           "--out", str(out), "--quiet", "--threads", "1", f"data.root={root}", "data.val_split=dev",
           "data.test_split=test", "data.val_from_train=0", f"train.seed={seed}", *extra]
    t0 = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(work / "runs" / f"{name}.log", "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    return name, time.perf_counter() - t0, rc


def _score(m: dict, metric: str) -> float:
    from xmodal.retrieval.evaluate import score

    return float(score(m, metric))


def rules_of_run(run: Path) -> dict:
    """What each rule selects for one run, and every normaliser's carved-test score."""
    from xmodal.retrieval.perquery_read import read_per_query
    from xmodal.retrieval.selection import select_normalizer

    m = json.loads((run / "metrics.json").read_text())
    results, _ = read_per_query(run / "per_query.npz")
    metric = m["metric"]
    names = [n for n in m["val"] if n != "protocol"]
    val = {n: m["val"][n] for n in names}
    pq = {n: results["val"][n] for n in names}
    chosen = {f"paired@{lv:g}": select_normalizer(names, val, pq, metric, rule="paired", level=lv, seed=0)
              for lv in LEVELS}
    chosen["best"] = select_normalizer(names, val, pq, metric, rule="best")
    test = {n: {"score": _score(m["test"][n], metric), "t2v_r1": m["test"][n]["t2v"]["R@1"]} for n in names}
    vals = {n: _score(val[n], metric) for n in names}
    tests = chosen["paired@0.95"]["tests"]
    return {"metric": metric, "best_epoch": m["best_epoch"], "val": vals, "test": test,
            "selected": {r: c["selected"] for r, c in chosen.items()},
            "val_tests": {n: {k: tests[n][k] for k in ("diff", "ci_low", "ci_high")} for n in tests},
            "trained_selection": m["normalizer"]}


def table(work: Path, configs: list[str], seeds: list[int]) -> str:
    from xmodal.metrics.paired import format_p, seed_test

    rules = [f"paired@{lv:g}" for lv in LEVELS] + ["best"]
    per_run, lines = {}, []
    for c in configs:
        for s in seeds:
            run = work / "runs" / f"{c}_s{s}"
            if (run / "metrics.json").is_file():
                per_run[(c, s)] = rules_of_run(run)
    if not per_run:
        return "no finished runs"
    names = sorted({n for r in per_run.values() for n in r["test"]}, key=lambda n: (n != "none", n))
    head = (["config", "seed", "best epoch"] + [f"val {n}" for n in names] + [f"test {n}" for n in names]
            + [f"{r} selects" for r in rules])
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|---|---:|---:|" + "---:|" * (2 * len(names)) + "---|" * len(rules))
    for (c, s), r in per_run.items():
        cells = [c, str(s), str(r["best_epoch"])]
        cells += [f"{r['val'][n]:.2f}" if n in r["val"] else "-" for n in names]
        cells += [f"{r['test'][n]['score']:.2f}" if n in r["test"] else "-" for n in names]
        cells += [r["selected"][rule] for rule in rules]
        lines.append("| " + " | ".join(cells) + " |")
    metric = next(iter(per_run.values()))["metric"]
    lines += ["", f"Carved-test {metric} of each rule's choice (mean over seeds per config; gain = choice - none "
                  "on the carved test split):", ""]
    lines.append("| rule | " + " | ".join(f"{c} test {metric}" for c in configs) + " | mean gain over none "
                 "(all runs) | runs where the choice beat none / lost to none | seed-level p (sign flip over runs) |")
    lines.append("|---|" + "---:|" * len(configs) + "---:|---|---:|")
    for rule in ["none", *rules, "hindsight"]:
        cells, gains = [], []
        for c in configs:
            vals = []
            for s in seeds:
                r = per_run.get((c, s))
                if r is None:
                    continue
                chosen = ("none" if rule == "none" else r["selected"][rule] if rule in r["selected"] else
                          max(r["test"], key=lambda n: r["test"][n]["score"]))  # hindsight: the best on test
                vals.append(r["test"][chosen]["score"])
                gains.append(r["test"][chosen]["score"] - r["test"]["none"]["score"])
            cells.append(f"{np.mean(vals):.2f} ± {np.std(vals, ddof=1):.2f}" if len(vals) > 1 else
                         f"{vals[0]:.2f}" if vals else "-")
        g = np.asarray(gains)
        if rule == "none":
            cells += ["0", "-", "-"]
        else:
            t = seed_test(np.zeros_like(g), g, paired=True) if np.any(g != 0) else {"p_value": 1.0}
            cells += [f"{g.mean():+.2f}", f"{int((g > 0).sum())} / {int((g < 0).sum())} of {g.size}",
                      format_p(t["p_value"])]
        label = "hindsight (the best on the carved test itself; no rule can know it)" if rule == "hindsight" else rule
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Runs where the rules choose differently (carved-test score of each rule's choice):", ""]
    differ = [(k, r) for k, r in per_run.items() if len({r["selected"][x] for x in rules}) > 1]
    if not differ:
        lines.append("none: every rule made the same choice on every run.")
    else:
        lines.append("| config | seed | " + " | ".join(rules) + " | val gain of the best-on-val choice over none "
                     "[95% CI] |")
        lines.append("|---|---:|" + "---|" * len(rules) + "---|")
        for (c, s), r in differ:
            best = r["selected"]["best"]
            t = r["val_tests"].get(best)
            ci = (f"{t['diff']:+.2f} [{t['ci_low']:+.2f}, {t['ci_high']:+.2f}]" if t else "-")
            lines.append(f"| {c} | {s} | " + " | ".join(f"{r['selected'][x]} ({r['test'][r['selected'][x]]['score']:.2f})"
                                                       for x in rules) + f" | {ci} |")
    return "\n".join(lines)


def _summary(ranks: np.ndarray) -> dict:
    return {f"R@{k}": 100.0 * float(np.mean(ranks <= k)) for k in (1, 5, 10)}


def smaller_val(work: Path, configs: list[str], seeds: list[int], sizes: tuple[int, ...], draws: int,
                n_boot: int) -> str:
    """The rules on smaller validation splits: ``size`` dev images drawn at random (their captions as the
    t2v queries, the images as the v2t queries; ranks against the full dev gallery, as stored), ``draws``
    times per run; the carved-test score of each rule's choice (the test split is unchanged)."""
    from xmodal.retrieval.perquery_read import read_per_query
    from xmodal.retrieval.selection import select_normalizer

    t2v = np.load(work / "data" / "dev_text_to_video.npy")
    rng = np.random.default_rng(CARVE_SEED)
    rules = [f"paired@{lv:g}" for lv in LEVELS] + ["best"]
    gains: dict[tuple[int, str], list[float]] = {}
    kept_none: dict[tuple[int, str], int] = {}
    for c in configs:
        for s in seeds:
            run = work / "runs" / f"{c}_s{s}"
            if not (run / "metrics.json").is_file():
                continue
            r = rules_of_run(run)
            results, _ = read_per_query(run / "per_query.npz")
            names = list(r["val"])
            for size in sizes:
                for _ in range(draws):
                    images = np.sort(rng.choice(t2v.max() + 1, size, replace=False))
                    texts = np.isin(t2v, images)
                    pq = {n: {"t2v": {"rank": results["val"][n]["t2v"]["rank"][texts]},
                              "v2t": {"rank": results["val"][n]["v2t"]["rank"][images]}} for n in names}
                    val = {n: {d: _summary(pq[n][d]["rank"]) for d in ("t2v", "v2t")} for n in names}
                    for rule in rules:
                        if rule == "best":
                            chosen = select_normalizer(names, val, pq, r["metric"], rule="best")["selected"]
                        else:
                            chosen = select_normalizer(names, val, pq, r["metric"], rule="paired",
                                                       level=float(rule.split("@")[1]), n_boot=n_boot,
                                                       seed=int(rng.integers(1 << 30)))["selected"]
                        gains.setdefault((size, rule), []).append(r["test"][chosen]["score"] - r["test"]["none"]["score"])
                        kept_none[(size, rule)] = kept_none.get((size, rule), 0) + (chosen == "none")
    if not gains:
        return ""
    lines = [f"Smaller validation splits: {draws} random draws of N dev images per run (their captions and "
             f"themselves as the val queries, ranks against the full dev gallery), {n_boot} bootstrap resamples; "
             f"carved-test {r['metric']} gain of each rule's choice over none, mean over runs x draws "
             "(in brackets: how often the rule kept none):", "",
             "| val images | " + " | ".join(rules) + " |", "|---:|" + "---:|" * len(rules)]
    for size in sizes:
        cells = []
        for rule in rules:
            g = np.asarray(gains[(size, rule)])
            cells.append(f"{g.mean():+.2f} (none {kept_none[(size, rule)]} of {g.size})")
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", required=True, help="folder for the carved layout and the runs (not in the repo)")
    p.add_argument("--data", default=str(DATA), help="Flickr8k layout (default ../shared/data/flickr8k)")
    p.add_argument("--configs", default="best,infonce_linear,ncl", help="configs/flickr8k/NAME.yaml, comma-separated")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--carve", type=int, default=1000, help="train images carved off as the test split")
    p.add_argument("--set", action="append", default=[], help="override added to every run")
    p.add_argument("--table-only", action="store_true")
    p.add_argument("--val-sizes", default="", help="also apply the rules on random val subsets of these many dev "
                   "images (e.g. 100,250,500)")
    p.add_argument("--draws", type=int, default=20, help="random val subsets per run and size")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples of the paired rule on the subsets")
    args = p.parse_args(argv)
    work = Path(args.work)
    configs = [c for c in args.configs.split(",") if c]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if not args.table_only:
        root = carve(work, Path(args.data), args.carve)
        for c in configs:
            for s in seeds:
                name, sec, rc = train_one(work, root, c, s, args.set)
                print(f"{name}: rc {rc}, {sec:.0f} s", flush=True)
    text = table(work, configs, seeds)
    if args.val_sizes:
        text += "\n\n" + smaller_val(work, configs, seeds, tuple(int(x) for x in args.val_sizes.split(",")),
                                     args.draws, args.n_boot)
    print(text)
    (work / "table.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
