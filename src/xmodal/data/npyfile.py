"""Reading ``.npy`` / ``.npz`` arrays from users' files without trusting their headers.

A ``.npy`` header declares the array's shape; ``np.load`` allocates what it declares
before reading a byte of data, so a 100-byte file claiming shape ``(2**40,)`` asks for
8 TiB. :func:`load_array` reads the header first (``numpy.lib.format.read_array_header_*``)
and refuses, in one line naming the file, an array whose declared size does not match the
bytes the file holds, that needs more memory than the machine has, or that holds Python
objects; only then does it load. ``.npz`` members are checked the same way against their
stored (uncompressed) size.

``load_array(path, mmap=True)`` maps a ``.npy`` read-only instead of reading it
(``np.load(mmap_mode="r")``): the array keeps its stored dtype (float16 stays float16) and
its pages are page cache the kernel can drop, so a file larger than the machine's memory
opens (only the memory check is skipped; the size and object checks stay).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import IO

import numpy as np
from numpy.lib import format as npformat

__all__ = ["array_header", "load_array", "memory_limit"]


def memory_limit() -> int:
    """Bytes of physical memory (an array larger than this cannot be loaded)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 1 << 40


def _read_header(fp: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = npformat.read_magic(fp)
    if version == (1, 0):
        return npformat.read_array_header_1_0(fp)
    if version == (2, 0):
        return npformat.read_array_header_2_0(fp)
    impl = getattr(npformat, "_read_array_header", None)
    if impl is None:  # numpy >= 2 keeps the version-generic reader here
        from numpy.lib import _format_impl

        impl = _format_impl._read_array_header
    return impl(fp, version)


def _describe(shape: tuple[int, ...], dtype: np.dtype) -> str:
    return f"shape {tuple(shape)} dtype {dtype}"


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def _check_header(fp: IO[bytes], available: int, where: str, *, in_memory: bool = True
                  ) -> tuple[tuple[int, ...], np.dtype]:
    """Read and check one header; ``available``: bytes after the header in the file;
    ``in_memory``: the array will be read into memory (else mapped: no memory check)."""
    try:
        shape, _fortran, dtype = _read_header(fp)
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as exc:
        raise ValueError(f"{where}: not a readable .npy array (bad header: {str(exc).splitlines()[0]})") from None
    if dtype.hasobject:
        raise ValueError(f"{where}: not a readable .npy array (it holds Python objects, "
                         f"{_describe(shape, dtype)}; only numeric arrays are read)")
    need = int(np.prod([int(s) for s in shape], dtype=object)) * dtype.itemsize
    have = available - fp.tell()
    if need > have:
        raise ValueError(f"{where}: its header declares {_describe(shape, dtype)} ({_human(need)}) but the "
                         f"file holds {_human(max(have, 0))} of data: truncated or corrupt")
    if in_memory and need > memory_limit():
        raise ValueError(f"{where}: {_describe(shape, dtype)} needs {_human(need)}, more than this machine's "
                         f"memory ({_human(memory_limit())})")
    return tuple(int(s) for s in shape), dtype


def array_header(path: str | os.PathLike) -> tuple[tuple[int, ...], np.dtype]:
    """``(shape, dtype)`` of a ``.npy`` file from its header, after the checks of
    :func:`load_array`; reads no data."""
    path = Path(path)
    with open(path, "rb") as fp:
        return _check_header(fp, path.stat().st_size, str(path))


def load_array(path: str | os.PathLike, label: str | None = None, *, npz: str = "refuse",
               mmap: bool = False) -> np.ndarray:
    """One array from a ``.npy`` (or, with ``npz="features"``, a ``.npz``) file.

    Args:
        path: the file.
        label: how messages name it (default: the path), e.g. ``"--text-features: t.npz"``.
        npz: ``"refuse"`` (a ``.npz`` is an error saying to give a ``.npy``) or ``"features"``
            (the archive's only array, or the one named ``features``).
        mmap: map a ``.npy`` read-only (a ``numpy.memmap`` in its stored dtype; nothing is
            read until rows are indexed) instead of reading it. An ``.npz`` member is
            always read (archives cannot be mapped).

    Raises:
        ValueError: one line naming the file: missing, not an array file, a header whose
            declared size the file does not hold or the machine cannot, object arrays,
            pickles, an ``.npz`` where one array is expected.
    """
    if label is not None and not isinstance(label, str):
        raise TypeError(f"label: expected a string or None, got {type(label).__name__}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a .npy file path, got {type(path).__name__}")
    path = Path(path)
    where = label or str(path)
    if not path.is_file():
        raise ValueError(f"{where}: file not found")
    with open(path, "rb") as fp:
        head = fp.read(6)
    if head.startswith(b"PK"):
        if npz != "features":
            raise ValueError(f"{where}: is an .npz archive; give a single .npy array file")
        return _load_npz_member(path, where)
    if head != b"\x93NUMPY":
        raise ValueError(f"{where}: not a readable .npy array (no .npy header)")
    with open(path, "rb") as fp:
        shape, _ = _check_header(fp, path.stat().st_size, where, in_memory=not mmap)
    try:
        if mmap and 0 not in shape and len(shape):  # np.load cannot map an empty or 0-d array
            return np.load(path, mmap_mode="r", allow_pickle=False)
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"{where}: not a readable .npy array ({str(exc).splitlines()[0]})") from None
    return arr


def _load_npz_member(path: Path, where: str) -> np.ndarray:
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if n.endswith(".npy")]
            keys = [n[:-len(".npy")] for n in names]
            if "features" in keys:
                key = "features"
            elif len(keys) == 1:
                key = keys[0]
            else:
                raise ValueError(f"{where}: several arrays {keys or '(none)'}; name the features one "
                                 f"'features'")
            info = zf.getinfo(key + ".npy")
            with zf.open(info) as fp:
                _check_header(fp, info.file_size, f"{where} [{key}]")
        with np.load(path, allow_pickle=False) as data:
            return data[key]
    except (zipfile.BadZipFile, OSError, EOFError, KeyError) as exc:
        raise ValueError(f"{where}: not a readable .npz archive ({exc})") from None
    except ValueError as exc:
        if str(exc).startswith(where):
            raise
        raise ValueError(f"{where}: not a readable .npz archive ({str(exc).splitlines()[0]})") from None
