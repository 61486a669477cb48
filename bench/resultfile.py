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
