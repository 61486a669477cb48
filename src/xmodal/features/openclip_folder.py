"""An ``open_clip:DIR`` folder read as data, never as code (issue 42, with issue 44's rules): the config
bounded before parsing and checked field by field against the plain ViT CLIP that
:mod:`xmodal.features.openclip` maps (anything else refused in one line naming the field), no
``auto_map``, and the weights checked before use: every tensor the config asks for with its shape, nothing
else, one floating dtype, all finite; a ``.bin`` read only with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from xmodal.features import hf_folder, hf_weights

CONFIG = "open_clip_config.json"
WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
#: model_cfg fields of the plain ViT CLIP and the values this mapping takes (None: a bounded int).
_TOP = {"embed_dim": None, "vision_cfg": dict, "text_cfg": dict, "quick_gelu": (False, True),
        "cast_dtype": (None, "fp16", "bf16"), "custom_text": (False, True)}
_VISION = {"layers": None, "width": None, "head_width": None, "mlp_ratio": "ratio", "patch_size": None,
           "image_size": None, "ls_init_value": (None,), "patch_dropout": "dropout", "attentional_pool": (False,),
           "no_ln_pre": (False,), "pos_embed_type": ("learnable",), "final_ln_after_pool": (False,),
           "pool_type": ("tok",), "output_tokens": (False,), "act_kwargs": (None,), "norm_kwargs": (None,),
           "block_type": (None, "default"), "qk_norm": (False,), "scaled_cosine_attn": (False,),
           "scale_heads": (False,), "scale_attn_inner": (False,), "scale_attn": (False,), "scale_fc": (False,),
           "timm_model_name": (None,), "attn_pooler_queries": None, "attn_pooler_heads": None}
_TEXT = {"context_length": None, "vocab_size": None, "width": None, "heads": None, "layers": None,
         "mlp_ratio": "ratio", "ls_init_value": (None,), "embed_cls": (False,), "pad_id": (0,),
         "no_causal_mask": (False,), "final_ln_after_pool": (False,), "pool_type": ("argmax",),
         "proj_bias": (False,), "proj_type": ("linear",), "output_tokens": (False,), "act_kwargs": (None,),
         "norm_kwargs": (None,), "block_type": (None, "default"), "qk_norm": (False,),
         "scaled_cosine_attn": (False,), "scale_heads": (False,), "scale_attn_inner": (False,),
         "scale_attn": (False,), "scale_fc": (False,), "hf_model_name": (None,), "hf_tokenizer_name": (None,),
         "tokenizer_mode": (None,), "tokenizer_kwargs": (None,), "eos_id": None}
_PREPROCESS = {"size": None, "mode": ("RGB",), "mean": "triple", "std": "triple",
               "interpolation": ("bicubic", "bilinear"), "resize_mode": ("shortest", "squash"), "fill_color": None}


def folder_of(spec: str) -> Path:
    """The folder of an ``open_clip:DIR`` spec, checked to hold a config and weights."""
    raw = spec[len("open_clip:"):]
    if not raw:
        raise ValueError("model: open_clip: needs a folder (open_clip:DIR with open_clip_config.json and "
                         "open_clip_model.safetensors)")
    folder = Path(raw).expanduser()
    if not folder.is_dir():
        raise ValueError(f"model: {spec}: {'not a folder' if folder.exists() else 'no such folder'} (open_clip:DIR "
                         f"takes a folder with {CONFIG} and {WEIGHTS[0]}; nothing is downloaded; an architecture "
                         f"name such as open_clip:ViT-B-32 alone names no weights)")
    if not (folder / CONFIG).is_file():
        raise ValueError(f"model: {spec}: {folder / CONFIG} not found (open_clip's push_to_hf_hub writes it)")
    if weights_file(folder) is None:
        raise ValueError(f"model: {spec}: no weights in {folder} ({' or '.join(WEIGHTS)})")
    return folder.resolve()


def weights_file(folder: Path) -> Path | None:
    return next((folder / n for n in WEIGHTS if (folder / n).is_file()), None)


def read_config(folder: Path, spec: str) -> dict:
    """``{"model_cfg": ..., "preprocess_cfg": ...}`` of the folder, bounded and checked to be a plain ViT
    CLIP this module maps (one line naming the first field that is not)."""
    hf_folder.check_files(folder, spec)
    path = folder / CONFIG
    data = hf_folder.read_json(path, spec)
    hf_folder.refuse_code(data, path, spec)
    if not isinstance(data, dict):
        raise ValueError(f"model: {spec}: {path} is not a JSON object")
    cfg = data.get("model_cfg", data)
    pre = data.get("preprocess_cfg") or {}
    if not isinstance(cfg, dict) or not isinstance(pre, dict):
        raise ValueError(f"model: {spec}: {path}: model_cfg and preprocess_cfg must be objects")
    _refuse_family(cfg, path, spec)
    _check(cfg, _TOP, "", path, spec)
    for key in ("vision_cfg", "text_cfg"):
        if key not in cfg:
            raise ValueError(f"model: {spec}: {path}: model_cfg has no {key}")
    _check(cfg["vision_cfg"], _VISION, "vision_cfg.", path, spec)
    _check(cfg["text_cfg"], _TEXT, "text_cfg.", path, spec)
    _check(pre, _PREPROCESS, "preprocess_cfg.", path, spec)
    vision, text = cfg["vision_cfg"], cfg["text_cfg"]
    if vision.get("width", 768) % vision.get("head_width", 64):
        raise ValueError(f"model: {spec}: {path}: vision_cfg.head_width does not divide vision_cfg.width")
    if text.get("width", 512) % text.get("heads", 8):
        raise ValueError(f"model: {spec}: {path}: text_cfg.heads does not divide text_cfg.width")
    size = pre.get("size", vision.get("image_size", 224))
    if size != vision.get("image_size", 224):
        raise ValueError(f"model: {spec}: {path}: preprocess_cfg.size {size} differs from vision_cfg.image_size")
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (folder / name).is_file():
            hf_folder.refuse_code(hf_folder.read_json(folder / name, spec), folder / name, spec)
    return {"model_cfg": cfg, "preprocess_cfg": pre}


#: What a refused family's user can do instead (the end of its one line).
INSTEAD = ("use a plain ViT open_clip checkpoint (ViT-B-32, ViT-L-14, ViT-H-14, ViT-bigG-14 ...), or encode both "
           "sides with open_clip itself where timm and torchvision import and bring the arrays in with 'xmodal data "
           "import PAIRS --features IMAGES.npy --ids LIST --text-features TEXTS.npy'")


def _refuse_family(cfg: dict, path: Path, spec: str) -> None:
    """The open_clip families that are not a plain ViT CLIP, each refused in one line saying why and what
    to do: CoCa (``multimodal_cfg``: attentional pooling and a text decoder over the image tokens, Yu et
    al. 2022), timm image towers (``vision_cfg.timm_model_name``: ConvNeXt, EVA ..., built by timm, which
    needs torchvision) and Hugging Face text towers (``text_cfg.hf_model_name``). None has a place in
    transformers' CLIPModel, which is what the plain ViT CLIP is mapped onto."""
    if not isinstance(cfg, dict):
        return
    vision, text = cfg.get("vision_cfg"), cfg.get("text_cfg")
    why = None
    if "multimodal_cfg" in cfg:
        why = ("model_cfg.multimodal_cfg: a CoCa checkpoint (attentional pooling of the image tokens and a text "
               "decoder over them, Yu et al. 2022), which transformers' CLIPModel has no place for")
    elif isinstance(vision, dict) and isinstance(vision.get("timm_model_name"), str) and vision["timm_model_name"]:
        name = vision["timm_model_name"]
        family = "a ConvNeXt" if name.startswith("convnext") else "an EVA" if name.startswith("eva") else "a timm"
        why = (f"vision_cfg.timm_model_name is {json.dumps(name[:60])}: {family} image tower, which open_clip builds "
               f"with timm (and timm needs torchvision) and transformers' CLIPModel does not have")
    elif isinstance(text, dict) and isinstance(text.get("hf_model_name"), str) and text["hf_model_name"]:
        why = (f"text_cfg.hf_model_name is {json.dumps(text['hf_model_name'][:60])}: a Hugging Face text tower, "
               f"which transformers' CLIPModel does not have")
    if why is not None:
        raise ValueError(f"model: {spec}: {path.name}: {why}; not mapped (only the plain ViT CLIP is); {INSTEAD}")


def _check(part: Any, allowed: dict, where: str, path: Path, spec: str) -> None:
    if not isinstance(part, dict):
        raise ValueError(f"model: {spec}: {path}: {where.rstrip('.')} must be an object")
    for key, value in part.items():
        name = f"{where}{key}"
        if key not in allowed:
            raise ValueError(f"model: {spec}: {path}: {name} is not part of the plain ViT CLIP that open_clip:DIR "
                             f"maps onto transformers' CLIPModel; refused")
        rule = allowed[key]
        if rule is None:
            if key == "fill_color" and isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 255:
                continue
            sides = value if key in ("image_size", "size") and isinstance(value, list) and len(value) == 2 \
                and value[0] == value[1] else [value]
            if not all(isinstance(v, int) and not isinstance(v, bool) and
                       1 <= v <= (hf_folder.MAX_IMAGE_SIDE if key in ("image_size", "size") else
                                  hf_folder.MAX_CONFIG_INT) for v in sides):
                raise ValueError(f"model: {spec}: {path}: {name} is {str(value)[:40]}, expected a positive int "
                                 f"(square images only)")
            if isinstance(value, list):
                part[key] = value[0]
        elif rule is dict:
            continue
        elif rule == "ratio":
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.25 <= value <= 16:
                raise ValueError(f"model: {spec}: {path}: {name} is {str(value)[:40]}, expected a number in [0.25, 16]")
        elif rule == "dropout":
            if value not in (0, 0.0):
                pass  # patch dropout acts in training only
        elif rule == "triple":
            if not (isinstance(value, list) and len(value) == 3 and all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in value)) or (
                    key == "std" and min(value) <= 0):
                raise ValueError(f"model: {spec}: {path}: {name} is {str(value)[:60]}, expected 3 finite numbers"
                                 f"{' above 0' if key == 'std' else ''}")
        elif value not in rule:
            expected = ", ".join("null" if r is None else json.dumps(r) for r in rule)
            raise ValueError(f"model: {spec}: {path}: {name} is {json.dumps(value)[:40]}, which is not part of the plain "
                             f"ViT CLIP that open_clip:DIR maps onto transformers' CLIPModel (expected {expected}); refused")


def expected_names(cfg: dict) -> dict[str, tuple[int, ...]]:
    """open_clip's state dict of the config: name -> shape (what the weights must hold exactly)."""
    m = cfg["model_cfg"]
    v, t = m["vision_cfg"], m["text_cfg"]
    e = int(m["embed_dim"])
    out: dict[str, tuple[int, ...]] = {"logit_scale": (), "text_projection": (t.get("width", 512), e),
                                       "token_embedding.weight": (t.get("vocab_size", 49408), t.get("width", 512)),
                                       "positional_embedding": (t.get("context_length", 77), t.get("width", 512)),
                                       "ln_final.weight": (t.get("width", 512),), "ln_final.bias": (t.get("width", 512),)}
    vw, p, s = v.get("width", 768), v.get("patch_size", 16), v.get("image_size", 224)
    out.update({"visual.class_embedding": (vw,), "visual.positional_embedding": ((s // p) ** 2 + 1, vw),
                "visual.proj": (vw, e), "visual.conv1.weight": (vw, 3, p, p)})
    for ln in ("ln_pre", "ln_post"):
        out[f"visual.{ln}.weight"] = out[f"visual.{ln}.bias"] = (vw,)
    for prefix, w, layers, ratio in (("visual.transformer", vw, v.get("layers", 12), v.get("mlp_ratio", 4.0)),
                                     ("transformer", t.get("width", 512), t.get("layers", 12), t.get("mlp_ratio", 4.0))):
        h = int(w * ratio)
        for i in range(layers):
            b = f"{prefix}.resblocks.{i}."
            out.update({b + "ln_1.weight": (w,), b + "ln_1.bias": (w,), b + "ln_2.weight": (w,), b + "ln_2.bias": (w,),
                        b + "attn.in_proj_weight": (3 * w, w), b + "attn.in_proj_bias": (3 * w,),
                        b + "attn.out_proj.weight": (w, w), b + "attn.out_proj.bias": (w,),
                        b + "mlp.c_fc.weight": (h, w), b + "mlp.c_fc.bias": (h,),
                        b + "mlp.c_proj.weight": (w, h), b + "mlp.c_proj.bias": (w,)})
    return out


def read_weights(folder: Path, cfg: dict, spec: str) -> dict:
    """open_clip's state dict from the folder, checked before use: every tensor the config asks for
    with its shape, nothing else (but the causal mask buffer), one floating dtype, all finite."""
    import torch

    path = weights_file(folder)
    want = expected_names(cfg)
    if path.suffix == ".safetensors":
        headers = hf_weights.read_headers([path], spec)
        shapes = {k: t.shape for k, t in headers.items()}
        dtypes = {k: t.dtype for k, t in headers.items()}
        _check_state(shapes, dtypes, want, path, spec, floating=set(hf_weights.EXPONENT))
        hf_weights.check_finite(headers, spec)
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # noqa: BLE001 -- a damaged or code-carrying pickle is one line
            raise ValueError(f"model: {spec}: {path} does not load as plain tensors (torch.load weights_only=True: "
                             f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]})") from None
        if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
            state = state["state_dict"]
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise ValueError(f"model: {spec}: {path} is not a state dict of tensors")
        state = {k.removeprefix("module."): v for k, v in state.items()}
        _check_state({k: tuple(v.shape) for k, v in state.items()}, {k: str(v.dtype) for k, v in state.items()},
                     want, path, spec, floating={"torch.float32", "torch.float16", "torch.bfloat16", "torch.float64"})
        for name, value in state.items():
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                raise ValueError(f"model: {spec}: {path}: {name} holds values that are not finite (NaN or infinity)")
    state.pop("attn_mask", None)
    return state


def _check_state(shapes: dict, dtypes: dict, want: dict, path: Path, spec: str, floating: set) -> None:
    names = set(shapes) - {"attn_mask"}
    missing, extra = sorted(set(want) - names), sorted(names - set(want))
    if missing:
        raise ValueError(f"model: {spec}: weight {missing[0]} is missing from {path.name}"
                         f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}")
    if extra:
        raise ValueError(f"model: {spec}: {path} holds {extra[0][:80]}, which the config's model does not have"
                         f"{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''}")
    for name, shape in want.items():
        if tuple(shapes[name]) != shape:
            raise ValueError(f"model: {spec}: {path}: {name} has shape {list(shapes[name])}, the config asks for "
                             f"{list(shape)}")
    kinds = {dtypes[n] for n in want}
    odd = sorted(k for k in kinds if k not in floating)
    if odd:
        raise ValueError(f"model: {spec}: {path}: weights of dtype {odd[0]}, not floating; refused")
    if len(kinds) > 1:
        raise ValueError(f"model: {spec}: {path}: weights of several dtypes ({', '.join(sorted(kinds))}); refused")
