"""``hf:DIR`` encoders: a Hugging Face ``transformers`` model saved locally with ``save_pretrained``
(CLIPModel, SiglipModel, XCLIPModel) and its processor from the same folder, offline.

Features are exactly what the library computes (Radford et al. 2021, CLIP; Zhai et al. 2023, SigLIP;
Ni et al. 2022, X-CLIP), from the folder's own processor:

- text: ``processor(text=captions, padding=P, truncation=True, max_length=L)`` then
  ``model.get_text_features(...)`` (``P``: ``"max_length"`` for SigLIP, which was trained so, else the
  batch's longest; ``L``: the smaller of the tokenizer's ``model_max_length`` and the text tower's
  position table);
- images (and video frames, one at a time): ``processor(images=[image])`` then
  ``model.get_image_features(...)``;
- video clips (XCLIP): ``processor(videos=[frames])`` then ``model.get_video_features(...)``, the clip's
  frames through the video branch (prompt-free, as the library's function).

Outputs are ``pooler_output`` of the library's return value, float32, not normalised. Weights load in
float32 with ``local_files_only=True`` and ``HF_HUB_OFFLINE=1``: nothing is ever downloaded, and a
missing folder or file is one line naming it.

The folder is data, never code (issue 44): ``trust_remote_code=False`` on every load with standard input
replaced by an empty one, a folder naming code (``auto_map``) refused; every file bounded and every
config field checked before it is parsed or built (:mod:`xmodal.features.hf_folder`); the weights
safetensors only, complete, of one floating dtype, finite and matching the config before the model is
built (:mod:`xmodal.features.hf_weights`), and the library's own loading report read back; a folder
without a tokenizer encodes no text. Whatever the library still raises is one line naming the files.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

from xmodal.features import hf_folder, hf_weights


#: model_type in config.json -> (transformers class, the kinds it encodes).
SUPPORTED = {"clip": ("CLIPModel", ("text", "image")), "siglip": ("SiglipModel", ("text", "image")),
             "xclip": ("XCLIPModel", ("text", "video"))}
#: Files of the weights (hashed into ``weights_sha256``) and of the processor (``preprocessing_sha256``).
WEIGHT_SUFFIXES = (".safetensors", ".bin")
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
                   "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "vocab.txt",
                   "special_tokens_map.json", "added_tokens.json", "spiece.model")
MAX_CONFIG_BYTES = 4 * 1024 * 1024
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def folder_of(spec: str) -> Path:
    """The folder of an ``hf:DIR`` spec, checked to be a saved model (config.json and weights)."""
    raw = spec[len("hf:"):]
    if not raw:
        raise ValueError("model: hf: needs a folder (hf:DIR, a model saved with save_pretrained)")
    folder = Path(raw).expanduser()
    if not folder.exists():
        raise ValueError(f"model: {spec}: no such folder (hf:DIR takes a model saved locally with "
                         f"save_pretrained; nothing is downloaded)")
    if not folder.is_dir():
        raise ValueError(f"model: {spec}: not a folder (hf:DIR takes a folder saved with save_pretrained)")
    if not (folder / "config.json").is_file():
        raise ValueError(f"model: {spec}: {folder / 'config.json'} not found (save the model with "
                         f"model.save_pretrained(DIR))")
    if not weight_files(folder):
        raise ValueError(f"model: {spec}: no weights (*.safetensors or *.bin) in {folder}")
    if not safetensors_files(folder):  # pickle can run code when read: .bin weights alone are refused
        hf_weights.refuse_pickle(folder, spec)
    return folder.resolve()


def weight_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES
                  and not p.name.startswith(".") and p.name != "training_args.bin")


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files that load (a ``.bin`` beside them, as a hub snapshot holds, is never read)."""
    return [p for p in weight_files(folder) if p.suffix == ".safetensors"]


def read_config(folder: Path, spec: str) -> dict:
    """config.json of the folder, with a supported ``model_type``, after the whole folder is vetted as
    data (:mod:`xmodal.features.hf_folder`): every parsed file bounded, no ``auto_map`` anywhere, config
    fields typed as the library's defaults, processor targets bounded."""
    hf_folder.check_files(folder, spec)
    path = folder / "config.json"
    cfg = hf_folder.read_json(path, spec)
    hf_folder.refuse_code(cfg, path, spec)
    others = {name: hf_folder.read_json(folder / name, spec) for name in (*hf_folder.PROCESSOR_CONFIGS,
              "tokenizer_config.json") if (folder / name).is_file()}
    for name, data in others.items():
        hf_folder.refuse_code(data, folder / name, spec)
    kind = cfg.get("model_type") if isinstance(cfg, dict) else None
    if kind not in SUPPORTED:
        raise ValueError(f"model: {spec}: model_type {str(kind)[:40]!r} is not supported; hf: takes "
                         f"{', '.join(v[0] for v in SUPPORTED.values())}")
    for key in ("quantization_config", "attn_implementation", "_attn_implementation"):
        if cfg.get(key) not in (None, "eager", "sdpa"):
            raise ValueError(f"model: {spec}: {path}: {key} {str(cfg[key])[:40]!r} is refused (hf: folders load "
                             f"plain float weights with the library's own attention)")
    classes = _config_classes(kind)
    if classes is not None:
        hf_folder.check_config(cfg, classes, path, spec)
    for name in hf_folder.PROCESSOR_CONFIGS:
        if isinstance(others.get(name), dict):
            hf_folder.check_processor(others[name], folder / name, spec)
    return cfg


def _config_classes(model_type: str) -> dict | None:
    """``{"": ModelConfig, "text_config": ..., "vision_config": ...}`` of a model type (None without
    transformers: then nothing is loaded either)."""
    try:
        import transformers
    except ImportError:
        return None
    cls = getattr(transformers, SUPPORTED[model_type][0]).config_class
    return {"": cls, **dict(getattr(cls, "sub_configs", {}) or {})}


def require_tokenizer(folder: Path, spec: str) -> None:
    """A folder without tokenizer files encodes no text (else every caption would be one vector)."""
    if not hf_folder.has_tokenizer(folder):
        raise ValueError(f"model: {spec}: no tokenizer in the folder ({', '.join(hf_folder.TOKENIZER_FILES[:3])}, "
                         f"...): it cannot encode text; save the tokenizer beside the model with "
                         f"processor.save_pretrained(DIR)")


def kinds_of(model_type: str) -> tuple[str, ...]:
    return SUPPORTED[model_type][1]


def hub_name(cfg: dict) -> str | None:
    """The hub id the folder's config names (``_name_or_path``, written by older ``transformers``
    when the model was loaded from the hub), else None."""
    name = cfg.get("_name_or_path")
    return name if isinstance(name, str) and _HUB_ID.match(name) and not os.path.exists(name) else None


@contextlib.contextmanager
def hf_progress(progress: bool):
    """transformers / huggingface_hub progress bars on only when ``progress`` and stderr is a
    terminal (so no bar's carriage returns land in a log file); restored afterwards."""
    show = bool(progress) and sys.stderr.isatty()
    undo = []
    try:
        from transformers.utils import logging as hf_logging

        if not show and hf_logging.is_progress_bar_enabled():
            hf_logging.disable_progress_bar()
            undo.append(hf_logging.enable_progress_bar)
    except ImportError:
        pass
    try:
        from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

        if not show and not are_progress_bars_disabled():
            disable_progress_bars()
            undo.append(enable_progress_bars)
    except ImportError:
        pass
    try:
        yield
    finally:
        for fn in undo:
            fn()


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@contextlib.contextmanager
def _no_stdin():
    """Standard input is never read while a folder loads (the library's trust prompt reads it)."""
    before = sys.stdin
    sys.stdin = io.StringIO("")
    try:
        yield
    finally:
        sys.stdin = before


class HFModel:
    """A loaded ``hf:DIR`` model and processor (float32, eval mode, CPU)."""

    def __init__(self, folder: Path, spec: str) -> None:
        _offline()
        try:
            import transformers
        except ImportError:
            raise ModuleNotFoundError("hf: encoders need transformers (pip install 'xmodal[clip]')") from None
        cfg = read_config(folder, spec)
        self.folder, self.spec, self.model_type = folder, spec, cfg["model_type"]
        cls = getattr(transformers, SUPPORTED[self.model_type][0])
        with _no_stdin(), hf_progress(False):
            self.model = _load_model(cls, folder, spec, cfg)
            self.processor = _load_processor(transformers, folder, spec)
        self.config = self.model.config
        text = self.config.text_config
        tok = self.processor if isinstance(self.processor, transformers.PreTrainedTokenizerBase) else getattr(
            self.processor, "tokenizer", None)
        self.tokenizer = tok
        if tok is not None and len(tok) > text.vocab_size:
            raise ValueError(f"model: {spec}: the tokenizer in {_names(folder, hf_folder.TOKENIZER_FILES)} has "
                             f"{len(tok):,} tokens, the text tower's vocab_size {text.vocab_size:,}: a tokenizer of "
                             f"another model")
        limit = getattr(tok, "model_max_length", None)
        self.max_length = int(min(text.max_position_embeddings, limit if isinstance(limit, int) else 1 << 30))
        self.padding = "max_length" if self.model_type == "siglip" else True
        self.num_frames = int(self.config.vision_config.num_frames) if self.model_type == "xclip" else None

    def dim(self, kind: str) -> int:
        return feature_dim(self.config.to_dict(), self.model_type, kind)

    def text(self, captions: list[str]):
        """``get_text_features`` of one batch of captions (float32 tensor)."""
        import torch

        if self.tokenizer is None:
            raise ValueError(f"model: {self.spec}: no tokenizer loads from the folder: it cannot encode text")
        inputs = self.processor(text=captions, padding=self.padding, truncation=True, max_length=self.max_length,
                                return_tensors="pt")
        inputs = {k: v.to(self.model.device) for k, v in inputs.items()}
        with torch.inference_mode():
            return _pooled(self.model.get_text_features(**inputs))

    def pixels(self, image) -> Any:
        """The processor's ``pixel_values`` of one image ``[1, 3, H, W]`` (the image as opened: a processor
        with ``do_convert_rgb`` converts it as the library does; for one without, it is made RGB first)."""
        if not getattr(getattr(self.processor, "image_processor", self.processor), "do_convert_rgb", False) and \
                image.mode != "RGB":
            image = image.convert("RGB")
        return self.processor(images=[image], return_tensors="pt")["pixel_values"]

    def images(self, pixel_values):
        import torch

        with torch.inference_mode():
            return _pooled(self.model.get_image_features(
                pixel_values=pixel_values.to(device=self.model.device, dtype=self.model.dtype)))

    def clips(self, clips: list[list]) -> Any:
        """``get_video_features`` of a batch of clips, each a list of ``num_frames`` PIL frames."""
        import torch

        pixel_values = torch.cat([self.processor(videos=[list(c)], return_tensors="pt")["pixel_values"]
                                  for c in clips])
        with torch.inference_mode():
            return _pooled(self.model.get_video_features(
                pixel_values=pixel_values.to(device=self.model.device, dtype=self.model.dtype)))

    def preprocessing(self, kind: str) -> dict:
        """What the inputs of ``kind`` go through (the folder's processor, summarised)."""
        if kind == "text":
            tok = self.tokenizer
            return {"tokenizer": type(tok).__name__, "padding": "max_length" if self.padding == "max_length"
                    else "longest", "truncation": True, "max_length": self.max_length, "dtype": "float32"}
        proc = getattr(self.processor, "video_processor" if kind == "video" else "image_processor", None)
        keep = ("size", "crop_size", "do_resize", "do_center_crop", "resample", "do_rescale", "rescale_factor",
                "do_normalize", "image_mean", "image_std", "do_convert_rgb")
        info = {k: v for k, v in (proc.to_dict() if proc is not None else {}).items() if k in keep}
        info = json.loads(json.dumps(info, default=str))
        if kind == "video":
            info["num_frames"] = self.num_frames
        return {"processor": type(proc).__name__, **info, "dtype": "float32"}


def feature_dim(cfg: dict, model_type: str, kind: str) -> int:
    """The size of the features of ``kind`` from a config (no weights loaded)."""
    if model_type in ("clip", "xclip"):
        return int(cfg.get("projection_dim", 512))
    text, vision = cfg.get("text_config") or {}, cfg.get("vision_config") or {}
    if kind == "text":
        return int(text.get("projection_size") or text.get("hidden_size", 768))
    return int(vision.get("hidden_size", 768))


def _load_model(cls, folder: Path, spec: str, cfg: dict):
    """The model of the folder, float32 in eval mode, after its weights are checked against a copy built
    on the meta device (no memory) from the vetted config; the library's loading report read back."""
    import torch

    tensors = hf_weights.read_headers(safetensors_files(folder), spec)
    path = folder / "config.json"
    hf_weights.check_layers(cfg, tensors, path, spec)
    try:
        config = cls.config_class.from_pretrained(str(folder), local_files_only=True)
        with torch.device("meta"):
            skeleton = cls(config)
    except Exception as exc:  # noqa: BLE001 -- whatever the library says of a config is one line
        raise ValueError(f"model: {spec}: {path}: the library refuses this config ({_first(exc)})") from None
    hf_weights.check_against(skeleton, tensors, spec)
    del skeleton
    hf_weights.check_finite(tensors, spec)
    files = _names(folder, [p.name for p in safetensors_files(folder)] + ["config.json"])
    try:
        model, info = cls.from_pretrained(str(folder), config=config, local_files_only=True, dtype="float32",
                                          trust_remote_code=False, use_safetensors=True, output_loading_info=True)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"model: {spec}: cannot load the model from {files} ({_first(exc)})") from None
    buffers = {k for k, _ in model.named_buffers()}
    report = {"missing": info.get("missing_keys"), "mismatched": info.get("mismatched_keys"),
              "unexpected": [k for k in info.get("unexpected_keys") or () if k not in buffers],
              "error": info.get("error_msgs")}
    for what, keys in report.items():
        if keys:
            keys = sorted(map(str, keys))
            raise ValueError(f"model: {spec}: loading {files}: {what} weights {keys[0][:120]}"
                             f"{f' (and {len(keys) - 1} more)' if len(keys) > 1 else ''}")
    return model.eval()


def _load_processor(transformers, folder: Path, spec: str):
    files = _names(folder, hf_folder.PROCESSOR_CONFIGS + hf_folder.TOKENIZER_FILES + (
        "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "merges.txt"))
    try:
        return transformers.AutoProcessor.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 -- whatever the library says of these files is one line
        raise ValueError(f"model: {spec}: cannot load its processor from {files} ({_first(exc)}); save it beside "
                         f"the model with processor.save_pretrained(DIR)") from None


def _names(folder: Path, names) -> str:
    return ", ".join(n for n in names if (folder / n).is_file()) or f"{folder} (no such files)"


def _pooled(out):
    value = out if hasattr(out, "shape") else out.pooler_output
    return value.float()


def _first(exc: BaseException) -> str:
    text = " ".join(str(exc).split())  # the whole message on one line (the library's run over several)
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


_MODELS: dict[tuple, HFModel] = {}
_LOCK = threading.Lock()  # serve's upload thread and its text queries may both ask for one folder


def load(spec: str) -> HFModel:
    """The :class:`HFModel` of ``hf:DIR`` (loaded once while its weight files stay the same)."""
    folder = folder_of(spec)
    key = (str(folder), tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in weight_files(folder)))
    with _LOCK:
        if key not in _MODELS:
            for old in [k for k in _MODELS if k[0] == key[0]]:
                del _MODELS[old]
            _MODELS[key] = HFModel(folder, spec)
        return _MODELS[key]


def identity(spec: str, kind: str) -> dict:
    """The identity record of ``hf:DIR`` encoding ``kind`` (config read and files hashed; the weights
    are not loaded), :mod:`xmodal.features.identity`."""
    from xmodal.features.hashing import files_sha256

    folder = folder_of(spec)
    cfg = read_config(folder, spec)
    model_type = cfg["model_type"]
    if kind not in kinds_of(model_type):
        raise ValueError(unsupported_kind(spec, model_type, kind))
    level = {"text": "sentence", "image": "image", "video": "clip"}[kind]
    processor = [folder / n for n in PROCESSOR_FILES if (folder / n).is_file()]
    pre = {"text": {"input": "captions through the folder's tokenizer", "truncation": True,
                    "padding": "max_length" if model_type == "siglip" else "longest"},
           "image": {"input": "each image as decoded (video frames: RGB) through the folder's image processor"},
           "video": {"input": "num_frames frames sampled uniformly over the video, through the folder's video "
                              "processor, one clip"}}[kind]
    if model_type == "xclip" and kind == "video":
        pre["num_frames"] = int((cfg.get("vision_config") or {}).get("num_frames", 8))
    return {"spec": f"hf:{folder}", "kind": kind, "level": level, "family": model_type, "hub_name": hub_name(cfg),
            "weights_sha256": files_sha256(weight_files(folder)), "preprocessing_sha256": files_sha256(processor),
            "preprocessing": {**pre, "dtype": "float32"}, "dim": feature_dim(cfg, model_type, kind),
            "normalized": False}


def unsupported_kind(spec: str, model_type: str, kind: str) -> str:
    cls, kinds = SUPPORTED[model_type]
    if kind == "image" and "video" in kinds:
        return (f"model: {spec} is an {cls}: it encodes whole video clips ('xmodal encode videos'), not single "
                f"images")
    return f"model: {spec} is a {cls}: it encodes {' and '.join(kinds)}, not {kind}"
