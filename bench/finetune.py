"""Fine-tuning the encoder (``model.kind: clip4clip``): training speed against a bare loop, and peak memory.

1. Speed, in one process, same random CLIP, same batch, same threads: frames/s of xmodal's training step
   (the clip4clip towers: frame sampling, CLIP's normalisation, meanP, the InfoNCE module, Adam) against a
   bare loop (transformers ``CLIPModel`` + masked mean of the unit frame embeddings + symmetric
   cross-entropy, Adam), interleaved, median of ``--repeats``; the ratio is what the bench states.
2. Peak memory of one training step at batch ``--batch`` x ``--frames`` frames: plain, with
   ``model.gradient_checkpointing``, with ``train.chunk_size`` (gradient caching), and both; each in a fresh
   subprocess: its peak RSS during the step above its RSS before it (Linux ``VmHWM`` after ``clear_refs``).

Default: a small random CLIP (quick, a minute on 2 cores). ``--vit-b32``: a ViT-B/32-sized random CLIP
(vision 768 x 12 layers at 224 px, text 512 x 12) at batch 32 x 12 (slow on a CPU: minutes per step).

    python bench/finetune.py [--vit-b32] [--batch 32] [--frames 12] [--chunk 8] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

SMALL = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4)


def make_clip(folder: Path, vit_b32: bool) -> Path:
    """A random CLIP folder (model + processor): ViT-B/32's sizes, or a small one."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    from hf_tiny import tokenizer

    tok = tokenizer(max_length=32)
    torch.manual_seed(0)
    if vit_b32:
        text = dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=8)
        vision = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                      image_size=224, patch_size=32)
        dim = 512
    else:
        text, vision, dim = SMALL, dict(SMALL, image_size=32, patch_size=8), 64
    cfg = CLIPConfig(text_config=dict(vocab_size=len(tok), max_position_embeddings=32, bos_token_id=0, eos_token_id=1,
                                      pad_token_id=1, **text), vision_config=vision, projection_dim=dim)
    CLIPModel(cfg).save_pretrained(folder)
    size = vision["image_size"]
    CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": size},
                                                     crop_size={"height": size, "width": size}),
                  tokenizer=tok).save_pretrained(folder)
    return folder


def batch(size: int, n: int, frames: int, seed: int = 0):
    import numpy as np

    g = np.random.default_rng(seed)
    video = g.integers(0, 256, size=(n, frames, size * size * 3), dtype=np.uint8)
    mask = np.ones((n, frames), bool)
    mask[::2, frames // 2:] = False  # half the videos half as long
    caps = [f"clip {i} of the bench" for i in range(n)]
    return video, mask, caps


def xmodal_step(folder: Path, frames: int, *, checkpointing: bool = False, chunk: int = 0):
    import torch

    from xmodal.losses import InfoNCE
    from xmodal.models.clip4clip import build_clip4clip, tokenize
    from xmodal.training.gradcache import cached_backward

    model, proc = build_clip4clip(f"hf:{folder}", max_frames=frames, max_words=32,
                                  gradient_checkpointing=checkpointing)
    model.train()
    loss = InfoNCE(temperature=0.05)
    opt = torch.optim.Adam(model.parameters(), lr=1e-6)

    def step(video, mask, caps):
        ids = torch.from_numpy(tokenize(caps, proc.tokenizer, 32))
        v, m = torch.from_numpy(video), torch.from_numpy(mask)
        opt.zero_grad(set_to_none=True)
        if chunk:
            cached_backward(model.forward_video, model.forward_text, loss, video=v, video_mask=m, text=ids,
                            text_mask=None, chunk_size=chunk)
        else:
            loss(model.forward_video(v, m), model.forward_text(ids)).backward()
        opt.step()
    return step, model.video_tower.size


def bare_step(folder: Path):
    """transformers' CLIPModel, masked mean of the unit frame embeddings, symmetric cross-entropy, Adam."""
    import torch
    from torch.nn import functional as F
    from transformers import CLIPModel, CLIPProcessor

    clip = CLIPModel.from_pretrained(str(folder)).train()
    proc = CLIPProcessor.from_pretrained(str(folder))
    opt = torch.optim.Adam(clip.parameters(), lr=1e-6)
    ip = proc.image_processor
    mean = torch.tensor(ip.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(ip.image_std).view(1, 3, 1, 1)
    size = clip.config.vision_config.image_size

    def step(video, mask, caps):
        tok = proc.tokenizer(caps, padding="max_length", max_length=32, truncation=True, return_tensors="pt")
        m = torch.from_numpy(mask)
        x = torch.from_numpy(video)[m].view(-1, size, size, 3).permute(0, 3, 1, 2).float() / 255
        opt.zero_grad(set_to_none=True)
        f = clip.visual_projection(clip.vision_model(pixel_values=(x - mean) / std).pooler_output)
        per = torch.zeros(*m.shape, f.shape[-1]).masked_scatter(m[..., None], F.normalize(f, dim=-1))
        v = per.sum(1) / m.sum(1, keepdim=True)
        t = clip.text_projection(clip.text_model(**tok).pooler_output)
        logits = F.normalize(t, dim=-1) @ F.normalize(v, dim=-1).T / 0.05
        labels = torch.arange(len(caps))
        ((F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2).backward()
        opt.step()
    return step


def speed(folder: Path, n: int, frames: int, repeats: int) -> dict:
    ours, size = xmodal_step(folder, frames)
    bare = bare_step(folder)
    data = batch(size, n, frames)
    real = int(data[1].sum())
    for fn in (ours, bare):  # warm-up
        fn(*data)
    times = {"xmodal": [], "bare": []}
    for _ in range(repeats):  # interleaved: a busy machine slows both alike
        for name, fn in (("xmodal", ours), ("bare", bare)):
            t = time.perf_counter()
            fn(*data)
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"frames_per_step": real, "xmodal_frames_s": real / med["xmodal"], "bare_frames_s": real / med["bare"],
            "ratio": med["bare"] / med["xmodal"]}


def _child(args: argparse.Namespace) -> None:
    """One training step's peak memory in this fresh process."""
    import torch

    step, size = xmodal_step(Path(args.folder), args.frames, checkpointing=args.checkpointing, chunk=args.chunk)
    data = batch(size, args.batch, args.frames)
    if args.device == "cuda":
        step(*data)  # (the GPU path is not wired here: peak RSS on CPU only)
    # loading the model set the process's peak: reset it (Linux clear_refs 5: VmHWM = VmRSS) before the step
    Path("/proc/self/clear_refs").write_text("5")
    base = _status("VmRSS")
    step(*data)
    peak = _status("VmHWM")
    print(json.dumps({"peak_mib_above_inputs": (peak - base) / 1024, "torch": torch.__version__}))


def _status(key: str) -> int:
    """A ``/proc/self/status`` memory line in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key}")


def memory(folder: Path, n: int, frames: int, chunk: int) -> dict:
    out = {}
    for name, extra in (("plain", []), ("checkpointing", ["--checkpointing"]), (f"chunk {chunk}", ["--chunk", str(chunk)]),
                        (f"checkpointing + chunk {chunk}", ["--checkpointing", "--chunk", str(chunk)])):
        cmd = [sys.executable, __file__, "--child", "--folder", str(folder), "--batch", str(n), "--frames", str(frames),
               *extra]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out[name] = json.loads(res.stdout.strip().splitlines()[-1])["peak_mib_above_inputs"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vit-b32", action="store_true", help="a ViT-B/32-sized random CLIP (slow on CPU)")
    p.add_argument("--batch", type=int, default=None, help="videos per batch (default 32 with --vit-b32, else 16)")
    p.add_argument("--frames", type=int, default=None, help="frames per video (default 12, else 4)")
    p.add_argument("--chunk", type=int, default=8, help="train.chunk_size of the memory runs")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--write", default=None, help="a result file (docs/results/data/NAME.json) with provenance and "
                   "the memory table docs/finetune.md renders")
    p.add_argument("--device", default="cpu", choices=("cpu",), help="where the steps run (CPU: peak RSS)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    p.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.chunk = args.chunk if "--chunk" in (argv or sys.argv) else 0
        _child(args)
        return 0
    n = args.batch or (32 if args.vit_b32 else 16)
    frames = args.frames or (12 if args.vit_b32 else 4)
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_clip(Path(tmp) / "clip", args.vit_b32)
        result = {"model": "ViT-B/32-sized random CLIP" if args.vit_b32 else "small random CLIP", "batch": n,
                  "frames": frames, "speed": speed(folder, n, frames, args.repeats) if not args.vit_b32 else None,
                  "peak_memory_mib": memory(folder, n, frames, args.chunk)}
    if result["speed"]:
        s = result["speed"]
        print(f"training speed ({result['model']}, batch {n} x {frames}): xmodal {s['xmodal_frames_s']:.0f} frames/s, "
              f"bare transformers loop {s['bare_frames_s']:.0f} frames/s, ratio {s['ratio']:.2f}x")
    for name, mib in result["peak_memory_mib"].items():
        print(f"peak memory, one step at batch {n} x {frames} ({name}): {mib:.0f} MiB above the inputs")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if args.write:
        from resultfile import provenance, write_json

        mem = result["peak_memory_mib"]
        plain = mem["plain"]
        result["memory_table"] = {"columns": ["one training step", "peak MiB above the inputs", "x plain"],
                                  "formats": [None, ",.0f", ".2f"],
                                  "rows": [[name, v, v / plain] for name, v in mem.items()]}
        write_json(args.write, {**provenance("bench/finetune.py", argv if argv is not None else sys.argv[1:],
                                             "bench/finetune.py --write"), **result})
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
