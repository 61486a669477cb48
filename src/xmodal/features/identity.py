"""Encoder identity: which frozen encoder made a features file, carried with the features everywhere.

An *identity record* is a plain dict (JSON) describing one encoder's output:

- ``spec``: the encoder spec (``minilm``, ``efficientnet-lite0``, ``hf:/abs/folder``, a registered name);
- ``kind``: ``text``, ``image`` (images and video frames) or ``video`` (whole clips, e.g. XCLIP);
- ``level``: ``sentence``, ``tokens`` (text), ``image`` / ``frame`` (pixels), ``clip`` (a video clip);
- ``family``, ``hub_name`` (the Hugging Face hub id an ``hf:`` folder's config names, else None);
- ``weights_sha256``: the SHA-256 of the weights file (of the weight files' ``sha256sum`` lines when sharded);
- ``preprocessing_sha256`` and ``preprocessing`` (what the inputs go through before the model);
- ``dim`` (feature size) and ``normalized`` (L2-normalised or not);
- ``sources_sha256`` (a layout imported from a frame store): the SHA-256 of its videos' recorded source
  hashes (:func:`xmodal.features.sources.sources_digest`).

Where it travels (names fixed by the API contract):

- ``OUT.encoder.json`` beside a file ``xmodal encode text|images`` wrote, ``FEATS/encoder.json`` in the
  folder ``xmodal encode videos`` wrote (:func:`sidecar_path`, :func:`write_sidecar`, :func:`read_sidecar`);
- ``DATA/encoders.json`` of a layout and ``RUN/encoders.json`` of a run (:func:`write_encoders`,
  :func:`read_encoders`: ``{"text": record | null, "video": record | null, "experts": {...}}``);
- an export's ``config.json`` (``encoders``) and an index's ``meta.json`` (``text_encoder``, ``encoders``).

Two records name the same encoder (:func:`mismatch` is None) when their sizes agree and, where both
hash their weights, the hashes (weights and preprocessing) agree; otherwise when their specs agree. A
consumer refuses a mismatch in one line. Where nothing is recorded, :func:`assumed_builtin` says
which built-in encoder a feature size matches: an *assumption*, shown as such, never recorded.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from xmodal._files.paths import elide_paths
from xmodal.features.hashing import file_sha256, files_sha256  # noqa: F401  (used by the encoders)

__all__ = ["sidecar_path", "read_sidecar", "write_sidecar", "check_record", "read_encoders", "write_encoders",
           "run_encoders", "mismatch", "assumed_builtin", "portable", "resolve_text", "ENCODERS_NAME", "SIDECAR_NAME"]

#: ``FEATS/encoder.json`` (a folder of per-video features), and the suffix of a file's sidecar.
SIDECAR_NAME = "encoder.json"
#: ``DATA/encoders.json`` of a layout, ``RUN/encoders.json`` of a run.
ENCODERS_NAME = "encoders.json"
SIDECAR_FORMAT, ENCODERS_FORMAT, VERSION = "xmodal-encoder", "xmodal-encoders", 1
#: Largest identity file read (a record is a few hundred bytes; the preprocessing summary a few KB).
MAX_BYTES = 256 * 1024
#: Deepest nesting of an identity file (``encoders.json``: the file, ``experts``, a record, then
#: :data:`MAX_VALUE_DEPTH` levels of its ``preprocessing`` / ``sampling``).
MAX_DEPTH = 8
#: Deepest nesting inside a record's ``preprocessing`` / ``sampling`` (what xmodal writes holds 2).
MAX_VALUE_DEPTH = 4
KINDS = ("text", "image", "video")
LEVELS = ("sentence", "tokens", "image", "frame", "clip")
#: Feature sizes of the built-in encoders, by kind (what an unrecorded size is matched against).
BUILTIN_DIMS = {"text": {"minilm": 384}, "image": {"efficientnet-lite0": 1280}}
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_FIELDS = {"spec", "kind", "level", "family", "hub_name", "weights_sha256", "preprocessing_sha256", "preprocessing",
           "dim", "normalized", "dtype", "sampling", "source", "runtime", "spec_relative_to", "sources_sha256"}
#: Folder specs (``hf:``, ``open_clip:``) are written relative to the file that holds them (marked by
#: ``"spec_relative_to": "file"``) and read back as absolute paths: no file names a server's absolute path.
FOLDER_PREFIXES = ("hf:", "open_clip:")


def sidecar_path(out: str | os.PathLike) -> Path:
    """Where the identity of ``out`` lives: ``out/encoder.json`` for a folder, ``OUT.encoder.json`` (the
    file's full name plus ``.encoder.json``) for a file.

    >>> sidecar_path("feats/caps.npy").as_posix()
    'feats/caps.npy.encoder.json'
    """
    p = _path(out, "out")
    return p / SIDECAR_NAME if p.is_dir() else p.with_name(p.name + "." + SIDECAR_NAME)


def _path(value: Any, name: str) -> Path:
    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)) or not str(value):
        raise TypeError(f"{name}: expected a path, got {type(value).__name__}")
    return Path(value)


def _record_or_none(value: Any, name: str) -> dict | None:
    if value is not None and not isinstance(value, dict):
        raise TypeError(f"{name}: expected an encoder record (dict) or None, got {type(value).__name__}")
    return value


def check_record(record: Any, where: str) -> dict | None:
    """A validated identity record (None stays None); ValueError naming ``where`` otherwise."""
    if not isinstance(where, str):
        raise TypeError(f"where: expected text, got {type(where).__name__}")
    if record is None:
        return None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected an encoder record (a JSON object) or null, got {type(record).__name__}")
    spec = record.get("spec")
    if not isinstance(spec, str) or not spec.strip() or len(spec) > 4096 or "\n" in spec:
        raise ValueError(f"{where}: 'spec' must be an encoder spec (one line of text)")
    if record.get("kind") not in KINDS:
        raise ValueError(f"{where}: 'kind' must be one of {', '.join(KINDS)}")
    if record.get("level") is not None and record["level"] not in LEVELS:
        raise ValueError(f"{where}: 'level' must be one of {', '.join(LEVELS)}")
    for key in ("weights_sha256", "preprocessing_sha256", "sources_sha256"):
        value = record.get(key)
        if value is not None and (not isinstance(value, str) or not _HEX64.match(value)):
            raise ValueError(f"{where}: {key!r} must be 64 lower-case hex digits or null")
    dim = record.get("dim")
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= 1 << 20):
        raise ValueError(f"{where}: 'dim' must be a positive integer or null")
    if record.get("normalized") not in (None, True, False):
        raise ValueError(f"{where}: 'normalized' must be true, false or null")
    for key in ("family", "hub_name", "dtype", "source"):
        value = record.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > 4096):
            raise ValueError(f"{where}: {key!r} must be text or null")
    if record.get("spec_relative_to") not in (None, "file"):
        raise ValueError(f"{where}: 'spec_relative_to' must be \"file\" or null")
    runtime = record.get("runtime")
    if runtime is not None and (not isinstance(runtime, dict) or len(runtime) > 16 or not all(
            isinstance(v, (str, int, float, type(None))) and not isinstance(v, bool) for v in runtime.values())):
        raise ValueError(f"{where}: 'runtime' must be an object of a few plain values or null")
    for key in ("preprocessing", "sampling"):
        if record.get(key) is not None and not isinstance(record[key], (dict, str)):
            raise ValueError(f"{where}: {key!r} must be an object, text or null")
        if _deeper_than(record.get(key), MAX_VALUE_DEPTH):
            raise ValueError(f"{where}: {key!r} is nested more than {MAX_VALUE_DEPTH} levels deep")
    return {k: v for k, v in record.items() if k in _FIELDS}


def _deeper_than(value: Any, limit: int, max_items: int = 1 << 16) -> bool:
    """Whether ``value`` nests dicts / lists more than ``limit`` levels deep (or holds more than
    ``max_items`` of them): walked with a stack, so no depth is a RecursionError."""
    stack, seen = [(value, 0)], 0
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list, tuple)):
            seen += 1
            if depth + 1 > limit or seen > max_items:
                return True
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))
    return False


def _read_json(path: Path, where: str, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """A JSON file through the shared bounded reader (:func:`xmodal._files.jsonfile.read_json_file`)."""
    from xmodal._files.jsonfile import read_json_file

    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise ValueError(f"{where}: {path} is {size:,} bytes, more than an encoder record ({max_bytes:,} at most)")
        return read_json_file(path, f"{where}: {path}", max_bytes=max_bytes, max_depth=max_depth)
    except FileNotFoundError:
        raise ValueError(f"{where}: {path} does not exist") from None
    except OSError as exc:
        raise ValueError(f"{where}: cannot read {path} ({exc.strerror or exc})") from None


def _bounded_text(body: dict, what: str) -> str:
    """The JSON text of an identity file, refused (one line) when its readers would refuse it: the
    producer's bound, so nothing a command writes is later refused by another."""
    from xmodal._files.jsonfile import json_shape

    text = json.dumps(body, indent=1) + "\n"
    size, (depth, _) = len(text.encode("utf-8")), json_shape(text.encode("utf-8"))
    if size > MAX_BYTES:
        raise ValueError(f"{what}: the encoder records would take {size:,} bytes, more than an identity file "
                         f"holds ({MAX_BYTES:,} at most)")
    if depth > MAX_DEPTH:
        raise ValueError(f"{what}: the encoder records would nest {depth} levels deep, more than an identity "
                         f"file holds ({MAX_DEPTH} at most)")
    return text


def spec_to_file(record: dict | None, folder: str | os.PathLike) -> dict | None:
    """``record`` as a file in ``folder`` stores it: an absolute ``hf:`` / ``open_clip:`` folder written
    relative to ``folder`` (and marked so).

    >>> spec_to_file({"spec": "hf:/w/models/clipA", "kind": "text"}, "/w/data/feats")["spec"]
    'hf:../../models/clipA'
    """
    if not isinstance(record, dict) or not isinstance(record.get("spec"), str):
        return record
    for prefix in FOLDER_PREFIXES:
        path = record["spec"][len(prefix):]
        if record["spec"].startswith(prefix) and os.path.isabs(path):
            rel = os.path.relpath(path, os.path.abspath(os.fspath(folder)))
            return {**record, "spec": prefix + rel, "spec_relative_to": "file"}
    return record


def spec_from_file(record: dict | None, folder: str | os.PathLike) -> dict | None:
    """The inverse of :func:`spec_to_file`: a marked relative folder spec made absolute again."""
    if not isinstance(record, dict) or record.get("spec_relative_to") is None:
        return record
    out = {k: v for k, v in record.items() if k != "spec_relative_to"}
    for prefix in FOLDER_PREFIXES:
        if str(out.get("spec", "")).startswith(prefix) and not os.path.isabs(out["spec"][len(prefix):]):
            out["spec"] = prefix + str((Path(os.path.abspath(os.fspath(folder))) / out["spec"][len(prefix):]).resolve())
    return out


def read_sidecar(features: str | os.PathLike, where: str = "features") -> dict | None:
    """The identity record beside a features file or in a features folder (:func:`sidecar_path`), or
    None when there is none; ValueError naming ``where`` when the file is not one."""
    path = sidecar_path(features)
    if not path.is_file():
        return None
    body = _read_json(path, where)
    if not isinstance(body, dict) or body.get("format") != SIDECAR_FORMAT:
        raise ValueError(f"{where}: {path} was not written by 'xmodal encode' (no \"format\": \"{SIDECAR_FORMAT}\")")
    record = check_record({k: v for k, v in body.items() if k not in ("format", "version")}, f"{where}: {path}")
    return spec_from_file(record, path.parent)


def write_sidecar(features: str | os.PathLike, record: dict) -> Path:
    """Write the identity ``record`` of ``features`` (a file or a folder) atomically; returns its path."""
    from xmodal.runs import atomic_write_text

    if not isinstance(record, dict):
        raise TypeError(f"record: expected an encoder record (dict), got {type(record).__name__}")
    path = sidecar_path(features)
    record = spec_to_file(check_record(record, "record"), path.parent)
    atomic_write_text(path, _bounded_text({"format": SIDECAR_FORMAT, "version": VERSION, **record}, "record"))
    return path


def read_encoders(folder: str | os.PathLike, where: str = "data") -> dict | None:
    """``{"text", "video", "experts"}`` records of a layout's or a run's ``encoders.json``, or None
    when the folder has none."""
    path = _path(folder, "folder") / ENCODERS_NAME
    if not path.is_file():
        return None
    body = _read_json(path, where)
    if not isinstance(body, dict) or body.get("format") != ENCODERS_FORMAT:
        raise ValueError(f"{where}: {path} was not written by xmodal (no \"format\": \"{ENCODERS_FORMAT}\")")
    experts = body.get("experts") or {}
    if not isinstance(experts, dict) or len(experts) > 256:
        raise ValueError(f"{where}: {path}: 'experts' must map at most 256 expert names to records")
    base = path.parent
    return {"text": spec_from_file(check_record(body.get("text"), f"{where}: {path}: text"), base),
            "video": spec_from_file(check_record(body.get("video"), f"{where}: {path}: video"), base),
            "experts": {str(k): spec_from_file(check_record(v, f"{where}: {path}: experts[{k!r}]"), base)
                        for k, v in experts.items()}}


def write_encoders(folder: str | os.PathLike, encoders: dict) -> Path:
    """Write ``{"text", "video", "experts"}`` as ``folder/encoders.json`` (atomic)."""
    from xmodal.runs import atomic_write_text

    if not isinstance(encoders, dict):
        raise TypeError(f"encoders: expected {{'text', 'video', 'experts'}}, got {type(encoders).__name__}")
    if not isinstance(encoders.get("experts") or {}, dict):
        raise TypeError("encoders['experts']: expected a dict of expert name -> record")
    body = {"format": ENCODERS_FORMAT, "version": VERSION,
            "text": spec_to_file(check_record(encoders.get("text"), "encoders['text']"), folder),
            "video": spec_to_file(check_record(encoders.get("video"), "encoders['video']"), folder),
            "experts": {k: spec_to_file(check_record(v, f"encoders['experts'][{k!r}]"), folder)
                        for k, v in (encoders.get("experts") or {}).items()}}
    if len(body["experts"]) > 256:
        raise ValueError(f"encoders['experts']: at most 256 expert records, got {len(body['experts'])}")
    path = Path(folder) / ENCODERS_NAME
    atomic_write_text(path, _bounded_text(body, "encoders"))
    return path


def run_encoders(run: str | os.PathLike, where: str = "--run") -> dict:
    """``{"text", "video", "experts"}`` records of a run folder (``RUN/encoders.json``), a checkpoint
    file (its folder's) or an export folder (``config.json``'s ``encoders``); records missing or not
    written are None (a run made before xmodal recorded encoders, in-memory data ...)."""
    p = _path(run, "run")
    folder = p if p.is_dir() else p.parent
    empty = {"text": None, "video": None, "experts": {}}
    if (folder / "config.json").is_file() and not (folder / ENCODERS_NAME).is_file():
        body = _read_json(folder / "config.json", where, max_bytes=64 << 20, max_depth=32) \
            if (folder / "config.json").stat().st_size <= 64 << 20 else {}
        enc = body.get("encoders") if isinstance(body, dict) else None
        if not isinstance(enc, dict):
            return empty

        def one(value: Any, name: str) -> dict | None:
            if not isinstance(value, dict) or not isinstance(value.get("spec"), str) or value.get("kind") not in KINDS:
                return None  # an export that states a name only (--text-encoder without a record)
            return check_record(value, f"{where}: {folder / 'config.json'}: encoders[{name!r}]")

        experts = enc.get("experts") if isinstance(enc.get("experts"), dict) else {}
        return {"text": one(enc.get("text"), "text"), "video": one(enc.get("video"), "video"),
                "experts": {str(k): one(v, str(k)) for k, v in list(experts.items())[:256]}}
    return read_encoders(folder, where) or empty


def portable(record: dict | None) -> dict | None:
    """A record to hand on (an export's config.json): an ``hf:`` / ``open_clip:`` spec names the folder by its hub id or
    its base name instead of this machine's absolute path (the hashes still identify it).

    >>> portable({"spec": "hf:/home/me/models/clip-b32", "kind": "text", "hub_name": None})["spec"]
    'hf:clip-b32'
    >>> portable({"spec": "open_clip:/home/me/oc/vit-b32", "kind": "text", "hub_name": None})["spec"]
    'open_clip:vit-b32'
    """
    if _record_or_none(record, "record") is None:
        return None
    out = dict(record)
    spec = str(out.get("spec", ""))
    for prefix in ("hf:", "open_clip:"):
        if spec.startswith(prefix):
            out["spec"] = prefix + (out.get("hub_name") or Path(spec[len(prefix):]).name or "model")
    return out


def shown_spec(spec: str | None, record: dict | None = None) -> str | None:
    """A spec as a page, an API answer or a card shows it: an ``hf:`` / ``open_clip:`` folder by its hub
    id or folder name (never this machine's path), with the first 12 hex digits of its weights' SHA-256
    where a record has them.

    >>> shown_spec("hf:/srv/models/clipA", {"weights_sha256": "ab" * 32, "hub_name": None})
    'hf:clipA (sha256 abababababab)'
    >>> shown_spec("minilm")
    'minilm'
    """
    if spec is None:
        return None
    name = portable({"spec": spec, "kind": "text", "hub_name": (record or {}).get("hub_name")})["spec"]
    digest = (record or {}).get("weights_sha256")
    return f"{name} (sha256 {digest[:12]})" if name != spec and isinstance(digest, str) else name


def spec_of(record: dict | None) -> str | None:
    """The spec string of a record (None for None)."""
    return None if record is None else record.get("spec")


def _level(record: dict) -> str | None:
    level = record.get("level")
    return "image" if level == "frame" else level  # frames of a video are images to the encoder


def mismatch(recorded: dict | None, given: dict | None) -> str | None:
    """Why ``given`` is not the encoder ``recorded`` describes, in words; None when they are the same
    (or either is unknown). Sizes first, then the weights' and preprocessing's hashes where both
    have them, else the specs.

    >>> a = {"spec": "minilm", "kind": "text", "dim": 384}
    >>> mismatch(a, {"spec": "hf:/m/clip", "kind": "text", "dim": 512})
    'hf:/m/clip gives 512-d features, but the recorded encoder minilm gives 384-d'
    """
    if _record_or_none(recorded, "recorded") is None or _record_or_none(given, "given") is None:
        return None
    a, b = check_record(recorded, "recorded"), check_record(given, "given")
    if a.get("dim") and b.get("dim") and a["dim"] != b["dim"]:
        return f"{b['spec']} gives {b['dim']}-d features, but the recorded encoder {a['spec']} gives {a['dim']}-d"
    if a.get("kind") == "text" and b.get("kind") == "text" and _level(a) and _level(b) and _level(a) != _level(b):
        return f"{b['spec']} gives {_level(b)} features, but the recorded ones are {_level(a)} features"
    if a.get("kind") and b.get("kind") and a["kind"] != b["kind"]:
        return f"{b['spec']} encodes {b['kind']}, but the recorded encoder {a['spec']} encodes {a['kind']}"
    if a.get("weights_sha256") and b.get("weights_sha256"):
        if a["weights_sha256"] != b["weights_sha256"]:
            return (f"{b['spec']} has other weights than the recorded encoder {a['spec']} (SHA-256 "
                    f"{b['weights_sha256'][:12]}... vs {a['weights_sha256'][:12]}...)")
        if a.get("preprocessing_sha256") and b.get("preprocessing_sha256") and \
                a["preprocessing_sha256"] != b["preprocessing_sha256"]:
            return f"{b['spec']} preprocesses its inputs differently from the recorded encoder {a['spec']}"
        return None
    if a["spec"] != b["spec"]:
        return f"{b['spec']} is not the recorded encoder {a['spec']}"
    return None


def assumed_builtin(dim: int | None, kind: str) -> str | None:
    """The built-in encoder of ``kind`` (``text`` / ``image``) whose feature size is ``dim``, or None:
    what an unrecorded feature size is *assumed* to come from (always shown as an assumption).

    >>> assumed_builtin(384, "text"), assumed_builtin(12, "text"), assumed_builtin(1280, "image")
    ('minilm', None, 'efficientnet-lite0')
    """
    if kind not in BUILTIN_DIMS:
        raise ValueError(f"kind: expected text or image, got {str(kind)[:40]!r}")
    if dim is None:
        return None
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim: expected an integer or None, got {type(dim).__name__}")
    return next((name for name, d in BUILTIN_DIMS[kind].items() if d == dim), None)


def stated(spec: str, kind: str, dim: int | None, flag: str) -> dict:
    """The identity of an encoder a user names with ``flag`` (its size checked against ``dim``, the
    size the features must have); ValueError naming ``flag`` for an unknown spec or another size."""
    from xmodal.features.encoders import identity_of

    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{flag}: expected an encoder spec, got {str(spec)[:40]!r}")
    try:
        record = identity_of(spec, kind, dim=dim)
    except ModuleNotFoundError as exc:
        raise ValueError(f"{flag}: {spec} is not installed ({exc})") from None
    except ValueError as exc:
        raise ValueError(f"{flag}: {str(exc).removeprefix('model: ')}") from None
    if dim is not None and record.get("dim") not in (None, dim):
        raise ValueError(f"{flag}: {spec} gives {record['dim']}-d features, but these features are {dim}-d")
    return record


def recorded_text(meta: dict) -> dict | None:
    """The text encoder an index's ``meta.json`` records (None: unknown; an index written before
    xmodal recorded encoders named ``minilm`` whatever made the features, so its name is not taken)."""
    enc = meta.get("encoders") if isinstance(meta, dict) else None
    if not isinstance(enc, dict):
        return None
    return check_record(enc.get("text"), "--index: meta.json: encoders['text']")


def resolve_text(recorded: dict | None, dim: int | None, given: str | None = None, *,
                 flag: str = "--text-encoder") -> dict:
    """Which encoder turns raw captions into features a run's text head takes:
    ``{"spec": str | None, "status", "reason": str | None, "record": dict | None}``.

    ``status``: ``recorded`` (the features' own encoder, available here), ``stated`` (named with
    ``flag`` where nothing is recorded), ``assumed`` (nothing recorded; the size ``dim`` matches a
    built-in encoder: shown as an assumption) or ``off`` (no usable encoder: ``reason`` says why;
    ``given == "none"`` turns it off). ``given`` is checked against the record: another encoder
    (identity or size) is a ValueError naming ``flag``.

    >>> resolve_text(None, 12)["status"], resolve_text(None, 384)["spec"]
    ('off', 'minilm')
    """
    return resolve("text", recorded, dim, given, flag=flag)


def resolve(kind: str, recorded: dict | None, dim: int | None, given: str | None = None, *,
            flag: str = "--text-encoder") -> dict:
    """:func:`resolve_text` for ``kind`` ``text`` (captions) or ``video`` (an uploaded video's frames or clip)."""
    if kind not in ("text", "video"):
        raise ValueError(f"kind: expected text or video, got {str(kind)[:40]!r}")
    recorded = check_record(_record_or_none(recorded, "recorded"), "recorded")
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 1):
        raise ValueError(f"dim: expected a positive integer or None, got {str(dim)[:40]!r}")
    if given is not None and not isinstance(given, str):
        raise TypeError(f"{flag}: expected an encoder spec, got {type(given).__name__}")
    what = "text encoder" if kind == "text" else "image encoder"
    if given == "none":
        return {"spec": None, "status": "off", "reason": f"{flag} none", "record": recorded}
    tokens = recorded is not None and recorded.get("level") == "tokens"  # the same encoder's token features
    if given is not None:
        mine = _as_tokens(stated(given, kind, dim, flag), tokens)
        if recorded is None:
            return {"spec": mine["spec"], "status": "stated", "reason": None, "record": mine}
        why = mismatch(recorded, mine)
        if why is not None:
            raise ValueError(f"{flag}: {why}; the features were made by {recorded['spec']}")
        if mine["spec"] != recorded["spec"]:  # another folder with the recorded hashes: stated, and checked
            return {"spec": mine["spec"], "status": "stated", "record": recorded,
                    "reason": f"{flag} {shown_spec(mine['spec'])}: a copy of the recorded {what} "
                              f"{shown_spec(recorded['spec'], recorded)} (the same weights and preprocessing)"}
        return {"spec": mine["spec"], "status": "recorded", "reason": None, "record": recorded}
    if recorded is not None:
        try:
            here = _as_tokens(stated(recorded["spec"], kind, dim, what), tokens)
        except ValueError as exc:
            return {"spec": None, "status": "off", "record": recorded,
                    "reason": f"the recorded {what} {shown_spec(recorded['spec'], recorded)} is not usable here "
                              f"({elide_paths(str(exc).removeprefix(what + ': '))}); name its copy with {flag} SPEC"}
        why = mismatch(recorded, here)
        if why is not None:
            return {"spec": None, "status": "off", "record": recorded,
                    "reason": f"the recorded {what} changed since the features were made ({elide_paths(why)})"}
        return {"spec": here["spec"], "status": "recorded", "reason": None, "record": recorded}
    builtin = "text" if kind == "text" else "image"
    guess = assumed_builtin(dim, builtin) if isinstance(dim, int) and not isinstance(dim, bool) else None
    side = "text" if kind == "text" else "video"
    if guess is not None:
        return {"spec": guess, "status": "assumed", "record": None,
                "reason": f"no {what} is recorded; the {dim}-d {side} features match the built-in {guess}, so it "
                          f"is assumed (state the right one with {flag} SPEC)"}
    shown = f"{dim}-d" if dim else "the"
    return {"spec": None, "status": "off", "record": None,
            "reason": f"no {what} is recorded, and {shown} {side} features match no built-in encoder "
                      f"(name the one that made them with {flag} SPEC)"}


def _as_tokens(record: dict, tokens: bool) -> dict:
    """A text encoder's record for its token-level features (``encode text --tokens``) where those were
    recorded: the encoder is the same, only the level differs."""
    return {**record, "level": "tokens", "normalized": False} if tokens else record


def recorded_video(meta: dict) -> dict | None:
    """The video (frame or clip) encoder an index's ``meta.json`` records (None: unknown)."""
    enc = meta.get("encoders") if isinstance(meta, dict) else None
    if not isinstance(enc, dict):
        return None
    return check_record(enc.get("video"), "--index: meta.json: encoders['video']")


def index_encoders(run: str | os.PathLike, given: str | None, text_dim: int | None) -> dict:
    """The ``meta.json`` keys of an index built from ``run``: ``text_encoder`` (the spec, or None when
    unknown), ``text_encoder_source`` (``recorded``; ``stated``: named with ``--text-encoder``, a copy of
    the recorded one or where none is recorded; ``none``: ``--text-encoder none``; None) and ``encoders`` (``{"text",
    "video"}`` records). ``given`` (``--text-encoder``) states the encoder of a run that records none,
    or names a local copy of the recorded one (refused when it is another encoder)."""
    recs = run_encoders(run)
    text, source = recs["text"], ("recorded" if recs["text"] is not None else None)
    if given == "none":  # stated as none: a consumer says so, not "nothing recorded"
        text, source = None, "none"
    elif given is not None:
        mine = stated(given, "text", text_dim, "--text-encoder")
        if text is not None:
            why = mismatch(text, mine)
            if why is not None:
                raise ValueError(f"--text-encoder: {why}; the run's features were made by {text['spec']}")
            if mine["spec"] != text["spec"]:
                source = "stated"  # a copy, checked by its hashes
            text = {**text, "spec": mine["spec"]}
        else:
            text, source = mine, "stated"
    return {"text_encoder": spec_of(text), "text_encoder_source": source,
            "encoders": {"text": text, "video": recs["video"]}}
