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

import math
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
#: config.json larger than this is refused unread (it holds numbers, never weights; an export's is a few KB
#: plus the inline DN means), as is one nested deeper or holding more JSON values than these.
MAX_CONFIG_BYTES = 8 << 20
MAX_CONFIG_DEPTH = 32
MAX_CONFIG_VALUES = 1 << 20
#: model.safetensors' JSON header larger than this is refused before safetensors parses it.
MAX_HEADER_BYTES = 8 << 20
#: The keys of config.json (``text_encoder`` ...: the encoder identity the ``encode`` sidecars record).
CONFIG_KEYS = ("format", "version", "library_name", "xmodal_version", "model_type", "architecture", "feature_sizes",
               "encoders", "temperature", "test_time", "run_config", "onnx", "onnx_check", "card", "text_encoder",
               "video_encoder", "image_encoder", "encoder_folder")
_TEST_TIME_KEYS = ("version", "temperature", "hparams", "names", "selected", "val", "banks", "dn", "selection")
#: 1-D test-time tensors up to this many values are written into config.json as plain lists.
MAX_INLINE_VALUES = 4096
_TT = "test_time."

_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
    torch.int64, torch.uint8, torch.bool)}
#: safetensors' dtype names (its header) -> torch dtypes.
_SAFETENSORS_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
                       "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
                       "U8": torch.uint8, "BOOL": torch.bool}


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
    else:  # a copy of its own: two banks holding one tensor (a loaded export may) would be shared memory,
        tensors[name] = t.clone(memory_format=torch.contiguous_format)  # which safetensors refuses to save
        record["tensor"] = name
    return record


def _record(record: Any, where: str) -> tuple[torch.dtype, tuple[int, ...]]:
    """The dtype and shape of a tensor record of config.json, checked."""
    if not isinstance(record, dict) or not ({"dtype", "shape"} <= set(record) <= {"dtype", "shape", "values", "tensor"}) \
            or ("values" in record) == ("tensor" in record):
        raise ValueError(f"{where}: expected {{dtype, shape, values | tensor}}")
    if not isinstance(record["dtype"], str) or record["dtype"] not in _DTYPES:
        raise ValueError(f"{where}.dtype: expected one of {', '.join(_DTYPES)}, got {str(record['dtype'])[:40]!r}")
    shape = record["shape"]
    if not isinstance(shape, list) or len(shape) > 4 or not all(
            isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2 ** 40 for n in shape):
        raise ValueError(f"{where}.shape: expected a list of at most 4 sizes >= 0, got {str(shape)[:60]}")
    return _DTYPES[record["dtype"]], tuple(shape)


def tensor_names(rec: Any) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """``{safetensors entry: (dtype, shape)}`` of every tensor a config.json ``test_time`` record names."""
    out: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    if not isinstance(rec, dict):
        return out
    records = []
    banks = rec.get("banks")
    if isinstance(banks, dict):
        records += [(pair.get(side), f"config.json: test_time.banks.{bank}.{side}")
                    for bank, pair in banks.items() if isinstance(pair, dict) for side in ("text", "video")]
    dn = rec.get("dn")
    if isinstance(dn, dict) and isinstance(dn.get("tensors"), dict):
        records += [(v, f"config.json: test_time.dn.tensors.{k}") for k, v in dn["tensors"].items()]
    for record, where in records:
        if isinstance(record, dict) and "tensor" in record:
            dtype, shape = _record(record, where)
            name = record["tensor"]
            if not isinstance(name, str) or not name.startswith(_TT):
                raise ValueError(f"{where}.tensor: expected a {_TT}* entry of {WEIGHTS_NAME}, got {str(name)[:60]!r}")
            if out.get(name, (dtype, shape)) != (dtype, shape):
                raise ValueError(f"{where}.tensor: {name} is named twice with different shapes or dtypes")
            out[name] = (dtype, shape)
    return out


def _tensor_from_plain(record: Any, tensors: dict[str, torch.Tensor], where: str) -> torch.Tensor:
    dtype, shape = _record(record, where)
    if "tensor" in record:
        t = tensors.get(record["tensor"])
        if t is None:
            raise ValueError(f"{where}: names {str(record['tensor'])[:60]!r}, which {WEIGHTS_NAME} lacks")
    else:
        values = record["values"]
        size = math.prod(shape)
        if not isinstance(values, list):
            raise ValueError(f"{where}.values: expected a list of numbers, got {type(values).__name__}")
        if len(shape) > 1 or size > MAX_INLINE_VALUES or len(values) != size:
            raise ValueError(f"{where}.values: {len(values)} values where the record says shape {list(shape)} "
                             f"(inline: at most 1-D, {MAX_INLINE_VALUES} values)")
        if not all(isinstance(v, (int, float)) and (dtype == torch.bool or not isinstance(v, bool)) for v in values):
            raise ValueError(f"{where}.values: expected numbers only")
        try:
            t = torch.tensor(values, dtype=dtype).reshape(shape)
        except (OverflowError, RuntimeError, TypeError, ValueError):
            raise ValueError(f"{where}.values: do not fit dtype {record['dtype']}") from None
    if t.dtype != dtype or tuple(t.shape) != shape:
        raise ValueError(f"{where}: holds {tuple(t.shape)} {t.dtype}, the record says {shape} {dtype}")
    return t


def _test_time_record(state: dict, tensors: dict[str, torch.Tensor]) -> dict:
    """``TestTime.state_dict()`` as JSON (tensors moved to ``tensors`` or inlined)."""
    rec = {k: state[k] for k in ("version", "temperature", "hparams", "names", "selected", "val", "selection")
           if k in state}
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
    unknown = sorted(str(k) for k in rec if k not in _TEST_TIME_KEYS)
    if unknown:
        raise ValueError(f"config.json: test_time holds unknown key(s) {', '.join(unknown[:3])}")
    banks = rec.get("banks") or {}
    if not isinstance(banks, dict):
        raise ValueError("config.json: test_time.banks must be a mapping")
    for key, kind in (("version", int), ("temperature", (int, float)), ("hparams", dict), ("names", list),
                      ("selected", str), ("val", dict), ("selection", (dict, type(None)))):
        if key in rec and (isinstance(rec[key], bool) or not isinstance(rec[key], kind)):
            raise ValueError(f"config.json: test_time.{key} has the wrong type ({type(rec[key]).__name__})")
    if not all(isinstance(n, str) for n in rec.get("names", [])):
        raise ValueError("config.json: test_time.names must be a list of normaliser names")
    state = {k: rec[k] for k in ("version", "temperature", "hparams", "names", "selected", "val", "selection")
             if k in rec}
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
        if set(dn) - {"name", "hparams", "tensors"} or not isinstance(dn.get("hparams"), dict):
            raise ValueError("config.json: test_time.dn must hold name, hparams (a mapping) and tensors only")
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
    if "clip4clip" in arch:  # an encoder trained end to end: frames and token ids in (xmodal.models.clip4clip)
        from xmodal.models.clip4clip import config_dim

        c = arch["clip4clip"]
        size = int(c["clip_config"]["vision_config"]["image_size"])
        return {"video": size * size * 3, "text": int(c["max_words"]), "joint": config_dim(c["clip_config"]),
                "experts": {}, "max_frames": int(c["max_frames"]), "max_tokens": int(c["max_words"]),
                "text_tokens": False, "frames": True}
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
              "model_type": "xmodal-hierarchical-two-tower" if "hierarchy" in arch else
              "xmodal-clip4clip" if "clip4clip" in arch else "xmodal-two-tower",
              "architecture": arch, "feature_sizes": feature_sizes(arch), "encoders": dict(encoders or {}),
              "temperature": float(model.temperature),
              "test_time": _test_time_record(payload["test_time"], tensors),
              "run_config": run_config, **(extra or {})}
    return tensors, config


def read_config(path: str | os.PathLike) -> dict:
    """``config.json`` of an export folder, checked to be one before and after parsing: at most
    :data:`MAX_CONFIG_BYTES` bytes, :data:`MAX_CONFIG_DEPTH` levels and :data:`MAX_CONFIG_VALUES` values
    (measured before any object is built), ``format``, an integer ``version`` this xmodal reads, only
    the keys an export writes (:data:`CONFIG_KEYS`)."""
    from xmodal._files.jsonfile import read_json_file

    p = Path(path) / CONFIG_NAME if Path(path).is_dir() else Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"path: {p} does not exist")
    cfg = read_json_file(p, f"path: {p}", max_bytes=MAX_CONFIG_BYTES, max_depth=MAX_CONFIG_DEPTH,
                         max_values=MAX_CONFIG_VALUES)
    if not isinstance(cfg, dict) or cfg.get("format") != FORMAT:
        raise ValueError(f"path: {p} was not written by 'xmodal export' (no \"format\": \"{FORMAT}\")")
    version = cfg.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"path: {p}: \"version\" must be a whole number >= 1, got {str(version)[:40]!r}")
    if version > VERSION:
        raise ValueError(f"path: {p} is export version {version}, written by a newer xmodal; this xmodal reads "
                         f"version {VERSION} (pip install -U xmodal)")
    unknown = sorted(str(k)[:40] for k in cfg if k not in CONFIG_KEYS)
    if unknown:
        raise ValueError(f"path: {p} holds key(s) an xmodal export does not write: {', '.join(unknown[:3])}")
    for key, kind in (("architecture", dict), ("test_time", (dict, type(None))), ("run_config", (dict, type(None))),
                      ("encoders", dict), ("feature_sizes", dict)):
        if key in cfg and not isinstance(cfg[key], kind):
            raise ValueError(f"path: {p}: \"{key}\" must be a mapping, got {type(cfg[key]).__name__}")
    return cfg


def _header(p: Path) -> None:
    """Refuse a safetensors file whose JSON header is larger than :data:`MAX_HEADER_BYTES` (read 8 bytes)."""
    with open(p, "rb") as f:
        head = f.read(8)
    if len(head) < 8:
        raise ValueError(f"path: {p} is not a readable safetensors file (shorter than its header length)")
    size = int.from_bytes(head, "little")
    if size > MAX_HEADER_BYTES:
        raise ValueError(f"path: {p} is not a readable safetensors file (it declares a {size:,}-byte header, more "
                         f"than the {MAX_HEADER_BYTES:,} an xmodal export's holds)")


def read_tensors(path: str | os.PathLike, wanted: dict[str, tuple[torch.dtype, tuple[int, ...]]] | None = None
                 ) -> dict[str, torch.Tensor]:
    """Tensors of a ``model.safetensors`` (CPU), or a one-line ValueError naming the file.

    Args:
        path: the file.
        wanted: ``{name: (dtype, shape)}``: exactly these entries, checked against the header before
            any is read (an entry not named here is refused unread); None reads every entry.
    """
    from safetensors import SafetensorError, safe_open

    p = Path(path)
    try:
        _header(p)
        with safe_open(str(p), framework="pt", device="cpu") as f:
            names = list(f.keys())
            if wanted is not None:
                missing = [n for n in wanted if n not in names]
                if missing:
                    raise ValueError(f"path: {p} lacks {missing[0]}, which config.json declares")
                extra = sorted(n for n in names if n not in wanted)
                if extra:
                    raise ValueError(f"path: {p} holds tensor(s) config.json never names: "
                                     f"{', '.join(n[:60] for n in extra[:3])}{' ...' if len(extra) > 3 else ''}")
                for name, (dtype, shape) in wanted.items():
                    have = f.get_slice(name)
                    have_dtype = _SAFETENSORS_DTYPES.get(have.get_dtype())
                    if have_dtype != dtype or tuple(have.get_shape()) != tuple(shape):
                        got = str(have_dtype).removeprefix("torch.") if have_dtype else have.get_dtype()
                        why = "" if have_dtype == dtype else " (a converted copy would change every score)"
                        raise ValueError(f"path: {p} holds {name} as {got} {list(have.get_shape())}; config.json "
                                         f"declares {str(dtype).removeprefix('torch.')} {list(shape)}{why}")
            # clone: safetensors' tensors need not be 64-byte aligned; an unaligned one takes other SIMD paths in
            # a matmul and changes the last bit of a score (a fresh tensor is aligned)
            return {n: f.get_tensor(n).clone() for n in (names if wanted is None else wanted)}
    except (SafetensorError, OSError, RuntimeError, TypeError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"path: {p} is not a readable safetensors file ({msg})") from None


def export_payload(path: str | os.PathLike) -> dict:
    """An export folder (``model.safetensors`` + ``config.json``) as the payload
    :func:`xmodal.models.io.model_from_payload` rebuilds the model from (what ``model.pt`` stores
    under ``"model"``); :func:`xmodal.load_model` does both.

    Only the tensors config.json names are read: the architecture's (shapes and dtypes from the model
    built on the ``meta`` device, its computed buffers bounded, :func:`xmodal.models.skeleton.skeleton`) and
    the test-time record's; each is checked against the file's header first.

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: a file is not what ``xmodal export`` writes.
    """
    from xmodal.models.skeleton import skeleton

    folder = Path(path)
    cfg = read_config(folder)
    if "architecture" not in cfg:
        raise ValueError(f"path: {folder / CONFIG_NAME} has no \"architecture\"")
    declared = {k: (v.dtype, tuple(v.shape)) for k, v in skeleton(cfg["architecture"]).state_dict().items()}
    wanted = {**declared, **tensor_names(cfg.get("test_time"))}
    tensors = read_tensors(folder / WEIGHTS_NAME, wanted)
    state = {k: v for k, v in tensors.items() if not k.startswith(_TT)}
    return {"architecture": cfg["architecture"], "state_dict": state,
            "test_time": _test_time_state(cfg.get("test_time"), tensors)}


__all__ = ["FORMAT", "VERSION", "WEIGHTS_NAME", "CONFIG_NAME", "MODEL_FILES", "is_export_dir", "export_state",
           "read_config", "read_tensors", "tensor_names", "export_payload"]
