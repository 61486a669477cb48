"""Re-encode all of Flickr8k dev (5,000 captions, 1,000 images) and compare with the shipped
``dev_*_features.npy`` (float16). Slow on CPU (about 3 + 10 minutes on 2 cores).

Run: .venv/bin/python bench/encoder_equivalence.py [--data ../shared/data/flickr8k]
"""
import argparse
import time
from pathlib import Path

import numpy as np

from xmodal.data import load_paired_split
from xmodal.features.encoders import encode_images, encode_text, list_images

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "flickr8k"))
    root = Path(parser.parse_args().data)
    if not root.is_dir():
        raise SystemExit(f"Flickr8k not found at {root}: nothing to compare against")
    split = load_paired_split(root, "dev")
    t = time.perf_counter()
    text = encode_text(split.captions, progress=True)
    d = np.abs(text - split.text)
    print(f"captions {len(text)}: max abs diff {d.max():.3g}, mean {d.mean():.3g} ({time.perf_counter() - t:.0f} s)")
    t = time.perf_counter()
    images = encode_images(list_images(root / "dev_images", root / "dev_images.txt"), progress=True)
    d = np.abs(images - split.video)
    print(f"images {len(images)}: max abs diff {d.max():.3g} (relative to max |feature| "
          f"{d.max() / np.abs(split.video).max():.3g}), mean {d.mean():.3g} ({time.perf_counter() - t:.0f} s)")


if __name__ == "__main__":
    main()
