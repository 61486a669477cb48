"""CrossCLR weights and pruning on real batches: effective sample size and share pruned.

    python bench/crossclr_weights.py --data ../shared/data/flickr8k [--batch 64 --batches 20 --kappa 0.0035]
        [--write docs/results/data/crossclr_weights.json]

For seeded random train batches of (image, caption) input features: the effective sample size
``(sum w)^2 / sum w^2`` of the connectivity weights (out of the batch size) and their spread
``max w / min w`` under xmodal's ``C / sum |C|`` (the default ``weight_norm="sum"``), Algorithm 2
read literally (``C / sum C``, signed) and eq. 5 read literally (``C / kappa``, "mean"), the
smallest ``sum C / sum |C|`` seen (1: no negative connectivity, the two Alg. 2 forms agree), and
the share of samples whose influence score ``C / max C`` exceeds gamma (appendix B.1), per modality.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from xmodal.data import load_paired_split
from xmodal.functional.crossclr import connectivity, connectivity_weights, influence_scores


def ess(w: torch.Tensor) -> float:
    return float(w.sum() ** 2 / (w * w).sum())


def signed_sum_weights(conn: torch.Tensor, kappa: float) -> torch.Tensor:
    """Alg. 2 literally: ``B * softmax((C / sum C) / kappa)`` (undefined when ``sum C = 0``)."""
    return conn.numel() * torch.softmax(conn / conn.sum() / kappa, dim=0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--kappa", type=float, default=0.0035)
    p.add_argument("--gamma", type=float, default=0.9)
    p.add_argument("--write", metavar="FILE.json",
                   help="also write the values as a result file the docs pages render (bench/resultfile.py)")
    args = p.parse_args(argv)
    train = load_paired_split(args.data, "train")
    rng = np.random.default_rng(0)
    rows = {"xmodal (C / sum |C|)": ("sum", []), "Alg. 2 literally (C / sum C)": ("signed", []),
            "eq. 5 literally (C / kappa)": ("mean", [])}
    ratio = {"images": [], "captions": []}
    pruned = {"images": [], "captions": []}
    for _ in range(args.batches):
        idx = rng.choice(train.num_texts, args.batch, replace=False)
        feats = {"images": torch.as_tensor(np.asarray(train.video, np.float64)[train.text_to_video[idx]]),
                 "captions": torch.as_tensor(np.asarray(train.text, np.float64)[idx])}
        for mod, x in feats.items():
            conn = connectivity(x)
            ratio[mod].append(float(conn.sum() / conn.abs().sum()))
            for norm, out in rows.values():
                w = (signed_sum_weights(conn, args.kappa) if norm == "signed"
                     else connectivity_weights(conn, args.kappa, norm))
                out.append((mod, ess(w), float(w.max() / w.min())))
            pruned[mod].append(float((influence_scores(conn) > args.gamma).double().mean()))
    print(f"| weights (kappa {args.kappa}) | ESS images (of {args.batch}) | ESS captions "
          f"| max/min w images | max/min w captions |\n|---|---:|---:|---:|---:|")
    result = {"batch": args.batch, "batches": args.batches, "kappa": args.kappa, "gamma": args.gamma, "weights": {}}
    for name, (norm, out) in rows.items():
        e = {m: float(np.mean([x for mm, x, _ in out if mm == m])) for m in ("images", "captions")}
        r = {m: float(np.mean([x for mm, _, x in out if mm == m])) for m in ("images", "captions")}
        print(f"| {name} | {e['images']:.2f} | {e['captions']:.2f} | {r['images']:.3g} | {r['captions']:.3g} |")
        result["weights"][norm] = {"name": name, "ess": e, "max_over_min": r}
    print(f"\nsmallest sum C / sum |C|: images {min(ratio['images']):.4f}, captions {min(ratio['captions']):.4f}")
    print(f"\nshare with C / max C > {args.gamma}: images {100 * np.mean(pruned['images']):.1f} %, "
          f"captions {100 * np.mean(pruned['captions']):.1f} % ({args.batches} seeded batches)")
    result["min_signed_ratio"] = {m: min(v) for m, v in ratio.items()}
    result["influential_percent"] = {m: float(100 * np.mean(v)) for m, v in pruned.items()}
    if args.write:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import resultfile

        data = resultfile.provenance("bench/crossclr_weights.py", argv,
                                     "bench/crossclr_weights.py --write (this file is its output)")
        resultfile.write_json(args.write, {**data, **result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
