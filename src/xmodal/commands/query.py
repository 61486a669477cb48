"""``xmodal query``: search an index written by ``xmodal index`` with texts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


NAME = "query"
HELP = "search an 'xmodal index' with caption features or raw captions; prints the top-k videos"
DESCRIPTION = """Search an index written by 'xmodal index' with text:

  xmodal query --index DIR --text-features T.npy --k 10
  xmodal query --index DIR --captions "a dog runs on grass" "two people cook" --k 5

Caption features go through the run's text head (copied into DIR); raw captions are
first encoded offline with the index's text encoder: the one recorded with the features
(meta.json "text_encoder"; --text-encoder names a local copy of it, another encoder is
refused), else, for a text size that matches a built-in encoder, that one, printed as
assumed; otherwise --captions is refused (give --text-features, or --text-encoder SPEC).
--text-features beside an OUT.encoder.json of another encoder is refused too. Scores are the run's normalised text -> video scores (the normaliser
folded into the index). With a flat index the top-k equals brute force over all
videos; an approximate index (ivf, ivfpq, ivfpqr, hnsw) returns, on average, the share of the
true top-10 that 'xmodal index' measured and stored (recall@10, printed below the
results). --nprobe N (ivf, ivfpq, ivfpqr) or --ef-search N (hnsw) trades speed for recall
(the stored recall then no longer applies); --exact searches exactly (ivf: every
cell; hnsw: its stored vectors; not ivfpq / ivfpqr, which keep only compressed vectors)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from xmodal.commands import add_common_args

    parser.add_argument("--index", required=True, metavar="DIR", help="directory written by 'xmodal index'")
    parser.add_argument("--text-features", metavar="NPY", help="raw caption features [T, Dt] or tokens [T, L, Dt]")
    parser.add_argument("--text-mask", metavar="NPY", help="bool or 0/1 [T, L], True = real token, of token "
                        "features (written by 'xmodal encode text --tokens')")
    parser.add_argument("--captions", nargs="+", metavar="TEXT", help="raw captions to encode and search")
    parser.add_argument("--k", type=int, default=10, help="results per query (default 10)")
    parser.add_argument("--text-encoder", default=None, metavar="SPEC",
                        help="--captions: the recorded encoder's spec here (e.g. hf:DIR of a moved folder), or the "
                             "encoder of an index that records none")
    parser.add_argument("--device", default="auto", metavar="DEV",
                        help="--captions through an hf:DIR / open_clip:DIR encoder: auto (CUDA when present, else "
                             "CPU; default), cpu, cuda, cuda:N")
    parser.add_argument("--out", metavar="NPY", default=None,
                        help="save the indices [T, k] (int64) here, the scores to OUT with .scores.npy, and print "
                             "a summary instead of the table (--json still prints every result)")
    parser.add_argument("--nprobe", type=int, default=None, metavar="N",
                        help="ivf / ivfpq / ivfpqr index: cells visited per query instead of the measured setting")
    parser.add_argument("--ef-search", type=int, default=None, metavar="N",
                        help="hnsw index: efSearch instead of the measured setting")
    parser.add_argument("--exact", action="store_true",
                        help="exact search of an approximate index (ivf: every cell; hnsw: the stored vectors)")
    parser.add_argument("--json", action="store_true", help="print results as JSON (with the recall)")
    add_common_args(parser, threads=None, progress=True)


def _outputs(out: str) -> tuple[Path, Path]:
    """The files ``--out`` names (indices, then scores), refused before any work if one is a folder or a link."""
    path = Path(out if out.endswith(".npy") else out + ".npy")  # np.save's naming, kept
    paths = (path, Path(str(Path(out).with_suffix("")) + ".scores.npy"))
    for p in paths:
        if p.is_dir() or p.is_symlink():
            raise ValueError(f"--out: {p} is a {'directory' if p.is_dir() else 'symbolic link'}; "
                             f"give the .npy file to write")
    return paths


def run(args: argparse.Namespace) -> int:
    from xmodal.commands import progress_enabled
    from xmodal.commands import load_npy

    if (args.text_features is None) == (args.captions is None):
        raise ValueError("--text-features: give exactly one of --text-features or --captions")
    if args.k < 1:
        raise ValueError(f"--k: must be >= 1, got {args.k}")
    if getattr(args, "text_mask", None) and args.text_features is None:
        raise ValueError("--text-mask: only with --text-features")
    from xmodal.retrieval.index import MAX_EF_SEARCH, MAX_NPROBE

    for flag, value, most in (("--nprobe", args.nprobe, MAX_NPROBE), ("--ef-search", args.ef_search, MAX_EF_SEARCH)):
        if value is not None and not 1 <= value <= most:
            raise ValueError(f"{flag}: must be in [1, {most}] (at most {most}), got {value}")
    if args.exact and (args.nprobe is not None or args.ef_search is not None):
        raise ValueError("--exact: give --exact or --nprobe / --ef-search, not both")
    from xmodal.commands._device import check_placed, query_device

    device = query_device(getattr(args, "device", "auto"))
    outputs = _outputs(args.out) if args.out else None
    from xmodal.retrieval.search import SearchIndex

    idx = SearchIndex(args.index)
    kind = idx.index.kind
    if args.nprobe is not None and kind not in ("ivf", "ivfpq", "ivfpqr"):
        raise ValueError(f"--nprobe: only for ivf / ivfpq indexes; {args.index} is {kind}"
                         + (" (use --ef-search)" if kind == "hnsw" else ""))
    if args.ef_search is not None and kind != "hnsw":
        raise ValueError(f"--ef-search: only for hnsw indexes; {args.index} is {kind}")
    if args.exact and kind in ("ivfpq", "ivfpqr"):
        raise ValueError(f"--exact: {args.index} is an {kind} index, which stores only compressed vectors, so no "
                         f"search of it is exact; build a flat, ivf or hnsw index for exact answers")
    search_kw = {"nprobe": args.nprobe, "ef_search": args.ef_search, "exact": args.exact}
    quality = idx.quality(**search_kw)
    choice = None
    if args.captions is not None:
        choice = idx.text_encoder(args.text_encoder)
        if choice["spec"] is None:
            raise ValueError(f"--captions: no text encoder for this index: {choice['reason']}")
        check_placed(device, [choice["spec"]])
        try:
            feats = idx.encode_captions(args.captions, text_encoder=args.text_encoder,
                                        progress=progress_enabled(args), device=device)
        except ValueError as exc:
            if str(exc).startswith("text encoder"):
                raise ValueError(f"--captions: {exc}") from None
            raise
        labels = list(args.captions)
    else:
        if args.text_encoder is not None:
            raise ValueError("--text-encoder: only with --captions (--text-features carry their own OUT.encoder.json)")
        if device is not None:
            raise ValueError("--device: only with --captions (--text-features are already encoded)")
        _check_features_encoder(idx, args.text_features)
        feats = load_npy(args.text_features, "--text-features")
        labels = [f"text {i}" for i in range(len(feats))]
        if getattr(args, "text_mask", None):
            from xmodal.data.types import token_mask

            feats = (feats, token_mask(load_npy(args.text_mask, "--text-mask")))
    try:
        scores, indices = idx.search(feats, args.k, **search_kw)
    except (ValueError, TypeError) as exc:
        msg = str(exc)
        if msg.startswith("features:"):
            msg = ("--captions: " if args.captions else "--text-features: ") + msg[len("features:"):].strip()
        elif msg.startswith("text_mask:"):
            msg = ("--captions: " if args.captions else "--text-mask: ") + msg[len("text_mask:"):].strip()
        raise type(exc)(msg) from None
    if outputs is not None:
        from xmodal.runs import atomic_save_npy

        for path, array in zip(outputs, (indices, scores)):
            atomic_save_npy(path, array)
    if args.json:
        print(json.dumps({"normalizer": idx.meta.get("normalizer"), "k": args.k, "kind": kind,
                          "text_encoder": None if choice is None else choice["spec"],
                          "text_encoder_status": None if choice is None else choice["status"],
                          "exact": quality["exact"], "recall_at_10": quality["recall_at_10"],
                          "recall_queries": quality["recall_queries"], "search_params": quality["search_params"],
                          "indices": indices.tolist(), "scores": scores.tolist()}, indent=2))
        return 0
    if outputs is not None:  # the results are in the files: a summary, not one table row per result
        found = int((indices >= 0).sum())
        print(f"wrote {outputs[0]} (video rows [{len(labels)}, {args.k}], int64; -1 = none) and {outputs[1]} "
              f"(scores, float32): {len(labels):,} queries x top {args.k} against {idx.index.num_items:,} videos, "
              f"{found:,} results")
        print(f"(normaliser {idx.meta.get('normalizer')} folded in; {quality['note']})")
        return 0
    from xmodal.commands import markdown_table

    rows = []
    for label, row_s, row_i in zip(labels, scores, indices):
        for rank, (s, j) in enumerate(zip(row_s, row_i), 1):
            name = idx.names[j] if idx.names is not None and j >= 0 else str(j)
            rows.append([label if rank == 1 else "", rank, name, f"{s:.4f}"])
    from xmodal.features.identity import shown_spec
    from xmodal.serve.images import gallery_kind

    items = gallery_kind(idx.meta)  # "images" or "videos", by the gallery's recorded encoder
    print(markdown_table(["query", "rank", items[:-1], "score"], rows))
    encoder = "" if choice is None else f"; text encoder {shown_spec(choice['spec'])} ({choice['status']})"
    print(f"({len(labels)} queries against {idx.index.num_items} {items}; normaliser "
          f"{idx.meta.get('normalizer')} folded in; {quality['note']}{encoder})")
    if choice is not None and choice["status"] == "assumed":
        print(f"note: {choice['reason']}")
    return 0


def _check_features_encoder(idx, path: str) -> None:
    """--text-features made by another encoder than the index records: refused in one line."""
    from xmodal.features.identity import mismatch, read_sidecar, recorded_text

    mine = read_sidecar(path, "--text-features")
    why = mismatch(recorded_text(idx.meta), mine)
    if why is not None:
        raise ValueError(f"--text-features: {why} (its {Path(path).name}.encoder.json against the index's meta.json)")
