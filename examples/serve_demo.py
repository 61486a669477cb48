"""A searchable gallery of generated images for ``xmodal serve`` (the screenshots of docs/search.md).

Draws seeded pictures of coloured shapes with Pillow, encodes them with EfficientNet-Lite0 and
their captions with MiniLM (extra ``[encoders]``, offline), trains a small run on them, and
indexes a held-out gallery with its names and captions (``--data``: the page shows each image's
captions, "more like this" and captions for an image):

    .venv/bin/python examples/serve_demo.py runs/shapes        # a few minutes on 2 CPU cores
    .venv/bin/xmodal serve --index runs/shapes/index --images runs/shapes/images

Nothing is downloaded; every picture and caption is made here.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import yaml
from PIL import Image, ImageDraw

from xmodal.features import encoders
from xmodal.cli import main

COLOURS = {"red": (214, 40, 40), "green": (46, 160, 67), "blue": (40, 90, 214), "yellow": (240, 200, 30),
           "purple": (140, 60, 190), "orange": (245, 130, 20)}
SHAPES = ("circle", "square", "triangle", "star")
BACKGROUNDS = {"white": (245, 245, 245), "black": (25, 25, 25)}
SPLITS = {"train": 720, "val": 144, "gallery": 96}


def draw(shape: str, colour: str, background: str, big: bool, rng: np.random.Generator) -> Image.Image:
    """A 224x224 picture of one shape, at a random place and angle."""
    im = Image.new("RGB", (224, 224), BACKGROUNDS[background])
    r = rng.uniform(62, 80) if big else rng.uniform(26, 36)
    cx, cy = rng.uniform(r + 8, 216 - r, size=2)
    turn = rng.uniform(0, 2 * math.pi)
    fill = tuple(int(np.clip(c + rng.integers(-15, 16), 0, 255)) for c in COLOURS[colour])
    d = ImageDraw.Draw(im)
    if shape == "circle":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        return im
    corners = {"square": 4, "triangle": 3, "star": 10}[shape]
    pts = []
    for i in range(corners):
        radius = r * (0.45 if shape == "star" and i % 2 else 1.0)
        a = turn + 2 * math.pi * i / corners
        pts.append((cx + radius * math.cos(a), cy + radius * math.sin(a)))
    d.polygon(pts, fill=fill)
    return im


def captions(shape: str, colour: str, background: str, big: bool) -> list[str]:
    size = "large" if big else "small"
    return [f"a {size} {colour} {shape} on a {background} background",
            f"a {colour} {shape}",
            f"{'a big' if big else 'a tiny'} {colour} {shape} against {background}"]


def make_split(root: Path, name: str, count: int, rng: np.random.Generator) -> tuple[list[Path], list[str], list[int]]:
    folder = root / "images"
    folder.mkdir(parents=True, exist_ok=True)
    paths, texts, t2v = [], [], []
    for i in range(count):
        shape, colour = SHAPES[rng.integers(len(SHAPES))], list(COLOURS)[rng.integers(len(COLOURS))]
        background, big = list(BACKGROUNDS)[rng.integers(2)], bool(rng.integers(2))
        path = folder / f"{name}_{i:04d}_{'large' if big else 'small'}_{colour}_{shape}.png"
        draw(shape, colour, background, big, rng).save(path)
        paths.append(path)
        for text in captions(shape, colour, background, big):
            texts.append(text)
            t2v.append(i)
    return paths, texts, t2v


def main_(out: Path, epochs: int) -> None:
    rng = np.random.default_rng(0)
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    names = {}
    for split, count in SPLITS.items():
        paths, texts, t2v = make_split(out, split, count, rng)
        np.save(data / f"{split}_video_features.npy", encoders.encode_images(paths, progress=False))
        np.save(data / f"{split}_text_features.npy", encoders.encode_text(texts, progress=False))
        np.save(data / f"{split}_text_to_video.npy", np.asarray(t2v, np.int64))
        names[split] = [p.name for p in paths]
        (data / f"{split}_videos.txt").write_text("".join(n + "\n" for n in names[split]), encoding="utf-8")
        (data / f"{split}_texts.tsv").write_text("text\n" + "".join(t + "\n" for t in texts), encoding="utf-8")
        print(f"{split}: {count} images, {len(texts)} captions")
    config = {"data": {"name": "paired", "root": str(data.resolve()), "train_split": "train",
                       "val_split": "val", "test_split": ""},
              "model": {"kind": "linear", "dim": 128},
              "loss": {"name": "infonce", "temperature": 0.05, "learnable": True},
              "optim": {"name": "adam", "lr": 0.001},
              "test_time": {"normalizers": ["none", "dn", "sinkhorn"], "bank_size": 1000},
              "train": {"seed": 0, "epochs": epochs, "batch_size": 128, "sampling": "captions"}}
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    assert main(["train", str(out / "config.yaml"), "--out", str(out / "run"), "--no-plots", "--no-resume"]) == 0
    assert main(["index", "--run", str(out / "run"), "--data", str(data), "--split", "gallery",
                 "--out", str(out / "index"), "--overwrite",
                 "--normalizer", "sinkhorn"]) == 0  # a folded bias to show (val: as good as none)
    print(f"now: xmodal serve --index {out / 'index'} --images {out / 'images'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write (images, features, run, index)")
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    main_(args.out, args.epochs)
