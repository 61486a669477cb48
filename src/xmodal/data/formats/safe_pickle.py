"""A pickle reader that builds plain data only and never runs code from the file.

``raw-captions.pkl`` (MSVD, as Collaborative Experts and CLIP4Clip distribute it) is a pickle: a dict
``{video id: [caption tokens, ...]}``. ``pickle.load`` would run whatever callable the file names
(a ``__reduce__`` payload). :func:`load_plain` uses a :class:`pickle.Unpickler` whose ``find_class``
refuses every global, so only what the pickle opcodes build by themselves loads: dicts, lists,
tuples, sets, strings, bytes, numbers, booleans and None. A file naming any class or function is
refused, and the callable is never looked up, let alone called.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

#: The largest pickle read (bytes): MSVD's raw-captions.pkl is about 5 MB.
MAX_BYTES = 1 << 30


class _PlainUnpickler(pickle.Unpickler):
    """Refuses every global: no class, function or module is ever imported or called."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it names {module}.{name}; only plain data (dicts, lists, strings) is read")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it holds a persistent id; only plain data (dicts, lists, strings) is read")


def load_plain(path: str | Path, what: str) -> Any:
    """The plain data of a pickle file; ``ValueError`` naming ``what`` for anything else.

    >>> import pickle, tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "c.pkl"
    >>> _ = p.write_bytes(pickle.dumps({"vid": [["a", "dog"]]}))
    >>> load_plain(p, "c.pkl")
    {'vid': [['a', 'dog']]}
    """
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise ValueError(f"{what}: {size} bytes, more than the {MAX_BYTES} read")
    data = path.read_bytes()
    try:
        return _PlainUnpickler(io.BytesIO(data), encoding="utf-8").load()
    except pickle.UnpicklingError as exc:
        raise ValueError(f"{what}: refused, not plain data ({exc})") from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, UnicodeDecodeError,
            MemoryError, RecursionError) as exc:
        raise ValueError(f"{what}: not a readable pickle ({type(exc).__name__}: {str(exc)[:80]})") from None
