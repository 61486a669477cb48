"""What ``xmodal index --normalizer auto`` costs when it folds nothing (issue 43 item 2).

    .venv/bin/python bench/fold_sample.py --videos 200000 --root /tmp/xmodal_fold_sample

One seeded run (synthetic layout, linear heads, ``test_time.normalizers [none, sinkhorn]``, selection
``best``: the index's candidate is Sinkhorn) and a gallery of ``--videos`` random feature rows. In one
process, interleaved: a flat index with ``--normalizer none``; with ``auto`` (the candidate fitted and
measured on :data:`xmodal.retrieval.foldcheck.SAMPLE_ROWS` rows plus each held-out caption's nearest
videos); and with ``auto`` measured on the whole gallery (``SAMPLE_ROWS`` set to the gallery: the
behaviour before the sample). Prints each build's wall time, the ratio to ``none`` (the median of the
``none`` builds), and whether the sample's decision equals the whole gallery's. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--videos", type=int, default=200_000)
    p.add_argument("--root", default="/tmp/xmodal_fold_sample")
    p.add_argument("--bank", type=int, default=2000, help="test_time.bank_size (the Sinkhorn bank)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-whole", action="store_true", help="skip auto measured on the whole gallery (the slow one)")
    p.add_argument("--json", default=None)
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
    run = root / "run"
    if not (run / "model.pt").is_file():
        cfg = from_dict({
            "data": {"name": "synthetic", "synthetic": {"num_train": 6000, "num_val": 500, "num_test": 500,
                                                         "num_concepts": 50}},
            "model": {"kind": "linear", "dim": 128},
            "loss": {"name": "infonce", "temperature": 0.05},
            "test_time": {"normalizers": ["none", "sinkhorn"], "bank_size": args.bank, "selection": "best"},
            "train": {"seed": 0, "epochs": 2, "batch_size": 128},
        })
        train(cfg, run, resume=False, progress=False, verbose=False)
    model = load_model(run)
    feats = root / f"gallery_{args.videos}.npy"
    if not feats.is_file():
        dim = model.architecture()["video"]["in_dim"]
        np.save(feats, np.random.default_rng(5).standard_normal((args.videos, dim)).astype(np.float32))
    gallery = np.load(feats, mmap_mode="r")
    sample = foldcheck.SAMPLE_ROWS
    builds = []
    plan = [("none", "none", sample), ("auto (sample)", "auto", sample),
            ("auto (whole gallery)", "auto", args.videos + 1), ("none", "none", sample), ("auto (sample)", "auto", sample)]
    for name, normalizer, rows in [b for b in plan if not (args.no_whole and "whole" in b[0])]:
        foldcheck.SAMPLE_ROWS = rows
        start = time.perf_counter()
        meta = write_index(str(run), gallery, root / "idx", normalizer=normalizer, kind="flat", overwrite=True,
                           model=model)
        wall = time.perf_counter() - start
        choice = meta["normalizer_choice"]
        builds.append({"build": name, "wall_s": round(wall, 2), "folded": meta["normalizer"],
                       "sample_rows": choice.get("sample_rows"), "near_rows": choice.get("near_rows"),
                       "diff": (choice.get("test") or {}).get("diff"), "ci": [(choice.get("test") or {}).get("ci_low"),
                                                                               (choice.get("test") or {}).get("ci_high")]})
        print(json.dumps(builds[-1]), flush=True)
    foldcheck.SAMPLE_ROWS = sample
    none = float(np.median([b["wall_s"] for b in builds if b["build"] == "none"]))
    print(f"\ngallery {args.videos:,} videos, bank {args.bank:,}, {args.threads} thread(s); none median {none:.1f} s")
    print("| build | wall s | x none | folded | rows fitted on | R@1+5+10 diff [CI] |")
    print("|---|---|---|---|---|---|")
    for b in builds:
        ci = "" if b["diff"] is None else f"{b['diff']:+.2f} [{b['ci'][0]:.2f}, {b['ci'][1]:.2f}]"
        print(f"| {b['build']} | {b['wall_s']:.1f} | {b['wall_s'] / none:.2f} | {b['folded']} | "
              f"{b['sample_rows'] or '-'} | {ci} |")
    auto = {b["build"]: b["folded"] for b in builds if b["build"].startswith("auto")}
    if "auto (whole gallery)" in auto:
        print(f"sample decision == whole-gallery decision: {auto['auto (sample)'] == auto['auto (whole gallery)']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"videos": args.videos, "bank": args.bank, "builds": builds}, indent=2))


if __name__ == "__main__":
    main()
