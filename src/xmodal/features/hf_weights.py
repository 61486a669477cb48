"""The weights of an ``hf:DIR`` folder, checked before the library builds or loads anything (issue 44):
safetensors only (a folder of pickle ``.bin`` weights is refused; one beside safetensors is never read), each file's header read with bounded memory and
checked to cover the file exactly (a truncated file is one line), every parameter the model declares
present with its shape, all of one floating dtype, and every value finite (read in bounded chunks,
the exponent bits tested: IEEE 754 and bfloat16 infinities and NaNs have all exponent bits set).
"""

from __future__ import annotations

import contextlib
import json
import re
import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

#: safetensors dtype -> bytes per element.
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
            "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
#: floating dtype -> (unsigned view, exponent mask): a value is not finite iff all its exponent bits are set.
EXPONENT = {"F64": (np.uint64, 0x7FF0000000000000), "F32": (np.uint32, 0x7F800000),
            "F16": (np.uint16, 0x7C00), "BF16": (np.uint16, 0x7F80)}
MAX_HEADER_BYTES = 100 * 2 ** 20  # the safetensors format's own limit
CHUNK_BYTES = 16 * 2 ** 20
_LAYER = re.compile(r"^(text_model|vision_model)\.encoder\.layers\.(\d+)\.")


class Tensor(NamedTuple):
    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute offsets in the file
    end: int


def refuse_pickle(folder: Path, spec: str) -> None:
    """Pickle weights can run code when read: a folder whose weights are pickle files is refused."""
    found = sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix in (".bin", ".pt", ".pth", ".ckpt")
                   and p.name != "training_args.bin" and not p.name.startswith("."))
    if found:
        raise ValueError(f"model: {spec}: {folder / found[0]} holds pickle weights, which are refused (they can "
                         f"run code); save the model with safetensors (save_pretrained's default)")


def read_headers(files: list[Path], spec: str) -> dict[str, Tensor]:
    """Every tensor of the safetensors ``files`` by name, from their headers alone."""
    out: dict[str, Tensor] = {}
    for path in files:
        for name, tensor in _header(path, spec).items():
            if name in out:
                raise ValueError(f"model: {spec}: {path}: tensor {name[:80]} is also in {out[name].file.name}")
            out[name] = tensor
    return out


def _header(path: Path, spec: str) -> dict[str, Tensor]:
    from xmodal._files.jsonfile import json_shape

    size = path.stat().st_size
    bad = f"model: {spec}: {path}"
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
        if n is None or 8 + n > size:
            raise ValueError(f"{bad} is truncated or not safetensors ({size:,} bytes; no complete header)")
        if n > MAX_HEADER_BYTES:
            raise ValueError(f"{bad}: header of {n:,} bytes (at most {MAX_HEADER_BYTES:,})")
        raw = f.read(n)
    if json_shape(raw)[0] > 3:
        raise ValueError(f"{bad}: header nested deeper than safetensors' three levels")
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"{bad}: header is not valid JSON (not safetensors, or damaged)") from None
    if not isinstance(header, dict):
        raise ValueError(f"{bad}: header is not a JSON object")
    tensors, spans = {}, []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            ok = (dtype in ITEMSIZE and all(type(d) is int and d >= 0 for d in shape)
                  and type(begin) is int and type(end) is int and 0 <= begin <= end
                  and end - begin == int(np.prod(shape, dtype=object)) * ITEMSIZE[dtype])
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"{bad}: tensor {str(name)[:80]} has a damaged header entry ({str(entry)[:80]})")
        tensors[name] = Tensor(path, dtype, shape, 8 + n + begin, 8 + n + end)
        spans.append((begin, end))
    spans.sort()
    covered = 0
    for begin, end in spans:
        if begin != covered:
            raise ValueError(f"{bad}: tensors overlap or leave gaps (damaged header)")
        covered = end
    if 8 + n + covered != size:
        raise ValueError(f"{bad} is truncated or has trailing bytes: {size:,} bytes, its header describes "
                         f"{8 + n + covered:,}")
    return tensors


def layer_counts(tensors: dict[str, Tensor]) -> dict[str, int]:
    """Layers of each tower the weights hold: ``{"text_config": 12, "vision_config": 12}``."""
    seen: dict[str, set] = {}
    for name in tensors:
        m = _LAYER.match(name)
        if m:
            seen.setdefault(m.group(1).replace("_model", "_config"), set()).add(int(m.group(2)))
    return {k: len(v) for k, v in seen.items()}


def check_layers(cfg: dict, tensors: dict[str, Tensor], path: Path, spec: str) -> None:
    """The towers' ``num_hidden_layers`` equal the layers the weights hold, and no other layer count of
    the config exceeds the number of tensors: checked before a config object or a module is built."""
    held = layer_counts(tensors)
    for sub in ("text_config", "vision_config"):
        want = (cfg.get(sub) or {}).get("num_hidden_layers")
        if isinstance(want, int) and want != held.get(sub, 0):
            raise ValueError(f"model: {spec}: {path}: {sub}.num_hidden_layers is {want}, but the weights hold "
                             f"{held.get(sub, 0)} layers")
    for sub in ("", "text_config", "vision_config"):
        part = cfg if not sub else cfg.get(sub) or {}
        for key, value in part.items():
            if "layers" in key and isinstance(value, int) and value > len(tensors):
                raise ValueError(f"model: {spec}: {path}: {sub + '.' if sub else ''}{key} is {value}, more layers "
                                 f"than the weights hold tensors ({len(tensors)})")


def check_against(model, tensors: dict[str, Tensor], spec: str) -> None:
    """Every parameter and persistent buffer of ``model`` (built on the meta device: no memory) is in
    the weights with its shape, parameters all of one floating dtype; nothing else is in the weights
    but the model's buffers (``position_ids`` of older saves)."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    params = {k for k, _ in model.named_parameters()}
    extra = set(tensors) - set(expected) - {k for k, _ in model.named_buffers()}
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise ValueError(f"model: {spec}: weight {missing[0]} is missing from {_files(tensors)}"
                         f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}")
    if extra:
        first = sorted(extra)
        raise ValueError(f"model: {spec}: {tensors[first[0]].file} holds {first[0]}, which the model does not have"
                         f"{f' (and {len(first) - 1} more)' if len(first) > 1 else ''}")
    for name, shape in expected.items():
        if tensors[name].shape != shape:
            raise ValueError(f"model: {spec}: {tensors[name].file}: {name} has shape {list(tensors[name].shape)}, "
                             f"the config asks for {list(shape)}")
    dtypes = {}
    for name in sorted(params):
        dtypes.setdefault(tensors[name].dtype, name)
    odd = [d for d in dtypes if d not in EXPONENT]
    if odd:
        name = dtypes[odd[0]]
        raise ValueError(f"model: {spec}: {tensors[name].file}: {name} is {odd[0]}, not a floating dtype; refused "
                         f"(it would be cast)")
    if len(dtypes) > 1:
        common = max(dtypes, key=lambda d: sum(tensors[k].dtype == d for k in params))
        name = next(v for d, v in dtypes.items() if d != common)
        raise ValueError(f"model: {spec}: {tensors[name].file}: {name} is {tensors[name].dtype}, the other weights "
                         f"{common}; refused (one dtype per model)")


def check_finite(tensors: dict[str, Tensor], spec: str) -> None:
    """Every floating tensor is finite, read ``CHUNK_BYTES`` at a time."""
    with contextlib.ExitStack() as stack:
        handles: dict[Path, Any] = {}
        for name, t in sorted(tensors.items(), key=lambda kv: (str(kv[1].file), kv[1].begin)):
            if t.dtype not in EXPONENT:
                continue
            view, mask = EXPONENT[t.dtype]
            if t.file not in handles:
                handles[t.file] = stack.enter_context(open(t.file, "rb"))
            f = handles[t.file]
            f.seek(t.begin)
            left = t.end - t.begin
            while left:
                data = f.read(min(left, CHUNK_BYTES - CHUNK_BYTES % 8))
                if not data:
                    raise ValueError(f"model: {spec}: {t.file} is truncated (ends inside {name})")
                left -= len(data)
                bits = np.frombuffer(data, dtype=view)
                if np.any((bits & view(mask)) == view(mask)):
                    raise ValueError(f"model: {spec}: {t.file}: {name} holds values that are not finite "
                                     f"(NaN or infinity)")


def _files(tensors: dict[str, Tensor]) -> str:
    return ", ".join(sorted({t.file.name for t in tensors.values()})) or "the weights"
