"""Frames per second of ``hf:DIR`` encoding against a bare ``transformers`` loop, in one run (issue 33).

A random-weight CLIP of ViT-B/32's size (vision: 12 layers, width 768, patch 32, 224 px; text: 12
layers, width 512; projection 512; about 150M parameters) is saved to a temporary folder with its
processor. The same images go through

- ``xmodal``: :func:`xmodal.features.encoders.encode_images` with ``model="hf:DIR"`` (what
  ``xmodal encode images --model hf:DIR`` runs), and :func:`~xmodal.features.encoders.encode_videos`
  over a video made of the same frames (``encode videos --model hf:DIR --all-frames``: decoding included);
- ``bare``: ``model.get_image_features(**processor(images=batch))`` in batches, under ``torch.inference_mode``;
- ``open_clip:DIR`` (issue 42): the same weights written back in open_clip's checkpoint format
  (:func:`to_open_clip`, the inverse of :func:`xmodal.features.openclip.to_hf`), encoded by
  ``encode_images(model="open_clip:DIR")`` against its own bare loop (the mapped model on
  :func:`xmodal.features.openclip.preprocess` pixels).

``--device`` (auto: CUDA when present) runs every path, bare loops included, on that device.

Rounds alternate; each path's best round counts (the machine is shared). Prints frames/s and the ratio
``xmodal / bare`` (goal >= 0.9 on CPU). Usage::

    python bench/encoders.py [--images 64] [--batch-size 32] [--rounds 3] [--threads 1] [--device auto]
        [--write docs/results/data/encoders_speed.json]

(``--write FILE.json``: every printed value with the run's provenance, ``bench/resultfile.py``, for the docs.)

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


def to_open_clip(hf_folder: Path, out: Path) -> Path:
    """The CLIPModel of ``hf_folder`` as an open_clip checkpoint folder (config, safetensors, tokenizer files)."""
    import json

    from safetensors.torch import load_file, save_file

    state = load_file(str(hf_folder / "model.safetensors"))
    cfg = json.loads((hf_folder / "config.json").read_text())
    t, v = cfg["text_config"], cfg["vision_config"]
    oc = {"logit_scale": state["logit_scale"], "text_projection": state["text_projection.weight"].t(),
          "visual.proj": state["visual_projection.weight"].t(),
          "token_embedding.weight": state["text_model.embeddings.token_embedding.weight"],
          "positional_embedding": state["text_model.embeddings.position_embedding.weight"],
          "ln_final.weight": state["text_model.final_layer_norm.weight"],
          "ln_final.bias": state["text_model.final_layer_norm.bias"],
          "visual.class_embedding": state["vision_model.embeddings.class_embedding"],
          "visual.conv1.weight": state["vision_model.embeddings.patch_embedding.weight"],
          "visual.positional_embedding": state["vision_model.embeddings.position_embedding.weight"]}
    for a, b in (("ln_pre", "pre_layrnorm"), ("ln_post", "post_layernorm")):
        for p in ("weight", "bias"):
            oc[f"visual.{a}.{p}"] = state[f"vision_model.{b}.{p}"]
    for dst, src, n in (("visual.transformer", "vision_model.encoder", v["num_hidden_layers"]),
                        ("transformer", "text_model.encoder", t["num_hidden_layers"])):
        for i in range(n):
            d, s_ = f"{dst}.resblocks.{i}.", f"{src}.layers.{i}."
            for p in ("weight", "bias"):
                oc[d + f"attn.in_proj_{p}"] = torch.cat([state[s_ + f"self_attn.{x}_proj.{p}"] for x in "qkv"])
                for a, b in (("attn.out_proj", "self_attn.out_proj"), ("ln_1", "layer_norm1"), ("ln_2", "layer_norm2"),
                             ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2")):
                    oc[d + f"{a}.{p}"] = state[s_ + f"{b}.{p}"]
    out.mkdir(parents=True)
    save_file({k: x.contiguous() for k, x in oc.items()}, str(out / "open_clip_model.safetensors"))
    model_cfg = {"embed_dim": cfg["projection_dim"], "quick_gelu": v.get("hidden_act") == "quick_gelu",
                 "vision_cfg": {"image_size": v["image_size"], "layers": v["num_hidden_layers"], "width": v["hidden_size"],
                                "head_width": v["hidden_size"] // v["num_attention_heads"], "patch_size": v["patch_size"]},
                 "text_cfg": {"context_length": t["max_position_embeddings"], "vocab_size": t["vocab_size"],
                              "width": t["hidden_size"], "heads": t["num_attention_heads"], "layers": t["num_hidden_layers"]}}
    (out / "open_clip_config.json").write_text(json.dumps({"model_cfg": model_cfg, "preprocess_cfg": {}}))
    return out


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
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    ap.add_argument("--write", metavar="FILE.json",
                    help="also write the values as a result file the docs pages render (bench/resultfile.py)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from PIL import Image
    from transformers import AutoModel, AutoProcessor

    from xmodal.features import encoders, openclip

    device = encoders.resolve_device(args.device)
    tmp = Path(tempfile.mkdtemp(prefix="enc-bench-"))
    try:
        folder = save_vit_b32(tmp / "clip-vit-b32-random")
        paths = images(args.images, tmp)
        spec = f"hf:{folder}"
        model = AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval().to(device)
        proc = AutoProcessor.from_pretrained(str(folder))
        bs = args.batch_size
        oc_folder = to_open_clip(folder, tmp / "open-clip-vit-b32-random")
        oc_spec = f"open_clip:{oc_folder}"
        oc_cfg = openclip.read_config(oc_folder, oc_spec)

        def bare():
            out = []
            with torch.inference_mode():
                for i in range(0, len(paths), bs):
                    batch = [Image.open(p) for p in paths[i:i + bs]]
                    pixels = proc(images=batch, return_tensors="pt")["pixel_values"].to(device)
                    out.append(model.get_image_features(pixel_values=pixels).pooler_output.float().cpu())
            return torch.cat(out).numpy()

        def bare_open_clip():
            out = []
            with torch.inference_mode():
                for i in range(0, len(paths), bs):
                    pixels = torch.from_numpy(np.stack([openclip.preprocess(Image.open(p), oc_cfg)
                                                        for p in paths[i:i + bs]])).to(device)
                    out.append(model.get_image_features(pixel_values=pixels).pooler_output.float().cpu())
            return torch.cat(out).numpy()

        def ours():
            return encoders.encode_images(paths, model=spec, batch_size=bs, progress=False, device=device)

        def ours_open_clip():
            return encoders.encode_images(paths, model=oc_spec, batch_size=bs, progress=False, device=device)

        clip = None
        try:
            clip = video_of(paths, tmp / "frames.avi")
        except ImportError:
            print("PyAV missing: the video path is not measured")

        def ours_video():
            return encoders.encode_videos([clip], model=spec, batch_size=bs, device=device)[0]

        ref, got = bare(), ours()  # warm-up (and xmodal's one model load), then the check
        diff = float(np.abs(ref - got).max())
        print(f"max |xmodal - bare| over {len(paths)} images: {diff:.2e}")
        ref_oc, got_oc = bare_open_clip(), ours_open_clip()
        diff_oc = float(np.abs(ref_oc - got_oc).max())
        print(f"max |xmodal open_clip:DIR - its bare loop| over {len(paths)} images: {diff_oc:.2e}")
        paths_named = {"bare": bare, "xmodal encode images": ours, "bare open_clip": bare_open_clip,
                       "xmodal open_clip:DIR": ours_open_clip}
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
        print(f"ViT-B/32-sized random CLIP, {n} images (224 px), batch {bs}, {args.threads} thread(s), {device}, "
              f"best of {args.rounds} rounds, order rotating (shared machine: the CPU-time column is the steadier one):")
        rows = []
        for name in names:
            ref_name = "bare open_clip" if "open_clip" in name else "bare"
            print(f"  {name:22s} wall {n / best[name]:6.2f} frames/s (ratio to {ref_name} "
                  f"{best[ref_name] / best[name]:.3f})   CPU {n / cpu[name]:6.2f} frames/CPU-s (ratio to {ref_name} "
                  f"{cpu[ref_name] / cpu[name]:.3f})")
            rows.append([name, ref_name, n / cpu[name], cpu[ref_name] / cpu[name], n / best[name],
                         best[ref_name] / best[name]])
        if args.write:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            import os

            import resultfile

            table = {"columns": ["path", "reference", "frames per CPU-second", "ratio to the reference (CPU)",
                                 "wall frames/s (noisy)", "ratio to the reference (wall)"],
                     "formats": [None, None, ".2f", ".3f", ".2f", ".3f"], "rows": rows}
            data = resultfile.provenance("bench/encoders.py", None, "bench/encoders.py --write (this file is its output)")
            resultfile.write_json(args.write, {**data, "images": n, "batch": bs, "rounds": args.rounds,
                                               "threads": args.threads, "device": str(device),
                                               "load_average": os.getloadavg()[0], "max_abs_diff": diff,
                                               "max_abs_diff_open_clip": diff_oc, "table": table})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
