"""Re-fit a trained run's bank-based normalisers (QB-Norm, IS, Sinkhorn) with other bank sizes and
QB-Norm/IS beta, and print dev t2v R@1 / rsum for each (no retraining; tune on dev only).

    python bench/testtime_sweep.py --run runs/f8k_best --data ../shared/data/flickr8k \
        [--banks 5000,15000,30000] [--betas 10,20,30,50] [--val-split dev]

Banks are drawn as the trainer draws them (seeded ``[seed, 4242]`` over the train split).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import xmodal
from xmodal.data import load_paired_split
from xmodal.retrieval.evaluate import evaluate_normalizers
from xmodal.retrieval.testtime import fit_test_time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--val-split", default="dev")
    p.add_argument("--banks", default="5000,15000,30000")
    p.add_argument("--betas", default="10,20,30,50")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model = xmodal.load_model(args.run)
    train, val = load_paired_split(args.data, "train"), load_paired_split(args.data, args.val_split)
    text, video = model.encode_text(train.text), model.encode_video(train.video)
    print("| bank | beta | normaliser | t2v R@1 | rsum |\n|---:|---:|---|---:|---:|")
    for bank in (int(b) for b in args.banks.split(",")):
        g = np.random.default_rng([args.seed, 4242])
        ti = np.sort(g.choice(train.num_texts, min(bank, train.num_texts), replace=False))
        vi = np.sort(g.choice(train.num_videos, min(bank, train.num_videos), replace=False))
        for beta in (float(b) for b in args.betas.split(",")):
            tt = fit_test_time(["qbnorm", "is", "sinkhorn"], text_bank=text[ti], video_bank=video[vi],
                               temperature=model.temperature, beta=beta)
            for name, m in evaluate_normalizers(["qbnorm", "is", "sinkhorn"], tt, model, val).items():
                rsum = sum(m[d][f"R@{k}"] for d in ("t2v", "v2t") for k in (1, 5, 10))
                print(f"| {bank} | {beta:g} | {name} | {m['t2v']['R@1']:.2f} | {rsum:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
