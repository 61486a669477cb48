"""A trained model as a folder in the Hugging Face layout: ``model.safetensors`` + ``config.json``.

The folder is what ``xmodal export`` writes and what :func:`xmodal.load_model` reads beside a run
directory; nothing in it is a pickle:

- ``model.safetensors``: every tensor of the model's ``state_dict`` under its own name
  (``video_tower.net.weight`` ...), plus the matrices of the fitted test-time normalisers under
  ``test_time.*`` (the query banks ``test_time.banks.{bank}.{text,video}`` of Sinkhorn / NCL /
  QB-Norm / IS, DN's samples). Tensors keep their dtype and bytes, so the reloaded model's
  scores are bit-identical to the run's.
- ``config.json``: the architecture (:meth:`TwoTower.architecture`), the feature sizes, the
  encoders that made the input features, the run's config, and the test-time record as plain
  numbers and arrays (DN's fitted means as lists; a larger matrix names its safetensors entry).

:func:`export_state` splits a model into ``(tensors, config)``; :func:`export_payload` reads it back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

FORMAT = "xmodal-export"
VERSION = 1
WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
#: The files that carry an exported model (an index folder copies these for its text head).
MODEL_FILES = (WEIGHTS_NAME, CONFIG_NAME)
#: config.json larger than this is refused unread (it holds numbers, never weights).
MAX_CONFIG_BYTES = 64 << 20
#: 1-D test-time tensors up to this many values are written into config.json as plain lists.
MAX_INLINE_VALUES = 4096
_TT = "test_time."

_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
    torch.int64, torch.uint8, torch.bool)}


def is_export_dir(path: str | os.PathLike) -> bool:
    """True when ``path`` is a folder holding ``model.safetensors`` and ``config.json``."""
    p = Path(path)
    return p.is_dir() and (p / WEIGHTS_NAME).is_file() and (p / CONFIG_NAME).is_file()


def _dtype_name(t: torch.Tensor) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"model: a tensor of dtype {t.dtype} cannot be exported")
    return name


def _plain_tensor(t: torch.Tensor, name: str, tensors: dict[str, torch.Tensor]) -> dict:
    """A tensor as JSON: its values inline when small and at most 1-D, else a safetensors entry."""
    t = t.detach().cpu()
    record = {"dtype": _dtype_name(t), "shape": list(t.shape)}
    if t.ndim <= 1 and t.numel() <= MAX_INLINE_VALUES:
        # float(x) of a float16/32/64 value is exact, and json writes the shortest repr that reads
        # back to the same double: the list round-trips bit for bit.
        record["values"] = t.reshape(-1).tolist()
    else:
        tensors[name] = t.contiguous()
        record["tensor"] = name
    return record


def _tensor_from_plain(record: Any, tensors: dict[str, torch.Tensor], where: str) -> torch.Tensor:
    if not isinstance(record, dict) or record.get("dtype") not in _DTYPES or not isinstance(record.get("shape"), list):
        raise ValueError(f"{where}: expected {{dtype, shape, values | tensor}}")
    dtype, shape = _DTYPES[record["dtype"]], tuple(record["shape"])
    if "tensor" in record:
        t = tensors.get(record["tensor"])
        if t is None:
            raise ValueError(f"{where}: names {record['tensor']!r}, which {WEIGHTS_NAME} lacks")
    else:
        values = record.get("values")
        if not isinstance(values, list):
            raise ValueError(f"{where}: expected a list of values")
        t = torch.tensor(values, dtype=dtype)
    if t.dtype != dtype or tuple(t.shape) != shape:
        raise ValueError(f"{where}: holds {tuple(t.shape)} {t.dtype}, the record says {shape} {dtype}")
    return t


def _test_time_record(state: dict, tensors: dict[str, torch.Tensor]) -> dict:
    """``TestTime.state_dict()`` as JSON (tensors moved to ``tensors`` or inlined)."""
    rec = {k: state[k] for k in ("version", "temperature", "hparams", "names", "selected", "val")}
    rec["banks"] = {}
    for bank, (text, video) in state["banks"].items():
        rec["banks"][bank] = {"text": _plain_tensor(text, f"{_TT}banks.{bank}.text", tensors),
                              "video": _plain_tensor(video, f"{_TT}banks.{bank}.video", tensors)}
    dn = state.get("dn")
    if dn is not None:
        dn = {"name": dn["name"], "hparams": dn["hparams"],
              "tensors": {k: _plain_tensor(v, f"{_TT}dn.{k}", tensors) for k, v in dn["tensors"].items()}}
    rec["dn"] = dn
    return rec


def _test_time_state(rec: Any, tensors: dict[str, torch.Tensor]) -> dict | None:
    """The inverse of :func:`_test_time_record`: a ``TestTime.from_state_dict`` input."""
    if rec is None:
        return None
    if not isinstance(rec, dict):
        raise ValueError("config.json: test_time must be a mapping")
    banks = rec.get("banks") or {}
    if not isinstance(banks, dict):
        raise ValueError("config.json: test_time.banks must be a mapping")
    state = {k: rec[k] for k in ("version", "temperature", "hparams", "names", "selected", "val") if k in rec}
    state["banks"] = {}
    for bank, pair in banks.items():
        if not isinstance(pair, dict):
            raise ValueError(f"config.json: test_time.banks.{bank} must be a mapping")
        state["banks"][bank] = [_tensor_from_plain(pair.get(side), tensors, f"config.json: test_time.banks.{bank}.{side}")
                                for side in ("text", "video")]
    dn = rec.get("dn")
    if dn is not None:
        if not isinstance(dn, dict) or not isinstance(dn.get("tensors"), dict):
            raise ValueError("config.json: test_time.dn must be a mapping with tensors")
        dn = {"name": dn.get("name"), "hparams": dn.get("hparams"),
              "tensors": {k: _tensor_from_plain(v, tensors, f"config.json: test_time.dn.tensors.{k}")
                          for k, v in dn["tensors"].items()}}
    state["dn"] = dn
    return state


def _version() -> str:
    """The installed xmodal's version (read from the package metadata: ``import xmodal`` here would close an
    import circle through ``xmodal.load_model``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("xmodal")
    except PackageNotFoundError:
        return "unknown"


def feature_sizes(arch: dict) -> dict:
    """What the towers take: ``{"video": Dv, "text": Dt, "experts": {name: De}, "joint": D,
    "max_frames": F or None, "max_tokens": L or None, "text_tokens": bool}``."""
    video, text = arch["video"], arch["text"]
    return {"video": int(video["in_dim"]), "text": int(text["in_dim"]), "joint": int(video["out_dim"]),
            "experts": {k: int(v["in_dim"]) for k, v in (arch.get("experts") or {}).items()},
            "max_frames": int(video["max_frames"]) if video["kind"] == "transformer" else None,
            "max_tokens": int(text["max_frames"]) if text["kind"] == "transformer" else None,
            "text_tokens": bool(text.get("tokens", False))}


def export_state(model: Any, *, encoders: dict | None = None, run_config: dict | None = None,
                 extra: dict | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """Split a model into the tensors of ``model.safetensors`` and the plain ``config.json``.

    Args:
        model: a :class:`~xmodal.models.TwoTower` (or hierarchical) model.
        encoders: ``{"video": ..., "text": ...}`` what made the input features (recorded as given).
        run_config: the run's config (plain dict), kept for the record (e.g. ``train.metric``).
        extra: further plain keys of ``config.json``.

    Returns:
        ``(tensors, config)``: contiguous CPU tensors by name, and a JSON-serialisable dict.
    """
    from xmodal._validate import short_repr
    from xmodal.models.two_tower import TwoTower

    if not isinstance(model, TwoTower):
        raise TypeError(f"model: expected a TwoTower, got {short_repr(model)}")
    payload = {"architecture": model.architecture(), "state_dict": model.state_dict(),
               "test_time": model.test_time.state_dict()}  # what xmodal.models.io.model_payload stores
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in payload["state_dict"].items()}
    if any(k.startswith(_TT) for k in tensors):
        raise ValueError(f"model: a parameter name starts with {_TT!r}, which the export reserves")
    arch = payload["architecture"]
    config = {"format": FORMAT, "version": VERSION, "library_name": "xmodal", "xmodal_version": _version(),
              "model_type": "xmodal-hierarchical-two-tower" if "hierarchy" in arch else "xmodal-two-tower",
              "architecture": arch, "feature_sizes": feature_sizes(arch), "encoders": dict(encoders or {}),
              "temperature": float(model.temperature),
              "test_time": _test_time_record(payload["test_time"], tensors),
              "run_config": run_config, **(extra or {})}
    return tensors, config


def read_config(path: str | os.PathLike) -> dict:
    """``config.json`` of an export folder, checked to be one (size, JSON, ``format``)."""
    p = Path(path) / CONFIG_NAME if Path(path).is_dir() else Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"path: {p} does not exist")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"path: {p} is {p.stat().st_size} bytes, more than an xmodal export's config.json "
                         f"({MAX_CONFIG_BYTES} at most)")
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"path: {p} is not valid JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(cfg, dict) or cfg.get("format") != FORMAT:
        raise ValueError(f"path: {p} was not written by 'xmodal export' (no \"format\": \"{FORMAT}\")")
    if not isinstance(cfg.get("version"), int) or cfg["version"] > VERSION:
        raise ValueError(f"path: {p} is export version {cfg.get('version')!r}; this xmodal reads {VERSION}")
    return cfg


def read_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of a ``model.safetensors`` (CPU), or a one-line ValueError naming the file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    p = Path(path)
    try:
        # clone: load_file's tensors are views at the file's byte offsets; a view that is not 64-byte aligned
        # takes other SIMD paths in a matmul and changes the last bit of a score (a fresh tensor is aligned)
        return {k: v.clone() for k, v in load_file(str(p), device="cpu").items()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise ValueError(f"path: {p} is not a readable safetensors file ({str(exc).splitlines()[0]})") from None


def export_payload(path: str | os.PathLike) -> dict:
    """An export folder (``model.safetensors`` + ``config.json``) as the payload
    :func:`xmodal.models.io.model_from_payload` rebuilds the model from (what ``model.pt`` stores
    under ``"model"``); :func:`xmodal.load_model` does both.

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: a file is not what ``xmodal export`` writes.
    """
    folder = Path(path)
    cfg = read_config(folder)
    tensors = read_tensors(folder / WEIGHTS_NAME)
    state = {k: v for k, v in tensors.items() if not k.startswith(_TT)}
    return {"architecture": cfg.get("architecture"), "state_dict": state,
            "test_time": _test_time_state(cfg.get("test_time"), tensors)}


__all__ = ["FORMAT", "VERSION", "WEIGHTS_NAME", "CONFIG_NAME", "MODEL_FILES", "is_export_dir", "export_state",
           "read_config", "read_tensors", "export_payload"]
