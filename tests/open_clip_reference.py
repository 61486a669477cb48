"""Reference features from open_clip itself, for tests/test_openclip.py (run in a subprocess).

Usage: python open_clip_reference.py OUT_DIR [EXTRA_SYS_PATH]

Creates a tiny random open_clip ViT CLIP (seeded) with ``open_clip.create_model`` from a custom config,
saves it as open_clip's ``push_to_hf_hub`` does (open_clip_config.json, open_clip_model.safetensors) plus
its BPE tokenizer as vocab.json / merges.txt, and writes open_clip's own ``encode_text`` /
``encode_image`` outputs for fixed captions and pixel tensors (and, where a real torchvision imports,
open_clip's own eval preprocessing of fixed images).

open_clip imports torchvision at import time; torchvision's PyPI wheels die beside torch 2.13.0+cpu on
``register_fake("torchvision::nms")``. The two op schemas are defined first (never called). Without any
torchvision, minimal stand-ins of ``torchvision.transforms`` / ``torchvision.ops.misc`` (and ``ftfy``,
whose ``fix_text`` is the identity on the ASCII captions used here) let open_clip import in this
subprocess only; the model and tokenizer are then still open_clip's own, and no preprocessing reference
is written.
"""

import json
import sys
import types
from pathlib import Path

import numpy as np
import torch

out = Path(sys.argv[1])
if len(sys.argv) > 2 and sys.argv[2]:
    sys.path.insert(0, sys.argv[2])
lib = torch.library.Library("torchvision", "FRAGMENT")
lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
try:
    import torchvision
    real_tv = True
except Exception:
    real_tv = False
    for name in list(sys.modules):
        if name.startswith("torchvision"):
            del sys.modules[name]
    import transformers
    tv, tr, fn, ops, misc = (types.ModuleType(n) for n in ("torchvision", "torchvision.transforms",
                                                          "torchvision.transforms.functional", "torchvision.ops",
                                                          "torchvision.ops.misc"))
    for n in ("Normalize", "Compose", "RandomResizedCrop", "ToTensor", "Resize", "CenterCrop", "ColorJitter",
              "Grayscale"):
        setattr(tr, n, type(n, (), {"__init__": lambda self, *a, **k: None}))
    tr.InterpolationMode = types.SimpleNamespace(BICUBIC="bicubic", BILINEAR="bilinear", NEAREST="nearest")
    tr.functional, tv.transforms, tv.ops, ops.misc = fn, tr, ops, misc
    misc.FrozenBatchNorm2d = torch.nn.BatchNorm2d
    sys.modules.update({"torchvision": tv, "torchvision.transforms": tr, "torchvision.transforms.functional": fn,
                        "torchvision.ops": ops, "torchvision.ops.misc": misc})
try:
    import ftfy
except ImportError:
    sys.modules["ftfy"] = types.SimpleNamespace(fix_text=lambda text: text)
import open_clip
from PIL import Image
from safetensors.torch import save_file

quick = len(sys.argv) > 3 and sys.argv[3] == "quick"
cfg = {"embed_dim": 24, "quick_gelu": quick,
       "vision_cfg": {"image_size": 48, "layers": 2, "width": 32, "head_width": 16, "patch_size": 16},
       "text_cfg": {"context_length": 20, "vocab_size": 49408, "width": 32, "heads": 4, "layers": 2}}
pre = {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3], "interpolation": "bicubic", "resize_mode": "shortest"}
open_clip.factory._MODEL_CONFIGS["xmodal-tiny"] = cfg
torch.manual_seed(0)
model = open_clip.create_model("xmodal-tiny").eval()
with torch.no_grad():  # LayerNorms and biases away from their 1 / 0 start, so a swapped mapping shows
    for name, p in model.named_parameters():
        if p.ndim == 1 or "embedding" in name:
            p.add_(torch.randn_like(p) * 0.2)
out.mkdir(parents=True, exist_ok=True)
(out / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": pre}))
state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "attn_mask"}
save_file(state, str(out / "open_clip_model.safetensors"))
tok = open_clip.get_tokenizer("xmodal-tiny")
names = {"<start_of_text>": "<|startoftext|>", "<end_of_text>": "<|endoftext|>"}  # as the hub's CLIP files spell them
(out / "vocab.json").write_text(json.dumps({names.get(k, k): v for k, v in tok.encoder.items()}))
merges = sorted(tok.bpe_ranks, key=tok.bpe_ranks.get)
(out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
captions = ["a dog on the grass", "Two people riding horses, at sunset!",
            "a very long caption " + "with many repeated words " * 10, "x"]
rng = np.random.default_rng(0)
pixels = torch.from_numpy(rng.standard_normal((3, 3, 48, 48)).astype(np.float32))
with torch.no_grad():
    ref = {"text": model.encode_text(tok(captions)).numpy(), "tokens": tok(captions).numpy(),
           "pixels": pixels.numpy(), "image": model.encode_image(pixels).numpy()}
if real_tv:
    _, _, transform = open_clip.create_model_and_transforms("xmodal-tiny")
    transform.transforms[-1].mean, transform.transforms[-1].std = pre["mean"], pre["std"]
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in
              ((60, 90), (97, 50), (48, 48), (20, 31))]
    images.append(Image.fromarray(rng.integers(0, 256, (70, 55), dtype=np.uint8)))  # greyscale: RGB after resize
    for i, im in enumerate(images):
        im.save(out / f"img{i}.png")
    ref["preprocessed"] = torch.stack([transform(im) for im in images]).numpy()
np.savez(out / "reference.npz", captions=np.array(captions), **ref)
print(json.dumps({"torchvision": real_tv, "open_clip": open_clip.__version__}))
