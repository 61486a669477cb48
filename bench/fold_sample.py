"""What ``xmodal index --normalizer auto`` costs when it folds nothing (issue 43 item 2).

    .venv/bin/python bench/fold_sample.py --videos 200000 --root /tmp/xmodal_fold_sample --repeat 3
    .venv/bin/python bench/fold_sample.py --videos 1000000 --video-dim 768 --root /tmp/xmodal_fold_sample

One seeded run (synthetic layout, ``--video-dim`` video features, linear heads, ``test_time.normalizers
[none, sinkhorn]``, selection ``best``: the index's candidate is Sinkhorn) and a gallery of ``--videos``
random feature rows. In one process, interleaved ``--repeat`` times: a flat index with ``--normalizer
none``; with ``auto`` (the candidate fitted and measured in stages, :data:`xmodal.retrieval.foldcheck.STAGES`,
ending with :data:`~xmodal.retrieval.foldcheck.SAMPLE_ROWS` rows plus each held-out caption's nearest
videos); with ``--no-stages`` also ``auto`` measured on the last stage only (the behaviour before the
stages); and once ``auto`` measured on the whole gallery (``SAMPLE_ROWS`` set to the gallery: the
behaviour before the sample; ``--no-whole`` skips it). Prints each build's wall time, the ratio of each
build's median to ``none``'s median, the median of each round's ratio to that round's ``none`` (less
moved by a load that drifts), the decision's own work timed inside the build (``build._fold`` and the first
stage's scoring of the blocks as they are embedded; ``1 + decision / none`` is the ratio it implies, less
moved by the load than whole builds), and whether each decision equals the whole gallery's.
``--never-worse`` times a candidate that is not clearly worse on any stage (all stages measured). Nothing
is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


#: The result file's key of each build (the pages name them: ``{{ fold_sample_1m:table.auto.x_none }}``).
KEYS = {"none": "none", "auto (stages)": "auto", "auto (last stage only)": "last_stage", "auto (whole gallery)": "whole"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--videos", type=int, default=200_000)
    p.add_argument("--root", default="/tmp/xmodal_fold_sample")
    p.add_argument("--bank", type=int, default=2000, help="test_time.bank_size (the Sinkhorn bank)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-whole", action="store_true", help="skip auto measured on the whole gallery (the slow one)")
    p.add_argument("--video-dim", type=int, default=64, help="video feature size of the run and the gallery")
    p.add_argument("--repeat", type=int, default=2, help="interleaved (none, auto) rounds (0: only make the inputs)")
    p.add_argument("--no-stages", action="store_true", help="also time auto on the last stage only (before stages)")
    p.add_argument("--never-worse", action="store_true",
                   help="no stage ends the measurement (each interval's upper end raised to 0 at least): what a "
                        "candidate that is not clearly worse costs")
    p.add_argument("--json", default=None, help="every build's record, as printed")
    p.add_argument("--write", default=None, help="the result file (docs/results/data/fold_sample_*.json): "
                   "provenance, the table and each round's ratio")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    import faiss

    faiss.omp_set_num_threads(args.threads)
    from xmodal.config import from_dict
    from xmodal.models import load_model
    from xmodal.retrieval import foldcheck
    from xmodal.retrieval.build import write_index
    from xmodal.training.loop import train

    root = Path(args.root)
    tag = "" if args.video_dim == 64 else f"_d{args.video_dim}"
    run = root / f"run{tag}"
    if not (run / "model.pt").is_file():
        cfg = from_dict({
            "data": {"name": "synthetic", "synthetic": {"num_train": 6000, "num_val": 500, "num_test": 500,
                                                         "num_concepts": 50, "video_dim": args.video_dim}},
            "model": {"kind": "linear", "dim": 128},
            "loss": {"name": "infonce", "temperature": 0.05},
            "test_time": {"normalizers": ["none", "sinkhorn"], "bank_size": args.bank, "selection": "best"},
            "train": {"seed": 0, "epochs": 2, "batch_size": 128},
        })
        train(cfg, run, resume=False, progress=False, verbose=False)
    model = load_model(run)
    feats = root / f"gallery_{args.videos}{tag}.npy"
    if not feats.is_file():  # written in blocks: a 1M x 768 gallery never whole in memory
        dim = model.architecture()["video"]["in_dim"]
        rng, tmp = np.random.default_rng(5), feats.with_suffix(".tmp.npy")
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(args.videos, dim))
        for start in range(0, args.videos, 65536):
            stop = min(args.videos, start + 65536)
            out[start:stop] = rng.standard_normal((stop - start, dim), dtype=np.float32)
        out.flush()
        del out
        tmp.rename(feats)
    gallery = np.load(feats, mmap_mode="r")
    sample, stages = foldcheck.SAMPLE_ROWS, getattr(foldcheck, "STAGES", ())  # () before the stages
    # the decision's own work, timed inside the build (less moved by the load than a whole build's wall):
    # build._fold, and the first stage's scoring of each block as the gallery is embedded
    from xmodal.retrieval import build as build_module

    spent = [0.0]

    def timed(f):
        def inner(*a, **kw):
            t = time.perf_counter()
            try:
                return f(*a, **kw)
            finally:
                spent[0] += time.perf_counter() - t
        return inner

    build_module._fold = timed(build_module._fold)
    if args.never_worse:
        measured = foldcheck.choose_fold

        def never_worse(*a, **kw):  # the same measurement; no stage is clearly worse
            rec = measured(*a, **kw)
            rec["test"]["ci_high"] = max(rec["test"]["ci_high"], 0.0)
            return rec

        foldcheck.choose_fold = never_worse
    if hasattr(foldcheck, "FirstStage"):
        foldcheck.FirstStage.add = timed(foldcheck.FirstStage.add)
    builds = []
    one = [("none", "none", sample, stages), ("auto (stages)", "auto", sample, stages)]
    if args.no_stages:
        one.append(("auto (last stage only)", "auto", sample, ()))
    plan = one * args.repeat
    if not args.no_whole:
        plan.insert(2, ("auto (whole gallery)", "auto", args.videos + 1, stages))
    for name, normalizer, rows, stage_plan in plan:
        foldcheck.SAMPLE_ROWS, foldcheck.STAGES = rows, stage_plan
        spent[0] = 0.0
        start = time.perf_counter()
        meta = write_index(str(run), gallery, root / "idx", normalizer=normalizer, kind="flat", overwrite=True,
                           model=model)
        wall = time.perf_counter() - start
        choice = meta["normalizer_choice"]
        test = choice.get("test") or {}
        builds.append({"build": name, "wall_s": round(wall, 2), "decision_s": round(spent[0], 3),
                       "folded": meta["normalizer"],
                       "queries": choice.get("queries"), "sample_rows": choice.get("sample_rows"),
                       "near_rows": choice.get("near_rows"), "stages": choice.get("stages"),
                       "diff": test.get("diff"), "ci": [test.get("ci_low"), test.get("ci_high")]})
        print(json.dumps(builds[-1]), flush=True)
    foldcheck.SAMPLE_ROWS, foldcheck.STAGES = sample, stages
    if not builds:  # --repeat 0 --no-whole: the run and the gallery made, nothing timed
        print(f"made {run} and {feats}")
        return
    walls = {}
    for b in builds:
        walls.setdefault(b["build"], []).append(b["wall_s"])
    none = float(np.median(walls["none"]))
    print(f"\ngallery {args.videos:,} videos x {args.video_dim}, bank {args.bank:,}, {args.threads} thread(s); "
          f"none median {none:.2f} s over {len(walls['none'])}")
    print("| build | builds | median wall s | x none (medians) | decision s (median) | 1 + decision / none | "
          "folded | captions | rows fitted on | R@1+5+10 diff [CI] |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    table = {}
    for name, w in walls.items():
        b = next(x for x in builds if x["build"] == name)
        ci = "" if b["diff"] is None else f"{b['diff']:+.2f} [{b['ci'][0]:.2f}, {b['ci'][1]:.2f}]"
        dec = float(np.median([x["decision_s"] for x in builds if x["build"] == name]))
        table[KEYS[name]] = {"build": name, "builds": len(w), "median_wall_s": float(np.median(w)),
                             "x_none": float(np.median(w) / none), "decision_s": dec,
                             "one_plus_decision_over_none": 1 + dec / none, "folded": b["folded"],
                             "captions": b["queries"], "rows_fitted_on": b["sample_rows"]}
        print(f"| {name} | {len(w)} | {np.median(w):.2f} | {np.median(w) / none:.2f} | {dec:.3f} | "
              f"{1 + dec / none:.2f} | {b['folded']} | "
              f"{b['queries'] or '-'} | {b['sample_rows'] or '-'} | {ci} |")
    rounds = [b for b in builds if b["build"] != "auto (whole gallery)"]
    per = len(one)
    for name in [x[0] for x in one[1:]]:  # each round's auto over the same round's none: load drifts less
        r = [next(b for b in rounds[i:i + per] if b["build"] == name)["wall_s"] / rounds[i]["wall_s"]
             for i in range(0, len(rounds), per)]
        table[KEYS[name]]["same_round_ratio"] = {"median": float(np.median(r)), "rounds": r}
        print(f"{name} / none, same round: median {np.median(r):.2f} (rounds: {', '.join(f'{x:.2f}' for x in r)})")
    auto = {b["build"]: b["folded"] for b in builds if b["build"].startswith("auto")}
    if "auto (whole gallery)" in auto:
        for name in auto:
            print(f"{name} decision == whole-gallery decision: {auto[name] == auto['auto (whole gallery)']}")
            table[KEYS[name]]["equals_whole_gallery"] = "yes" if auto[name] == auto["auto (whole gallery)"] else "no"
    if args.write:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import resultfile

        data = resultfile.provenance("bench/fold_sample.py", None,
                                     "bench/fold_sample.py --write (this file is its output)")
        resultfile.write_json(args.write, {**data, "videos": args.videos, "video_dim": args.video_dim,
                                           "threads": args.threads, "goal_x_none": 1.2,
                                           "sample_rows": int(sample), "stages": [list(s) for s in stages],
                                           "table": table, "builds": builds})
    if args.json:
        Path(args.json).write_text(json.dumps({"videos": args.videos, "bank": args.bank, "builds": builds}, indent=2))


if __name__ == "__main__":
    main()
