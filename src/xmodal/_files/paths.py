"""Absolute paths of the training machine kept out of what a run hands on (an export folder, the model
card, the trackers): each is made relative to a base folder, or elided to its last component.

A path is found inside any string (a command line, ``--out=/x``, ``hf:/models/clip``): a ``/`` at the
start or after a space, ``=``, ``:``, a quote, a comma or a bracket, not followed by a second ``/`` (so
``https://host/p`` stays), up to the next space, quote, comma or closing bracket; and ``~/...`` and ``file:///...``.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import PurePosixPath
from typing import Any, Callable

_ABSOLUTE = re.compile(r"(?:(?<=^)|(?<=[\s=:,'\"(\[]))((?:file://)?(?:~|/(?!/))[^\s'\",;)\]]*)")


def _map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {_map_strings(k, fn) if isinstance(k, str) else k: _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_map_strings(v, fn) for v in value]
    return value


def elide_paths(value: Any) -> Any:
    """``value`` (a string, or dicts / lists of them) with every absolute path cut to ``…/NAME``.

    >>> elide_paths({"cmd": "xmodal train /home/me/c.yaml --out=/data/runs/r1", "url": "https://x.org/a"})
    {'cmd': 'xmodal train …/c.yaml --out=…/r1', 'url': 'https://x.org/a'}
    """
    def cut(m: re.Match) -> str:
        name = PurePosixPath(m.group(1).rstrip("/")).name
        return f"…/{name}" if name and name != "~" else "…"

    return _map_strings(value, lambda s: _ABSOLUTE.sub(cut, s))


def relative_paths(value: Any, base: str | os.PathLike) -> Any:
    """``value`` with every absolute path written relative to ``base`` (``../data`` ...).

    >>> relative_paths("data: /w/data/x.npy", "/w/runs/r1")
    'data: ../../data/x.npy'
    """
    base = os.path.abspath(os.fspath(base))

    def rel(m: re.Match) -> str:
        p = os.path.expanduser(m.group(1).removeprefix("file://"))
        return os.path.relpath(p, base) if p.startswith("/") else p

    return _map_strings(value, lambda s: _ABSOLUTE.sub(rel, s))


def data_sha256(files: Any) -> str | None:
    """One SHA-256 for the data a run read: over the sorted ``"NAME DIGEST"`` lines of ``provenance.json``'s
    ``data`` record (``{path: sha256}``), so the same files anywhere give the same value; None without files."""
    if not isinstance(files, dict) or not files:
        return None
    lines = sorted(f"{PurePosixPath(str(k)).name} {v}" for k, v in files.items())
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


__all__ = ["elide_paths", "relative_paths", "data_sha256"]
