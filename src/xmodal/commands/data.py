"""``xmodal data import|check``: build and check the paired-split layout."""

from __future__ import annotations

import argparse

NAME = "data"
HELP = "import a table of (video, caption) pairs into the data layout, or check a data directory"
DESCRIPTION = """Your own data in the layout xmodal train reads (docs/data.md, "Your data"):

  xmodal data import pairs.csv --features feats/ --out mydata [--split train] [--text-features T.npy]
  xmodal data import --format msrvtt msrvtt_data/ --features feats/ --out msrvtt    (a benchmark's own files)
  xmodal data import pairs.csv --features img.npy --ids images.txt --out mydata     (encode images' array)
  xmodal data import --format coco dataset_coco.json --images coco/ --model hf:DIR --text-model hf:DIR --out coco
                     [--expert audio=audio_feats/ --expert flow='flow/*.npy' ...] [--max-frames N]
  xmodal data check mydata [--split train ...] [--config CONFIG]
  xmodal data synthetic --out synth [--seed 0]

synthetic: writes the embedded default dataset (xmodal.data.synthetic: train 2,000 videos x 3
captions, val and test 500 videos) as a layout, the splits 'data.name: synthetic' generates for
train.seed = --seed, so every command that reads a data folder can be tried on it.

import: pairs.csv (header: video_id,caption[,split]; UTF-8 with or without BOM, ',' or ';')
or pairs.jsonl (clips inside long videos: header
video_id,clip_id[,start,end],caption: the clips are the rows, features per clip
feats/<clip_id>.npy, and {split}_video_to_group.npy + {split}_groups.txt hold the long
videos; clips ordered by start within their video); per-video features feats/<video_id>.npy or .npz ([D] or [F, D], any number
of frames: padded + mask; --max-frames N samples longer videos uniformly), or a glob
('feats/*.npy'); captions encoded with --text-model (MiniLM by default; hf:DIR) unless
--text-features gives a .npy with one row per pair. The encoders that made the features (the
--features folder's encoder.json, --text-features' OUT.encoder.json, --text-model) are recorded
in DATA/encoders.json, which 'train' carries into the run. Every feature file is looked up before any caption is encoded; a video id is its
feature file's stem (feats/clip1.npy for clip1.mp4), and --skip-missing drops (and names) the
rows of videos without one. --dtype float16 stores the features as float16. Features are
streamed one video at a time into the split's arrays. Built in a temporary folder and renamed to --out at the end: a failure leaves
nothing, a re-import replaces every file of the previous one; an --out holding other files
is refused.
--format NAME reads a benchmark's own files (coco, flickr30k: Karpathy's split JSON; msrvtt, msvd,
didemo, activitynet, lsmdc: the files CLIP4Clip and Collaborative Experts distribute) into the same
rows a pairs table gives, with the benchmark's standard splits; what a file lacks is named in one line.
check: lists every problem at once, naming file, row and video (missing files, shapes,
dtypes, NaN, ids out of range, videos without captions, padding without a mask, relevancy
outside [0, 1], feature sizes or experts that differ between splits, videos in two splits,
split names the config does not read) and a summary per split; exit code 1 if there are
problems."""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from xmodal.commands import add_common_args

    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    imp = sub.add_parser("import", help="pairs table + per-video feature files -> data layout")
    imp.add_argument("pairs", metavar="PAIRS_OR_SOURCE",
                     help=".csv (header row) or .jsonl of (video_id, caption[, split]); with --format, the "
                          "benchmark's folder (coco / flickr30k: also the Karpathy JSON itself)")
    from xmodal.data.formats import FORMATS

    imp.add_argument("--format", default=None, choices=tuple(FORMATS), metavar="NAME",
                     help=f"read a benchmark's own files instead of a table: {', '.join(FORMATS)} (their "
                          "standard splits; docs/data.md, 'Benchmark formats')")
    imp.add_argument("--features", default=None,
                     help="directory of <video_id>.npy/.npz, a glob, or one [N, D] .npy ('encode images' output; "
                          "its rows named by --ids)")
    imp.add_argument("--images", default=None, metavar="DIR",
                     help="instead of --features: encode the table's images found in DIR with --model (COCO's "
                          "filepath/filename, else DIR/<id>.jpg|png|...), then import them")
    imp.add_argument("--model", default=None, metavar="SPEC",
                     help="with --images: the image encoder (efficientnet-lite0 by default, hf:DIR, a registered "
                          "name); its record goes into DATA/encoders.json")
    imp.add_argument("--ids", default=None, metavar="LIST_OR_DIR",
                     help="with --features FILE.npy: the --list file (or the --dir folder) 'encode images' read, "
                          "naming the array's rows in order (an id is the image's file stem)")
    imp.add_argument("--out", required=True, help="output data directory")
    imp.add_argument("--split", default="train", help="split of rows without a split column (default: train)")
    imp.add_argument("--text-features", default=None,
                     help=".npy [rows, Dt] aligned with the table (default: encode captions with MiniLM)")
    imp.add_argument("--text-model", default="minilm", metavar="SPEC",
                     help="text encoder spec of the captions when --text-features is not given: minilm (default), "
                          "hf:DIR or a registered name (recorded in DATA/encoders.json)")
    imp.add_argument("--expert", action="append", default=[], metavar="NAME=DIR_OR_GLOB",
                     help="a further expert's per-video files (repeatable) -> {split}_video_features.NAME.npy; "
                          "videos without a file are masked in {split}_video_mask.NAME.npy")
    imp.add_argument("--max-frames", type=_positive, default=None, metavar="N",
                     help="sample longer videos uniformly to N frames (the middle frame of N equal "
                          "segments; experts too), so one long video does not pad the whole split")
    imp.add_argument("--skip-missing", action="store_true",
                     help="drop (and name) the rows of videos that have no feature file, instead of refusing "
                          "the table (a video id is its feature file's stem: feats/<video_id>.npy)")
    imp.add_argument("--dtype", choices=("float32", "float16"), default="float32",
                     help="stored dtype of the video, expert and text features (default float32; float16 "
                          "halves the files, training reads them as they are)")
    add_common_args(imp, threads=None, progress=True)
    chk = sub.add_parser("check", help="list every problem of a data directory and summarise it")
    chk.add_argument("root", help="data directory")
    chk.add_argument("--split", action="append", default=None, help="split(s) to check (default: all found)")
    chk.add_argument("--config", default=None, metavar="YAML",
                     help="the training config: its data.train_split / val_split / test_split are the "
                          "split names expected (default train, val, test)")
    add_common_args(chk, threads=None, progress=False)
    syn = sub.add_parser("synthetic", help="write the embedded synthetic default dataset as a data layout")
    syn.add_argument("--out", required=True, help="output data directory (new, or one written by this command)")
    syn.add_argument("--seed", type=int, default=0, help="the generator's seed (train.seed of a synthetic run)")
    add_common_args(syn, threads=None, progress=False)


def summarize(arrays: dict) -> list[str]:
    """Former home of :func:`xmodal.data.check.summarize`."""
    from xmodal.data.check import summarize as _summarize

    return _summarize(arrays)


def _import(rows: list[dict], hints: dict, kind: str | None, args: argparse.Namespace, options: dict) -> dict:
    """:func:`xmodal.data.importer.import_rows` of ``rows``; with ``--images``, the table's images are
    first encoded into one array in a scratch folder beside ``--out`` (removed at the end)."""
    import os
    import shutil
    from pathlib import Path

    from xmodal.data.importer import import_rows

    if args.images is None:
        return import_rows(rows, **options, kind=kind)
    from xmodal.data.imagedir import encode_collection, image_files

    ids = list(dict.fromkeys(r["video"] for r in rows))
    files = image_files(args.images, ids, hints, allow_missing=args.skip_missing)
    out = Path(args.out)
    scratch = out.parent / f".{out.name}.images-{os.getpid()}"
    try:
        array, listing = encode_collection(files, model=args.model or "efficientnet-lite0", scratch=scratch,
                                           progress=options["progress"])
        return import_rows(rows, **{**options, "features": str(array), "ids": str(listing)}, kind="images")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _configured(path: str | None) -> tuple[str, ...] | None:
    if path is None:
        return None
    from xmodal.config import load_config

    try:
        cfg = load_config(path)
    except (ValueError, TypeError, OSError) as exc:
        msg = str(exc)
        raise ValueError(f"--config: {msg[len('config: '):] if msg.startswith('config: ') else msg}") from None
    d = cfg.data
    return tuple(s for s in (d.train_split, d.val_split, d.test_split) if s)


def check(root: str, splits: list[str] | None = None) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """``({split: problems}, {split: summary lines})`` for every split of ``root``
    (cross-split problems: :func:`xmodal.data.check.check_directory`)."""
    from xmodal.data.check import check_directory

    res = check_directory(root, splits)
    return res["problems"], res["summaries"]


def run(args: argparse.Namespace) -> int:
    if args.action == "synthetic":
        from xmodal.data.synthetic import write_synthetic

        if args.seed < 0:
            raise ValueError(f"--seed: expected a non-negative integer, got {args.seed}")
        splits = write_synthetic(args.out, seed=args.seed)
        for name, split in splits.items():
            print(f"{name}: {split.num_videos} videos, {split.num_texts} texts")
        print(f"wrote {args.out} (train on it with: xmodal train configs/synthetic.yaml --out RUN "
              f"data.name=paired data.root={args.out})")
        return 0
    if args.action == "import":
        from xmodal.data.importer import parse_experts

        encode, records = None, None
        if args.text_features is None:
            from xmodal.features.encoders import encode_text, identity_of

            try:
                records = {"text": identity_of(args.text_model, "text")}
            except ModuleNotFoundError as exc:
                raise ValueError(f"--text-model: {exc}") from None
            except ValueError as exc:
                raise ValueError(f"--text-model: {str(exc).removeprefix('model: ')}") from None

            def encode(captions):
                try:
                    return encode_text(captions, model=args.text_model, progress=False)
                except ModuleNotFoundError as exc:  # a missing optional extra is a user error
                    raise ValueError(f"--text-model: {exc}") from None
        experts = parse_experts(args.expert)
        from xmodal.commands import progress_choice

        options = {"features": args.features, "out": args.out, "split": args.split,
                   "text_features": args.text_features, "encode": encode, "experts": experts,
                   "max_frames": args.max_frames, "skip_missing": args.skip_missing, "dtype": args.dtype,
                   "progress": progress_choice(args), "encoders": records, "ids": args.ids}
        if (args.features is None) == (args.images is None):
            raise ValueError("--features / --images: give one (per-item features, one array with --ids, or a "
                             "folder of images to encode)")
        if args.model is not None and args.images is None:
            raise ValueError("--model: only with --images (the encoder of the images encoded here)")
        if args.images is not None and args.ids is not None:
            raise ValueError("--ids: not with --images (the rows of the encoded images are named here)")
        where = {}
        if args.format is not None:
            from xmodal.data.formats import read_format

            found = read_format(args.format, args.pairs)
            where = found.splits
            for note in found.notes:
                print(f"{args.format}: {note}")
            rows, hints, kind = found.rows, found.files, found.kind
        else:
            from xmodal.data.importer import read_pairs

            rows, hints, kind = read_pairs(args.pairs), {}, None
        summary = _import(rows, hints, kind, args, options)
        kind = next(iter(summary.values()))["kind"]
        notes = []
        first = next(iter(summary.values()))
        if first.get("missing"):
            missing = first["missing"]
            lacking = "a row" if args.ids is not None else "a feature file"
            lacking = "an image file" if args.images is not None else lacking
            print(f"skipped {len(missing)} {kind[:-1]}(s) without {lacking} in {args.features or args.images} "
                  f"({first['dropped_rows']} row(s) dropped): {', '.join(missing[:10])}"
                  f"{' ...' if len(missing) > 10 else ''}")
        for split, s in summary.items():
            if s.get("groups") is not None:  # a clip table: the rows are clips of longer videos
                print(f"{split}: {s['videos']} clips in {s['groups']} groups (long videos), {s['texts']} texts, "
                      f"up to {s['max_frames']} frames per clip")
            else:
                frames = f", up to {s['max_frames']} frames per video" if kind == "videos" else ""
                source = f" ({where[split]})" if split in where else ""
                print(f"{split}: {s['videos']} {kind}, {s['texts']} texts{frames}{source}")
            for expert, n in s["experts"].items():
                print(f"  expert {expert}: {n} of {s['videos']} videos")
            if s.get("frames_note"):
                print(f"  note: {s['frames_note']}")
            notes = s.get("notes", [])
        for note in notes:
            print(f"note: {note}")
        from xmodal.features.identity import read_encoders

        known = read_encoders(args.out) or {}
        named = ", ".join(f"{k} {known[k]['spec']}" for k in ("video", "text") if known.get(k))
        print(f"encoders: {named or 'none recorded'} ({args.out}/encoders.json)")
        print(f"wrote {args.out}, {args.dtype} features (check it with: xmodal data check {args.out})")
        return 0
    from xmodal.commands import progress_choice
    from xmodal.data.check import check_directory

    res = check_directory(args.root, args.split, _configured(args.config), progress=progress_choice(args))
    total = 0
    for split, lines in res["summaries"].items():
        print(f"[{split}]")
        for line in lines:
            print(f"  {line}")
        for p in res["problems"][split]:
            print(f"  PROBLEM: {p}")
        total += len(res["problems"][split])
    if res["across"]:
        print("[across splits]")
        for p in res["across"]:
            print(f"  PROBLEM: {p}")
        total += len(res["across"])
    for note in res["notes"]:
        print(f"note: {note}")
    print(f"{total} problem(s)" if total else "ok: no problems")
    return 1 if total else 0
