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
per 4 values), ivfpqr (IVF cells, 4-bit fast-scan codes that shortlist 8x the results
asked for, re-ranked by one byte per value: about a third of ivf's memory), hnsw (a
neighbour graph over float32 vectors), opq (a learned rotation, OPQ, then one byte per
sub-quantiser: the compressed index autofaiss builds for a memory budget).
--max-memory SIZE chooses among them for the index file's size: flat alone where it fits,
else the largest of each compressed kind that fits (predicted from FAISS's layout) is built
and measured at the best recall@10 it reaches (its setting doubled until the recall stops
growing; with --target-recall, at that target instead), the best whose written file fits
is kept, and the choice, why, and the next budget up are printed. The ivf kinds choose their cell count by
measurement unless --nlist is given (sqrt(N), 2 sqrt(N) or 4 sqrt(N): the fewest
vectors compared per query that reach the target). An approximate kind states
its quality: the build searches up to --recall-queries of the run's stored text
embeddings (held-out train texts through the text head, which no normaliser was fitted
on; runs from before: the train text bank) exactly and approximately, keeps the
smallest nprobe (ivf kinds) or efSearch (hnsw) whose recall@10 reaches --target-recall,
and writes that recall, its sample size and the parameter into meta.json, with the whole
curve it measured (each setting's recall@10 and queries/s, printed too); 'xmodal query'
and 'xmodal serve' print the recall. When no setting reaches the target (ivfpq's
compression or hnsw's graph can cap the recall), the fastest setting within 0.005 of the
best recall measured is kept and a warning says what to do for that kind.

Memory: features are read memory-mapped, the gallery is embedded in blocks into a
temporary file beside --out (when large), the normaliser's gallery bias is fitted
blockwise and the index is filled block by block: the peak is the index plus one block.

Frame masks and experts: --data reads them from the data layout (names from S_videos.txt);
with --video-features give --video-mask / --expert / --expert-mask (features whose rows end
in all-zero frames are refused without a mask, unless --no-mask).

Which normaliser is folded (--normalizer auto, the default): the run's choice among the
foldable ones (metrics.json "index_normalizer"), only where it serves text -> video on this
gallery. The build fits it on a seeded sample of the gallery and ranks the run's held-out
train captions (no normaliser was fitted on them; their videos added to the gallery as if it
held them) with and without it, in stages (32 captions on 1,000 rows, 128 on 8,000, all on
50,000: a stage where it is clearly worse than none ends the measurement); it is folded
only when clear of none by the paired rule (the lower end of the 95% paired bootstrap
interval of t2v R@1+R@5+R@10, fold minus none, above 0), and on 6 captions or more (with fewer even a gain on every caption cannot reach p < 0.05: the paired
sign-flip test's smallest p is 2/2^n), else none is. Both measurements are printed and written to meta.json ("normalizer_choice"). A bias
fitted from a few thousand train queries against a gallery of millions can hurt text ->
video (1M videos: Sinkhorn R@1 32.25 vs none 45.00); runs trained before this check fold
none unless told (--normalizer selected: the run's own choice, as 'xmodal eval' uses it;
--select-split SPLIT: measure on a split of --data / --select-data instead).

The chosen normaliser is folded into the index so that FAISS's inner
product is the normalised score: DN exactly (gallery y - lam mu_y, queries shifted
by -lam mu_x), NCL / Sinkhorn as the per-video bias b_j fitted on the run's stored
query bank against this gallery. QB-Norm, IS and DSL depend on each query's scores
against the whole gallery and cannot be folded: choose --normalizer none, dn,
sinkhorn or ncl for such runs; with --normalizer selected on such a run the
one the run's summary names for an index is used (metrics.json "index_normalizer": the
best foldable one clear of none on val, else none), and a note says why. DIR holds index.faiss,
query_shift.npy, meta.json and a copy of the run's checkpoint (for the text head), and for 'xmodal serve'
videos.npy (the gallery's video embeddings [V, D], float16 unless --store float32: "more like
this", searched through the index) and, with --data (the layout's captions,
S_texts.tsv) or --texts FILE, texts.npy + texts.json (caption embeddings: video -> text search).

meta.json records the encoders of the run's features (from RUN/encoders.json or an export's
config.json): "text_encoder" is the spec 'query --captions' and 'serve' encode captions with,
null when unknown (then a text size matching a built-in encoder is shown as assumed, any other
means no text search by words); --text-encoder states it for a run that records none.

Built in shards (ivf, ivfpq; a gallery larger than one process's memory): --train-only folds the gallery
and trains the quantisers on a sample (OUT/gallery.npy, OUT/trained.faiss); --shard K/N adds shard K of N
(any process or machine that sees OUT), or --cluster local:N|ADDRESS adds them all as retried tasks on a
Dask cluster; --merge joins the shards into index.faiss + lists.ivfdata, FAISS on-disk inverted lists that
query and serve memory-map instead of loading, and measures the recall@10 as above (docs/scale.md).

  xmodal index --run RUN --video-features V.npy --out IDX --kind ivf --train-only
  xmodal index --run RUN --out IDX --cluster local:2 --cluster-shards 8
  xmodal index --run RUN --out IDX --shard 3/8     # or by hand, then: --merge"""



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
    parser.add_argument("--normalizer", default="auto", metavar="NAME",
                        help="auto (default): the run's foldable choice only where it serves text -> video on "
                             "this gallery (measured, see above), else none; selected (the run's choice on val, "
                             "as eval uses it), none, dn, sinkhorn or ncl")
    parser.add_argument("--select-split", metavar="SPLIT", default=None,
                        help="with --normalizer auto: measure the fold on this split's captions and videos "
                             "(of --select-data, default --data) instead of the run's held-out train captions")
    parser.add_argument("--select-data", metavar="DIR", default=None,
                        help="the data layout --select-split is read from (default: --data)")
    parser.add_argument("--names", metavar="TXT", default=None,
                        help="optional video names, one per line (printed by 'xmodal query')")
    parser.add_argument("--kind", default=None, choices=("flat", "ivf", "ivfpq", "ivfpqr", "hnsw", "opq", "rabitq"),
                        help="flat: exact search (default); ivf, ivfpq, ivfpqr, hnsw, opq, rabitq: approximate, "
                             "with the recall measured at build time (see above); with --max-memory: only that kind")
    parser.add_argument("--bits", type=int, default=None, metavar="B",
                        help="--kind rabitq: bits per stored value, 1 to 8 (default 4; --max-memory chooses them)")
    parser.add_argument("--max-memory", default=None, metavar="SIZE",
                        help="a budget for the index file (22MB, 1.5GB, 512MiB): the kind, factory (OPQ rotation, "
                             "PQ code size, RaBitQ bits, refine, cells) and search setting with the best measured recall@10 "
                             "within it are kept; the choice, why, and what the next budget up buys are printed "
                             "and stored in meta.json (budget)")
    parser.add_argument("--target-recall", type=float, default=None, metavar="R",
                        help="recall@10 the approximate kinds' search parameter must reach (default 0.95; with "
                             "--max-memory, default none: each candidate at the best recall it reaches)")
    parser.add_argument("--recall-queries", type=int, default=None, metavar="N",
                        help="stored text embeddings of the run the recall is measured on (default 1000, "
                             "at most the run's test_time.bank_size)")
    parser.add_argument("--nlist", type=int, default=None, metavar="N",
                        help="IVF cells of the ivf kinds (default: chosen by measurement among 1, 2 and 4 "
                             "sqrt(videos), at most videos / 39)")
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
    parser.add_argument("--store", default="float16", choices=("float16", "float32"),
                        help="dtype of videos.npy / texts.npy, the search page's embeddings (default float16: "
                             "half the size; float32 keeps them as computed)")
    parser.add_argument("--train-only", action="store_true",
                        help="ivf/ivfpq built in shards: fold the gallery, train the quantisers on a sample and write "
                             "an empty index to --out (then --shard K/N or --cluster, then --merge)")
    parser.add_argument("--train-rows", type=int, default=None, metavar="N",
                        help="--train-only: rows of the seeded training sample (default 40 per IVF cell; fewer "
                             "make the k-means faster and smaller, FAISS warns below 39 per cell)")
    parser.add_argument("--shard", default=None, metavar="K/N",
                        help="add shard K of N of a --train-only folder's gallery (into OUT/shards/)")
    parser.add_argument("--merge", nargs="*", default=None, metavar="SHARD",
                        help="join the shards (default: all in OUT/shards/) into one index whose lists stay on "
                             "disk (lists.ivfdata, memory-mapped by query/serve), measuring its recall@10")
    parser.add_argument("--cluster", default=None, metavar="local:N|ADDRESS",
                        help="add every shard of a --train-only folder as tasks on a Dask cluster (extra [cluster]; "
                             "retried), then merge")
    parser.add_argument("--cluster-shards", type=int, default=None, metavar="N",
                        help="--cluster: the number of shards (default 8)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing index in --out (the new one is built beside it and swapped in "
                             "at the end: a failed rebuild leaves the old one as it was)")
    add_common_args(parser, threads=None, progress=True)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from xmodal.commands import _video_inputs, load_npy, load_run, progress_choice
    from xmodal.progress import Stages
    from xmodal.retrieval.build import RECALL_QUERIES, caption_texts, check_out, write_index

    from xmodal.commands import _index_ondisk

    if getattr(args, "train_rows", None) is not None and not args.train_only:
        raise ValueError("--train-rows: only with --train-only (the sample the quantisers are trained on)")
    if _index_ondisk.wanted(args) and not args.train_only:  # a step on a folder --train-only wrote
        return _index_ondisk.run_ondisk(args, None, recall_line, show_measured)
    start = time.perf_counter()
    kind_given, args.kind = args.kind is not None, args.kind or "flat"
    max_bytes = None
    if args.max_memory is not None:
        from xmodal.retrieval.budget import parse_size

        max_bytes = parse_size(args.max_memory)
        for flag, value in (("--nprobe", args.nprobe), ("--ef-search", args.ef_search), ("--train-only",
                                                                                         args.train_only or None)):
            if value is not None:
                raise ValueError(f"{flag}: --max-memory chooses the index and its search setting; give one or the other")
        if args.kind == "flat" and kind_given:
            raise ValueError("--kind: flat with --max-memory has nothing to choose; give another kind or none")
        if not kind_given:
            args.kind = "ivf" if args.nlist is not None else args.kind  # checked as a kind with cells
    _check_search_flags(args)
    if max_bytes is not None and not kind_given:
        args.kind = "flat"  # write_index: flat means any kind
    check_out(Path(args.out), args.run, overwrite=args.overwrite)  # before anything is loaded or encoded
    names = None
    if args.names:
        from xmodal.data.loaders import read_captions

        names = read_captions(args.names)
    model = load_run(args.run)  # loaded once: write_index takes it as it is
    texts = None
    if args.data is not None:
        _video_inputs.check_no_flags(args)
        from xmodal.data import load_paired_split

        split = load_paired_split(args.data, args.split)
        feats, mask = _video_inputs.from_split(split, model)
        if names is None and split.video_names is not None:
            names = list(split.video_names)
        from xmodal.models.clip4clip import Clip4Clip, tokenized_text

        text, text_mask = (tokenized_text(model, split, args.run) if isinstance(model, Clip4Clip)
                           else (split.text, split.text_mask))  # a clip4clip run reads its captions as tokens
        texts = caption_texts(split.captions, text, mask=text_mask, text_to_video=split.text_to_video)
    elif args.video_features is None:
        raise ValueError("--video-features: required (or --data DIR --split S)")
    else:
        feats, mask = _video_inputs.from_flags(args, model, lambda path, flag: load_npy(path, flag, mmap=True))
    if args.texts is not None:
        texts = _caption_file(args, model)
    select_on = _select_on(args, model)
    if args.threads is None:  # faiss's OpenMP threads follow torch's (--threads)
        import torch

        _faiss_threads(torch.get_num_threads())
    else:
        _faiss_threads(args.threads)
    if args.train_only:
        from xmodal.retrieval.build_shards import write_trained

        def build_trained() -> dict:
            try:
                with Stages(show=progress_choice(args)) as stage:
                    return write_trained(args.run, feats, args.out, normalizer=args.normalizer, kind=args.kind,
                                         nlist=args.nlist, names=names, text_encoder=args.text_encoder,
                                         overwrite=args.overwrite, video_mask=mask, log=stage, model=model,
                                         store=args.store, select_on=select_on, train_rows=args.train_rows,
                                         recall_queries=args.recall_queries, target_recall=args.target_recall)
            except ValueError as exc:
                if str(exc).startswith("train_rows:"):
                    raise ValueError("--train-rows:" + str(exc).removeprefix("train_rows:")) from None
                raise

        return _index_ondisk.run_ondisk(args, build_trained, recall_line, show_measured)
    try:
        with Stages(show=progress_choice(args)) as stage:  # without a terminal: the stage every 30 s
            meta = write_index(args.run, feats, args.out, normalizer=args.normalizer, kind=args.kind, names=names,
                               text_encoder=args.text_encoder, overwrite=args.overwrite, video_mask=mask, log=stage,
                               texts=texts, target_recall=args.target_recall,
                               recall_queries=args.recall_queries or RECALL_QUERIES, nlist=args.nlist,
                               nprobe=args.nprobe, ef_search=args.ef_search, model=model, store=args.store,
                               select_on=select_on, max_bytes=max_bytes, bits=args.bits)
    except (ValueError, TypeError) as exc:
        name, sep, rest = str(exc).partition(":")
        flags = {"normalizer": "--normalizer", "features": "--video-features", "texts": "--texts", "nlist": "--nlist",
                 "nprobe": "--nprobe", "ef_search": "--ef-search", "target_recall": "--target-recall",
                 "recall_queries": "--recall-queries", "kind": "--kind"}
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
        from xmodal.features.identity import shown_spec

        shown += f"; text encoder {shown_spec(meta['text_encoder'])} ({meta.get('text_encoder_source')})"
    elif meta.get("text_encoder_source") == "none":
        shown += "; no text encoder (--text-encoder none: text search off)"
    else:
        print("note: the run records no text encoder (meta.json text_encoder: null); 'query --captions' and "
              "'serve' assume a built-in one only where the text size matches it (state it with --text-encoder)",
              file=sys.stderr)
    from xmodal.serve.images import gallery_kind

    print(f"wrote {args.out}: {meta['num_items']} {gallery_kind(meta)} x {meta['dim']} ({meta['kind']} index "
          f"{meta['factory']}, normaliser {meta['normalizer']} folded in{shown}; {time.perf_counter() - start:.1f} s)")
    choice = meta.get("normalizer_choice") or {}
    if choice.get("given") == "auto":
        print(f"normaliser {meta['normalizer']}: {choice.get('why')}")
    if choice.get("bank_note"):
        print(f"note: {choice['bank_note']}", file=sys.stderr)
    if meta.get("budget"):
        from xmodal.retrieval.budget import budget_line

        print(budget_line(meta["budget"]))
    print(recall_line(meta))
    show_measured(meta)
    if meta["target_met"] is False:
        print(f"warning: {miss_warning(meta)}", file=sys.stderr)
    elif meta["recall_at_10"] is None:
        print("note: this run stores no text embeddings, so the recall could not be measured", file=sys.stderr)
    return 0


def show_measured(meta: dict) -> None:
    """Print what the build measured: the cell-count table, the curve (and how its queries/s were timed)
    and, on stderr, the kind advice."""
    if meta.get("nlist_choice"):
        print(nlist_table(meta))
    if meta.get("curve") and meta["kind"] != "flat":
        print(curve_table(meta))
        if meta.get("curve_rate"):
            print(f"queries/s: {meta['curve_rate']}")
    if meta.get("kind_advice"):
        print(f"note: {meta['kind_advice']}", file=sys.stderr)


def curve_table(meta: dict) -> str:
    """The settings the build measured: ``nprobe | recall@10 | queries/s`` (the kept one marked)."""
    from xmodal.commands import markdown_table

    word = _param_word(meta)
    kept = (meta.get("search_params") or {}).get(word)
    kept_exact = (meta.get("search_params") or {}).get("exact") is True
    rows = []
    for point in meta["curve"]:
        setting = "exact scan" if point.get("exact") else str(point.get(word))
        mark = " (kept)" if (kept_exact if point.get("exact") else point.get(word) == kept) else ""
        rows.append([setting + mark, f"{point['recall_at_10']:.3f}", f"{point['queries_per_s']:,.0f}"])
    return markdown_table([word, "recall@10", "queries/s"], rows)


def nlist_table(meta: dict) -> str:
    """The cell counts the build measured (``meta.json["nlist_choice"]``): ``nlist | nprobe | recall@10 |
    vectors compared per query``, the chosen one marked."""
    from xmodal.commands import markdown_table

    rows = []
    for c in meta["nlist_choice"]:
        mark = " (chosen)" if c.get("chosen") else ""
        reach = "" if c.get("reaches_target", True) else " (short of the target)"
        rows.append([f"{c['nlist']}{mark}", str(c["nprobe"]), f"{c['recall_at_10']:.3f}{reach}",
                     f"{c['compared']:,.0f}"])
    return markdown_table(["nlist", "nprobe", "recall@10", "vectors compared per query"], rows)


def miss_warning(meta: dict) -> str:
    """What a missed target means for this kind, and what to do about it."""
    word, target = _param_word(meta), meta["target_recall"]
    best = max(p["recall_at_10"] for p in meta["curve"] if not p.get("exact"))
    kept = recall_line(meta, short=True)
    head = (f"no {word} reached the target recall@10 {target:.3f} (best measured {best:.3f}); the index keeps "
            f"the fastest setting within 0.005 of the best ({kept})")
    if meta["kind"] == "hnsw":
        exact = next((p for p in meta["curve"] if p.get("exact")), None)
        scan = "" if exact is None else \
            f"; 'xmodal query --exact' scans this index's vectors at {exact['queries_per_s']:,.0f} queries/s"
        return (f"{head}{scan}; the graph caps the recall on this gallery: --kind ivf (float32 vectors, any "
                f"recall up to exact) or flat, or a lower --target-recall")
    if meta["kind"] == "ivfpq":
        return (f"{head}; the compressed vectors cap the recall: --kind ivfpqr (the same codes re-ranked by "
                f"8-bit vectors) or ivf (float32 vectors) reach higher recall, or accept this one with a lower "
                f"--target-recall")
    if meta["kind"] == "ivfpqr":
        return (f"{head}; the 8-bit re-ranking caps the recall here: --kind ivf (float32 vectors) reaches the "
                f"target, or accept this recall with a lower --target-recall")
    return f"{head}; a lower --target-recall, or --kind flat for exact answers"


def _select_on(args: argparse.Namespace, model) -> dict | None:
    """``--select-split``: that split's captions and videos embedded by the run, the measurement set of
    ``--normalizer auto`` (its videos are the gallery's own rows when it is the indexed split)."""
    if args.select_split is None:
        if args.select_data is not None:
            raise ValueError("--select-data: only with --select-split")
        return None
    if args.normalizer != "auto":
        raise ValueError(f"--select-split: measures --normalizer auto's choice; --normalizer {args.normalizer} "
                         f"folds what it names")
    root = args.select_data or args.data
    if root is None:
        raise ValueError("--select-split: needs --select-data DIR (or --data DIR), the layout the split is read from")
    from pathlib import Path

    from xmodal.commands import _video_inputs
    from xmodal.data import load_paired_split

    from xmodal.models.clip4clip import tokenized_text

    split = load_paired_split(root, args.select_split)
    text = model.encode_text(*tokenized_text(model, split, args.run))
    same = args.data is not None and Path(root).resolve() == Path(args.data).resolve() and \
        args.select_split == args.split
    video = None if same else model.encode_video(*_video_inputs.from_split(split, model))
    return {"text": text, "video": video, "text_to_video": split.text_to_video,
            "source": f"captions of split {args.select_split!r} of {root}"}


def _caption_file(args: argparse.Namespace, model) -> dict:
    """``--texts FILE``: its captions encoded with ``--text-encoder`` (:func:`~xmodal.retrieval.build.caption_texts`)."""
    from xmodal.commands import read_caption_file
    from xmodal.retrieval.build import caption_texts
    from xmodal.retrieval.search import encode_captions

    captions = read_caption_file(args.texts, "--texts")
    from xmodal.features.identity import index_encoders, resolve_text

    text_dim = model.architecture()["text"]["in_dim"]
    choice = resolve_text(index_encoders(args.run, args.text_encoder, text_dim)["encoders"]["text"], text_dim)
    if choice["spec"] is None:
        raise ValueError(f"--texts: no text encoder to encode them with: {choice['reason']}")
    if choice["status"] == "assumed":
        print(f"note: --texts: {choice['reason']}", file=sys.stderr)
    feats = encode_captions(model, captions, choice["spec"])
    return caption_texts(captions, *(feats if isinstance(feats, tuple) else (feats,)))


def _param_word(meta: dict) -> str:
    return "efSearch" if meta["kind"] == "hnsw" else "nprobe"


def recall_line(meta: dict, *, short: bool = False) -> str:
    """``recall@10 0.953 (nprobe 32, measured on 1000 held-out queries; target 0.95)`` or ``exact``."""
    if meta.get("exact") and meta.get("kind") not in (None, "flat"):
        return f"exact search kept: recall@10 1.000 (the build measured it as fast as every {meta['kind']} setting)"
    if meta.get("exact"):
        return "exact search: recall@10 1.000 by construction"
    params = ", ".join(f"{k} {v}" for k, v in (meta.get("search_params") or {}).items())
    if meta.get("recall_at_10") is None:
        return f"recall@10 not measured ({params})"
    text = f"recall@10 {meta['recall_at_10']:.3f} at {params}"
    if short:
        return text
    target = "" if meta.get("target_recall") is None else f"; target {meta['target_recall']:.3f}"
    if meta.get("tuned_to") == "best":  # a memory budget's choice: no target for the setting
        from xmodal.retrieval.index import BEST_TOLERANCE

        target = (f"; the cheapest setting within {BEST_TOLERANCE} of the best it reached, cells chosen for "
                  f"{meta['target_recall']:.3f}")
    return f"{text} (measured on {meta['recall_queries']} queries: {meta.get('recall_source') or 'stored texts'} " \
           f"of the run{target})"


def _check_search_flags(args: argparse.Namespace) -> None:
    from xmodal.retrieval.index import IVF_KINDS, MAX_EF_SEARCH, MAX_NPROBE, RABITQ_BITS

    kind = args.kind
    for flag, value, most in (("--nprobe", args.nprobe, MAX_NPROBE), ("--ef-search", args.ef_search, MAX_EF_SEARCH),
                              ("--nlist", args.nlist, MAX_NPROBE)):
        if value is not None and not 1 <= value <= most:
            raise ValueError(f"{flag}: must be in [1, {most}] (at most {most}), got {value}")
    if args.nprobe is not None and kind not in IVF_KINDS:
        raise ValueError(f"--nprobe: only for --kind {' / '.join(IVF_KINDS)} (this is {kind}"
                         + ("; hnsw takes --ef-search)" if kind == "hnsw" else ")"))
    if args.ef_search is not None and kind != "hnsw":
        raise ValueError(f"--ef-search: only for --kind hnsw (this is {kind})")
    if args.nlist is not None and kind not in IVF_KINDS:
        raise ValueError(f"--nlist: only for --kind {' / '.join(IVF_KINDS)} (this is {kind})")
    bits = getattr(args, "bits", None)
    if bits is not None:
        if kind != "rabitq":
            raise ValueError(f"--bits: only for --kind rabitq (this is {kind})")
        if getattr(args, "max_memory", None) is not None:
            raise ValueError("--bits: --max-memory chooses rabitq's bits; give one or the other")
        if bits not in RABITQ_BITS:
            raise ValueError(f"--bits: must be in [{RABITQ_BITS[0]}, {RABITQ_BITS[-1]}], got {bits}")
    if args.target_recall is not None:
        if kind == "flat" and getattr(args, "max_memory", None) is None:
            raise ValueError("--target-recall: a flat index is exact; give --kind ivf, ivfpq, ivfpqr or hnsw")
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
