"""``xmodal normalize``: apply a test-time normaliser to embeddings and compare metrics."""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

NAME = "normalize"
HELP = "apply a test-time normaliser (dn, sinkhorn, qbnorm, is, dsl) and print before/after metrics"
DESCRIPTION = """Evaluate retrieval of QUERIES against GALLERY (embeddings, .npy) before and after a
test-time normaliser fitted on a query bank, with R@K, MdR, MnR (streamed block by block)
and the normalisation error (mean_j |Q/N - sum_i softmax_j(sim_i / T)|).

  dn        Distribution Normalization; means from --bank (else the test queries)
  sinkhorn  NCL Sinkhorn gallery biases; bank = --bank, or the test queries with --oracle
  qbnorm    QB-Norm dynamic inverted softmax with --bank
  is        inverted softmax with --bank
  dsl       dual softmax over the test queries (or over --bank without --oracle)

DSL, QB-Norm, IS and Sinkhorn exponentiate scores / temperature, so they are only
meaningful on cosine similarities: un-normalised embeddings are refused unless --l2
(normalise them) or --force (reported in issue 9: DSL R@1 92.2 -> 31.1 and QB-Norm
-> 70.9 on un-normalised embeddings). --save-bias writes the per-gallery bias of
dn / sinkhorn for 'xmodal eval --bias'.

Example: xmodal normalize --method sinkhorn --queries q.npy --gallery g.npy \\
             --positives p.npy --bank train_q.npy --temperature 0.03 --l2 --save-bias b.npy"""

METHODS = ("dn", "sinkhorn", "qbnorm", "is", "dsl")
#: normalisers whose output depends on the scale of the scores (softmax / exp of score / T)
SCALE_SENSITIVE = ("sinkhorn", "qbnorm", "is", "dsl")
#: per-gallery biases these methods can save (``--save-bias``)
BIAS_METHODS = ("dn", "sinkhorn")
#: largest |row norm - 1| still treated as L2-normalised (float16 storage rounds norms)
NORM_TOLERANCE = 1e-2
#: largest Q x N for which the dense normalisation error is computed
MAX_DENSE = 50_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--method", required=True, choices=METHODS, help="normaliser")
    parser.add_argument("--queries", required=True, help="[Q, D] query embeddings (.npy)")
    parser.add_argument("--gallery", required=True, help="[N, D] gallery embeddings (.npy)")
    parser.add_argument("--positives", required=True,
                        help="[Q] int (correct gallery row per query) or [Q, N] bool (.npy)")
    parser.add_argument("--bank", default=None, help="[K, D] query bank embeddings (.npy)")
    parser.add_argument("--oracle", action="store_true",
                        help="use the test queries themselves as the bank (not deployable)")
    parser.add_argument("--temperature", type=float, default=0.05,
                        help="Sinkhorn gamma / DSL temperature / normalisation-error temperature")
    parser.add_argument("--iters", type=int, default=4,
                        help="Sinkhorn iterations (default 4, as NCL; at most 10000)")
    parser.add_argument("--gallery-marginal", default=None,
                        help="[N] Sinkhorn gallery mass, e.g. captions per item (.npy)")
    parser.add_argument("--k", type=int, default=1, help="QB-Norm top-k activation (default 1)")
    parser.add_argument("--beta", type=float, default=20.0, help="QB-Norm / IS inverse temperature")
    parser.add_argument("--lam", type=float, default=0.25, help="DN lambda (default 0.25)")
    parser.add_argument("--num-samples", type=int, default=100, help="DN sample size (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="DN sampling seed")
    parser.add_argument("--force", action="store_true",
                        help="run a scale-sensitive method (sinkhorn, qbnorm, is, dsl) on "
                             "un-normalised embeddings anyway (a warning instead of an error)")
    parser.add_argument("--save-bias", metavar="NPY", default=None,
                        help="write the fitted per-gallery bias [N] (dn, sinkhorn) for "
                             "'xmodal eval --bias'")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    from xmodal.commands import add_common_args

    add_common_args(parser, threads=None, progress=True, ks="1,5,10", l2=True)


def _load(path: str, name: str) -> np.ndarray:
    """One ``.npy`` array (a missing file, a folder, an ``.npz`` or a broken file: one line naming ``--name``)."""
    from xmodal.commands import load_npy

    return load_npy(path, f"--{name}")


def _embeddings(path: str, name: str, l2: bool) -> np.ndarray:
    x = _load(path, name)
    if x.ndim != 2 or not np.issubdtype(x.dtype, np.number):
        raise ValueError(f"--{name}: expected a numeric [rows, dim] array, got shape {x.shape}")
    x = x.astype(np.float32 if x.dtype != np.float64 else np.float64)
    if l2:
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return x


def build_and_fit(method: str, queries: np.ndarray, gallery: np.ndarray, bank: np.ndarray | None,
                  *, oracle: bool, temperature: float, iters: int = 4, k: int = 1, beta: float = 20.0,
                  lam: float = 0.25, num_samples: int | None = 100, seed: int = 0,
                  gallery_marginal: Any = None):
    """The fitted normaliser for ``method`` (shared by the CLI and the benchmarks)."""
    from xmodal.normalize import (DistributionNormalization, DualSoftmax, InvertedSoftmax, QBNorm,
                                  SinkhornBias)

    if oracle or (bank is None and method in ("dn", "dsl")):
        bank_used, oracle = queries, True
    elif bank is None:
        raise ValueError(f"--bank: method {method!r} needs a query bank (or --oracle)")
    else:
        bank_used = bank
    if method == "dn":
        norm = DistributionNormalization(lam=lam, num_samples=num_samples, seed=seed, oracle=oracle)
        norm.fit(bank_used, gallery)
    elif method == "sinkhorn":
        norm = SinkhornBias(temperature, iters=iters, oracle=oracle)
        norm.fit(bank_used, gallery, gallery_marginal=gallery_marginal)
    elif method == "qbnorm":
        norm = QBNorm(k=k, beta=beta, oracle=oracle).fit(bank_used, gallery)
    elif method == "is":
        norm = InvertedSoftmax(beta=beta, oracle=oracle).fit(bank_used, gallery)
    else:
        norm = DualSoftmax(temperature, oracle=oracle).fit(bank_used, gallery)
    return norm


def evaluate(norm, queries, gallery, positives, *, ks, temperature: float, progress: bool = False) -> dict:
    """Before/after metrics and normalisation errors of a fitted normaliser."""
    import torch

    from xmodal.metrics import normalization_error, streaming_retrieval

    before = streaming_retrieval(queries, gallery, positives, ks=ks, progress=progress)
    after = streaming_retrieval(queries, gallery, positives, ks=ks, progress=progress,
                                **norm.streaming_kwargs())
    out = {"before": before, "after": after, "normalization_error": None}
    if queries.shape[0] * gallery.shape[0] <= MAX_DENSE:
        sim = torch.from_numpy(queries) @ torch.from_numpy(gallery).T
        out["normalization_error"] = {"before": normalization_error(sim, temperature),
                                      "after": normalization_error(norm(sim), temperature)}
    return out


def _table(result: dict, method: str, ks: tuple[int, ...]) -> str:
    from xmodal.commands import markdown_table
    from xmodal.metrics import format_metric

    cols = [f"R@{k}" for k in ks] + ["MdR", "MnR"]
    rows = []
    for row, label in (("before", "none"), ("after", method)):
        err = result["normalization_error"]
        err_s = "n/a" if err is None else f"{err[row]:.4f}"
        vals = [format_metric(c, result[row][c]) for c in cols]
        rows.append([label, *vals, err_s])
    return markdown_table(["normaliser", *cols, "norm. error"], rows)


def check_scale(method: str, arrays: dict[str, np.ndarray], *, force: bool) -> str | None:
    """Refuse (or, with ``force``, return a warning for) a scale-sensitive method on
    embeddings whose rows are not unit length; None when all is well."""
    if method not in SCALE_SENSITIVE:
        return None
    bad = {}
    for flag, x in arrays.items():
        norms = np.linalg.norm(x.astype(np.float64), axis=1)
        if norms.size and np.abs(norms - 1.0).max() > NORM_TOLERANCE:
            bad[flag] = (norms.min(), norms.max())
    if not bad:
        return None
    where = ", ".join(f"{f} row norms {lo:.3g}..{hi:.3g}" for f, (lo, hi) in bad.items())
    msg = (f"--method {method}: embeddings are not L2-normalised ({where}); {method} exponentiates "
           f"score / temperature, so its result depends on the score scale (a reported case: DSL "
           f"R@1 92.2 -> 31.1). Add --l2, or --force to run anyway")
    if not force:
        raise ValueError(msg)
    return msg


def save_bias(norm, method: str, path: str) -> np.ndarray:
    """Write the fitted per-gallery bias ``[N]`` (float32 .npy, atomically)."""
    from pathlib import Path

    if method not in BIAS_METHODS:
        raise ValueError(f"--save-bias: {method} is not a per-gallery bias (its change to the scores "
                         f"depends on each query); available for {', '.join(BIAS_METHODS)}")
    from xmodal.runs import atomic_save_npy

    _check_bias_path(path)
    bias = np.asarray(norm.bias.detach().cpu().numpy(), dtype=np.float32)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_save_npy(out, bias)
    return bias


def _check_bias_path(path: str) -> None:
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        raise ValueError(f"--save-bias: {path} is a directory; give the .npy file to write")
    if p.is_symlink():
        raise ValueError(f"--save-bias: {path} is a symbolic link; refused")


def run(args: argparse.Namespace) -> int:
    import sys

    from xmodal.commands import parse_ks, progress_enabled

    ks = parse_ks(args.ks)
    if args.save_bias and args.method not in BIAS_METHODS:
        save_bias(None, args.method, args.save_bias)  # raises the one-line error before any work
    if args.save_bias:
        _check_bias_path(args.save_bias)  # before any work
    queries = _embeddings(args.queries, "queries", args.l2)
    gallery = _embeddings(args.gallery, "gallery", args.l2)
    positives = _load(args.positives, "positives")
    bank = _embeddings(args.bank, "bank", args.l2) if args.bank else None
    marginal = _load(args.gallery_marginal, "gallery-marginal") if args.gallery_marginal else None
    flags = {"iters": "--iters", "k": "--k", "beta": "--beta", "lam": "--lam", "temperature": "--temperature",
             "num_samples": "--num-samples", "gallery_marginal": "--gallery-marginal", "positives": "--positives",
             "queries": "--queries", "gallery": "--gallery", "bank": "--bank"}
    try:
        norm = build_and_fit(args.method, queries, gallery, bank, oracle=args.oracle,
                             temperature=args.temperature, iters=args.iters, k=args.k, beta=args.beta,
                             lam=args.lam, num_samples=args.num_samples, seed=args.seed,
                             gallery_marginal=marginal)
        checked = {"--queries": queries, "--gallery": gallery, **({"--bank": bank} if bank is not None else {})}
        warning = check_scale(args.method, checked, force=args.force)
        if warning:
            print(f"xmodal normalize: warning: {warning}", file=sys.stderr)
        result = evaluate(norm, queries, gallery, positives, ks=ks, temperature=args.temperature,
                          progress=progress_enabled(args))
    except (ValueError, TypeError) as exc:
        name, sep, rest = str(exc).partition(":")
        if sep and name in flags:
            raise type(exc)(f"{flags[name]}:{rest}") from None
        raise
    if args.save_bias:  # last: every input has been read and used, none can refuse after the file is written
        save_bias(norm, args.method, args.save_bias)
    result.update(method=args.method, normalizer=repr(norm),
                  uses_test_queries=bool(norm.uses_test_queries), temperature=args.temperature)
    if args.method == "sinkhorn":
        result["sinkhorn_marginal_error"] = norm.history
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{norm!r}  (uses test queries: {'yes' if norm.uses_test_queries else 'no'}; "
          f"{queries.shape[0]} queries, {gallery.shape[0]} gallery items"
          f"{'' if bank is None or args.oracle else f', bank of {bank.shape[0]}'})")
    print(_table(result, args.method, ks))
    if result["normalization_error"] is None:
        print(f"(normalisation error skipped: Q x N > {MAX_DENSE})")
    if args.method == "sinkhorn":
        print("Sinkhorn marginal error per iteration: " + ", ".join(f"{e:.2e}" for e in norm.history))
    if args.save_bias:
        print(f"wrote the {args.method} gallery bias [{gallery.shape[0]}] to {args.save_bias} "
              f"(use: xmodal eval --queries ... --gallery ... --bias {args.save_bias})")
    return 0
