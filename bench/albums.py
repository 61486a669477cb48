"""Flickr8k "albums": a real-feature testbed for the two-level model (clips inside videos).

    OMP_NUM_THREADS=1 python bench/albums.py --data ../shared/data/flickr8k --out runs/albums \\
        [--seeds 0 1 2] [--epochs 15] [--write docs/results/albums.md]

For each seed, the images of a split are shuffled and cut into albums of 3-8 images (sizes
drawn uniformly): an album is a "video" whose images are its clips (in album order), and one
of each image's 5 captions (drawn at random) is the clip's sentence, so an album's paragraph is
its captions in image order. Train albums: Flickr8k train, 100 of them carved out as the
validation split (epoch selection on its paragraph <-> video R@1,5,10, ``train.metric:
p2v_rsum``, for every model); test albums: Flickr8k dev (never seen in training).

Compared, with InfoNCE and with CrossCLR (Alg. 2, no queue) as the loss at each level:

- ``hierarchical``: ``model.hierarchy: true`` (global towers, attention pooling,
  ``L_local + 0.6 L_global``); paragraph -> video from the global embeddings;
- ``flat, mean-pooled``: the same local model trained on (image, caption) pairs only; an
  album's video (paragraph) embedding is the mean of its normalised image (caption)
  embeddings;
- ``hierarchical, local mean-pooled``: the hierarchical run's local embeddings mean-pooled
  like the flat model's (is the gain in the global towers or in the local training?).

Reported: test paragraph -> video R@1 (and video -> paragraph R@1, clip-level t2v R@1),
mean +- std over seeds, plus the per-seed values. Runs live in ``OUT/runs`` (a finished run
is reused); the album splits in ``OUT/data`` (derived data: never commit).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from xmodal.config import from_dict
from xmodal.data import PairedSplit, load_paired_split
from xmodal.metrics import text_video

LOSSES = {"infonce": {"name": "infonce", "temperature": 0.05},
          "crossclr": {"name": "crossclr", "temperature": 0.03,
                       "kwargs": {"weight_scale": 0.0035, "intra_weight": 0.8, "prune_threshold": 0.9}}}
VAL_ALBUMS = 100


def make_albums(split: PairedSplit, seed: int, *, low: int = 3, high: int = 8) -> PairedSplit:
    """Albums of ``low``-``high`` images (seeded), one caption per image, as a hierarchical split.

    Images are shuffled, then cut into consecutive albums with sizes drawn uniformly from
    ``[low, high]``; leftover images too few for an album are dropped. Each image keeps one of
    its captions, drawn at random. Rows: the album's images in album order
    (``video_to_group`` non-decreasing); texts: one per image, in the same order.
    """
    rng = np.random.default_rng([seed, 8])
    order = rng.permutation(split.num_videos)
    sizes = []
    while sum(sizes) + low <= len(order):
        sizes.append(int(min(rng.integers(low, high + 1), len(order) - sum(sizes))))
    rows = order[:sum(sizes)]
    captions_of: dict[int, list[int]] = {}
    for t, v in enumerate(split.text_to_video.tolist()):
        captions_of.setdefault(v, []).append(t)
    texts = np.array([captions_of[int(v)][rng.integers(len(captions_of[int(v)]))] for v in rows])
    return PairedSplit.from_arrays(video=split.video[rows], text=split.text[texts],
                                   text_to_video=np.arange(len(rows)),
                                   video_to_group=np.repeat(np.arange(len(sizes)), sizes),
                                   name=f"{split.name} albums seed {seed}")


def _save(root: Path, name: str, s: PairedSplit) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for role, arr in (("video_features", s.video), ("text_features", s.text), ("text_to_video", s.text_to_video),
                      ("video_to_group", s.video_to_group)):
        tmp = root / f"{name}_{role}.tmp.npy"
        np.save(tmp, arr)
        tmp.replace(root / f"{name}_{role}.npy")


def write_albums(data: Path, root: Path, seed: int) -> None:
    if (root / "test_video_to_group.npy").is_file():
        return
    train = make_albums(load_paired_split(data, "train"), seed)
    test = make_albums(load_paired_split(data, "dev"), seed)
    cut = int(np.searchsorted(train.video_to_group, train.num_groups - VAL_ALBUMS))
    _save(root, "train", train.subset(np.arange(cut)))
    _save(root, "val", train.subset(np.arange(cut, train.num_videos)))
    _save(root, "test", test)


def config(root: Path, loss: str, hierarchy: bool, seed: int, epochs: int):
    return from_dict({
        "data": {"name": "paired", "root": str(root), "train_split": "train", "val_split": "val",
                 "test_split": "test"},
        "model": {"kind": "linear", "dim": 256, "dropout": 0.1, "hierarchy": hierarchy, "global_heads": 4,
                  "pooling": "atn"},
        "loss": {**LOSSES[loss], "global_weight": 0.6},
        "optim": {"name": "adam", "lr": 1e-3, "warmup_epochs": 1},
        "test_time": {"normalizers": ["none"], "bank_size": 1000, "oracle": False},
        # about 88 clips per step either way: 16 albums of 5.5 images on average, or 88 pairs
        # epochs selected on the validation albums' paragraph <-> video retrieval, for both models
        "train": {"seed": seed, "epochs": epochs, "batch_size": 16 if hierarchy else 88, "patience": 4,
                  "progress": False, "metric": "p2v_rsum"},
    })


def mean_pooled_p2v(model, split: PairedSplit) -> dict:
    """p2v / v2p with album (paragraph) embeddings = mean of the normalised local embeddings."""
    from xmodal.retrieval.evaluate import mean_pooled_groups

    paragraph, video = mean_pooled_groups(model, split)
    out = text_video(paragraph @ video.T, np.arange(paragraph.shape[0]))
    return {"p2v": out["t2v"], "v2p": out["v2t"]}


def run_seed(args, seed: int) -> dict:
    from xmodal.models import load_model
    from xmodal.training.loop import train

    root = Path(args.out) / "data" / f"seed{seed}"
    write_albums(Path(args.data), root, seed)
    test = load_paired_split(root, "test")
    rows = {}
    for loss in args.losses:
        for hierarchy in [m == "hier" for m in args.models]:
            run = Path(args.out) / "runs" / f"{loss}-{'hier' if hierarchy else 'flat'}" / f"seed{seed}"
            if not (run / "metrics.json").is_file():
                train(config(root, loss, hierarchy, seed, args.epochs), run)
            summary = json.loads((run / "metrics.json").read_text())
            metrics = {**summary["test"]["none"], "best_epoch": summary["best_epoch"]}
            if hierarchy:  # p2v from the global towers; also its local embeddings mean-pooled
                rows[(loss, "hierarchical")] = metrics
                rows[(loss, "hierarchical, local mean-pooled")] = {**metrics,
                                                                   **mean_pooled_p2v(load_model(run), test)}
            else:  # metrics.json's p2v of a flat run is already the mean-pooled one (xmodal.retrieval.evaluate)
                rows[(loss, "flat, mean-pooled")] = metrics
            print(f"seed {seed} {loss} {'hier' if hierarchy else 'flat'}: p2v R@1 {metrics['p2v']['R@1']:.2f} "
                  f"(best epoch {summary['best_epoch']})", flush=True)
    return rows


def table(per_seed: dict[int, dict], test: PairedSplit, command: str) -> str:
    seeds = sorted(per_seed)
    keys = list(per_seed[seeds[0]])
    lines = [f"### Flickr8k albums: test (dev images, {test.num_groups} albums of 3-8, seed 0 split), "
             f"mean ± std over {len(seeds)} seeds", "",
             f"Command: `{command}`", "",
             "| loss (each level) | model | p2v R@1 | v2p R@1 | p2v R@5 | clip t2v R@1 | p2v R@1 per seed "
             "| best epochs |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    for key in keys:
        get = lambda d, k: np.array([per_seed[s][key][d][k] for s in seeds])  # noqa: E731
        ms = lambda a: f"{a.mean():.1f} ± {a.std(ddof=1) if len(a) > 1 else 0:.1f}"  # noqa: E731
        lines.append(f"| {key[0]} | {key[1]} | {ms(get('p2v', 'R@1'))} | {ms(get('v2p', 'R@1'))} | "
                     f"{ms(get('p2v', 'R@5'))} | {ms(get('t2v', 'R@1'))} | "
                     f"{', '.join(f'{x:.1f}' for x in get('p2v', 'R@1'))} | "
                     f"{', '.join(str(per_seed[s][key]['best_epoch']) for s in seeds)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="the flickr8k folder of ../shared/data")
    p.add_argument("--out", default="runs/albums")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--losses", nargs="+", default=list(LOSSES), choices=list(LOSSES))
    p.add_argument("--models", nargs="+", default=["hier", "flat"], choices=["hier", "flat"])
    p.add_argument("--write", default=None, help="also write the table to this markdown file")
    args = p.parse_args(argv)
    if not Path(args.data).is_dir():
        print(f"--data: {args.data} not found", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    per_seed = {s: run_seed(args, s) for s in args.seeds}
    test = load_paired_split(Path(args.out) / "data" / f"seed{args.seeds[0]}", "test")
    command = "OMP_NUM_THREADS=1 python bench/albums.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = table(per_seed, test, command)
    print(text)
    if args.write:
        Path(args.write).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
