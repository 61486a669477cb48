"""Rows written once, read in blocks: the gallery embeddings of an index build.

``xmodal index`` embeds a gallery block by block and reads the embeddings several times
(the Sinkhorn bias passes, the index's training sample, adding, the recall's exact
search). :class:`RowStore` keeps them in memory when small and otherwise in a temporary
raw float32 file read with ``os.pread`` (never mapped: a block read costs one block of
memory and nothing stays resident in the process), so the build's peak memory is the
index plus one block. :class:`ShiftedRows` subtracts a per-dimension shift (DN's gallery
mean) from every block it hands out.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

__all__ = ["RowStore", "ShiftedRows", "IN_MEMORY_BYTES"]

#: Stores up to this size stay in memory; larger ones go to a temporary file.
IN_MEMORY_BYTES = 64 << 20


#: :meth:`RowStore.take` reads the rows between two wanted rows up to this many bytes apart (cheaper than
#: another system call), in reads of at most :data:`TAKE_READ_BYTES`.
TAKE_GAP_BYTES = 1 << 16
TAKE_READ_BYTES = 1 << 24


class RowStore:
    """``[N, D]`` float32 rows appended in order, then read as row slices (torch tensors).

    Args:
        num_rows, dim: the final shape.
        directory: where a large store's temporary file goes (default: the system's).
        in_memory_bytes: stores up to this size stay in memory.
        prefix: the temporary file's name prefix (so a caller can find and remove stale ones).

    ``store[a:b]`` (a float32 tensor ``[b - a, D]``), :meth:`take` (sorted or not rows),
    :meth:`blocks`; ``shape``. :meth:`close` removes the file (also on garbage collection).

    >>> s = RowStore(3, 2); s.append(np.ones((2, 2))); s.append(np.zeros((1, 2)))
    >>> s[1:3].tolist(), s.take([2, 0]).tolist()
    ([[1.0, 1.0], [0.0, 0.0]], [[0.0, 0.0], [1.0, 1.0]])
    """

    def __init__(self, num_rows: int, dim: int, *, directory: str | os.PathLike | None = None,
                 in_memory_bytes: int = IN_MEMORY_BYTES, prefix: str = ".xmodal-rows-") -> None:
        from xmodal._validate import positive_int, short_repr, whole_number

        self.num_rows, self.dim = whole_number(num_rows, "num_rows"), positive_int(dim, "dim")
        in_memory_bytes = whole_number(in_memory_bytes, "in_memory_bytes")
        if directory is not None and not (isinstance(directory, (str, os.PathLike)) and Path(directory).is_dir()):
            raise ValueError(f"directory: expected an existing folder or None, got {short_repr(directory)}")
        if not isinstance(prefix, str) or "/" in prefix or os.sep in prefix:
            raise ValueError(f"prefix: expected a file name prefix, got {short_repr(prefix)}")
        self._filled = 0
        self._row_bytes = 4 * self.dim
        self._array: np.ndarray | None = None
        self._fd: int | None = None
        self.path: Path | None = None
        if self.num_rows * self._row_bytes <= in_memory_bytes:
            self._array = np.empty((self.num_rows, self.dim), np.float32)
        else:
            fd, name = tempfile.mkstemp(prefix=prefix, suffix=".f32", dir=directory)
            self._fd, self.path = fd, Path(name)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_rows, self.dim)

    @property
    def on_disk(self) -> bool:
        return self._fd is not None

    def append(self, block: Any) -> None:
        """Write the next rows (``[b, D]``, numpy or torch; converted to float32)."""
        b = block.detach().cpu().numpy() if isinstance(block, torch.Tensor) else np.asarray(block)
        b = np.ascontiguousarray(b, dtype=np.float32)
        if b.ndim != 2 or b.shape[1] != self.dim or self._filled + b.shape[0] > self.num_rows:
            raise ValueError(f"block: expected [<= {self.num_rows - self._filled}, {self.dim}] rows, "
                             f"got {tuple(b.shape)}")
        if self._array is not None:
            self._array[self._filled:self._filled + b.shape[0]] = b
        else:
            view, offset = memoryview(b).cast("B"), self._filled * self._row_bytes
            while view:  # pwrite may write less than asked
                done = os.pwrite(self._fd, view, offset)
                view, offset = view[done:], offset + done
        self._filled += b.shape[0]

    def _read(self, start: int, stop: int) -> np.ndarray:
        if self._array is not None:
            return self._array[start:stop]
        count = (stop - start) * self._row_bytes
        out = np.empty((stop - start, self.dim), np.float32)
        view, offset = memoryview(out).cast("B"), start * self._row_bytes
        while view:
            got = os.preadv(self._fd, [view], offset)
            if got <= 0:
                raise OSError(f"{self.path}: short read ({count} bytes wanted)")
            view, offset = view[got:], offset + got
        return out

    def __getitem__(self, sl: slice) -> torch.Tensor:
        if not isinstance(sl, slice) or sl.step not in (None, 1):
            raise TypeError("RowStore: index with a slice of rows")
        start, stop, _ = sl.indices(self._filled)
        return torch.from_numpy(self._read(start, max(start, stop)))

    def take(self, rows: Any) -> np.ndarray:
        """float32 ``[len(rows), D]``: the given rows, in the given order (read in runs of rows at most
        :data:`TAKE_GAP_BYTES` apart, each read at most :data:`TAKE_READ_BYTES`: a few large reads
        instead of a system call a row)."""
        rows = np.asarray(rows, dtype=np.int64)
        if self._array is not None:
            return self._array[rows]
        order = np.argsort(rows, kind="stable")
        out = np.empty((rows.size, self.dim), np.float32)
        sorted_rows = rows[order]
        gap = max(1, TAKE_GAP_BYTES // self._row_bytes)
        span = max(1, TAKE_READ_BYTES // self._row_bytes)
        # a read ends where the next row is more than `gap` rows on, or would make the read longer than `span`
        ends = np.flatnonzero(np.diff(sorted_rows) > gap) + 1
        i = 0
        for j in [*ends.tolist(), sorted_rows.size]:
            while i < j:
                k = i + int(np.searchsorted(sorted_rows[i:j], sorted_rows[i] + span, side="left"))
                k = max(k, i + 1)
                block = self._read(int(sorted_rows[i]), int(sorted_rows[k - 1]) + 1)
                out[order[i:k]] = block[sorted_rows[i:k] - sorted_rows[i]]
                i = k
        return out

    def blocks(self, rows: int) -> Iterator[tuple[int, int, torch.Tensor]]:
        """``(start, stop, rows[start:stop])`` blocks of ``rows`` rows."""
        for start in range(0, self._filled, rows):
            stop = min(self._filled, start + rows)
            yield start, stop, self[start:stop]

    def close(self) -> None:
        """Remove the temporary file (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            if self.path is not None:
                self.path.unlink(missing_ok=True)

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


class ShiftedRows:
    """``rows[a:b] - shift`` for a :class:`RowStore` (or tensor) and a ``[D]`` shift."""

    def __init__(self, rows: Any, shift: torch.Tensor) -> None:
        from xmodal._validate import short_repr

        shape = getattr(rows, "shape", None)
        if shape is None or len(shape) != 2 or not hasattr(rows, "__getitem__"):
            raise TypeError(f"rows: expected a RowStore or a tensor [N, D], got {short_repr(rows)}")
        if not isinstance(shift, torch.Tensor) or shift.shape != (shape[1],) or not shift.is_floating_point():
            raise ValueError(f"shift: expected a float tensor of {shape[1]} values, got {short_repr(shift)}")
        self.rows, self.shift = rows, shift.float().cpu()

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.rows.shape)

    def __getitem__(self, sl: slice) -> torch.Tensor:
        return self.rows[sl] - self.shift

    def take(self, rows: Any) -> np.ndarray:
        return _take(self.rows, rows) - self.shift.numpy()


def _take(rows: Any, idx: Any) -> np.ndarray:
    if hasattr(rows, "take") and not isinstance(rows, (np.ndarray, torch.Tensor)):
        return rows.take(idx)
    sel = rows[torch.as_tensor(np.asarray(idx), dtype=torch.long)] if isinstance(rows, torch.Tensor) \
        else rows[np.asarray(idx)]
    return np.asarray(sel.detach().cpu().numpy() if isinstance(sel, torch.Tensor) else sel, dtype=np.float32)


def take_rows(rows: Any, idx: Any) -> np.ndarray:
    """float32 ``rows[idx]`` of a tensor, an array, a :class:`RowStore` or :class:`ShiftedRows`."""
    return _take(rows, idx)
