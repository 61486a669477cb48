"""``xmodal index``: export a trained run's video gallery as a FAISS index (bias folded in)."""

from __future__ import annotations

import argparse
import sys
import time


NAME = "index"
HELP = "export a FAISS index of videos encoded by a run, with its DN / NCL normaliser folded in"
DESCRIPTION = """Encode raw video/image features with a trained run's video head and write a
self-contained search index to --out (searched by 'xmodal query'):

  xmodal index --run RUN --data DIR --split test --out IDX [--normalizer selected]
  xmodal index --run RUN --video-features V.npy [--video-mask M.npy] [--expert NAME=NPY ...]
               --out IDX
  xmodal index --run RUN --data DIR --split test --out IDX --kind hnsw [--target-recall 0.95]

Kinds (faiss.index_factory, inner product): flat (exact; every vector as float32),
ivf (IVF cells, float32 vectors), ivfpq (IVF cells, each vector compressed to one byte
per 4 values), hnsw (a neighbour graph over float32 vectors). An approximate kind states
its quality: the build searches up to --recall-queries of the run's stored text
embeddings (held-out train texts through the text head, which no normaliser was fitted
on; runs from before: the train text bank) exactly and approximately, keeps the
smallest nprobe (ivf, ivfpq) or efSearch (hnsw) whose recall@10 reaches --target-recall,
and writes that recall, its sample size and the parameter into meta.json; 'xmodal query'
and 'xmodal serve' print it. When no setting reaches the target (ivfpq's compression
can cap the recall), the largest one tried is kept and a warning says so.

Memory: features are read memory-mapped, the gallery is embedded in blocks into a
temporary file beside --out (when large), the normaliser's gallery bias is fitted
blockwise and the index is filled block by block: the peak is the index plus one block.

Frame masks and experts: --data reads them from the data layout (names from S_videos.txt);
with --video-features give --video-mask / --expert / --expert-mask (features whose rows end
in all-zero frames are refused without a mask, unless --no-mask).

The run's test-time normaliser is folded into the index so that FAISS's inner
product is the normalised score: DN exactly (gallery y - lam mu_y, queries shifted
by -lam mu_x), NCL / Sinkhorn as the per-video bias b_j fitted on the run's stored
query bank against this gallery. QB-Norm, IS and DSL depend on each query's scores
against the whole gallery and cannot be folded: choose --normalizer none, dn,
sinkhorn or ncl for such runs; with --normalizer selected on such a run the
one the run's summary names for an index is used (metrics.json "index_normalizer": the
best foldable one clear of none on val, else none), and a note says why. DIR holds index.faiss,
query_shift.npy, meta.json and a copy of the run's checkpoint (for the text head), and for 'xmodal serve'
videos.npy (the gallery's video embeddings, float32 [V, D]: "more like this"; as large as a flat
index, whatever --kind) and, with --data (the layout's captions,
S_texts.tsv) or --texts FILE, texts.npy + texts.json (caption embeddings: video -> text search).

meta.json records the encoders of the run's features (from RUN/encoders.json or an export's
config.json): "text_encoder" is the spec 'query --captions' and 'serve' encode captions with,
null when unknown (then a text size matching a built-in encoder is shown as assumed, any other
means no text search by words); --text-encoder states it for a run that records none."""



def add_arguments(parser: argparse.ArgumentParser) -> None:
    from xmodal.commands import add_common_args

    parser.add_argument("--run", required=True, metavar="RUN",
                        help="run directory or checkpoint written by 'xmodal train', or a folder written "
                             "by 'xmodal export'")
    parser.add_argument("--video-features", metavar="NPY",
                        help="raw video/image features [V, Dv] or [V, F, Dv] (or --data DIR --split S)")
    from xmodal.commands import _video_inputs

    _video_inputs.add_arguments(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="index directory to write")
    parser.add_argument("--normalizer", default="selected", metavar="NAME",
                        help="selected (default: the run's choice on val), none, dn, sinkhorn or ncl")
    parser.add_argument("--names", metavar="TXT", default=None,
                        help="optional video names, one per line (printed by 'xmodal query')")
    parser.add_argument("--kind", default="flat", choices=("flat", "ivf", "ivfpq", "hnsw"),
                        help="flat: exact search (default); ivf, ivfpq, hnsw: approximate, with the recall "
                             "measured at build time (see above)")
    parser.add_argument("--target-recall", type=float, default=None, metavar="R",
                        help="recall@10 the approximate kinds' search parameter must reach (default 0.95)")
    parser.add_argument("--recall-queries", type=int, default=None, metavar="N",
                        help="stored text embeddings of the run the recall is measured on (default 1000, "
                             "at most the run's test_time.bank_size)")
    parser.add_argument("--nlist", type=int, default=None, metavar="N",
                        help="IVF cells of ivf / ivfpq (default 4 sqrt(videos), at most videos / 39)")
    parser.add_argument("--nprobe", type=int, default=None, metavar="N",
                        help="fix ivf / ivfpq's cells visited per query instead of choosing it by "
                             "--target-recall (the recall at N is still measured)")
    parser.add_argument("--ef-search", type=int, default=None, metavar="N",
                        help="fix hnsw's efSearch instead of choosing it by --target-recall")
    parser.add_argument("--text-encoder", default=None, metavar="SPEC",
                        help="the encoder of the run's caption features, for 'query --captions' and 'serve' "
                             "(default: the one the run records; for a run that records none, state it here, "
                             "else meta.json says unknown; another encoder than the recorded one is refused)")
    parser.add_argument("--texts", metavar="TXT", default=None,
                        help="captions for the search page's video -> text search, one per line (or a .tsv, "
                             "text last), encoded with --text-encoder; --data uses its split's captions "
                             "unless --texts is given")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing index in --out")
    add_common_args(parser, threads=None, progress=True)


def run(args: argparse.Namespace) -> int:
    from xmodal.commands import load_npy, progress_choice
    from xmodal.progress import Stages

    start = time.perf_counter()
    names = None
    if args.names:
        from xmodal.data.loaders import read_captions

        names = read_captions(args.names)
    from xmodal.commands import _video_inputs, load_run

    model = load_run(args.run)
    texts = None
    if args.data is not None:
        _video_inputs.check_no_flags(args)
        from xmodal.data import load_paired_split

        split = load_paired_split(args.data, args.split)
        feats, mask = _video_inputs.from_split(split, model)
        if names is None and split.video_names is not None:
            names = list(split.video_names)
        from xmodal.retrieval.search import caption_texts

        texts = caption_texts(split.captions, split.text, mask=split.text_mask, text_to_video=split.text_to_video)
    elif args.video_features is None:
        raise ValueError("--video-features: required (or --data DIR --split S)")
    else:
        feats, mask = _video_inputs.from_flags(args, model, lambda path, flag: load_npy(path, flag, mmap=True))
    _check_search_flags(args)
    from xmodal.retrieval.search import RECALL_QUERIES, write_index

    if args.texts is not None:
        from pathlib import Path

        from xmodal.data.loaders import read_captions
        from xmodal.retrieval.search import caption_texts, check_out, encode_captions

        check_out(Path(args.out), args.run, overwrite=args.overwrite)  # before the captions are encoded
        try:
            captions = read_captions(args.texts)
        except ValueError as exc:
            raise ValueError(f"--texts: {exc}") from None
        if not captions:
            raise ValueError(f"--texts: {args.texts} holds no caption")
        from xmodal.features.identity import index_encoders, resolve_text

        text_dim = model.architecture()["text"]["in_dim"]
        choice = resolve_text(index_encoders(args.run, args.text_encoder, text_dim)["encoders"]["text"], text_dim)
        if choice["spec"] is None:
            raise ValueError(f"--texts: no text encoder to encode them with: {choice['reason']}")
        if choice["status"] == "assumed":
            print(f"note: --texts: {choice['reason']}", file=sys.stderr)
        feats_t = encode_captions(model, captions, choice["spec"])
        texts = caption_texts(captions, *(feats_t if isinstance(feats_t, tuple) else (feats_t,)))
    if args.threads is None:  # faiss's OpenMP threads follow torch's (--threads)
        import torch

        _faiss_threads(torch.get_num_threads())
    else:
        _faiss_threads(args.threads)
    try:
        with Stages(show=progress_choice(args)) as stage:  # without a terminal: the stage every 30 s
            meta = write_index(args.run, feats, args.out, normalizer=args.normalizer, kind=args.kind, names=names,
                               text_encoder=args.text_encoder, overwrite=args.overwrite, video_mask=mask, log=stage,
                               texts=texts, target_recall=args.target_recall,
                               recall_queries=args.recall_queries or RECALL_QUERIES, nlist=args.nlist,
                               nprobe=args.nprobe, ef_search=args.ef_search)
    except (ValueError, TypeError) as exc:
        name, sep, rest = str(exc).partition(":")
        flags = {"normalizer": "--normalizer", "features": "--video-features", "texts": "--texts", "nlist": "--nlist",
                 "nprobe": "--nprobe", "ef_search": "--ef-search", "target_recall": "--target-recall",
                 "recall_queries": "--recall-queries"}
        if sep and name in flags:
            raise type(exc)(f"{flags[name]}:{rest}") from None
        raise
    recorded = (getattr(getattr(model, "test_time", None), "selection", None) or {}).get("index_note")
    if "fallback_from" in meta and recorded:  # the words of the run's own summary (metrics.json index_note)
        print(f"note: {recorded}", file=sys.stderr)
    elif "fallback_from" in meta:
        print(f"note: the run selected {meta['fallback_from']}, which depends on each query's scores against "
              f"the whole gallery and cannot be folded into an index; using {meta['normalizer']}, the best "
              f"foldable normaliser on val (--normalizer NAME to choose another)", file=sys.stderr)
    shown = f"; {meta['texts']} captions for video -> text" if meta.get("texts") else ""
    if meta.get("text_encoder") is not None:
        shown += f"; text encoder {meta['text_encoder']} ({meta.get('text_encoder_source')})"
    else:
        print("note: the run records no text encoder (meta.json text_encoder: null); 'query --captions' and "
              "'serve' assume a built-in one only where the text size matches it (state it with --text-encoder)",
              file=sys.stderr)
    print(f"wrote {args.out}: {meta['num_items']} videos x {meta['dim']} ({meta['kind']} index {meta['factory']}, "
          f"normaliser {meta['normalizer']} folded in{shown}; {time.perf_counter() - start:.1f} s)")
    print(recall_line(meta))
    if meta["target_met"] is False:
        print(f"warning: no {_param_word(meta)} reached the target recall@10 {meta['target_recall']:.3f}; the index "
              f"keeps the largest tried ({recall_line(meta, short=True)}); try --kind ivf or hnsw, or a lower "
              f"--target-recall", file=sys.stderr)
    elif meta["recall_at_10"] is None:
        print("note: this run stores no text embeddings, so the recall could not be measured", file=sys.stderr)
    return 0


def _param_word(meta: dict) -> str:
    return "efSearch" if meta["kind"] == "hnsw" else "nprobe"


def recall_line(meta: dict, *, short: bool = False) -> str:
    """``recall@10 0.953 (nprobe 32, measured on 1000 held-out queries; target 0.95)`` or ``exact``."""
    if meta.get("exact"):
        return "exact search: recall@10 1.000 by construction"
    params = ", ".join(f"{k} {v}" for k, v in (meta.get("search_params") or {}).items())
    if meta.get("recall_at_10") is None:
        return f"recall@10 not measured ({params})"
    text = f"recall@10 {meta['recall_at_10']:.3f} at {params}"
    if short:
        return text
    target = "" if meta.get("target_recall") is None else f"; target {meta['target_recall']:.3f}"
    return f"{text} (measured on {meta['recall_queries']} queries: {meta.get('recall_source') or 'stored texts'} " \
           f"of the run{target})"


def _check_search_flags(args: argparse.Namespace) -> None:
    kind = args.kind
    if args.nprobe is not None and kind not in ("ivf", "ivfpq"):
        raise ValueError(f"--nprobe: only for --kind ivf / ivfpq (this is {kind}"
                         + ("; hnsw takes --ef-search)" if kind == "hnsw" else ")"))
    if args.ef_search is not None and kind != "hnsw":
        raise ValueError(f"--ef-search: only for --kind hnsw (this is {kind})")
    if args.nlist is not None and kind not in ("ivf", "ivfpq"):
        raise ValueError(f"--nlist: only for --kind ivf / ivfpq (this is {kind})")
    if args.target_recall is not None:
        if kind == "flat":
            raise ValueError("--target-recall: a flat index is exact; give --kind ivf, ivfpq or hnsw")
        if not 0 < args.target_recall <= 1:
            raise ValueError(f"--target-recall: must lie in (0, 1], got {args.target_recall}")
        if args.nprobe is not None or args.ef_search is not None:
            raise ValueError("--target-recall: give a target recall or a fixed --nprobe / --ef-search, not both")
    if args.recall_queries is not None and args.recall_queries < 1:
        raise ValueError(f"--recall-queries: must be >= 1, got {args.recall_queries}")


def _faiss_threads(n: int) -> None:
    try:
        import faiss
    except ImportError:  # the write reports the missing extra
        return
    faiss.omp_set_num_threads(max(1, int(n)))
