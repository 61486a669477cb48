"""A bench's result file: JSON under ``docs/results/data/`` that the docs pages render (issue 45 item 1).

Every file carries its provenance (``command``, ``commit``, ``dirty``, ``date``, ``machine``, ``source``)
beside the bench's own keys; ``docs/hooks/numbers.py`` refuses a file without it. A page quotes a file's
values with placeholders (``{{ NAME:KEY.PATH }}``), so re-running the bench and rebuilding the docs is the
only way a number on a page changes.
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


def _cell(text: str) -> Any:
    """A Markdown table cell as a value: ``m ± s`` -> ``{"mean", "std"}``, ``a, b, c`` -> a list, a number,
    or the text."""
    t = text.strip()
    if re.fullmatch(r"-?\d+(?:\.\d+)? ± \d+(?:\.\d+)?", t):
        m, s = t.split(" ± ")
        return {"mean": float(m), "std": float(s)}
    if re.fullmatch(r"-?\d+(?:\.\d+)?(?:, -?\d+(?:\.\d+)?)+", t):
        return [int(x) if re.fullmatch(r"-?\d+", x) else float(x) for x in t.split(", ")]
    if re.fullmatch(r"-?\d+", t):
        return int(t)
    if re.fullmatch(r"-?\d+\.\d+", t):
        return float(t)
    return t


def markdown_tables(text: str) -> list[dict]:
    """Every table of a Markdown file a bench wrote, as ``{"title", "command", "columns", "align", "rows"}``
    (``title``: the heading above it; ``command``: the ``Command: `...``` line between them, if any)."""
    tables, title, command, lines = [], "", None, text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            title, command = line.lstrip("#").strip(), None
        elif line.startswith("Command: `"):
            command = line[len("Command: `"):].rstrip("`")
        elif line.startswith("| ") and i + 1 < len(lines) and re.fullmatch(r"\|(?:-+:?\|)+", lines[i + 1]):
            split = lambda row: [c.strip() for c in row.strip().strip("|").split(" | ")]  # noqa: E731
            columns, align, rows = split(line), lines[i + 1].strip("|").split("|"), []
            i += 2
            while i < len(lines) and lines[i].startswith("| "):
                rows.append([_cell(c) for c in split(lines[i])])
                i += 1
            tables.append({"title": title, "command": command, "columns": columns, "align": align, "rows": rows})
            continue
        i += 1
    return tables


def main(argv: Sequence[str] | None = None) -> int:
    """``--from-markdown FILE``: a result file from the tables a bench once wrote as Markdown (parsed, never
    retyped; ``--commit``, ``--date``, ``--machine`` and ``--source`` say where they came from)."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__.split("\n")[0])
    p.add_argument("--from-markdown", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--commit", required=True, help="the commit that wrote the Markdown file")
    p.add_argument("--date", required=True)
    p.add_argument("--machine", default="not recorded")
    p.add_argument("--source", required=True, help="what the Markdown file is (the bench's own output)")
    p.add_argument("--only", type=int, nargs="+", default=None, help="keep these tables (0 = the first)")
    args = p.parse_args(argv)
    tables = markdown_tables(Path(args.from_markdown).read_text())
    if args.only is not None:
        tables = [tables[i] for i in args.only if i < len(tables)]
    if not tables:
        print(f"--from-markdown: {args.from_markdown} holds no table", file=sys.stderr)
        return 2
    write_json(args.out, {"command": "; ".join(dict.fromkeys(t["command"] for t in tables if t["command"])),
                          "commit": args.commit, "date": args.date, "machine": args.machine,
                          "source": args.source, "tables": tables})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
