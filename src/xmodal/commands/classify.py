"""``xmodal classify``: zero-shot classification of an image / video layout with labels."""

from __future__ import annotations

import argparse
import json

NAME = "classify"
HELP = "zero-shot classification (class names x prompt templates) with and without DN: top-1 / top-5"
DESCRIPTION = """Zero-shot classification of a labelled split (docs/evaluation.md, "Zero-shot
classification"): every class name is put into prompt templates, the prompts are encoded by the
text tower of the encoder that made the features, averaged per class as CLIP does (normalise each, mean, renormalise), and each image / video
is assigned its most similar classes (cosine; ties pessimistic). Reported: top-1 / top-5 as they are
and with DN (Zhou et al. 2023, Sec. 4.1; Table 2's protocol: the image mean from 100 random unlabeled
items of --dn-split, the text mean from the class embeddings, lambda 0.25, 5 sampling seeds: mean and
std; plus the DN whose mean averages the seeds' means, whose per-query ranks are written).

  xmodal classify --data DATA --split test --classes classes.txt --out runs/zs_clip
                  [--templates clip|photo|FILE] [--text-model hf:DIR] [--dn-split val]
  xmodal compare runs/zs_photo runs/zs_clip          (two such runs, paired query by query)

DATA holds S_video_features.npy (or S_image_features.npy; frames are averaged over the real ones)
and S_video_labels.npy (int class per item); --classes names label i on line i. --text-model
defaults to the image encoder DATA/encoders.json records when it is an hf: folder (CLIP, SigLIP);
another encoder's weights are refused. --out gets metrics.json (with the protocol card),
per_query.npz and class_embeddings.npy, written at the end (a failed run keeps the last good one)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from xmodal.commands import add_common_args

    parser.add_argument("--data", required=True, help="layout with S_video_features.npy and S_video_labels.npy")
    parser.add_argument("--split", default="test", help="the split classified (default test)")
    parser.add_argument("--classes", required=True, metavar="FILE", help="class names, one per line (line i = label i)")
    parser.add_argument("--templates", default="clip", metavar="clip|photo|FILE",
                        help="prompt templates: clip (CLIP's 80 ImageNet prompts, default), photo ('a photo of a "
                             "{}.') or a file with one template per line, each with one {}")
    parser.add_argument("--text-model", default=None, metavar="SPEC",
                        help="text encoder of the prompts (default: the image encoder DATA/encoders.json records, "
                             "when it is an hf: folder); minilm, hf:DIR or a registered name")
    parser.add_argument("--dn-split", default="val", metavar="S",
                        help="split whose unlabeled items give DN's image mean (default val; 'none': no DN; the "
                             "classified split itself is marked as using the test queries)")
    parser.add_argument("--dn-lam", type=float, default=0.25, help="DN's lambda (default 0.25, the paper's)")
    parser.add_argument("--dn-num-samples", type=int, default=100,
                        help="items drawn per seed for the image mean (default 100, the paper's)")
    parser.add_argument("--dn-seeds", type=int, default=5, help="sampling seeds (default 5, the paper's)")
    parser.add_argument("--dn-seed", type=int, default=0, help="the first sampling seed (default 0)")
    parser.add_argument("--out", required=True, help="the run folder written (new, or an earlier classify run)")
    parser.add_argument("--json", action="store_true", help="print metrics.json instead of the table")
    add_common_args(parser, threads=None, progress=False)


def _text_encoder(spec: str | None, data: str, dim: int) -> tuple[str, dict]:
    from xmodal.features import identity

    recorded = (identity.read_encoders(data, "--data") or {}).get("video")
    if spec is None:
        if recorded is None or not str(recorded.get("spec", "")).startswith("hf:"):
            what = f"records {recorded['spec']}" if recorded else "records no image encoder"
            raise ValueError(f"--text-model: name the text tower of the encoder that made the features "
                             f"(e.g. hf:DIR); {data}/encoders.json {what}")
        spec = recorded["spec"]
    record = identity.stated(spec, "text", dim, "--text-model")
    if recorded is not None and recorded.get("weights_sha256") and record.get("weights_sha256") \
            and recorded["weights_sha256"] != record["weights_sha256"]:
        raise ValueError(f"--text-model: {spec} has other weights than {recorded['spec']}, the encoder that made "
                         f"the features (SHA-256 {record['weights_sha256'][:12]}... vs "
                         f"{recorded['weights_sha256'][:12]}...)")
    return spec, {"text": record, "video": recorded}


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from xmodal.classify.run import DIRECTION, TASK, classify, collection_kind, read_labelled
    from xmodal.classify.templates import TEMPLATE_SETS, get_templates, read_class_names
    from xmodal.features.encoders import encode_text
    from xmodal.metrics.formatting import markdown_table

    for flag, value, low in (("--dn-num-samples", args.dn_num_samples, 1), ("--dn-seeds", args.dn_seeds, 1),
                             ("--dn-seed", args.dn_seed, 0)):
        if value < low:
            raise ValueError(f"{flag}: expected an integer >= {low}, got {value}")
    if not args.dn_lam >= 0 or args.dn_lam == float("inf"):
        raise ValueError(f"--dn-lam: expected a finite number >= 0, got {args.dn_lam}")
    names = read_class_names(args.classes)
    templates = get_templates(args.templates)
    x, _ = read_labelled(args.data, args.split, need_labels=False)
    spec, records = _text_encoder(args.text_model, args.data, int(x.shape[1]))

    def encode(prompts):
        try:
            return encode_text(prompts, model=spec, progress=False)
        except ModuleNotFoundError as exc:
            raise ValueError(f"--text-model: {exc}") from None

    tname = args.templates if args.templates in TEMPLATE_SETS else Path(args.templates).name
    m = classify(args.data, split=args.split, class_names=names, templates=templates, encode=encode, out=args.out,
                 dn_split=None if args.dn_split == "none" else args.dn_split, dn_lam=args.dn_lam,
                 dn_num_samples=args.dn_num_samples, dn_seeds=args.dn_seeds, dn_seed=args.dn_seed,
                 encoders=records, templates_name=tname)
    if args.json:
        print(json.dumps(m, indent=2, sort_keys=True))
        return 0
    r = m[args.split]
    kind = collection_kind(args.data, args.split)
    print(f"{TASK} of {args.data} {args.split}: {r['protocol']['num_queries'][DIRECTION]} {kind}, {len(names)} classes, "
          f"{len(templates)} template(s) per class ({tname}), text encoder {spec}")
    rows = [["none", f"{r['none'][DIRECTION]['top1']:.2f}", f"{r['none'][DIRECTION]['top5']:.2f}"]]
    if "dn" in r:
        p = r["dn_protocol"]
        rows.append([f"dn (mean of the {p['seeds']} seeds' means)", f"{r['dn'][DIRECTION]['top1']:.2f}",
                     f"{r['dn'][DIRECTION]['top5']:.2f}"])
        s = r["dn_seeds"]
        rows.append([f"dn, {p['seeds']} seeds: mean ± std (DN Table 2)",
                     f"{s['top1']['mean']:.2f} ± {s['top1']['std']:.2f}", f"{s['top5']['mean']:.2f} ± {s['top5']['std']:.2f}"])
    print(markdown_table(["normaliser", "top-1", "top-5"], rows))
    if "dn" in r:
        p = r["dn_protocol"]
        print(f"DN: image mean from {p['num_samples']} of the {p['of']} unlabeled {p['mean_from']} items per seed, "
              f"text mean from {p['gallery_mean']}, lambda {p['lam']}"
              + (" (the classified split itself: uses the test queries)" if p["mean_from"] == args.split else ""))
    for note in m["notes"]:
        print(f"note: {note}")
    print(f"wrote {args.out} (compare two such runs with: xmodal compare RUN_A RUN_B)")
    return 0
