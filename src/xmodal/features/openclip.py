"""``open_clip:DIR`` encoders: an open_clip checkpoint folder (``open_clip_config.json`` beside
``open_clip_model.safetensors`` or ``open_clip_pytorch_model.bin``, as open_clip's ``push_to_hf_hub``
writes it) run without open_clip or torchvision.

open_clip imports torchvision, whose PyPI wheels do not import beside torch 2.13.0+cpu (its
``_meta_registrations`` registers fakes for ``torchvision::nms`` / ``qnms``, compiled ops the wheel cannot
load; docs/encoders.md). Where the checkpoint is a plain ViT CLIP (Radford et al. 2021, Sec. 2.4: a
pre-LN vision transformer over patches with a class token, a causal text transformer pooled at the
end-of-text token, two linear projections), that architecture *is* transformers' ``CLIPModel``: the
weights are mapped onto it name by name (``in_proj`` split into q, k, v; projections transposed), and
open_clip's eval preprocessing is reproduced in PIL and numpy, step for step as its
``image_transform`` composes torchvision's (resize the shorter side, or squash, with the config's
interpolation, centre crop, then RGB, ``/ 255``, the config's mean / std). Text: the folder's CLIP BPE
tokenizer (``vocab.json`` + ``merges.txt`` or ``tokenizer.json``), ``<sot> tokens <eot>`` truncated to
the context length with ``<eot>`` last and padded with 0, no attention mask, pooled at the arg-max token
id, as open_clip's ``encode_text``. Any other architecture (ResNet, timm or HF towers, SigLIP, CoCa,
layer scale, attentional pooling ...) is refused in one line naming the field.

The folder is data, never code (issue 44; :mod:`xmodal.features.openclip_folder`): files bounded before
parsing, no ``auto_map``, config fields typed and bounded, weights complete, of one floating dtype and
finite, ``.bin`` read with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from xmodal.features.openclip_folder import (
    CONFIG,
    OPENAI_MEAN,
    OPENAI_STD,
    TOKENIZER_FILES,
    WEIGHTS,
    expected_names,
    folder_of,
    read_config,
    read_weights,
    weights_file,
)


def hf_config(cfg: dict):
    """transformers' ``CLIPConfig`` of the same network (no weights)."""
    from transformers import CLIPConfig

    m = cfg["model_cfg"]
    v, t = m["vision_cfg"], m["text_cfg"]
    act = "quick_gelu" if m.get("quick_gelu") else "gelu"
    width, twidth = v.get("width", 768), t.get("width", 512)
    return CLIPConfig(
        projection_dim=int(m["embed_dim"]),
        text_config={"vocab_size": t.get("vocab_size", 49408), "hidden_size": twidth,
                     "intermediate_size": int(twidth * t.get("mlp_ratio", 4.0)), "num_hidden_layers": t.get("layers", 12),
                     "num_attention_heads": t.get("heads", 8), "max_position_embeddings": t.get("context_length", 77),
                     "hidden_act": act, "layer_norm_eps": 1e-5, "projection_dim": int(m["embed_dim"]),
                     "eos_token_id": 2},  # 2: pool at the arg-max token id, as open_clip does
        vision_config={"hidden_size": width, "intermediate_size": int(width * v.get("mlp_ratio", 4.0)),
                       "num_hidden_layers": v.get("layers", 12), "num_attention_heads": width // v.get("head_width", 64),
                       "image_size": v.get("image_size", 224), "patch_size": v.get("patch_size", 16),
                       "hidden_act": act, "layer_norm_eps": 1e-5, "projection_dim": int(m["embed_dim"])})


def to_hf(state: dict) -> dict:
    """open_clip's state dict -> ``CLIPModel``'s (the same numbers, renamed, split or transposed)."""
    out = {"logit_scale": state["logit_scale"], "text_projection.weight": state["text_projection"].t(),
           "visual_projection.weight": state["visual.proj"].t(),
           "text_model.embeddings.token_embedding.weight": state["token_embedding.weight"],
           "text_model.embeddings.position_embedding.weight": state["positional_embedding"],
           "text_model.final_layer_norm.weight": state["ln_final.weight"],
           "text_model.final_layer_norm.bias": state["ln_final.bias"],
           "vision_model.embeddings.class_embedding": state["visual.class_embedding"],
           "vision_model.embeddings.patch_embedding.weight": state["visual.conv1.weight"],
           "vision_model.embeddings.position_embedding.weight": state["visual.positional_embedding"]}
    for a, b in (("ln_pre", "pre_layrnorm"), ("ln_post", "post_layernorm")):
        for p in ("weight", "bias"):
            out[f"vision_model.{b}.{p}"] = state[f"visual.{a}.{p}"]
    for src, dst in (("visual.transformer", "vision_model.encoder"), ("transformer", "text_model.encoder")):
        i = 0
        while f"{src}.resblocks.{i}.ln_1.weight" in state:
            s, d = f"{src}.resblocks.{i}.", f"{dst}.layers.{i}."
            for p in ("weight", "bias"):
                q, k, v = state[s + f"attn.in_proj_{p}"].chunk(3)
                out.update({d + f"self_attn.q_proj.{p}": q, d + f"self_attn.k_proj.{p}": k,
                            d + f"self_attn.v_proj.{p}": v, d + f"self_attn.out_proj.{p}": state[s + f"attn.out_proj.{p}"],
                            d + f"layer_norm1.{p}": state[s + f"ln_1.{p}"], d + f"layer_norm2.{p}": state[s + f"ln_2.{p}"],
                            d + f"mlp.fc1.{p}": state[s + f"mlp.c_fc.{p}"], d + f"mlp.fc2.{p}": state[s + f"mlp.c_proj.{p}"]})
            i += 1
    return {k: v.contiguous() for k, v in out.items()}


def preprocess(image, cfg: dict):
    """open_clip's eval ``image_transform`` of one PIL image, as a float32 array ``[3, S, S]``.

    Transcribed from open_clip ``transform.py`` and torchvision's PIL path: ``resize_mode="shortest"``:
    ``Resize(S)`` (shorter side to ``S``, the longer ``int(S * long / short)``) then ``CenterCrop(S)``
    (offsets ``int(round((side - S) / 2))``); ``"squash"``: ``Resize((S, S))``; both with PIL's bicubic
    or bilinear. Then the image is made RGB, scaled by 1/255 and normalised by the config's mean / std.
    """
    from PIL import Image

    pre = cfg["preprocess_cfg"]
    s = int(cfg["model_cfg"]["vision_cfg"].get("image_size", 224))
    resample = Image.BILINEAR if pre.get("interpolation", "bicubic") == "bilinear" else Image.BICUBIC
    w, h = image.size
    if pre.get("resize_mode", "shortest") == "squash":
        image = image.resize((s, s), resample)
    else:
        short, long = (w, h) if w <= h else (h, w)
        new_short, new_long = s, int(s * long / short)
        size = (new_short, new_long) if w <= h else (new_long, new_short)
        if size != (w, h):
            image = image.resize(size, resample)
        w, h = image.size
        if w < s or h < s:  # torchvision pads a smaller image with 0 before cropping
            canvas = Image.new(image.mode, (max(w, s), max(h, s)), 0)
            canvas.paste(image, ((max(w, s) - w) // 2, (max(h, s) - h) // 2))
            image, (w, h) = canvas, canvas.size
        top, left = int(round((h - s) / 2.0)), int(round((w - s) / 2.0))
        image = image.crop((left, top, left + s, top + s))
    if image.mode != "RGB":
        image = image.convert("RGB")
    x = np.asarray(image, dtype=np.uint8).astype(np.float32) / 255.0
    mean = np.asarray(pre.get("mean", OPENAI_MEAN), dtype=np.float32)
    std = np.asarray(pre.get("std", OPENAI_STD), dtype=np.float32)
    return ((x - mean) / std).transpose(2, 0, 1)


class OpenCLIPModel:
    """A loaded ``open_clip:DIR`` checkpoint as transformers' CLIPModel (float32, eval mode, CPU)."""

    def __init__(self, folder: Path, spec: str) -> None:
        try:
            import torch
            from transformers import CLIPModel
        except ImportError:
            raise ModuleNotFoundError("open_clip: encoders need transformers (pip install 'xmodal[clip]')") from None
        self.folder, self.spec = folder, spec
        self.cfg = read_config(folder, spec)
        state = read_weights(folder, self.cfg, spec)
        config = hf_config(self.cfg)
        with torch.device("meta"):
            model = CLIPModel(config)
        mapped = to_hf(state)
        model.load_state_dict({k: v.float() for k, v in mapped.items()}, strict=False, assign=True)
        leftover = [n for n, p in model.named_parameters() if p.is_meta]
        if leftover:  # the mapping is incomplete for this config: never run half-loaded
            raise ValueError(f"model: {spec}: weight for {leftover[0]} not mapped from {weights_file(folder).name}")
        for name, buf in list(model.named_buffers()):
            if buf.is_meta:  # position_ids
                mod, _, attr = name.rpartition(".")
                model.get_submodule(mod).register_buffer(attr, torch.arange(buf.shape[-1]).expand(buf.shape),
                                                         persistent=False)
        self.model = model.eval()
        self.context_length = int(self.cfg["model_cfg"]["text_cfg"].get("context_length", 77))
        self.tokenizer = None
        if any((folder / n).is_file() for n in ("tokenizer.json", "vocab.json")):
            self.tokenizer = _tokenizer(folder, spec)
            vocab = int(self.cfg["model_cfg"]["text_cfg"].get("vocab_size", 49408))
            if len(self.tokenizer) > vocab:
                raise ValueError(f"model: {spec}: the tokenizer of the folder has {len(self.tokenizer):,} tokens (its "
                                 f"special tokens included), the text tower {vocab:,}: a tokenizer of another model")

    def tokens(self, captions: list[str]):
        """open_clip's ``tokenize``: ``[B, context_length]`` int64, ``<sot> ... <eot>`` then zeros."""
        import torch

        if self.tokenizer is None:
            raise ValueError(f"model: {self.spec}: no tokenizer in the folder (vocab.json + merges.txt or "
                             f"tokenizer.json): it cannot encode text")
        ids = self.tokenizer([c for c in captions], add_special_tokens=True, truncation=True,
                             max_length=self.context_length)["input_ids"]
        out = torch.zeros(len(ids), self.context_length, dtype=torch.long)
        for i, row in enumerate(ids):
            out[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        return out

    def text(self, captions: list[str]):
        import torch

        ids = self.tokens(captions).to(self.device)
        with torch.inference_mode():
            return _pooled(self.model.get_text_features(input_ids=ids))

    def pixels(self, image):
        import torch

        return torch.from_numpy(preprocess(image, self.cfg))[None]

    def images(self, pixel_values):
        import torch

        with torch.inference_mode():
            return _pooled(self.model.get_image_features(
                pixel_values=pixel_values.to(device=self.device, dtype=self.dtype)))

    @property
    def device(self):
        return next(self.model.parameters()).device

    @property
    def dtype(self):
        return next(self.model.parameters()).dtype


def _pooled(out):
    return (out if hasattr(out, "shape") else out.pooler_output).float()


def _tokenizer(folder: Path, spec: str):
    from transformers import CLIPTokenizer

    files = ", ".join(n for n in TOKENIZER_FILES if (folder / n).is_file())
    try:
        tok = CLIPTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except Exception as exc:
        raise ValueError(f"model: {spec}: cannot load a CLIP tokenizer from {files} "
                         f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
    return tok


_MODELS: dict[tuple, OpenCLIPModel] = {}
_LOCK = threading.Lock()


def load(spec: str) -> OpenCLIPModel:
    """The :class:`OpenCLIPModel` of ``open_clip:DIR`` (loaded once while its weights file stays the same)."""
    folder = folder_of(spec)
    w = weights_file(folder)
    key = (str(folder), w.name, w.stat().st_size, w.stat().st_mtime_ns)
    with _LOCK:
        if key not in _MODELS:
            for old in [k for k in _MODELS if k[0] == key[0]]:
                del _MODELS[old]
            _MODELS[key] = OpenCLIPModel(folder, spec)
        return _MODELS[key]


def identity(spec: str, kind: str) -> dict:
    """The identity record of ``open_clip:DIR`` encoding ``kind`` (config read, files hashed; no weights
    loaded), :mod:`xmodal.features.identity`."""
    from xmodal.features.hashing import files_sha256

    if kind not in ("text", "image"):
        raise ValueError(f"model: {spec} is an open_clip CLIP: it encodes text and images, not {kind}")
    folder = folder_of(spec)
    cfg = read_config(folder, spec)
    pre_files = [folder / CONFIG] + [folder / n for n in TOKENIZER_FILES if (folder / n).is_file()]
    pre = cfg["preprocess_cfg"]
    if kind == "text":
        info = {"input": "captions through the folder's CLIP BPE tokenizer, <sot> ... <eot>, zero-padded",
                "context_length": int(cfg["model_cfg"]["text_cfg"].get("context_length", 77))}
    else:
        info = {"input": "open_clip's eval transform, reproduced", "size": int(cfg["model_cfg"]["vision_cfg"].get(
                "image_size", 224)), "resize_mode": pre.get("resize_mode", "shortest"),
                "interpolation": pre.get("interpolation", "bicubic"), "mean": list(pre.get("mean", OPENAI_MEAN)),
                "std": list(pre.get("std", OPENAI_STD))}
    return {"spec": f"open_clip:{folder}", "kind": kind, "level": "sentence" if kind == "text" else "image",
            "family": "open_clip", "hub_name": None, "weights_sha256": files_sha256([weights_file(folder)]),
            "preprocessing_sha256": files_sha256(pre_files), "preprocessing": {**info, "dtype": "float32"},
            "dim": int(cfg["model_cfg"]["embed_dim"]), "normalized": False}
