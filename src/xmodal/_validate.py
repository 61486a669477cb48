"""Shared argument validation: every public entry point turns bad input into a
``ValueError``/``TypeError`` naming the argument (API.md conventions)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def as_tensor(x: Any, name: str, *, dtype: torch.dtype | None = None,
              device: torch.device | str | None = None) -> torch.Tensor:
    """Convert a numpy array / tensor / nested list to a tensor without copying the
    caller's memory in place (the result may share memory; callers never write to it).

    Raises:
        TypeError: if ``x`` is not array-like.
    """
    if isinstance(x, torch.Tensor):
        t = x
    elif isinstance(x, np.ndarray):
        if x.dtype == object:
            raise TypeError(f"{name}: object arrays are not supported")
        with warnings.catch_warnings():
            # Read-only arrays (memmaps, np.load(mmap_mode='r')) are shared, never written to.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            t = torch.from_numpy(np.ascontiguousarray(x))
    elif isinstance(x, (list, tuple)):
        t = torch.as_tensor(np.asarray(x))
    else:
        raise TypeError(f"{name}: expected a numpy array or torch tensor, got {type(x).__name__}")
    if dtype is not None or device is not None:
        t = t.to(dtype=dtype or t.dtype, device=device or t.device)
    return t


def float_matrix(x: Any, name: str, *, ndim: int = 2, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, allow_empty: bool = False,
                 finite: bool = True) -> torch.Tensor:
    """A floating tensor with ``ndim`` dimensions (ints are promoted to float32), finite
    unless ``finite=False`` (the caller checks finiteness later, in one sync with others)."""
    t = as_tensor(x, name, device=device)
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"{name}: expected floating values, got {t.dtype}")
    if not t.is_floating_point():
        t = t.to(torch.float32)
    if dtype is not None:
        t = t.to(dtype)
    if t.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if not allow_empty and t.numel() == 0:
        raise ValueError(f"{name}: empty input, shape {tuple(t.shape)}")
    if finite:
        check_finite(t, name)
    return t


def all_finite(*tensors: torch.Tensor) -> bool:
    """Exact NaN/inf test of any number of tensors in ONE host sync: one float sum per
    tensor, stacked; only a non-finite sum (a NaN/inf entry, or an overflow of finite
    values) falls back to the element-wise check.

    >>> all_finite(torch.ones(3), torch.tensor([1.0, float("nan")]))
    False
    """
    ts = [t for t in tensors if (t.is_floating_point() or t.is_complex()) and t.numel()]
    if not ts:
        return True
    with torch.no_grad():
        dev = ts[0].device
        sums = torch.stack([t.sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32)
                            .to(device=dev, dtype=torch.float32) for t in ts])
        if bool(torch.isfinite(sums).all()):
            return True
        return all(bool(torch.isfinite(t).all()) for t in ts)


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raise ``ValueError`` naming ``name`` if ``t`` holds NaN or inf (one host sync when clean)."""
    if not all_finite(t):
        n_bad = int((~torch.isfinite(t)).sum())
        raise ValueError(f"{name}: contains {n_bad} NaN/inf value(s)")


def check_all_finite(named: dict[str, torch.Tensor]) -> None:
    """:func:`check_finite` of several tensors in one host sync; the error names the first bad one."""
    if all_finite(*named.values()):
        return
    for name, t in named.items():
        check_finite(t, name)


def short_repr(v: Any, limit: int = 60) -> str:
    """A one-line description of ``v`` for error messages (arrays by shape and dtype)."""
    if isinstance(v, (np.ndarray, torch.Tensor)) and getattr(v, "ndim", 0) > 0:
        return f"an array of shape {tuple(v.shape)} ({str(v.dtype).replace('torch.', '')})"
    text = " ".join(repr(v).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def positive_number(v: Any, name: str) -> float:
    """A strictly positive finite float."""
    try:
        f = float(v)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of several values
        raise TypeError(f"{name}: expected a number, got {short_repr(v)}") from None
    if not np.isfinite(f) or f <= 0:
        raise ValueError(f"{name}: must be a positive finite number, got {short_repr(v)}")
    return f


def choice(v: str, name: str, options: tuple[str, ...]) -> str:
    # not a string: never an option (and ``array in options`` would compare element-wise)
    if not isinstance(v, str) or v not in options:
        raise ValueError(f"{name}: unknown option {short_repr(v)}; expected one of {', '.join(options)}")
    return v


def flag(v: Any, name: str) -> bool:
    """A boolean switch: ``True``/``False``, a numpy bool, or the integers 0 and 1.

    Anything else (a string such as ``"false"``, None, an array) is refused rather than
    read through ``bool()``, which would take a typo for True or fail on an array.

    >>> flag(1, "normalize"), flag(False, "normalize")
    (True, False)
    """
    if isinstance(v, (bool, np.bool_)) or (isinstance(v, (int, np.integer)) and v in (0, 1)):
        return bool(v)
    raise TypeError(f"{name}: expected True or False, got {short_repr(v)}")


def integer(v: Any, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """A Python or numpy integer (not a bool) in ``[minimum, maximum]``.

    Raises:
        TypeError: not a number (None, a string, an array, a bool).
        ValueError: a non-integral number, or out of range.
    """
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer, float, np.floating)):
        raise TypeError(f"{name}: expected an integer, got {short_repr(v)}")
    low = "" if minimum is None else f" >= {minimum}"
    if not isinstance(v, (int, np.integer)) or (minimum is not None and v < minimum):
        raise ValueError(f"{name}: must be an integer{low}, got {short_repr(v)}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name}: must be at most {maximum}, got {short_repr(v)}")
    return int(v)


def number(v: Any, name: str, *, minimum: float | None = None) -> float:
    """A finite float (anything ``float()`` reads: numbers, numeric strings, one-element
    arrays), ``>= minimum`` when given.

    Raises:
        TypeError: not a number (None, an array of several values, a non-numeric string).
        ValueError: NaN/inf, too large for a float, or below ``minimum``.
    """
    try:
        f = float(v)
    except OverflowError:
        f = float("inf")
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of several values
        raise TypeError(f"{name}: expected a number, got {short_repr(v)}") from None
    if not np.isfinite(f) or (minimum is not None and f < minimum):
        low = "" if minimum is None else f" >= {minimum:g}"
        raise ValueError(f"{name}: must be a finite number{low}, got {short_repr(v)}")
    return f


def duck(v: Any, name: str, what: str, methods: tuple[str, ...] = (), attrs: tuple[str, ...] = ()) -> Any:
    """``v`` itself when it has the callables ``methods`` and attributes ``attrs``, else a
    ``TypeError`` naming the argument (e.g. a model or split where junk was given)."""
    missing = [m for m in methods if not callable(getattr(v, m, None))] + [a for a in attrs if not hasattr(v, a)]
    if missing:
        raise TypeError(f"{name}: expected {what}, got {type(v).__name__} (no {', '.join(missing)})")
    return v


def positive_int(v: Any, name: str) -> int:
    """A Python or numpy integer >= 1 (bools refused)."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name}: expected a positive integer, got {short_repr(v)}")
    if v < 1:
        raise ValueError(f"{name}: expected a positive integer, got {int(v)}")
    return int(v)


def option(v: Any, name: str, options: tuple[str, ...]) -> str:
    """:func:`choice` that first refuses a non-string (an array's ``in`` test is element-wise)."""
    if not isinstance(v, str):
        raise TypeError(f"{name}: expected one of {', '.join(options)}, got {short_repr(v)}")
    return choice(v, name, options)


def finite_number(v: Any, name: str) -> float:
    """A finite float (any sign): :func:`number` without a minimum."""
    return number(v, name)


def whole_number(v: Any, name: str, minimum: int = 0) -> int:
    """An integer >= ``minimum``: a Python/numpy int or a float holding a whole number (bools refused)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected an integer, got {short_repr(v)}")
    if isinstance(v, (float, np.floating)) and not np.isfinite(v) or int(v) != v or v < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {short_repr(v)}")
    return int(v)


def text_label(v: Any, name: str) -> str:
    """A one-line string used inside messages (a label, a flag name, a split name)."""
    if not isinstance(v, str):
        raise TypeError(f"{name}: expected a string, got {short_repr(v)}")
    if "\n" in v or "\r" in v:
        raise ValueError(f"{name}: expected one line of text, got {short_repr(v)}")
    return v


def int_array(x: Any, name: str, *, ndim: int = 1) -> np.ndarray:
    """An int64 numpy copy of an integer array / tensor / list with ``ndim`` dimensions (bools,
    floats and anything not array-like refused: a float row index is a mistake, not a rounding).

    >>> int_array([2, 0], "rows").tolist()
    [2, 0]
    """
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    elif isinstance(x, (list, tuple)):
        try:
            x = np.asarray(x)
        except (ValueError, TypeError):
            raise TypeError(f"{name}: expected an integer array, got {short_repr(x)}") from None
        if x.size == 0:
            x = x.astype(np.int64)
    if not isinstance(x, np.ndarray) or x.dtype == np.bool_ or not np.issubdtype(x.dtype, np.integer):
        what = f"dtype {x.dtype}" if isinstance(x, np.ndarray) else short_repr(x)
        raise TypeError(f"{name}: expected an integer array, got {what}")
    if x.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimension(s), got shape {tuple(x.shape)}")
    return x.astype(np.int64)
