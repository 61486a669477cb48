"""``xmodal train CONFIG --out DIR [section.key=value ...]``."""

from __future__ import annotations

import argparse
import os

from xmodal.commands import Parser, add_common_args, apply_threads

NAME = "train"
HELP = "train a two-tower head on pre-extracted features (YAML config + overrides)"
DESCRIPTION = """Train a two-tower head with any objective, select on the validation split,
choose the test-time normaliser on validation, and write a run directory
(config.yaml, log.jsonl, checkpoint.pt, model.pt, metrics.json, plots).

Overrides are section.key=value (values parsed as YAML), given after the config, with
--set, or as dotted flags:
  xmodal train configs/synthetic.yaml --out runs/x loss.name=ncl --optim.lr 3e-4 --set train.seed=1

An interrupted run resumes from DIR/checkpoint.pt (same final weights as an
uninterrupted run), written at every epoch's end and, inside an epoch, every
train.checkpoint_minutes (30; a killed long epoch resumes from that batch); a resume
over data files that changed since the run started is refused (--accept-changed-data
goes on and records both sets of hashes). Without a terminal, progress lines go to
stderr every 30 s (XMODAL_PROGRESS_SECONDS) while the data loads, inside each epoch
(batches, clips/s, time left) and while the run is evaluated.
Multi-process: torchrun --nproc_per_node N -m xmodal train ..."""


def _options(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument("--out", required=required, default=None, help="run directory (required)")
    parser.add_argument("--set", dest="set_", action="append", default=[], metavar="section.key=value",
                        help="config override (repeatable)")
    parser.add_argument("--no-resume", action="store_true", help="start over even if DIR has a checkpoint")
    parser.add_argument("--accept-changed-data", action="store_true",
                        help="resume even though a data file changed since the run started (refused by "
                             "default, naming the file); provenance.json then records both sets of hashes")
    add_common_args(parser, threads=None, progress=True)
    parser.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True,
                        help="write PNG plots into the run directory (default: on)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config file (see configs/)")
    # argparse cannot interleave a variable-length positional with options, so
    # everything after CONFIG is collected here and parsed (intermixed) in run().
    parser.add_argument("rest", nargs=argparse.REMAINDER, metavar="section.key=value ...",
                        help="config overrides (values parsed as YAML), in any order with the options")
    _options(parser, required=False)


def _dotted_flags(tokens: list[str]) -> list[str]:
    """``--loss.name ncl`` / ``--loss.name=ncl`` -> ``loss.name=ncl`` (dotted flags)."""
    out, i = [], 0
    while i < len(tokens):
        tok = tokens[i]
        key = tok[2:].split("=", 1)[0] if tok.startswith("--") else ""
        if "." in key:
            if "=" in tok:
                out.append(tok[2:])
            elif i + 1 < len(tokens):
                out.append(f"{key}={tokens[i + 1]}")
                i += 1
            else:
                raise ValueError(f"{tok}: missing value")
        else:
            out.append(tok)
        i += 1
    return out


def _parse_rest(args: argparse.Namespace) -> argparse.Namespace:
    p = Parser(prog="xmodal train", add_help=False)  # one-line errors
    _options(p, required=False)
    p.add_argument("overrides", nargs="*")
    rest = p.parse_intermixed_args(_dotted_flags(args.rest))
    merged = argparse.Namespace(**vars(args))
    merged.overrides = [o for o in rest.overrides]
    merged.out = rest.out or args.out
    merged.set_ = list(args.set_) + list(rest.set_)
    merged.no_resume = args.no_resume or rest.no_resume
    merged.accept_changed_data = args.accept_changed_data or rest.accept_changed_data
    merged.progress = rest.progress if rest.progress is not None else args.progress
    merged.quiet = bool(getattr(args, "quiet", False) or getattr(rest, "quiet", False))
    merged.threads = rest.threads if rest.threads is not None else args.threads
    merged.plots = args.plots and rest.plots
    if not merged.out:
        raise ValueError("--out: the run directory is required")
    bad = [o for o in merged.overrides if "=" not in o]
    if bad:
        raise ValueError(f"overrides: expected section.key=value, got {bad[0]!r}")
    return merged


def run(args: argparse.Namespace) -> int:
    from xmodal import dist
    from xmodal.config import load_config
    from xmodal.training.loop import init_distributed_from_env, train

    args = _parse_rest(args)
    cfg = load_config(args.config, list(args.overrides) + list(args.set_))
    apply_threads(args)  # a --threads given after CONFIG is only known here
    started = init_distributed_from_env(cfg.train.device)
    rank = dist.rank()
    _check_config_outside(args.config, args.out, cfg)
    try:  # OSError (a full disk) becomes one line in xmodal.cli.main
        summary = train(cfg, args.out, resume=not args.no_resume, progress=_progress(args, cfg),
                        verbose=not args.quiet,  # --quiet: no line per epoch, only the summary
                        accept_changed_data=args.accept_changed_data)
    finally:
        if started:
            dist.shutdown()
    if rank != 0:
        return 0
    if args.plots:
        from xmodal.reporting.plots import plot_run

        plot_run(args.out)
    print(format_summary(summary))
    print(f"run directory: {os.path.abspath(args.out)}")
    return 0


def _check_config_outside(config: str, out: str, cfg) -> None:
    """Refuse a CONFIG inside --out that the run would overwrite (anything but the ``config.yaml``
    of an existing run holding the same resolved config, as when resuming from it)."""
    from pathlib import Path

    from xmodal.config import load_config, to_dict

    path, folder = Path(config).resolve(), Path(out).resolve()
    if folder not in path.parents:
        return
    is_run = any((folder / name).is_file() for name in ("checkpoint.pt", "model.pt"))
    if path == folder / "config.yaml" and is_run and to_dict(load_config(path)) == to_dict(cfg):
        return  # a run resumed from its own resolved config: rewritten with the same content
    raise ValueError(f"config: {config} lives in --out {out}, whose files xmodal train rewrites; "
                     f"keep the config outside the run directory")


def _progress(args: argparse.Namespace, cfg) -> bool | None:  # noqa: ARG001 - cfg: train() reads it
    """``--progress/--no-progress`` as given (``--quiet``: nothing); else None: bars on a terminal when
    the config's ``train.progress`` allows them, a progress line every 30 s otherwise (a log file)."""
    if getattr(args, "quiet", False):
        return False
    if getattr(args, "progress", None) is not None:
        return bool(args.progress)
    return None


_WIDTHS = {"R@1": 7, "R@5": 6, "R@10": 6, "MdR": 6, "MnR": 7}
_HEAD = "{} R@1" + "".join(f"{k:>{w + 1}}" for k, w in list(_WIDTHS.items())[1:])


def _row(r: dict) -> str:
    """One direction's cells, aligned under :data:`_HEAD` (:func:`xmodal.metrics.format_metric`)."""
    from xmodal.metrics import format_metric

    return " ".join(f"{format_metric(k, r[k]):>{w}}" for k, w in _WIDTHS.items())


def format_summary(summary: dict) -> str:
    """Per-normaliser val (and test) table of one run."""
    lines = [f"best epoch {summary['best_epoch']} of {summary['epochs_run']}, train time "
             f"{summary['train_time_s']:.1f} s, temperature {summary['temperature']:.4f}, "
             f"selected normaliser: {summary['normalizer']}"]
    sel = summary.get("selection") or {}
    if sel.get("tests"):
        from xmodal.retrieval.selection import describe

        lines.append(f"selection ({sel['rule']}: a normaliser replaces none only when the lower end of its "
                     f"{100 * sel['level']:.0f}% paired bootstrap interval is above 0):" if sel["rule"] == "paired"
                     else f"selection ({sel['rule']}: the highest val score):")
        lines += [f"  {line}" for line in describe(sel)]
    if "index_normalizer" in summary:
        lines.append(f"index: {summary['index_note']}" if summary.get("index_note") else
                     f"index: 'xmodal index --normalizer selected' folds {summary['index_normalizer']}, the same")
    for split in ("val", "test"):
        if split not in summary:
            continue
        lines.append(f"{split:5s} {'normaliser':16s} | {_HEAD.format('t2v')} | {_HEAD.format('v2t')}")
        for name, m in summary[split].items():
            if name == "protocol":  # the split's protocol card, not a normaliser
                continue
            cells = [_row(m[d]) for d in ("t2v", "v2t")]
            mark = "*" if name == summary["normalizer"] else (
                "+" if name in summary.get("uses_test_queries", ()) else " ")
            lines.append(f"      {name + mark:16s} | {cells[0]} | {cells[1]}")
        for name, m in summary.get("oracle", {}).get(split, {}).items():
            cells = [_row(m[d]) for d in ("t2v", "v2t")]
            lines.append(f"      {name + '+':16s} | {cells[0]} | {cells[1]}")
    for split in ("val", "test"):  # a hierarchical run on groups: paragraph <-> video (same under every normaliser)
        m = next((v for k, v in summary.get(split, {}).items() if k != "protocol"), {})
        if "p2v" in m:
            cells = [_row(m[d]) for d in ("p2v", "v2p")]
            lines.append(f"{split:5s} {'paragraphs':16s} | {_HEAD.format('p2v')} | {_HEAD.format('v2p')}")
            lines.append(f"      {'global towers' if 'p2v_flat' in m else '(cosine)':16s} | {cells[0]} | {cells[1]}")
            if "p2v_flat" in m:  # the flat reference: the same model's clip embeddings mean-pooled
                cells = [_row(m[d]) for d in ("p2v_flat", "v2p_flat")]
                lines.append(f"      {'flat reference':16s} | {cells[0]} | {cells[1]}")
    if any("p2v_flat" in next(iter(summary.get(split, {}).values()), {}) for split in ("val", "test")):
        lines.append("flat reference: the same model's clip and sentence embeddings mean-pooled, no global level")
    if summary.get("oracle") or summary.get("uses_test_queries"):
        lines.append("* selected on val.  + fitted on the evaluated queries themselves (an oracle, "
                     "not deployable; never selected)")
    per_seed = summary.get("dn_per_seed") or {}
    for split in ("val", "test"):  # DN's own protocol: one DN per sampling seed, mean +- std of the recalls
        if split in per_seed:
            mean, std = per_seed[split]["mean"], per_seed[split]["std"]
            spread = (lambda v: "" if v is None else f" +- {v:.2f}")
            cells = ", ".join(f"{d} R@{k} {mean[d][f'R@{k}']:.2f}{spread(std[d][f'R@{k}'])}"
                              for d in ("t2v", "v2t") for k in (1, 5) if f"R@{k}" in mean.get(d, {}))
            used = per_seed.get("num_samples_used") or {}
            drawn = (f"{per_seed['num_samples']} val samples each" if not used else
                     f"{used['text']} val texts and {used['video']} val videos each of the "
                     f"{per_seed['num_samples']} asked")
            if per_seed.get("seeds_identical"):
                lines.append(f"{split} dn (DN Sec. 4.3; {drawn}: all of them, so the {len(per_seed['seeds'])} seeds "
                             f"are one fit, no spread): {cells}")
            else:
                lines.append(f"{split} dn over {len(per_seed['seeds'])} seeds ({drawn}, DN Sec. 4.3): {cells}")
    if per_seed.get("note"):
        lines.append(f"note: {per_seed['note']}")
    for name, why in summary.get("dropped_normalizers", {}).items():
        lines.append(f"note: test_time.normalizers lists {name}, left out: {why}")
    return "\n".join(lines)


