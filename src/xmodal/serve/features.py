"""Query features POSTed to ``xmodal serve``'s ``/api/search``: an ``.npy`` of caption features, read
from the request's bytes without trusting its header (the size it declares must be the bytes sent,
no Python objects), float values only, finite, at most ``max_rows`` rows."""

from __future__ import annotations

import io

import numpy as np

__all__ = ["parse_features"]


def parse_features(body: bytes, *, max_rows: int) -> np.ndarray:
    """Caption features ``[T, Dt]`` float32 from the bytes of an ``.npy`` (``[Dt]`` is one query);
    ValueError naming ``features`` otherwise.

    >>> buf = io.BytesIO(); np.save(buf, np.ones((2, 3), np.float16))
    >>> parse_features(buf.getvalue(), max_rows=8).shape
    (2, 3)
    """
    from xmodal.data.npyfile import _check_header

    if not isinstance(body, (bytes, bytearray)):
        raise TypeError(f"body: expected bytes, got {type(body).__name__}")
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"max_rows: expected a positive integer, got {str(max_rows)[:40]!r}")
    if not body:
        raise ValueError("features: empty body (POST the bytes of an .npy file of caption features)")
    fp = io.BytesIO(body)
    shape, dtype = _check_header(fp, len(body), "features", in_memory=True)
    if dtype.kind != "f":
        raise ValueError(f"features: expected float caption features, got dtype {dtype}")
    if len(shape) not in (1, 2) or 0 in shape:
        raise ValueError(f"features: expected [Dt] or [T, Dt] caption features, got shape {list(shape)}")
    rows = 1 if len(shape) == 1 else shape[0]
    if rows > max_rows:
        raise ValueError(f"features: {rows} queries, more than {max_rows} in one request")
    fp.seek(0)
    arr = np.load(fp, allow_pickle=False)
    arr = np.asarray(arr, dtype=np.float32).reshape(rows, -1)
    if not np.isfinite(arr).all():
        raise ValueError("features: NaN or infinite values")
    return arr
