"""Tiny random-weight CLIP / SigLIP / X-CLIP folders saved with ``save_pretrained`` (model + processor),
and small video files, for the tests of ``hf:DIR`` encoders (issue 33). Nothing is downloaded: the
tokenizer is a byte-level CLIP BPE over the 256 byte symbols (no merges), built here.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
_SMALL = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4)
#: Feature sizes of the tiny models (what their sidecars must say).
DIMS = {"clip": 24, "siglip": 32, "xclip": 24}
XCLIP_FRAMES = 4


def tokenizer(max_length: int = 16):
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in chars + [c + "</w>" for c in chars]:
        vocab.setdefault(c, len(vocab))
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=max_length)


def save_clip(folder: Path, seed: int = 0, *, image_size: int = 32, projection_dim: int | None = None) -> Path:
    """A tiny CLIP folder; ``projection_dim`` 32 (the text width) lets CLIP4Clip's seqTransf reuse its text blocks
    (whose feed-forward is then OpenAI's 4 x width)."""
    small = _SMALL if projection_dim is None else {**_SMALL, "intermediate_size": 4 * _SMALL["hidden_size"]}
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    tok = tokenizer()
    torch.manual_seed(seed)
    cfg = CLIPConfig(text_config=dict(vocab_size=len(tok), max_position_embeddings=16, bos_token_id=0,
                                      eos_token_id=1, pad_token_id=1, **small),
                     vision_config=dict(image_size=image_size, patch_size=8, **small),
                     projection_dim=projection_dim or DIMS["clip"])
    CLIPModel(cfg).eval().save_pretrained(folder)
    CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": image_size},
                                                     crop_size={"height": image_size, "width": image_size}),
                  tokenizer=tok).save_pretrained(folder)
    return folder


def save_siglip(folder: Path, seed: int = 0) -> Path:
    import torch
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel, SiglipProcessor

    tok = tokenizer()
    torch.manual_seed(seed)
    cfg = SiglipConfig(text_config=dict(vocab_size=len(tok), max_position_embeddings=16, bos_token_id=0,
                                        eos_token_id=1, pad_token_id=1, **_SMALL),
                       vision_config=dict(image_size=32, patch_size=8, **_SMALL))
    SiglipModel(cfg).eval().save_pretrained(folder)
    SiglipProcessor(image_processor=SiglipImageProcessor(size={"height": 32, "width": 32}),
                    tokenizer=tok).save_pretrained(folder)
    return folder


def save_xclip(folder: Path, seed: int = 0) -> Path:
    import torch
    from transformers import VideoMAEImageProcessor, XCLIPConfig, XCLIPModel, XCLIPProcessor

    tok = tokenizer()
    torch.manual_seed(seed)
    d = DIMS["xclip"]
    cfg = XCLIPConfig(text_config=dict(vocab_size=len(tok), max_position_embeddings=16, bos_token_id=0,
                                       eos_token_id=1, pad_token_id=1, **_SMALL),
                      vision_config=dict(image_size=32, patch_size=8, num_frames=XCLIP_FRAMES, mit_hidden_size=d,
                                         mit_intermediate_size=37, mit_num_hidden_layers=1,
                                         mit_num_attention_heads=4, **_SMALL),
                      projection_dim=d, prompt_layers=1, prompt_attention_heads=4, prompt_projection_dim=d)
    XCLIPModel(cfg).eval().save_pretrained(folder)
    XCLIPProcessor(image_processor=VideoMAEImageProcessor(size={"shortest_edge": 32},
                                                          crop_size={"height": 32, "width": 32}),
                   tokenizer=tok).save_pretrained(folder)
    return folder


def write_images(folder: Path, n: int, seed: int = 0) -> list[Path]:
    """``n`` PNGs of different sizes and modes (RGB, grayscale, RGBA): what the processor must convert."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h, w = 24 + 7 * i, 40 + 5 * i
        arr = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        im = Image.fromarray(arr)
        im = im.convert(("RGB", "L", "RGBA")[i % 3])
        out.append(folder / f"img_{i:02d}.png")
        im.save(out[-1])
    return out


def write_video(path: Path, frames: np.ndarray, rate: int = 5, codec: str = "mpeg4") -> Path:
    """RGB frames ``[T, H, W, 3]`` as a video file (PyAV)."""
    import av

    t, h, w, _ = frames.shape
    with av.open(str(path), "w") as c:
        s = c.add_stream(codec, rate=rate)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        for f in frames:
            for p in s.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def decoded_frames(path: Path) -> list:
    """Every frame of a video as an RGB ``PIL.Image`` (the reference path of the tests)."""
    import av
    from PIL import Image

    with av.open(str(path)) as c:
        return [Image.fromarray(f.to_ndarray(format="rgb24")) for f in c.decode(video=0)]
