"""Frames per second of ``hf:DIR`` encoding against a bare ``transformers`` loop, in one run (issue 33).

A random-weight CLIP of ViT-B/32's size (vision: 12 layers, width 768, patch 32, 224 px; text: 12
layers, width 512; projection 512; about 150M parameters) is saved to a temporary folder with its
processor. The same images go through

- ``xmodal``: :func:`xmodal.features.encoders.encode_images` with ``model="hf:DIR"`` (what
  ``xmodal encode images --model hf:DIR`` runs), and :func:`~xmodal.features.encoders.encode_videos`
  over a video made of the same frames (``encode videos --model hf:DIR --all-frames``: decoding included);
- ``bare``: ``model.get_image_features(**processor(images=batch))`` in batches, under ``torch.inference_mode``.

Rounds alternate; each path's best round counts (the machine is shared). Prints frames/s and the ratio
``xmodal / bare`` (goal >= 0.9 on CPU). Usage::

    python bench/encoders.py [--images 64] [--batch-size 32] [--rounds 3] [--threads 1]

Images: the first ``--images`` JPEGs of ``../shared/data/flickr8k/dev_images`` when present, else
random 320x240 JPEGs. Never used by the tests.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def save_vit_b32(folder: Path) -> Path:
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    import hf_tiny

    tok = hf_tiny.tokenizer(max_length=77)
    torch.manual_seed(0)
    cfg = CLIPConfig(text_config=dict(vocab_size=49408, hidden_size=512, intermediate_size=2048,
                                      num_hidden_layers=12, num_attention_heads=8, max_position_embeddings=77,
                                      bos_token_id=0, eos_token_id=1, pad_token_id=1),
                     vision_config=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                        num_attention_heads=12, image_size=224, patch_size=32),
                     projection_dim=512)
    CLIPModel(cfg).eval().save_pretrained(folder)
    CLIPProcessor(image_processor=CLIPImageProcessor(), tokenizer=tok).save_pretrained(folder)
    return folder


def images(n: int, tmp: Path) -> list[Path]:
    shared = ROOT.parent / "shared" / "data" / "flickr8k" / "dev_images"
    if shared.is_dir():
        found = sorted(shared.glob("*.jpg"))[:n]
        if len(found) == n:
            return found
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        out.append(tmp / f"img_{i:03d}.jpg")
        Image.fromarray(rng.integers(0, 256, size=(240, 320, 3), dtype=np.uint8)).save(out[-1])
    return out


def video_of(paths: list[Path], out: Path) -> Path:
    import av
    from PIL import Image

    with av.open(str(out), "w") as c:
        s = c.add_stream("mpeg4", rate=25)
        s.width, s.height, s.pix_fmt, s.bit_rate = 224, 224, "yuv420p", 4_000_000
        for p in paths:
            frame = np.asarray(Image.open(p).convert("RGB").resize((224, 224)))
            for pk in s.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                c.mux(pk)
        for pk in s.encode():
            c.mux(pk)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from PIL import Image
    from transformers import AutoModel, AutoProcessor

    from xmodal.features import encoders

    tmp = Path(tempfile.mkdtemp(prefix="enc-bench-"))
    try:
        folder = save_vit_b32(tmp / "clip-vit-b32-random")
        paths = images(args.images, tmp)
        spec = f"hf:{folder}"
        model = AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
        proc = AutoProcessor.from_pretrained(str(folder))
        bs = args.batch_size

        def bare():
            out = []
            with torch.inference_mode():
                for i in range(0, len(paths), bs):
                    batch = [Image.open(p) for p in paths[i:i + bs]]
                    out.append(model.get_image_features(**proc(images=batch, return_tensors="pt")).pooler_output)
            return torch.cat(out).numpy()

        def ours():
            return encoders.encode_images(paths, model=spec, batch_size=bs, progress=False)

        clip = None
        try:
            clip = video_of(paths, tmp / "frames.avi")
        except ImportError:
            print("PyAV missing: the video path is not measured")

        def ours_video():
            return encoders.encode_videos([clip], model=spec, batch_size=bs)[0]

        ref, got = bare(), ours()  # warm-up (and xmodal's one model load), then the check
        print(f"max |xmodal - bare| over {len(paths)} images: {float(np.abs(ref - got).max()):.2e}")
        paths_named = {"bare": bare, "xmodal encode images": ours}
        if clip is not None:
            ours_video()
            paths_named["xmodal encode videos"] = ours_video
        best = {k: float("inf") for k in paths_named}
        cpu = {k: float("inf") for k in paths_named}
        names = list(paths_named)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:  # the order rotates every round
                t0, c0 = time.perf_counter(), time.process_time()
                paths_named[name]()
                best[name] = min(best[name], time.perf_counter() - t0)
                cpu[name] = min(cpu[name], time.process_time() - c0)
        n = len(paths)
        print(f"ViT-B/32-sized random CLIP, {n} images (224 px), batch {bs}, {args.threads} thread(s), best of "
              f"{args.rounds} rounds, order rotating (shared machine: the CPU-time column is the steadier one):")
        for name in names:
            print(f"  {name:22s} wall {n / best[name]:6.2f} frames/s (ratio to bare {best['bare'] / best[name]:.3f})"
                  f"   CPU {n / cpu[name]:6.2f} frames/CPU-s (ratio to bare {cpu['bare'] / cpu[name]:.3f})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
