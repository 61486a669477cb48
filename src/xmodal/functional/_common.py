"""Helpers shared by the functional losses (pure tensor code, no state, no distributed).

Numerics: every loss computes similarities and logits in float32 (float64 when an
input is float64) with autocast disabled, so float16/bfloat16 inputs or an enclosing
``torch.autocast`` never overflow ``exp(s / 0.01)``; masks use ``-inf`` + ``logsumexp``.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
import torch.nn.functional as F

from xmodal._validate import all_finite  # noqa: F401  (re-exported: its former home)
from xmodal._validate import flag

Temperature = float | torch.Tensor


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (never a half type)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


@contextlib.contextmanager
def full_precision(device: torch.device) -> Iterator[None]:
    """Disable autocast on ``device`` (matmuls would otherwise be recast to 16 bits)."""
    with torch.autocast(device_type=device.type, enabled=False):
        yield


def check_embeddings(video: torch.Tensor, text: torch.Tensor,
                     names: tuple[str, str] = ("video", "text")) -> None:
    """Validate a pair of ``[B, D]`` embedding batches (floating, finite, same shape).

    The finiteness of both is tested in one host sync (:func:`xmodal._validate.all_finite`):
    the only sync of a loss forward with float temperatures.
    """
    for t, name in zip((video, text), names):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name}: expected a floating tensor, got {t.dtype}")
        if t.ndim != 2:
            raise ValueError(f"{name}: expected shape [B, D], got {tuple(t.shape)}")
        if t.shape[0] == 0 or t.shape[1] == 0:
            raise ValueError(f"{name}: empty batch, shape {tuple(t.shape)}")
    if video.shape != text.shape:
        raise ValueError(f"{names[0]} and {names[1]}: batch shapes differ, "
                         f"{tuple(video.shape)} vs {tuple(text.shape)}")
    if not all_finite(video, text):
        bad = names[0] if not all_finite(video) else names[1]
        raise ValueError(f"{bad}: contains NaN/inf values")


def check_tensor(t: object, name: str, *, ndim: int = 2, floating: bool = True) -> torch.Tensor:
    """A tensor of ``ndim`` dimensions (floating unless ``floating=False``): type and shape
    checks only, no host sync (finiteness is the caller's business)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if floating and not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating tensor, got {t.dtype}")
    if t.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    return t


def prepare(x: torch.Tensor, dtype: torch.dtype, normalize: bool) -> torch.Tensor:
    """Cast to the compute dtype and optionally L2-normalise rows (never in place)."""
    x = x.to(dtype)
    return l2_normalize(x) if flag(normalize, "normalize") else x


def l2_normalize(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Rows divided by their L2 norm (``F.normalize``; a zero row stays zero)."""
    return F.normalize(x, p=2.0, dim=-1, eps=eps)


def similarity(q: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``q @ g.T`` in the dtype of the inputs with autocast disabled. Shape: [Q, G]."""
    with full_precision(q.device):
        return q @ g.transpose(0, 1)


def per_sample(value: Temperature, n: int, name: str, *, like: torch.Tensor,
               allow_zero: bool = False) -> torch.Tensor:
    """Broadcast a float or a 0-d/``[n]`` tensor to a ``[n]`` tensor on ``like``'s device/dtype.

    Used for per-sample temperatures (TS++ eq. 4.7) and margins (eq. 4.8). Values must
    be finite and positive (``allow_zero``: non-negative, for margins). Gradients are kept
    (a learnable temperature flows through).

    Raises:
        TypeError: ``value`` is neither a number nor a tensor.
        ValueError: wrong shape, NaN/inf, or a non-positive (negative) value.
    """
    if isinstance(value, torch.Tensor):
        t = value.to(device=like.device, dtype=like.dtype)
        if t.ndim == 0:
            t = t.expand(n)
        elif t.shape != (n,):
            raise ValueError(f"{name}: expected a float or a tensor of shape [{n}], "
                             f"got shape {tuple(value.shape)}")
        check = t.detach()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        f = scalar_or_per_sample(float(value), n, name, like=like, allow_zero=allow_zero)  # no tensor, no sync
        return torch.full((n,), f, device=like.device, dtype=like.dtype)
    else:
        raise TypeError(f"{name}: expected a float or a tensor, got {type(value).__name__}")
    ok = torch.isfinite(check) & ((check >= 0) if allow_zero else (check > 0))
    if bool(ok.all()):  # one host sync when valid
        return t
    if not bool(torch.isfinite(check).all()):
        raise ValueError(f"{name}: contains NaN/inf")
    bad = (check < 0) if allow_zero else (check <= 0)
    if bool(bad.any()):
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name}: must be {kind}, got minimum {float(check.min())}")
    return t


def scalar_or_per_sample(value: Temperature, n: int, name: str, *, like: torch.Tensor,
                         allow_zero: bool = False) -> float | torch.Tensor:
    """Like :func:`per_sample`, but a Python number stays a validated ``float`` (cheaper:
    no tensor is built); use with :func:`take` and :func:`col`."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        f = float(value)
        if not math.isfinite(f):
            raise ValueError(f"{name}: contains NaN/inf")
        if f < 0 or (f == 0 and not allow_zero):
            raise ValueError(f"{name}: must be {'non-negative' if allow_zero else 'positive'}, got {f}")
        return f
    return per_sample(value, n, name, like=like, allow_zero=allow_zero)


def take(value: float | torch.Tensor, idx: torch.Tensor | None) -> float | torch.Tensor:
    """``value[idx]`` for a per-sample tensor; a float (or ``idx=None``) unchanged."""
    return value if isinstance(value, float) or idx is None else value[idx]


def col(value: float | torch.Tensor) -> float | torch.Tensor:
    """Broadcast a per-row value against ``[R, B]`` logits (``[R, 1]``; a float unchanged)."""
    return value if isinstance(value, float) else value[:, None]


def check_ids(ids: torch.Tensor, n: int, name: str = "ids") -> torch.Tensor:
    """Validate integer instance ids of shape ``[n]``."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(ids).__name__}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{name}: expected an integer tensor, got {ids.dtype}")
    if ids.shape != (n,):
        raise ValueError(f"{name}: expected shape [{n}], got {tuple(ids.shape)}")
    return ids


def same_id_mask(ids_q: torch.Tensor, ids_g: torch.Tensor) -> torch.Tensor:
    """Boolean ``[Q, G]``: True where query and gallery item share an instance id."""
    return ids_q[:, None] == ids_g[None, :].to(ids_q.device)


def resolve_rows(rows: torch.Tensor | slice | None, n: int, device: torch.device) -> torch.Tensor:
    """Indices of the query rows whose loss terms are computed (``None``: all ``n``).

    ``rows`` lets a rank compute only its local rows against the gathered batch
    (open_clip's ``local_loss``). Returns a long tensor ``[R]``.
    """
    if rows is None:
        return torch.arange(n, device=device)
    if isinstance(rows, slice):
        return torch.arange(n, device=device)[rows]
    if not isinstance(rows, torch.Tensor) or rows.is_floating_point() or rows.ndim != 1:
        raise TypeError("rows: expected None, a slice or a 1-d integer tensor")
    if rows.numel() == 0 or int(rows.min()) < 0 or int(rows.max()) >= n:
        raise ValueError(f"rows: indices must lie in [0, {n})")
    return rows.to(device=device, dtype=torch.long)


def positive_logit_mask(idx: torch.Tensor, n: int) -> torch.Tensor:
    """Boolean ``[R, n]`` with True at ``(r, idx[r])`` (the diagonal of the full batch)."""
    m = torch.zeros(idx.numel(), n, dtype=torch.bool, device=idx.device)
    m[torch.arange(idx.numel(), device=idx.device), idx] = True
    return m


def prepare_pair(video: torch.Tensor, text: torch.Tensor,
                 normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate, cast to the compute dtype and (optionally) L2-normalise both modalities."""
    check_embeddings(video, text)
    dtype = compute_dtype(video, text)
    return prepare(video, dtype, normalize), prepare(text, dtype, normalize)


def directional(value: Temperature, t2v: Temperature | None, v2t: Temperature | None, n: int,
                name: str, like: torch.Tensor) -> tuple[float | torch.Tensor, float | torch.Tensor]:
    """Values (float or ``[n]`` tensor) for the text->video and video->text directions.

    ``t2v``/``v2t`` override ``value`` for one direction (TS++ sec. 5.6.4).
    """
    base = scalar_or_per_sample(value, n, name, like=like)
    a = base if t2v is None else scalar_or_per_sample(t2v, n, f"t2v_{name}", like=like)
    b = base if v2t is None else scalar_or_per_sample(v2t, n, f"v2t_{name}", like=like)
    return a, b
