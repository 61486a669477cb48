"""JSON files another program wrote, read with memory bounded by settings, never by the file.

``json.loads`` of 63 MB of ``{},`` builds 21 million dicts (1.8 GB), and 100,000 nested ``[`` end in
a ``RecursionError``. :func:`loads_bounded` measures what a text would build before parsing it: the
strings are masked out with one regular expression, then the nesting depth and the number of
containers and values come from a cumulative sum over the remaining bytes (numpy, no Python loop).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

#: A JSON string: what the scan masks out (brackets and commas inside it are not structure). One left
#: open runs to the end of the text, so every match succeeds at its first quote and the scan stays
#: linear (requiring the closing quote made an unclosed ``"\\"\\"\\"...`` quadratic: 80 KB took 80 s).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*\\?(?:"|\Z)', re.DOTALL)
_OPEN = np.zeros(256, np.int8)
_OPEN[[ord("{"), ord("[")]] = 1
_CLOSE = np.zeros(256, np.int8)
_CLOSE[[ord("}"), ord("]")]] = 1


def json_shape(data: bytes) -> tuple[int, int]:
    """``(depth, values)`` of a JSON text, measured without parsing it: the deepest nesting of
    objects / arrays, and an upper bound on the number of values and containers it holds
    (separators + containers + 1).

    >>> json_shape(b'{"a": [1, 2, {"b": "[[["}]}')
    (3, 8)
    """
    bare = np.frombuffer(_STRING.sub(b'""', data), np.uint8)
    depth = deepest = containers = separators = 0
    for i in range(0, bare.size, 1 << 20):  # 1 MiB at a time: the scan's own memory stays a few MiB
        part = bare[i:i + (1 << 20)]
        opens = _OPEN[part]
        level = depth + np.cumsum(opens - _CLOSE[part], dtype=np.int32)
        deepest = max(deepest, int(level.max(initial=depth)))
        depth = int(level[-1]) if level.size else depth
        containers += int(opens.sum(dtype=np.int64))
        separators += int(np.count_nonzero((part == ord(",")) | (part == ord(":"))))
    return deepest, separators + containers + 1


def loads_bounded(data: bytes, name: str, *, max_depth: int = 32, max_values: int = 1 << 20) -> Any:
    """``json.loads(data)`` after :func:`json_shape` checked it stays within ``max_depth`` levels and
    ``max_values`` values; anything else is a one-line ``ValueError`` ``"{name} is ..."``."""
    depth, values = json_shape(data)
    if depth > max_depth:
        raise ValueError(f"{name} is JSON nested {depth} levels deep, more than the {max_depth} this file may hold")
    if values > max_values:
        raise ValueError(f"{name} holds about {values:,} JSON values, more than the {max_values:,} this file may hold")
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{name} is not UTF-8 text") from None
    except ValueError as exc:
        raise ValueError(f"{name} is not valid JSON ({str(exc).splitlines()[0]})") from None


def read_json_file(path: str | os.PathLike, name: str | None = None, *, max_bytes: int = 16 << 20,
                   max_depth: int = 32, max_values: int = 1 << 20) -> Any:
    """A JSON file read whole only when it is at most ``max_bytes`` long, then :func:`loads_bounded`.

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: ``"{name} is ..."`` (``name`` default: the path): a folder, too large, too deep, too many values,
            not UTF-8, not JSON.
    """
    p = Path(path)
    name = name or str(p)
    if not p.exists():
        raise FileNotFoundError(f"{name} does not exist")
    if not p.is_file():
        raise ValueError(f"{name} is not a file")
    size = p.stat().st_size
    if size > max_bytes:
        raise ValueError(f"{name} is {size:,} bytes, more than the {max_bytes:,} this file may hold")
    with open(p, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew since the stat
        raise ValueError(f"{name} is more than the {max_bytes:,} bytes this file may hold")
    return loads_bounded(data, name, max_depth=max_depth, max_values=max_values)


__all__ = ["json_shape", "loads_bounded", "read_json_file"]
