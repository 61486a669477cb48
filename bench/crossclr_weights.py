"""CrossCLR weights and pruning on real batches: effective sample size and share pruned.

    python bench/crossclr_weights.py --data ../shared/data/flickr8k [--batch 64 --batches 20 --kappa 0.0035]

For seeded random train batches of (image, caption) input features: the effective sample size
``(sum w)^2 / sum w^2`` of the connectivity weights (out of the batch size) under Algorithm 2's
normalisation (``C / sum C``, the default) and eq. 5 read literally (``C / kappa``, "mean"), and the
share of samples whose influence score ``C / max C`` exceeds gamma (appendix B.1), per modality.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from xmodal.data import load_paired_split
from xmodal.functional.crossclr import connectivity, connectivity_weights, influence_scores


def ess(w: torch.Tensor) -> float:
    return float(w.sum() ** 2 / (w * w).sum())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--kappa", type=float, default=0.0035)
    p.add_argument("--gamma", type=float, default=0.9)
    args = p.parse_args(argv)
    train = load_paired_split(args.data, "train")
    rng = np.random.default_rng(0)
    rows = {"Alg. 2 (C / sum C)": ("sum", []), "eq. 5 literally (C / kappa)": ("mean", [])}
    pruned = {"images": [], "captions": []}
    for _ in range(args.batches):
        idx = rng.choice(train.num_texts, args.batch, replace=False)
        feats = {"images": torch.as_tensor(np.asarray(train.video, np.float64)[train.text_to_video[idx]]),
                 "captions": torch.as_tensor(np.asarray(train.text, np.float64)[idx])}
        for mod, x in feats.items():
            conn = connectivity(x)
            for norm, out in rows.values():
                out.append((mod, ess(connectivity_weights(conn, args.kappa, norm))))
            pruned[mod].append(float((influence_scores(conn) > args.gamma).double().mean()))
    print(f"| weights (kappa {args.kappa}) | ESS images (of {args.batch}) | ESS captions |\n|---|---:|---:|")
    for name, (_, out) in rows.items():
        per = {m: np.mean([e for mm, e in out if mm == m]) for m in ("images", "captions")}
        print(f"| {name} | {per['images']:.2f} | {per['captions']:.2f} |")
    print(f"\nshare with C / max C > {args.gamma}: images {100 * np.mean(pruned['images']):.1f} %, "
          f"captions {100 * np.mean(pruned['captions']):.1f} % ({args.batches} seeded batches)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
