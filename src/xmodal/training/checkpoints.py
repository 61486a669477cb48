"""``RUN/checkpoint.pt``: what it holds, when it is written, and how a run resumes from it.

A checkpoint is written atomically (:func:`xmodal.runs.atomic_save`) at the end of every epoch and,
with ``train.checkpoint_minutes`` > 0, also *inside* an epoch once that many minutes have passed
since the last one (:class:`CheckpointClock`), so a killed long epoch loses at most those minutes.

It holds everything the rest of the run depends on: the model, the loss's state (queues, learnable
temperature, correspondence head), the optimiser, the ReduceLROnPlateau and EMA states, the global
torch RNG (dropout) and the losses' private generators, and the loop's ``state``: epochs and steps done,
the best epoch's weights, early-stopping counters, the history of epoch records and, inside an
epoch, ``batch`` (the batches of the current epoch already trained) with the epoch's running loss
values, loss-term sums and elapsed seconds. Everything else is a function of the config and of the
checkpointed counters: the epoch's batches come from a generator seeded with ``(seed, epoch)`` (a
resumed epoch skips its first ``batch`` batches; the batch loader's workers gather rows without
randomness and take their seed from a generator of their own), the learning rate and the TS++
schedules are functions of the step. So a run killed at any point and resumed ends with the same
weights, bit for bit, as a run never interrupted (on CPU; ``tests/test_midepoch_resume.py`` kills a
real process with SIGKILL).

Every checkpoint read is weights-only (:func:`xmodal.runs.load_checkpoint`).
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from xmodal.config import Config, to_dict
from xmodal.models import model_payload
from xmodal.runs import RunDirError, load_checkpoint
from xmodal.training.parts import generator_states, load_module_state, set_generator_states

__all__ = ["CheckpointClock", "same_run_config"]

#: Config keys a resume may change: they say how the run is written, not what it computes.
RESUME_MAY_CHANGE = (("train", "checkpoint_minutes"),)


def same_run_config(saved: Any, current: dict) -> bool:
    """Whether a checkpoint's config ``saved`` describes the run of ``current`` (``to_dict`` of the
    config), ignoring :data:`RESUME_MAY_CHANGE` (a checkpoint written before such a key existed
    resumes too)."""
    if not isinstance(saved, dict) or not isinstance(current, dict):
        return False
    a, b = copy.deepcopy(saved), copy.deepcopy(current)
    for section, key in RESUME_MAY_CHANGE:
        for d in (a, b):
            if isinstance(d.get(section), dict):
                d[section].pop(key, None)
    return a == b


class CheckpointClock:
    """When the next mid-epoch checkpoint is due: ``minutes`` after the last checkpoint (or the start).

    ``minutes`` 0 never asks for one (checkpoints only at epoch ends).

    >>> CheckpointClock(0).due()
    False
    """

    def __init__(self, minutes: float) -> None:
        from xmodal._validate import short_repr

        if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not math.isfinite(minutes) \
                or minutes < 0:
            raise ValueError(f"minutes: expected a number >= 0, got {short_repr(minutes)}")
        self.seconds = 60.0 * float(minutes)
        self.last = time.monotonic()

    def due(self) -> bool:
        return self.seconds > 0 and time.monotonic() - self.last >= self.seconds

    def reset(self) -> None:
        """A checkpoint was just written."""
        self.last = time.monotonic()


def rng_state(device: torch.device) -> dict:
    """The global torch RNG (and the CUDA one of ``device``)."""
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def payload(cfg: Config, *, model: nn.Module, loss_fn: nn.Module, optimizer: torch.optim.Optimizer,
            device: torch.device, state: dict, plateau: Any = None, ema: Any = None) -> dict:
    """The checkpoint of the run at this moment (``state``: the loop's counters, see the module doc)."""
    return {"config": to_dict(cfg), "model": model_payload(model), "loss": loss_fn.state_dict(),
            "optimizer": optimizer.state_dict(), "rng": rng_state(device),
            **({"plateau": plateau.state_dict()} if plateau is not None else {}),
            **({"ema": ema.state_dict()} if ema is not None else {}),
            "generators": generator_states(loss_fn), "state": state}


def restore(path: Path, cfg: Config, device: torch.device, model: nn.Module, loss_fn: nn.Module,
            optimizer: torch.optim.Optimizer, plateau: Any = None, ema: Any = None) -> dict:
    """Load the checkpoint ``path`` into the run's objects and the RNGs; returns the loop's ``state``.

    Raises:
        ValueError: a checkpoint of another config (:func:`same_run_config`), or one that is not a
            resumable checkpoint of this run (:class:`~xmodal.runs.RunDirError`).
    """
    ckpt = load_checkpoint(path, map_location=device)
    if not same_run_config(ckpt.get("config"), to_dict(cfg)):
        raise ValueError(f"out: {path.parent} holds a run with a different config; use another --out "
                         f"or --no-resume")
    try:
        model.load_state_dict(ckpt["model"]["state_dict"])
        load_module_state(loss_fn, ckpt["loss"])
        optimizer.load_state_dict(ckpt["optimizer"])
        if plateau is not None:
            plateau.load_state_dict(ckpt["plateau"])
        if ema is not None:
            ema.load_state_dict(ckpt["ema"])
        set_rng_state(ckpt["rng"], device)
        set_generator_states(loss_fn, ckpt.get("generators", {}))
        state = ckpt["state"]
        batch = state.get("batch", 0)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
            raise ValueError("batch")
        return state
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as exc:
        raise RunDirError(f"{path}: not a resumable checkpoint of this run ({type(exc).__name__}); "
                          f"use --no-resume or another --out") from None
