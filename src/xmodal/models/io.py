"""Checkpoint I/O: what a checkpoint stores about a model, and weights-only loading."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from xmodal._validate import short_repr
from xmodal.models.skeleton import MAX_DERIVED_BYTES, MAX_EXPERTS, _model_class, skeleton  # noqa: F401 (re-exported)
from xmodal.models.two_tower import TwoTower
from xmodal.runs import load_checkpoint
from xmodal.retrieval.testtime import TestTime

CHECKPOINT_NAMES = ("model.pt", "checkpoint.pt")


def checkpoint_file(path: str | os.PathLike) -> Path:
    """The checkpoint behind ``path``: the file itself, or a run directory's ``model.pt`` (else its
    ``checkpoint.pt``).

    Raises:
        FileNotFoundError: nothing at ``path``, or a directory without either file.
    """
    p = Path(path)
    if p.is_dir():
        for name in CHECKPOINT_NAMES:
            if (p / name).is_file():
                return p / name
        raise FileNotFoundError(f"path: no {' or '.join(CHECKPOINT_NAMES)} in {path}")
    if not p.is_file():
        raise FileNotFoundError(f"path: {path} does not exist")
    return p


def model_payload(model: TwoTower) -> dict:
    """What a checkpoint stores about the model (plain tensors and dicts)."""
    if not isinstance(model, TwoTower):
        raise TypeError(f"model: expected a TwoTower, got {short_repr(model)}")
    return {"architecture": model.architecture(), "state_dict": model.state_dict(),
            "test_time": model.test_time.state_dict()}


def check_declared_shapes(arch: dict, state_dict: dict) -> dict[str, torch.Tensor]:
    """Refuse weights that are not exactly what the architecture declares, before any module is
    allocated (the model is first built on the ``meta`` device, :func:`skeleton`): every declared
    tensor present, no other, each of the declared shape and dtype (float32: a float16 or int8 copy
    would be converted on load and change every score), and finite.

    Returns:
        The meta skeleton's ``state_dict`` (name -> meta tensor of the declared shape and dtype).

    Raises:
        ValueError: naming the first tensor that is missing, unexpected, of another shape or dtype,
            or holds NaN / inf.
    """
    from xmodal._validate import all_finite

    if not isinstance(state_dict, dict):
        raise ValueError("its weights are not a mapping of tensors")
    declared = skeleton(arch).state_dict()
    for name, want in declared.items():
        have = state_dict.get(name)
        if not isinstance(have, torch.Tensor):
            raise ValueError(f"the architecture declares {name} but the weights lack it")
        if tuple(have.shape) != tuple(want.shape):
            raise ValueError(f"the architecture declares {name} of shape {tuple(want.shape)} but the weights "
                             f"hold {tuple(have.shape)}")
        if have.dtype != want.dtype:
            raise ValueError(f"the weights hold {name} as {str(have.dtype).removeprefix('torch.')}, the "
                             f"architecture's is {str(want.dtype).removeprefix('torch.')} (xmodal writes "
                             f"{str(want.dtype).removeprefix('torch.')}; a converted copy changes the scores)")
    extra = sorted(str(k) for k in state_dict if k not in declared)
    if extra:
        raise ValueError(f"payload['state_dict']: the weights hold {', '.join(extra[:3])}"
                         f"{' ...' if len(extra) > 3 else ''}, which the architecture does not declare")
    for name in declared:
        if not all_finite(state_dict[name]):
            raise ValueError(f"the weights hold NaN or inf in {name}")
    return declared


def check_test_time_values(test_time: TestTime, dim: int) -> None:
    """The stored test-time state holds what the model can use: each query bank a float32
    ``[K, dim]`` finite matrix, DN's fitted tensors finite (its means ``[dim]``).

    Raises:
        ValueError: naming the bank or DN tensor.
    """
    from xmodal._validate import all_finite

    for bank, pair in test_time.banks.items():
        for side, t in zip(("text", "video"), pair):
            where = f"test_time.banks.{bank}.{side}"
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.ndim != 2 or t.shape[1] != dim:
                got = f"{str(t.dtype).removeprefix('torch.')} {tuple(t.shape)}" if isinstance(t, torch.Tensor) \
                    else short_repr(t)
                raise ValueError(f"{where}: expected float32 [K, {dim}] embeddings, got {got}")
            if not all_finite(t):
                raise ValueError(f"{where}: holds NaN or inf")
    dn = test_time.dn
    if dn is None:
        return
    if not isinstance(dn, dict) or not isinstance(dn.get("tensors"), dict):
        raise ValueError("test_time.dn: expected a fitted DN state with tensors")
    for key, t in dn["tensors"].items():
        where = f"test_time.dn.tensors.{key}"
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise ValueError(f"{where}: expected a floating tensor, got {short_repr(t)}")
        if key in ("mu_q", "mu_g") and tuple(t.shape) != (dim,):
            raise ValueError(f"{where}: expected a mean of shape ({dim},), got {tuple(t.shape)}")
        if not all_finite(t):
            raise ValueError(f"{where}: holds NaN or inf")
    try:
        from xmodal.normalize import DistributionNormalization

        DistributionNormalization.from_state_dict(dn)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"test_time.dn: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


def model_from_payload(payload: dict) -> TwoTower:
    """The model a :func:`model_payload` record describes, in eval mode.

    Raises:
        TypeError: ``payload`` is not a dict.
        ValueError: its architecture or weights are missing, malformed or do not match.
    """
    if not isinstance(payload, dict):
        raise TypeError(f"payload: expected a dict written by model_payload, got {short_repr(payload)}")
    for key in ("architecture", "state_dict"):
        if key not in payload:
            raise ValueError(f"payload: no {key!r} (not written by model_payload)")
    arch = payload["architecture"]
    check_declared_shapes(arch, payload["state_dict"])
    test_time = TestTime.from_state_dict(payload.get("test_time"))
    model = _model_class(arch).from_architecture(arch)
    check_test_time_values(test_time, model.dim)
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as exc:  # e.g. keys the architecture does not declare
        raise ValueError(f"payload['state_dict']: {' '.join(str(exc).split())[:300]}") from None
    model.test_time = test_time
    model.eval()
    return model


def model_files(path: str | os.PathLike) -> dict[str, Path]:
    """The files that carry the model behind ``path``, by the name a copy keeps: an export folder's
    ``{"model.safetensors": ..., "config.json": ...}`` or a run's / checkpoint's ``{"model.pt": ...}``
    (what an index folder copies for its text head).

    Raises:
        FileNotFoundError: nothing at ``path``, or a directory holding neither.
    """
    from xmodal.models.export import MODEL_FILES, is_export_dir

    if is_export_dir(path):
        return {name: Path(path) / name for name in MODEL_FILES}
    return {"model.pt": checkpoint_file(path)}


def run_config(path: str | os.PathLike) -> dict | None:
    """The training config (plain dict) recorded with the model behind ``path`` (a run, a checkpoint or
    an export folder), or None when it is not recorded or unreadable."""
    from xmodal.models.export import is_export_dir, read_config

    try:
        if is_export_dir(path):
            cfg = read_config(path).get("run_config")
        else:
            cfg = torch.load(checkpoint_file(path), map_location="cpu", weights_only=True).get("config")
    except (OSError, KeyError, TypeError, ValueError, RuntimeError, AttributeError):
        return None
    return cfg if isinstance(cfg, dict) else None


def load_model(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> TwoTower:
    """Load a model written by ``xmodal train`` or ``xmodal export``.

    Args:
        path: a run directory (its ``model.pt``, the selected best model, or else its
            last ``checkpoint.pt``), a checkpoint file, or a folder written by ``xmodal export``
            (``model.safetensors`` + ``config.json``, :mod:`xmodal.models.export`; no pickle).

    Returns:
        A :class:`TwoTower` in eval mode with ``temperature`` and ``test_time`` set.

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: the file is corrupt, truncated, not an xmodal checkpoint, or holds
            Python objects that could run code (refused: loading is weights-only).
    """
    from xmodal.models.export import export_payload, is_export_dir

    if is_export_dir(path):
        try:
            return model_from_payload(export_payload(path)).to(map_location)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ValueError(f"path: {path} is not a loadable xmodal export ({msg.removeprefix('path: ')})") from None
    if Path(path).is_dir() and (Path(path) / "model.safetensors").is_file() and not (Path(path) / "config.json").exists():
        raise FileNotFoundError(f"path: {path} holds model.safetensors but no config.json (an export that did not "
                                f"finish? run 'xmodal export' again)")
    p = checkpoint_file(path)
    payload = load_checkpoint(p, map_location=map_location)
    try:
        return model_from_payload(payload["model"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"path: {p} is not a loadable xmodal model ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
