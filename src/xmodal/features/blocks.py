"""Captions and images encoded block by block, and a block-aligned shard of them (``xmodal encode text|images``,
alone or as ``--cluster`` tasks).

A row's features can depend on the rows encoded with it: MiniLM (sentence-transformers) sorts a call's
captions by length before it batches them, and a batch is padded to its longest caption, so the same caption
padded to another length comes out a few ulps apart. ``encode text|images`` therefore encode in blocks of
:func:`block_rows` rows (:data:`BATCHES` batches: 2048 captions or 256 images at the default batch sizes),
``[0, U)``, ``[U, 2U)``, ...: a block is always encoded alone, so its rows' features
depend on the block alone, whether the blocks run in one process (with a progress bar or lines in a log) or
in shards on many workers. Shard ``K`` of ``N`` is a contiguous run of whole blocks (:func:`shard_span`), so
the shards' rows, concatenated in shard order, are the bytes one process writes.

May import: numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["BATCHES", "block_rows", "shard_span", "encode_blocks"]

#: Batches per block.
BATCHES = 8


def _shown(x: Any) -> str:
    """``repr(x)`` on one line, at most 60 characters (errors stay one line on any input)."""
    text = " ".join(repr(x).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _whole(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def block_rows(batch_size: int) -> int:
    """Rows of a block: :data:`BATCHES` batches of ``batch_size``.

    >>> block_rows(256), block_rows(32), block_rows(2)
    (2048, 256, 16)
    """
    if not _whole(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {_shown(batch_size)}")
    return BATCHES * int(batch_size)


def shard_span(n: int, shard: tuple[int, int], batch_size: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of shard ``(K, N)`` of ``n`` rows: blocks ``[B (K-1) / N, B K / N)`` of the
    ``B = ceil(n / U)`` blocks of :func:`block_rows` ``U`` (empty when N exceeds B).

    >>> [shard_span(40, (k, 3), 2) for k in (1, 2, 3)]
    [(0, 16), (16, 32), (32, 40)]
    """
    if not (isinstance(shard, tuple) and len(shard) == 2 and all(_whole(v) for v in shard) and _whole(n)
            and n >= 0 and 1 <= shard[0] <= shard[1]):
        raise ValueError(f"shard: expected (K, N) with 1 <= K <= N and n >= 0, got {_shown(shard)} of {_shown(n)}")
    k, m = shard
    unit = block_rows(batch_size)
    blocks = -(-int(n) // unit)
    return min(n, unit * (blocks * (k - 1) // m)), min(n, unit * (blocks * k // m))


def encode_blocks(fn: Callable[[Sequence[Any]], np.ndarray], items: Sequence[Any], *, batch_size: int,
                  start: int = 0, on_block: Callable[[int], None] | None = None) -> np.ndarray:
    """``fn`` over ``items`` one block at a time, concatenated: ``fn(items[a:b])`` for the blocks of
    :func:`block_rows`, counted from row ``start`` of the whole collection (a shard's first row, a multiple
    of the block size); ``on_block(rows)`` after each.

    Shape:
        ``[len(items), D]``, float32 as ``fn`` returns it.
    """
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    if not hasattr(items, "__len__") or not hasattr(items, "__getitem__"):
        raise TypeError(f"items: expected a sequence, got {type(items).__name__}")
    if on_block is not None and not callable(on_block):
        raise TypeError(f"on_block: expected a callable or None, got {type(on_block).__name__}")
    unit = block_rows(batch_size)
    if not _whole(start) or start < 0:
        raise ValueError(f"start: expected a row number >= 0, got {_shown(start)}")
    if start % unit:
        raise ValueError(f"start: {start} is not a block boundary (a multiple of {unit})")
    parts = []
    for a in range(0, len(items), unit):
        parts.append(np.asarray(fn(items[a:a + unit])))
        if on_block is not None:
            on_block(len(parts[-1]))
    if not parts:
        raise ValueError("items: empty")
    return np.concatenate(parts)
