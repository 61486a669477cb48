"""A bench's result file: JSON under ``docs/results/data/`` that the docs pages render (issue 45 item 1).

Every file carries its provenance (``command``, ``commit``, ``dirty``, ``date``, ``machine``, ``source``)
beside the bench's own keys; ``docs/hooks/numbers.py`` refuses a file without it. A page quotes a file's
values with placeholders (``{{ NAME:KEY.PATH }}``), so re-running the bench and rebuilding the docs is the
only way a number on a page changes.

A bench that prints Markdown tables gets its result file from this module's command line (from the
repository root)::

    python bench/resultfile.py --run "xmodal demo" --out docs/results/data/demo.json
    python bench/resultfile.py --run "xmodal bench --datasets synthetic --out runs/bench" \\
        --out docs/results/data/synthetic_grid_3seeds.json

(``--run`` runs the bench now and records this run's commit, date and machine; ``--from-markdown FILE``
parses what a bench once wrote, with ``--commit``, ``--date`` and ``--source`` naming where it came from).
Either way every table is checked to print back the bench's lines digit for digit.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]


def provenance(script: str, argv: Sequence[str] | None, source: str) -> dict:
    """``command`` (as retyped from the repository root), ``commit`` / ``dirty`` of the checkout,
    ``date`` (UTC), ``machine`` (platform, CPUs, torch and its threads) and ``source`` (what wrote the file)."""
    import torch

    from xmodal.training.provenance import git_revision, now

    args = list(sys.argv[1:] if argv is None else argv)
    commit, dirty = git_revision(ROOT)
    threads = os.environ.get("OMP_NUM_THREADS")
    return {"command": ("OMP_NUM_THREADS=1 " if threads == "1" else "") + f"python {script} "
            + " ".join(shlex.quote(a) for a in args),
            "commit": commit or "unknown (not a git checkout)", "dirty": dirty, "date": now(),
            "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, torch "
                       f"{torch.__version__}, {torch.get_num_threads()} thread(s)",
            "source": source}


def summary(values: Sequence[float]) -> dict:
    """``{"mean", "std" (ddof 1; 0 for one value), "per_seed"}`` as the pages print them."""
    vals = [float(v) for v in values]
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return {"mean": mean, "std": std, "per_seed": vals}


def write_json(path: str | os.PathLike, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` through a temporary name renamed at the end (a killed run leaves the
    last good file)."""
    path = Path(path)
    if path.suffix != ".json":
        raise ValueError(f"--write: {path} is not a .json file (benches write data; the pages render it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)


_NUM = r"[+-]?\d+(?:\.\d+)?"


def _cell(text: str) -> Any:
    """A Markdown table cell as a value: ``m ± s`` -> ``{"mean", "std"}``, ``a, b, c`` -> a list, a number,
    or the text."""
    t = text.strip()
    if re.fullmatch(rf"{_NUM} ± \d+(?:\.\d+)?", t):
        m, s = t.split(" ± ")
        return {"mean": float(m), "std": float(s)}
    if re.fullmatch(rf"{_NUM}(?:, {_NUM})+", t):
        return [int(x) if re.fullmatch(r"[+-]?\d+", x) else float(x) for x in t.split(", ")]
    if re.fullmatch(r"[+-]?\d+", t):
        return int(t)
    if re.fullmatch(r"[+-]?\d+\.\d+", t):
        return float(t)
    return t


def _spec(text: str) -> str | None:
    """The format a numeric cell was printed with (``.2f``, ``+.2f``), ``None`` for text."""
    t = text.strip()
    if isinstance(_cell(t), str):
        return None
    first = re.match(_NUM, t).group(0)
    decimals = len(first.split(".")[1]) if "." in first else 0
    return ("+" if first.startswith("+") else "") + f".{decimals}f"


def _column_spec(texts: list[str]) -> str | None:
    """A column's format: the first numeric cell's decimals, signed if any cell carries a ``+`` (a bare integer
    among decimals, the `0` of a gain column, prints as it is and does not set the format)."""
    specs = [s for s in map(_spec, texts) if s]
    if any(s.endswith("f") and not s.endswith(".0f") for s in specs):  # an integer cell (a bare 0) keeps its text
        specs = [s for s in specs if not s.endswith(".0f")]
    if not specs:
        return None
    return ("+" if any(s.startswith("+") for s in specs) else "") + specs[0].lstrip("+")


def _split_row(row: str) -> list[str]:
    """A table row's cells; an empty cell (``| |``) is ``""``."""
    inner = row.strip().removeprefix("|").removesuffix("|")
    return [c.strip() for c in re.split(r"(?<= )\|(?= )", f" {inner} ")]


def markdown_tables(text: str) -> list[dict]:
    """Every table of a Markdown file a bench wrote, as ``{"title", "command", "columns", "align", "formats",
    "rows", "before", "after"}`` (``title``: the heading above it; ``command``: the ``Command: `...``` line
    between them, if any; ``formats``: each column's printed format, so the page prints the digits the bench
    printed; ``before`` / ``after``: the bench's prose between the heading and the table / after the table)."""
    tables, title, command, lines = [], "", None, text.splitlines()
    prose: list[str] = []
    last = None  # the table whose "after" prose is being read

    def flush() -> None:
        if last is not None:
            last["after"] = "\n".join(prose).strip()

    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            flush()
            title, command, prose, last = line.lstrip("#").strip(), None, [], None
        elif line.startswith("Command: `"):
            command = line[len("Command: `"):].rstrip("`")
        elif line.startswith("| ") and i + 1 < len(lines) and re.fullmatch(r"\|(?: ?:?-+:? ?\|)+", lines[i + 1]):
            columns, align, cells = _split_row(line), lines[i + 1].strip("|").split("|"), []
            i += 2
            while i < len(lines) and lines[i].startswith("| "):
                cells.append(_split_row(lines[i]))
                i += 1
            formats = [_column_spec([r[c] for r in cells if c < len(r)]) for c in range(len(columns))]
            last = {"title": title, "command": command, "columns": columns, "align": align,
                    "formats": formats, "rows": [[_cell(c) for c in r] for r in cells],
                    "before": "\n".join(prose).strip(), "after": ""}
            tables.append(last)
            prose = []
            continue
        else:
            prose.append(line)
        i += 1
    flush()
    return tables


def check_round_trip(text: str, tables: list[dict]) -> None:
    """Raise ValueError unless every parsed table renders (through ``docs/hooks/numbers.py``) to the exact
    lines the bench wrote: nothing was lost or reformatted between the bench's Markdown and the JSON."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("numbers_hook", ROOT / "docs" / "hooks" / "numbers.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    printed = {" ".join(line.split()) for line in text.splitlines()}
    for t in tables:
        try:
            rendered = hook.table(t)
        except hook.Missing as exc:
            raise ValueError(f"--from-markdown: table {t['title'][:40]!r}: {exc.args[0]}") from None
        for line in rendered.splitlines()[2:]:
            if " ".join(line.split()) not in printed:
                raise ValueError(f"--from-markdown: table {t['title'][:40]!r} does not round-trip: {line[:100]!r}")


def run_command(command: str) -> str:
    """Run ``command`` (an ``xmodal ...`` or ``python ...`` line) from the repository root with this Python's
    environment; its stdout, echoed. Raise ValueError in one line if it fails."""
    import subprocess

    words = shlex.split(command)
    if not words:
        raise ValueError("--run: empty command")
    if words[0] == "xmodal":
        words = [sys.executable, "-m", "xmodal", *words[1:]]
    elif words[0] == "python":
        words = [sys.executable, *words[1:]]
    res = subprocess.run(words, cwd=ROOT, capture_output=True, text=True, check=False)
    sys.stdout.write(res.stdout)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ValueError(f"--run: {command!r} exited with {res.returncode}: {last}")
    return res.stdout


def main(argv: Sequence[str] | None = None) -> int:
    """A result file from the Markdown tables a bench printed: ``--run "CMD"`` runs the bench now (its
    provenance is this run's), ``--from-markdown FILE`` reads what a bench once wrote (parsed, never
    retyped; ``--commit``, ``--date``, ``--machine`` and ``--source`` say where it came from)."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__.split("\n")[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--from-markdown", help="a Markdown file a bench wrote")
    what.add_argument("--run", metavar="CMD", help="run this bench command (e.g. \"xmodal demo\") from the repository "
                      "root, keep its printed Markdown on stdout and write its tables")
    p.add_argument("--out", required=True)
    p.add_argument("--commit", help="the commit that wrote the Markdown file (--from-markdown)")
    p.add_argument("--date", help="when (--from-markdown)")
    p.add_argument("--machine", default="not recorded")
    p.add_argument("--source", help="what the Markdown file is (the bench's own output; --from-markdown)")
    p.add_argument("--command", default=None, help="the bench's command (default: the tables' Command lines)")
    p.add_argument("--until", default=None, help="read the Markdown only up to the first line starting with "
                   "this (text a person appended to the bench's output)")
    p.add_argument("--only", type=int, nargs="+", default=None, help="keep these tables (0 = the first)")
    args = p.parse_args(argv)
    if not args.out.endswith(".json"):
        p.error(f"--out: {args.out} is not a .json file")
    if args.from_markdown and not (args.commit and args.date and args.source):
        p.error("--from-markdown needs --commit, --date and --source (where the Markdown came from)")
    # the commit and date the bench starts at (a commit made while it runs is not the code it ran)
    started = provenance("bench/resultfile.py", None, f"bench/resultfile.py --run: the tables {args.run!r} printed, "
                         "parsed as it ran (this file is its output)") if args.run else None
    try:
        text = Path(args.from_markdown).read_text() if args.from_markdown else run_command(args.run)
    except (OSError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    where = args.from_markdown or f"the output of {args.run!r}"
    if args.until is not None:
        lines = text.splitlines(keepends=True)
        stop = next((i for i, line in enumerate(lines) if line.startswith(args.until)), None)
        if stop is None:
            print(f"--until: no line of {where} starts with {args.until!r}", file=sys.stderr)
            return 2
        text = "".join(lines[:stop])
    tables = markdown_tables(text)
    try:
        check_round_trip(text, tables)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.only is not None:
        tables = [tables[i] for i in args.only if i < len(tables)]
    if not tables:
        print(f"resultfile: {where} holds no table", file=sys.stderr)
        return 2
    if args.run:
        data = started
        data["command"] = args.run
        data["machine"] = data["machine"].rsplit(",", 1)[0] + " (threads: the bench's own --threads)"
        data["run_by"] = "python bench/resultfile.py " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    else:
        data = {"command": args.command or "; ".join(dict.fromkeys(t["command"] for t in tables if t["command"])),
                "commit": args.commit, "date": args.date, "machine": args.machine, "source": args.source}
    write_json(args.out, {**data, "tables": tables})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
