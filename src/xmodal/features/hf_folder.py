"""An ``hf:DIR`` folder read as data, never as code (issue 44): every file ``transformers`` would parse
is bounded in size and JSON nesting before anything parses it, ``auto_map`` (code named by the folder)
is refused, config fields are type- and range-checked against the library's own defaults, and the
processor's resize and crop targets are bounded. Each refusal is one line naming the file.

The caps hold every CLIP / SigLIP / X-CLIP of the hub with a wide margin (the largest tokenizer.json of
those families is about 2 MB, their configs a few KB, their images at most 512 pixels a side).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from xmodal._files.jsonfile import json_shape

#: Size caps (bytes) of the files the library parses; other ``.json`` files get ``MAX_JSON_BYTES``,
#: other ``.txt`` / ``.model`` / ``.jinja`` files ``MAX_VOCAB_BYTES``.
MAX_JSON_BYTES = 4 * 2 ** 20
MAX_TOKENIZER_BYTES = 32 * 2 ** 20
MAX_VOCAB_BYTES = 16 * 2 ** 20
CAPS = {"tokenizer.json": MAX_TOKENIZER_BYTES}
PARSED_SUFFIXES = (".json", ".txt", ".model", ".jinja")
#: Deepest JSON nesting of any file (real ones nest at most 6 deep).
MAX_JSON_DEPTH = 32
#: Largest side a processor may resize or crop to (pixels).
MAX_IMAGE_SIDE = 2048
#: Largest value of a size-like config field (a width, a layer or head count, a vocabulary).
MAX_CONFIG_INT = 2 ** 24
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "spiece.model", "tokenizer.model",
                   "sentencepiece.bpe.model")
PROCESSOR_CONFIGS = ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json")
_SIZE_FIELD = re.compile(r"(^|_)(size|dim|layers|heads|embeddings|channels|frames)$")
_HEAD_PAIRS = (("hidden_size", "num_attention_heads"), ("mit_hidden_size", "mit_num_attention_heads"),
               ("projection_dim", "prompt_attention_heads"))


def check_files(folder: Path, spec: str) -> None:
    """Every file the library would parse is within its size cap, and every JSON file nests at most
    ``MAX_JSON_DEPTH`` deep (measured on the bytes, before any parser sees them)."""
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.suffix not in PARSED_SUFFIXES:
            continue
        cap = CAPS.get(path.name, MAX_JSON_BYTES if path.suffix in (".json", ".jinja") else MAX_VOCAB_BYTES)
        size = path.stat().st_size
        if size > cap:
            raise ValueError(f"model: {spec}: {path} is larger than {cap:,} bytes ({size:,}); refused unread")
        if path.suffix == ".json":
            depth = json_shape(path.read_bytes())[0]
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"model: {spec}: {path} is nested {depth} deep (at most {MAX_JSON_DEPTH}); "
                                 f"refused unparsed")


def read_json(path: Path, spec: str):
    """A JSON file of the folder (bounded by :func:`check_files` first), parsed; one line otherwise."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"model: {spec}: {path} is not valid JSON ({str(exc)[:100]})") from None


def refuse_code(data, path: Path, spec: str) -> None:
    """A folder's ``auto_map`` names Python files to import: refused, whatever standard input says."""
    parts = [data] + [v for v in data.values() if isinstance(v, dict)] if isinstance(data, dict) else []
    if any("auto_map" in part for part in parts):  # processor_config.json nests its processors' configs
        raise ValueError(f"model: {spec}: {path} has an auto_map (code of the folder to run); hf: folders are "
                         f"data and never run code: use a folder saved by transformers' own classes")


def check_config(cfg: dict, classes: dict, path: Path, spec: str) -> None:
    """Each field of ``cfg`` (and of its ``text_config`` / ``vision_config``) has the type of the
    library's default for it (an int where the default is an int, a bool never for a number), every
    size-like field is an int in ``[1, MAX_CONFIG_INT]``, and every width divides by its head count.

    Args:
        cfg: config.json, parsed.
        classes: ``{"": ConfigClass, "text_config": TextConfigClass, ...}`` of the model type.
    """
    for sub, cls in classes.items():
        part = cfg if not sub else cfg.get(sub)
        part = {} if part is None else part  # the library's defaults
        where = f"{sub}." if sub else ""
        if not isinstance(part, dict):
            raise ValueError(f"model: {spec}: {path}: {sub} is a {type(part).__name__}, expected an object")
        defaults = cls().to_dict()
        for key, value in part.items():
            if sub == "" and key in classes:
                continue
            _check_field(f"{where}{key}", value, defaults.get(key), path, spec)
        for width, heads in _HEAD_PAIRS:
            w, h = part.get(width, defaults.get(width)), part.get(heads, defaults.get(heads))
            if isinstance(w, int) and isinstance(h, int) and h > 0 and w % h:
                raise ValueError(f"model: {spec}: {path}: {where}{heads} ({h}) does not divide {where}{width} ({w})")


def _check_field(name: str, value, default, path: Path, spec: str) -> None:
    sized = bool(_SIZE_FIELD.search(name.rsplit(".", 1)[-1])) and _is_int(default)  # not generation's 0s
    if sized:
        if not _is_int(value):
            raise ValueError(f"model: {spec}: {path}: {name} is {type(value).__name__} {repr(value)[:40]}, "
                             f"expected an int")
        if not 1 <= value <= MAX_CONFIG_INT:
            raise ValueError(f"model: {spec}: {path}: {name} is {value}, expected at least 1 and at most "
                             f"{MAX_CONFIG_INT:,}")
        return
    if value is None or default is None:
        return
    want = type(default)
    ok = (_is_int(value) if want is int else _is_number(value) if want is float else isinstance(value, want))
    if not ok:
        kind = {"float": "a finite float", "int": "an int"}.get(want.__name__, f"a {want.__name__}")
        raise ValueError(f"model: {spec}: {path}: {name} is {type(value).__name__} {repr(value)[:40]}, "
                         f"expected {kind}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_processor(proc: dict, path: Path, spec: str) -> None:
    """Resize and crop targets within ``[1, MAX_IMAGE_SIDE]`` pixels, mean/std/rescale finite numbers
    (std above 0), in a processor config (``processor_config.json`` nests its image and video
    processors; the others are flat)."""
    parts = [proc] + [v for k, v in proc.items() if k.endswith("processor") and isinstance(v, dict)]
    for part in parts:
        for key in ("size", "crop_size", "max_size", "shortest_edge", "longest_edge"):
            if key in part and part[key] is not None:
                _check_sides(key, part[key], path, spec)
        for key in ("image_mean", "image_std", "rescale_factor"):
            value = part.get(key)
            if value is None:
                continue
            values = value if isinstance(value, list) else [value]
            if not values or not all(_is_number(v) and (key == "image_mean" or v > 0) for v in values):
                raise ValueError(f"model: {spec}: {path}: {key} is {str(value)[:60]}, expected finite numbers"
                                 f"{'' if key == 'image_mean' else ' above 0'}")


def _check_sides(key: str, value, path: Path, spec: str) -> None:
    sides = value.items() if isinstance(value, dict) else [(key, value)]
    for name, side in sides:
        if side is None and isinstance(value, dict):
            continue
        if not _is_int(side) or not 1 <= side <= MAX_IMAGE_SIDE:
            raise ValueError(f"model: {spec}: {path}: {key} asks for {str(side)[:40]} pixels ({name}); at most "
                             f"{MAX_IMAGE_SIDE} a side are taken")


def has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES)
