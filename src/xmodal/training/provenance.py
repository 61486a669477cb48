"""``RUN/provenance.json``: which command, code, versions and data made a run.

Keys (``../shared/API.md``, "Workbench"): ``command`` (the command line), ``xmodal_version``,
``torch_version``, ``git_revision`` (the commit of the xmodal source tree, or ``null``
outside a git checkout; ``git_dirty`` says whether it had uncommitted changes),
``data`` (``{file: sha256}`` of every data file the run read; empty for the built-in
synthetic data), ``started`` and ``finished`` (UTC, ISO 8601; ``finished`` is ``null``
while the run is going or after a kill). A resumed run keeps its first ``started`` and
appends the time of each resume to ``resumed``. Written atomically (temporary file +
rename), so a reader never sees half a file.

A resume over changed data is refused (:func:`check_resume`, issue 25.5): the file would
otherwise list only the new hashes and misstate what the model was trained on. Accepted
(``xmodal train --accept-changed-data``), ``data`` holds the new hashes and ``data_history``
the earlier ones: ``[{"data": {file: sha256}, "until_epoch": E, "until_step": S, "replaced": time}, ...]``,
the hashes the epochs up to ``E`` (the first ``S`` optimisation steps) were trained on; a resume from a
checkpoint inside an epoch also records ``until_batch``, the batches of epoch ``E + 1`` trained before.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable

NAME = "provenance.json"


def now() -> str:
    """The current UTC time, ISO 8601 to the second (``2026-11-23T22:30:00Z``)."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def command_line(argv: Iterable[str] | None = None) -> str:
    """The command as a user would retype it: ``xmodal train ...`` for the CLI (also under
    ``python -m xmodal``), else the Python script and its arguments, shell-quoted."""
    argv = list(sys.argv if argv is None else argv)
    if argv and (Path(argv[0]).name in ("xmodal", "__main__.py") or argv[0] == "-m"):
        argv = ["xmodal"] + argv[1:]
    return " ".join(shlex.quote(a) for a in argv)


def sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def git_revision(path: str | os.PathLike | None = None) -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the git checkout holding ``path`` (default: the xmodal
    sources), or ``(None, None)`` when it is not in one or git is missing."""
    where = Path(path) if path is not None else Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        if rev.returncode != 0:
            return None, None
        status = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() or None, bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None, None


def split_files(root: str | os.PathLike, split: str) -> list[Path]:
    """Every existing layout file of ``split`` under ``root`` (all roles, experts and
    their masks): what :func:`xmodal.data.load_paired_split` may read."""
    from xmodal.data import layout

    files = [layout.find(root, split, role) for role in layout.ROLES]
    for name, path in layout.expert_files(root, split).items():
        files += [path, layout.expert_mask_file(root, split, name)]
    return sorted({p for p in files if p is not None})


def data_files(cfg: Any) -> list[Path]:
    """The data files a training run with config ``cfg`` reads (none for synthetic data)."""
    d = cfg.data
    if d.name == "synthetic":
        return []
    from xmodal.data import layout

    splits = [d.train_split] + ([] if d.val_from_train else [d.val_split])  # val carved out of train
    if d.test_split and not layout.missing_files(d.root, d.test_split):
        splits.append(d.test_split)
    return sorted({p for s in dict.fromkeys(splits) for p in split_files(d.root, s)})


def hash_files(files: Iterable[str | os.PathLike]) -> dict[str, str]:
    """``{absolute path: sha256}``."""
    return {str(Path(p).resolve()): sha256(p) for p in files}


class ChangedDataError(ValueError):
    """A resume over data files whose content changed since the run started."""


def data_changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What differs between two ``{file: sha256}`` records, one line per file.

    >>> data_changes({"/d/a.npy": "11", "/d/b.npy": "22"}, {"/d/a.npy": "33", "/d/c.npy": "44"})
    ['/d/a.npy changed (sha256 11... -> 33...)', '/d/b.npy is no longer read', '/d/c.npy is new']
    """
    out = []
    for f in sorted(set(before) | set(after)):
        if f not in after:
            out.append(f"{f} is no longer read")
        elif f not in before:
            out.append(f"{f} is new")
        elif before[f] != after[f]:
            out.append(f"{f} changed (sha256 {before[f][:12]}... -> {after[f][:12]}...)")
    return out


def check_resume(out: Path, hashes: dict[str, str], *, epoch: int, accept: bool = False, batch: int = 0,
                 step: int | None = None) -> dict | None:
    """Compare the data of a run being resumed with the hashes its ``provenance.json`` recorded.

    Args:
        out: the run directory.
        hashes: ``{file: sha256}`` of the data this resume reads (:func:`hash_files`).
        epoch: the epochs already trained (the checkpoint's), recorded with the old hashes.
        accept: go on when the data changed, recording both sets of hashes.
        batch: the batches of the next epoch already trained (a checkpoint inside an epoch).
        step: the optimisation steps already trained (recorded as ``until_step`` when given).

    Returns:
        None when nothing changed (or the run has no readable record to compare with); else,
        with ``accept``, the ``data_history`` entry :func:`start` appends.

    Raises:
        ChangedDataError: the data changed and ``accept`` is false; the message names the first
            changed file.
    """
    try:
        old = json.loads((out / NAME).read_text(encoding="utf-8"))
        before = old["data"]
        if not isinstance(before, dict):
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a run from before provenance.json, or a damaged one: nothing to compare with
    changes = data_changes(before, hashes)
    if not changes:
        return None
    if not accept:
        more = f" (and {len(changes) - 1} more file(s))" if len(changes) > 1 else ""
        trained = f"{epoch} epoch(s)" + (f" and {batch} batch(es)" if batch else "")
        raise ChangedDataError(f"resume: the data changed since this run started {trained} ago: "
                               f"{changes[0]}{more}; resuming would mix two datasets in one model. Start over "
                               f"with --no-resume (or another --out), or pass --accept-changed-data to go on "
                               f"(provenance.json then records both sets of hashes)")
    entry = {"data": before, "until_epoch": int(epoch), "replaced": now(), "changes": changes}
    if step is not None:  # inside an epoch, until_epoch alone would not say which batches saw the old data
        entry.update(until_step=int(step), **({"until_batch": int(batch)} if batch else {}))
    return entry


def start(out: Path, files: Iterable[str | os.PathLike], *, command: str | None = None,
          resumed: bool = False, hashes: dict[str, str] | None = None, changed: dict | None = None) -> dict:
    """Write ``out/provenance.json`` at the start of a run (``finished: null``) and return it.

    On a resume the existing file's ``started`` and ``data_history`` are kept, this start is
    appended to ``resumed``, and ``changed`` (an accepted :func:`check_resume` entry) to
    ``data_history``. ``hashes``: the files' hashes when already computed (else hashed here).
    """
    import torch

    import xmodal
    from xmodal.runs import atomic_write_text

    rev, dirty = git_revision()
    record: dict[str, Any] = {
        "command": command if command is not None else command_line(),
        "xmodal_version": xmodal.__version__, "torch_version": torch.__version__,
        "python_version": sys.version.split()[0], "git_revision": rev, "git_dirty": dirty,
        "data": hash_files(files) if hashes is None else dict(hashes), "started": now(), "finished": None,
    }
    path = out / NAME
    if resumed and path.is_file():
        try:
            old = json.loads(path.read_text())
            record["started"] = old.get("started", record["started"])
            record["resumed"] = list(old.get("resumed", [])) + [now()]
            if old.get("data_history"):
                record["data_history"] = list(old["data_history"])
        except (OSError, ValueError, AttributeError, TypeError):
            pass
    if changed is not None:
        record["data_history"] = list(record.get("data_history", [])) + [changed]
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")
    return record


def finish(out: Path, record: dict) -> dict:
    """Set ``finished`` and rewrite ``out/provenance.json`` atomically."""
    from xmodal.runs import atomic_write_text

    record = {**record, "finished": now()}
    atomic_write_text(out / NAME, json.dumps(record, indent=1) + "\n")
    return record
