"""``xmodal eval``: exact retrieval metrics from embeddings or a similarity matrix."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from xmodal.commands import load_npy

NAME = "eval"
HELP = "evaluate retrieval (R@K, MdR, MnR, mAP, nDCG) from embeddings or a similarity matrix"
DESCRIPTION = """Evaluate retrieval exactly (ties handled by --ties; no full sort; big
galleries are streamed block by block from the embeddings, never materialising the
score matrix). Inputs are .npy files:

  a trained run on raw features (its heads -> cosine -> its stored test-time normaliser;
  the numbers of the run's metrics.json for the same split):
    xmodal eval --run RUN --data DIR [--split test]     (the data layout; masks and experts)
    xmodal eval --run RUN --video-features V.npy --text-features T.npy --text-to-video M.npy
                [--video-mask MASK.npy] [--expert NAME=NPY [--expert-mask NAME=NPY]] [--no-mask]
                [--normalizer selected|none|dn|sinkhorn|ncl|qbnorm|...] [--v2t-scores transpose]
    (--data on a split with groups: p2v / v2p too; a hierarchical run also p2v_flat / v2p_flat,
     its own clip embeddings mean-pooled: the flat reference of its global towers)
  embeddings, one correct item per query (int [Q]) or several (bool [Q, G]):
    xmodal eval --queries q.npy --gallery g.npy --positives p.npy [--bias b.npy]
  text <-> video with several captions per video (int caption -> video map):
    xmodal eval --text t.npy --video v.npy --text-to-video t2v.npy [--v2t max-over-captions]
  video -> video by class label (positives: the other videos of its class):
    xmodal eval --video v.npy --labels labels.npy      (or --run RUN --video-features V.npy)
  a precomputed similarity matrix [Q, G]:
    xmodal eval --sim sim.npy --positives p.npy
    xmodal eval --sim sim.npy --text-to-video t2v.npy
    xmodal eval --sim sim.npy --relevancy rel.npy      (EPIC-KITCHENS-100 mAP / nDCG)

Embedding scores are dot products; --l2 makes them cosine similarities. --bias takes
per-gallery biases, e.g. from 'xmodal normalize --save-bias'. Recall, mAP and nDCG
are percentages, ranks are 1-based. --json prints machine-readable results."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from xmodal.commands import add_common_args

    r = parser.add_argument_group("trained run")
    r.add_argument("--run", metavar="RUN", help="run directory or checkpoint written by 'xmodal train', or a folder "
                   "written by 'xmodal export'")
    r.add_argument("--video-features", metavar="NPY", help="raw video/image features [V, Dv] or [V, F, Dv]")
    r.add_argument("--text-features", metavar="NPY", help="raw caption features [T, Dt] or tokens [T, L, Dt]")
    r.add_argument("--text-mask", metavar="NPY", help="bool or 0/1 [T, L], True = real token, of token "
                   "features (written by 'xmodal encode text --tokens')")
    from xmodal.commands import _video_inputs

    _video_inputs.add_arguments(parser, group=r)
    r.add_argument("--normalizer", default="selected", metavar="NAME",
                   help="test-time normaliser of the run: selected (default, chosen on val), none, "
                        "or any fitted name (dn, sinkhorn, ncl, qbnorm, is, dsl)")
    r.add_argument("--per-query", metavar="NPZ", default=None,
                   help="also write each query's rank (and AP / nDCG with a relevancy) and the protocol card to "
                        "this .npz, the layout of RUN/per_query.npz, for 'xmodal compare' (with --run)")
    r.add_argument("--v2t-scores", default="normalized", choices=("normalized", "transpose"),
                   help="video -> text scores: normalized (default: the normaliser fitted for that "
                        "direction, exactly the trainer's metrics.json) or transpose (the t2v scores "
                        "transposed; equal for none and dn)")
    g = parser.add_argument_group("embeddings")
    g.add_argument("--queries", metavar="NPY", help="query embeddings [Q, D]")
    g.add_argument("--gallery", metavar="NPY", help="gallery embeddings [G, D]")
    g.add_argument("--text", metavar="NPY", help="caption embeddings [T, D]")
    g.add_argument("--video", metavar="NPY", help="video/image embeddings [V, D]")
    g.add_argument("--bias", metavar="NPY", help="per-gallery-item bias [G] added to every score "
                   "(with --queries/--gallery; e.g. from 'xmodal normalize --save-bias')")
    s = parser.add_argument_group("similarity matrix")
    s.add_argument("--sim", metavar="NPY", help="similarity matrix [Q, G] (higher = more similar)")
    s.add_argument("--relevancy", metavar="NPY", help="graded relevancy in [0, 1], [Q, G] -> mAP and "
                   "nDCG (EPIC-KITCHENS-100 definitions; both directions and their mean)")
    t = parser.add_argument_group("ground truth")
    t.add_argument("--positives", metavar="NPY", help="int [Q] correct gallery index per query, "
                   "or bool [Q, G] (any of several correct items)")
    t.add_argument("--text-to-video", metavar="NPY", help="int [T]: the video of each caption")
    t.add_argument("--labels", metavar="NPY", help="int [V] class of each video: video -> video "
                   "retrieval, positives = the other videos of the same class")
    o = parser.add_argument_group("options")
    o.add_argument("--ties", default="pessimistic", choices=("pessimistic", "optimistic", "average"),
                   help="where items tied with the correct score rank (default pessimistic; "
                   "mAP/nDCG accept pessimistic/optimistic)")
    o.add_argument("--v2t", default="all-captions", choices=("all-captions", "max-over-captions"),
                   help="video->text protocol (default all-captions: a video's gallery is every "
                        "caption, hit if any of its own is in the top K)")
    o.add_argument("--block-size", type=int, default=4096, help="query rows per block (default 4096)")
    o.add_argument("--json", action="store_true", help="print results as JSON")
    add_common_args(parser, threads=None, progress=True, ks="1,5,10,50", l2=True)




def _l2(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


def _mode(args: argparse.Namespace) -> str:
    names = ("queries", "gallery", "text", "video", "sim", "run", "video_features", "text_features", "data")
    given = {name for name in names if getattr(args, name) is not None}
    if args.labels is not None:
        if given in ({"video"}, {"run", "video_features"}, {"sim"}):
            return "labels"
        raise ValueError("--labels: give the videos as --video, as --run with --video-features, "
                         "or as --sim [V, V]")
    modes = {"embeddings": {"queries", "gallery"}, "text-video": {"text", "video"}, "sim": {"sim"},
             "run": {"run", "video_features", "text_features"}, "run-data": {"run", "data"}}
    for mode, need in modes.items():
        if given == need:
            return mode
    if "run" in given or "video_features" in given or "text_features" in given:
        raise ValueError("--run: needs --video-features and --text-features (and --text-to-video), or --data; "
                         "do not mix with --queries/--gallery/--text/--video/--sim")
    raise ValueError("give exactly one input: --run with --video-features/--text-features, "
                     "--queries and --gallery, --text and --video, or --sim (see 'xmodal eval --help')")


def evaluate(args: argparse.Namespace) -> tuple[dict, str, dict]:
    """Run the evaluation the flags describe; returns (results, kind, info)."""
    from xmodal import metrics
    from xmodal.commands import parse_ks, progress_choice

    ks = parse_ks(args.ks)
    progress = progress_choice(args)  # None: a line every 30 s without a terminal (progress_enabled was False there)
    mode = _mode(args)
    l2 = "cosine (--l2)" if args.l2 else "dot product"
    if args.bias and mode != "embeddings":
        raise ValueError("--bias: only with --queries/--gallery")
    if args.normalizer != "selected" and mode not in ("run", "run-data", "labels"):
        raise ValueError("--normalizer: only with --run")
    if mode in ("run", "run-data", "sim") or (mode == "labels" and args.run is None and args.sim is not None):
        if args.l2:
            raise ValueError("--l2: applies to embeddings, not to --sim or --run (a run's scores "
                             "are cosine similarities already)")
    run_only = [f for f, v in (("--video-mask", args.video_mask), ("--expert", args.expert),
                               ("--expert-mask", args.expert_mask), ("--no-mask", args.no_mask)) if v]
    if run_only and args.run is None:
        raise ValueError(f"{run_only[0]}: only with --run")
    if args.v2t_scores != "normalized" and mode not in ("run", "run-data"):
        raise ValueError("--v2t-scores: only with --run")
    if args.per_query is not None and mode not in ("run", "run-data"):
        raise ValueError("--per-query: only with --run and its features (--data or --video-features/--text-features)")
    if args.per_query is not None and args.ties == "average":
        raise ValueError("--per-query: stores one integer rank per query; use --ties pessimistic or optimistic")
    if args.per_query is not None:
        _check_per_query_out(Path(args.per_query))
    if mode == "labels":
        return _evaluate_labels(args, ks)
    if mode in ("run", "run-data"):
        return _evaluate_run(args, mode, ks)
    if mode == "embeddings":
        q, g = load_npy(args.queries, "--queries"), load_npy(args.gallery, "--gallery")
        if args.l2:
            q, g = _l2(q), _l2(g)
        bias = load_npy(args.bias, "--bias") if args.bias else None
        pos = load_npy(args.positives, "--positives")
        res = {"queries": metrics.streaming_retrieval(
            q, g, pos, ks=ks, ties=args.ties, bias=bias, block_size=args.block_size, progress=progress)}
        return res, "retrieval", {"queries": len(q), "gallery": len(g),
                                  "scores": l2 + (" + per-gallery bias (--bias)" if bias is not None else "")}
    if mode == "text-video":
        t, v = load_npy(args.text, "--text"), load_npy(args.video, "--video")
        if args.l2:
            t, v = _l2(t), _l2(v)
        t2v = load_npy(args.text_to_video, "--text-to-video")
        res = metrics.streaming_text_video(t, v, t2v, ks=ks, ties=args.ties, v2t=args.v2t,
                                           block_size=args.block_size, progress=progress)
        return res, "retrieval", {"texts": len(t), "videos": len(v), "v2t": args.v2t, "scores": l2}
    sim = load_npy(args.sim, "--sim")
    given = [f for f in ("positives", "text_to_video", "relevancy") if getattr(args, f)]
    if len(given) != 1:
        raise ValueError("--sim: give exactly one of --positives, --text-to-video, --relevancy")
    shape = tuple(sim.shape) + (None, None)
    if args.relevancy:
        if args.ties == "average":
            raise ValueError("--ties: mAP/nDCG support pessimistic or optimistic")
        rel = load_npy(args.relevancy, "--relevancy")
        return (metrics.mir(sim, rel, ties=args.ties, directions="both"), "mir",
                {"rows": shape[0], "columns": shape[1], "scores": "precomputed (--sim)"})
    if args.text_to_video:
        t2v = load_npy(args.text_to_video, "--text-to-video")
        res = metrics.text_video(sim, t2v, ks=ks, ties=args.ties, v2t=args.v2t, block_size=args.block_size)
        return res, "retrieval", {"texts": shape[0], "videos": shape[1], "v2t": args.v2t,
                                  "scores": "precomputed (--sim)"}
    pos = load_npy(args.positives, "--positives")
    res = {"queries": metrics.retrieval(sim, pos, ks=ks, ties=args.ties, block_size=args.block_size)}
    return res, "retrieval", {"queries": shape[0], "gallery": shape[1], "scores": "precomputed (--sim)"}


def _evaluate_run(args: argparse.Namespace, mode: str, ks: tuple[int, ...]) -> tuple[dict, str, dict]:
    """A run on raw features, by the trainer's protocol (:func:`xmodal.retrieval.evaluate.retrieval_metrics`):
    each direction scored by the normaliser fitted for it, mAP / nDCG where the split has a relevancy."""
    from xmodal.commands import _video_inputs
    from xmodal.commands import load_run
    from xmodal.data.types import token_mask
    from xmodal.retrieval.evaluate import retrieval_metrics
    from xmodal.retrieval.index import selected_normalizer

    model = load_run(args.run)
    name = selected_normalizer(model, args.normalizer)
    relevancy = None
    if mode == "run-data":
        if args.text_to_video:
            raise ValueError("--data: the directory holds the text -> video map; drop --text-to-video")
        _video_inputs.check_no_flags(args)
        if getattr(args, "text_mask", None):
            raise ValueError(f"--data: the directory holds the token mask ({args.split}_text_mask.npy); drop --text-mask")
        from xmodal.data import load_paired_split

        from xmodal.models.clip4clip import tokenized_text

        split = load_paired_split(args.data, args.split)
        (tf, tmask), t2v = tokenized_text(model, split, args.run), split.text_to_video
        vf, vmask = _video_inputs.from_split(split, model)
        relevancy = split.mir_relevancy()
    else:
        # features memory-mapped: the heads read them one block at a time
        tf = load_npy(args.text_features, "--text-features", mmap=True)
        tmask = None if not getattr(args, "text_mask", None) else token_mask(load_npy(args.text_mask, "--text-mask"))
        t2v = load_npy(args.text_to_video, "--text-to-video")
        vf, vmask = _video_inputs.from_flags(args, model, lambda path, flag: load_npy(path, flag, mmap=True))
    if relevancy is not None and args.ties == "average":
        raise ValueError("--ties: this split has a relevancy (mAP / nDCG), which supports pessimistic or "
                         "optimistic ties")
    if relevancy is None and args.per_query is None and args.v2t_scores == "normalized":
        res, info = _stream_run(args, model, name, (tf, tmask), (vf, vmask), t2v, ks)
        if mode == "run-data":
            from xmodal.retrieval.evaluate import group_metrics

            res.update(group_metrics(model, split, ks=ks, ties=args.ties))
        return res, "retrieval", info
    text = model.encode_text(tf, tmask)
    video = model.encode_video(vf, vmask)
    sim_t2v, sim_v2t = model.test_time.similarities(text, video, name)
    if args.v2t_scores == "transpose":
        sim_v2t = None
    res = retrieval_metrics(sim_t2v, sim_v2t, t2v, relevancy, ks=ks, ties=args.ties, v2t=args.v2t,
                            block_size=args.block_size)
    if mode == "run-data":  # a split with groups: p2v / v2p too (the trainer's group_metrics)
        from xmodal.retrieval.evaluate import group_metrics

        res.update(group_metrics(model, split, ks=ks, ties=args.ties))
    if args.per_query is not None:
        _write_per_query(args, model, name, split if mode == "run-data" else None, (sim_t2v, sim_v2t), t2v,
                         relevancy, (tf, tmask), (vf, vmask))
    v2t_how = ("v2t ranks the t2v scores transposed (--v2t-scores transpose)" if sim_v2t is None and
               args.v2t_scores == "transpose" else "v2t scores normalised for that direction, as metrics.json")
    return res, "retrieval", {"texts": sim_t2v.shape[0], "videos": sim_t2v.shape[1], "v2t": args.v2t,
                              "scores": f"run {args.run}: heads -> cosine -> normaliser {name} ({v2t_how})"}


#: The writer's mark of a file of ``eval --per-query`` (the only kind of file it replaces).
PER_QUERY_WRITER = "xmodal eval --per-query"


def _check_per_query_out(out: Path) -> None:
    """``--per-query`` names a new ``.npz`` or a file this command wrote before (its writer's mark);
    never a folder, a link, another command's file or a run's own ``per_query.npz``."""
    if out.is_dir() or out.is_symlink():
        raise ValueError(f"--per-query: {out} is a {'directory' if out.is_dir() else 'symbolic link'}; "
                         f"give a new .npz file name")
    if out.suffix != ".npz":
        raise ValueError(f"--per-query: expected a file name ending in .npz, got {str(out)!r}")
    if out.exists():
        from xmodal.retrieval.perquery_read import PerQueryFile

        try:
            with PerQueryFile(out) as f:
                writer = f.writer
        except ValueError:
            writer = None
        if writer != PER_QUERY_WRITER:
            what = f"written by '{writer}'" if writer else "not written by 'xmodal eval --per-query'"
            raise ValueError(f"--per-query: {out} exists and was {what}; it is left as it is: give a new file name")


def _split_key(args: argparse.Namespace, sha: str) -> str:
    """The name the run gives the evaluated split: ``val`` / ``test`` when the run's metrics.json has a
    card of these very arrays (or, with ``--data``, when its config names ``--split`` so), else
    ``--split`` (``--data``) or ``eval`` (arrays given by flags)."""
    from xmodal.retrieval.perquery_read import load_json

    run = Path(args.run)
    folder = run if run.is_dir() else run.parent
    try:
        with open(folder / "metrics.json", "rb") as f:
            metrics = load_json(f.read((16 << 20) + 1), "metrics.json")
    except (OSError, ValueError):
        metrics = None
    if isinstance(metrics, dict):
        for role in ("val", "test"):
            entry = metrics.get(role)
            card = entry.get("protocol") if isinstance(entry, dict) else None
            if isinstance(card, dict) and card.get("split_sha256") == sha:
                return role
    if args.data is None:
        return "eval"
    try:
        import yaml

        with open(folder / "config.yaml", "rb") as f:
            data = (yaml.safe_load(f.read(1 << 20)) or {}).get("data") or {}
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        data = {}
    if isinstance(data, dict):
        if data.get("val_split") == args.split and not data.get("val_from_train"):
            return "val"
        if data.get("test_split") == args.split:
            return "test"
    return args.split


def _stream_run(args: argparse.Namespace, model, name: str, text: tuple, video: tuple, t2v, ks) -> tuple[dict, dict]:
    """The run's metrics streamed block by block (:mod:`xmodal.retrieval.streaming`): memory is the
    embeddings plus one score block at any gallery size; a gallery with uncaptioned videos is evaluated
    text -> video only (one line says v2t was skipped)."""
    import sys

    from xmodal.commands import progress_choice
    from xmodal.retrieval.streaming import captioned_everywhere, embed_rows, run_metrics

    t2v = np.asarray(t2v)
    if t2v.ndim != 1 or not np.issubdtype(t2v.dtype, np.integer):
        raise ValueError(f"text_to_video: expected integer video indices [T], got {t2v.dtype} {list(t2v.shape)}")
    text_emb = model.encode_text(*text)
    video_emb = embed_rows(lambda f, m: model.encode_video(f, m), *video, progress=progress_choice(args))
    if t2v.shape[0] != text_emb.shape[0] or (t2v.size and not (t2v.min() >= 0 and t2v.max() < video_emb.shape[0])):
        raise ValueError(f"text_to_video: expected {text_emb.shape[0]} video indices in [0, {video_emb.shape[0]})")
    both = captioned_everywhere(t2v, int(video_emb.shape[0]))
    if not both:
        missing = int(video_emb.shape[0] - np.unique(t2v).size)
        print(f"note: v2t skipped: {missing:,} of {video_emb.shape[0]:,} videos have no caption; text -> video only",
              file=sys.stderr)
    res = run_metrics(model.test_time, name, text_emb, video_emb, t2v, ks=ks, ties=args.ties, v2t=args.v2t,
                      block_size=args.block_size, progress=progress_choice(args))
    info = {"texts": int(text_emb.shape[0]), "videos": int(video_emb.shape[0]),
            "v2t": args.v2t if both else "skipped (uncaptioned videos)",
            "scores": f"run {args.run}: heads -> cosine -> normaliser {name} (" +
                      ("v2t scores normalised for that direction, as metrics.json; " if both else "") +
                      "streamed in blocks)"}
    return res, info


def _write_per_query(args: argparse.Namespace, model, name: str, split, sims: tuple, t2v, relevancy,
                     text: tuple, video: tuple) -> None:
    """``--per-query``: the evaluated split's per-query results, query ids and protocol card (the
    layout of ``RUN/per_query.npz``, :mod:`xmodal.retrieval.perquery`) under the name the run gives
    that split, written through a temporary file."""
    from types import SimpleNamespace

    from xmodal.retrieval.evaluate import group_ranks, query_results
    from xmodal.retrieval.perquery import protocol_card, query_ids, split_sha256, write_per_query
    from xmodal.training.provenance import git_revision

    results = query_results(*sims, t2v, relevancy, ties=args.ties, v2t=args.v2t)
    if split is not None:
        results.update(group_ranks(model, split))
    else:  # the arrays given by flags, hashed as the trainer hashes a split (xmodal.retrieval.perquery)
        t2v_arr = np.asarray(t2v)
        split = SimpleNamespace(text_to_video=t2v_arr, num_videos=int(sims[0].shape[1]), text=text[0],
                                video_input=lambda: video, text_input=lambda: text)
    sha = split_sha256(split)
    key = _split_key(args, sha)
    per_query = {key: {name: results}}
    v2t = args.v2t + (" (t2v scores transposed)" if args.v2t_scores == "transpose" and sims[1] is None else "")
    card = protocol_card(split, model.test_time, [name], selected=name, ties=args.ties, v2t=v2t, sha256=sha,
                         git=git_revision(), per_query=per_query[key])
    write_per_query(args.per_query, per_query, {key: card}, ids={key: query_ids(split)}, writer=PER_QUERY_WRITER)


def _evaluate_labels(args: argparse.Namespace, ks: tuple[int, ...]) -> tuple[dict, str, dict]:
    from xmodal.metrics.ranking import label_retrieval_from_sim as label_retrieval

    labels = load_npy(args.labels, "--labels")
    if args.sim is not None:
        sim, scores = load_npy(args.sim, "--sim"), "precomputed (--sim)"
    elif args.run is not None:
        from xmodal.commands import load_run

        model = load_run(args.run)
        if args.normalizer not in ("selected", "none"):
            raise ValueError("--normalizer: text -> video normalisers do not apply to video -> video "
                             "retrieval; leave it out")
        from xmodal.commands import _video_inputs

        v = model.encode_video(*_video_inputs.from_flags(args, model, load_npy))
        sim, scores = v @ v.T, f"run {args.run}: video head -> cosine"
    else:
        v = load_npy(args.video, "--video")
        v = _l2(v) if args.l2 else v.astype(np.float32)
        sim, scores = v @ v.T, "cosine (--l2)" if args.l2 else "dot product"
    res = label_retrieval(sim, labels, ks=ks, ties=args.ties, block_size=args.block_size)
    scored = res.pop("num_queries")
    return ({"v2v": res}, "retrieval",
            {"videos": int(sim.shape[0]), "scored queries": scored, "scores": scores,
             "protocol": "video -> other videos, positives = same label (query excluded)"})


def format_table(results: dict, kind: str) -> str:
    from xmodal.commands import markdown_table
    from xmodal.metrics import format_metric

    if kind == "mir":
        rows = [("rows as queries", results["mAP_rows"], results["nDCG_rows"]),
                ("columns as queries", results["mAP_cols"], results["nDCG_cols"]),
                ("mean (EPIC-100)", results["mAP"], results["nDCG"])]
        return markdown_table(["direction", "mAP", "nDCG"],
                              [(n, format_metric("mAP", m), format_metric("nDCG", d)) for n, m, d in rows])
    names = list(next(iter(results.values())))
    return markdown_table(["direction", *names],
                          [(d, *(format_metric(n, vals[n]) for n in names)) for d, vals in results.items()])


_FLAGS = {"sim": "--sim", "sim_tv": "--sim", "positives": "--positives", "queries": "--queries",
          "gallery": "--gallery", "text": "--text", "video": "--video", "bias": "--bias",
          "text_to_video": "--text-to-video", "relevancy": "--relevancy", "ks": "--ks",
          "block_size": "--block-size", "labels": "--labels", "normalizer": "--normalizer",
          "text_features": "--text-features", "video_features": "--video-features",
          "features": "--text-features/--video-features", "text_mask": "--text-mask"}


def run(args: argparse.Namespace) -> int:
    import xmodal.metrics  # noqa: F401  (import time is not evaluation time)

    start = time.perf_counter()
    try:
        results, kind, info = evaluate(args)
    except (ValueError, TypeError) as exc:
        # library messages name the argument; say which flag that is
        msg = str(exc)
        name, sep, rest = msg.partition(":")
        if sep and name in _FLAGS:
            raise type(exc)(f"{_FLAGS[name]}:{rest}") from None
        raise
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps({**results, "ties": args.ties, "info": info, "seconds": round(seconds, 3)},
                         indent=2))
    else:
        print(format_table(results, kind))
        print("(" + "; ".join(f"{k}: {v}" for k, v in info.items()) + f"; ties: {args.ties}; {seconds:.2f} s)")
    return 0
