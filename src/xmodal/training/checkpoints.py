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

Every checkpoint read is weights-only (:func:`xmodal.runs.load_checkpoint`). A checkpoint carries the
SHA-256 of its payload (:func:`payload_checksum`, every tensor's bytes and every value, in order), checked
before a resume: damaged bytes (a flipped bit in a weight) are refused in one line, never resumed into
other weights; and every field of the loop's ``state`` is checked against the run before it is used
(:func:`check_state`).
"""

from __future__ import annotations

import copy
import hashlib
import math
import struct
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from xmodal.config import Config, to_dict
from xmodal.models import model_payload
from xmodal.runs import RunDirError, load_checkpoint
from xmodal.training.parts import generator_states, load_module_state, set_generator_states

__all__ = ["CheckpointClock", "same_run_config", "payload_checksum", "check_state"]

#: The checkpoint key holding :func:`payload_checksum` of everything else in it.
CHECKSUM_KEY = "checksum"

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


def payload_checksum(obj: Any) -> str:
    """SHA-256 (hex) of a checkpoint payload: its structure, every key and value in order, and every
    tensor's dtype, shape and bytes. Walked with a stack (no recursion); the same after a
    ``torch.save`` / weights-only ``torch.load`` round trip.

    >>> payload_checksum({"w": torch.zeros(2)}) == payload_checksum({"w": torch.zeros(2)})
    True
    >>> payload_checksum({"w": torch.zeros(2)}) == payload_checksum({"w": torch.tensor([0.0, 1e-45])})
    False
    """
    h = hashlib.sha256()
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous().reshape(-1)
            h.update(f"T{t.dtype}{tuple(x.shape)}:".encode())
            h.update(memoryview(t.view(torch.uint8).numpy()))
        elif isinstance(x, dict):
            h.update(f"D{len(x)}:".encode())
            for k, v in reversed(list(x.items())):  # popped in the dict's own order
                stack.extend((v, k))
        elif isinstance(x, (list, tuple)):
            h.update(f"{'L' if isinstance(x, list) else 'U'}{len(x)}:".encode())
            stack.extend(reversed(x))
        elif isinstance(x, bool) or x is None:
            h.update(f"B{x};".encode())
        elif isinstance(x, int):
            h.update(f"I{x};".encode())
        elif isinstance(x, float):
            h.update(b"F" + struct.pack("<d", x))
        elif isinstance(x, str):
            data = x.encode("utf-8", "surrogatepass")
            h.update(f"S{len(data)}:".encode() + data)
        elif isinstance(x, bytes):
            h.update(f"Y{len(x)}:".encode() + x)
        else:  # torch.dtype, torch.device, ...: what the weights-only reader allows
            h.update(f"O{type(x).__name__}:{x!r};".encode())
    return h.hexdigest()


def payload(cfg: Config, *, model: nn.Module, loss_fn: nn.Module, optimizer: torch.optim.Optimizer,
            device: torch.device, state: dict, plateau: Any = None, ema: Any = None) -> dict:
    """The checkpoint of the run at this moment (``state``: the loop's counters, see the module doc),
    with :data:`CHECKSUM_KEY`: :func:`payload_checksum` of the rest."""
    out = {"config": to_dict(cfg), "model": model_payload(model), "loss": loss_fn.state_dict(),
           "optimizer": optimizer.state_dict(), "rng": rng_state(device),
           **({"plateau": plateau.state_dict()} if plateau is not None else {}),
           **({"ema": ema.state_dict()} if ema is not None else {}),
           "generators": generator_states(loss_fn), "state": state}
    out[CHECKSUM_KEY] = payload_checksum(out)
    return out


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _tensors(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and isinstance(t, torch.Tensor) for k, t in v.items())


def check_state(state: Any, *, epochs: int, epoch_steps: Any) -> dict:
    """The loop's ``state`` of a checkpoint, every field checked against the run (``epochs``, and
    ``epoch_steps(e)``: the batches of epoch ``e``); a ValueError naming the first wrong field.

    >>> check_state({"epoch": 0, "step": 0, "best_score": -math.inf, "best_epoch": -1, "bad_epochs": 0,
    ...              "history": [], "best_model": None, "train_time": 0.0, "done": False, "batch": 0},
    ...             epochs=2, epoch_steps=lambda e: 6)["epoch"]
    0
    """
    from xmodal._validate import short_repr, whole_number

    epochs = whole_number(epochs, "epochs", minimum=0)
    if not callable(epoch_steps):
        raise TypeError(f"epoch_steps: expected a function of the epoch, got {short_repr(epoch_steps)}")

    def bad(field: str, why: str, value: Any) -> ValueError:
        return ValueError(f"state {field!r}: {why}, got {short_repr(value, 40)}")

    if not isinstance(state, dict):
        raise bad("state", "expected a dict", state)
    for key in ("epoch", "step", "best_score", "best_epoch", "bad_epochs", "history", "train_time", "done"):
        if key not in state:
            raise ValueError(f"state {key!r}: missing")
    epoch, step = state["epoch"], state["step"]
    if not _whole(epoch) or not 0 <= epoch <= epochs:
        raise bad("epoch", f"expected an integer in 0..{epochs}", epoch)
    if not _whole(step) or step < 0:
        raise bad("step", "expected an integer >= 0", step)
    if not isinstance(state["done"], bool):
        raise bad("done", "expected true or false", state["done"])
    history = state["history"]
    if not isinstance(history, list) or len(history) != epoch or not all(isinstance(r, dict) for r in history):
        raise bad("history", f"expected {epoch} epoch record(s)", history)
    best_epoch = state["best_epoch"]
    if not _whole(best_epoch) or not (best_epoch == -1 or 0 <= best_epoch < epoch):
        raise bad("best_epoch", f"expected an integer in -1..{epoch - 1}", best_epoch)
    if not _whole(state["bad_epochs"]) or not 0 <= state["bad_epochs"] <= epoch:
        raise bad("bad_epochs", f"expected an integer in 0..{epoch}", state["bad_epochs"])
    score = state["best_score"]
    if isinstance(score, bool) or not isinstance(score, (int, float)) or math.isnan(score) or score == math.inf:
        raise bad("best_score", "expected a number (-inf before the first epoch)", score)
    if not _finite(state["train_time"]) or state["train_time"] < 0:
        raise bad("train_time", "expected seconds >= 0", state["train_time"])
    if state.get("best_model") is not None or best_epoch >= 0:
        for key in ("best_model", "best_loss"):
            if not _tensors(state.get(key)):
                raise bad(key, "expected the best epoch's tensors by name", state.get(key))
    batch = state.get("batch", 0)
    if not _whole(batch) or batch < 0:
        raise bad("batch", "expected an integer >= 0", batch)
    if batch == 0:
        if state.get("partial") is not None:
            raise bad("partial", "expected none at an epoch's end", state["partial"])
        return state
    if epoch >= epochs or state["done"]:
        raise bad("batch", f"expected 0 once the {epochs} epoch(s) are done", batch)
    steps = epoch_steps(epoch)
    if batch >= steps:
        raise bad("batch", f"past the {steps} batches of epoch {epoch + 1} (expected 0..{steps - 1})", batch)
    if step < batch:
        raise bad("step", f"expected at least the {batch} batches done in this epoch", step)
    partial = state.get("partial")
    if not isinstance(partial, dict):
        raise bad("partial", "expected the epoch's running losses (a dict) inside an epoch", partial)
    losses, terms, seconds = partial.get("losses"), partial.get("terms", {}), partial.get("seconds", 0.0)
    if not isinstance(losses, list) or len(losses) != batch or not all(_finite(x) for x in losses):
        raise bad("partial.losses", f"expected the {batch} finite losses of the batches done", losses)
    if not isinstance(terms, dict) or not all(isinstance(k, str) and (_finite(v) or (
            isinstance(v, torch.Tensor) and v.numel() == 1 and bool(torch.isfinite(v).all())))
            for k, v in terms.items()):
        raise bad("partial.terms", "expected finite loss-term sums by name", terms)
    if not _finite(seconds) or seconds < 0:
        raise bad("partial.seconds", "expected seconds >= 0", seconds)
    return state


def restore(path: Path, cfg: Config, device: torch.device, model: nn.Module, loss_fn: nn.Module,
            optimizer: torch.optim.Optimizer, plateau: Any = None, ema: Any = None, *,
            epoch_steps: Any = None) -> dict:
    """Load the checkpoint ``path`` into the run's objects and the RNGs; returns the loop's ``state``.

    ``epoch_steps(e)``: the batches of epoch ``e`` (:func:`check_state`; None: the state's ``batch`` is
    not checked against the epoch).

    Raises:
        ValueError: a checkpoint of another config (:func:`same_run_config`), or one that is not a
            resumable checkpoint of this run (:class:`~xmodal.runs.RunDirError`): without its checksum,
            with a payload that does not match it, or with a field of ``state`` out of range.
    """
    ckpt = load_checkpoint(path, map_location=device)
    saved = ckpt.pop(CHECKSUM_KEY, None)
    if not isinstance(saved, str):
        raise RunDirError(f"{path}: not a resumable checkpoint (no checksum of its payload: written before "
                          f"xmodal checked them, or damaged); use --no-resume or another --out")
    if saved != payload_checksum(ckpt):
        raise RunDirError(f"{path}: damaged checkpoint (its payload does not match the checksum it was written "
                          f"with); use --no-resume or another --out")
    try:
        check_state(ckpt.get("state"), epochs=cfg.train.epochs,
                    epoch_steps=epoch_steps or (lambda e: math.inf))
    except ValueError as exc:
        raise RunDirError(f"{path}: not a resumable checkpoint of this run ({exc}); use --no-resume or "
                          f"another --out") from None
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
        return ckpt["state"]
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as exc:
        raise RunDirError(f"{path}: not a resumable checkpoint of this run ({type(exc).__name__}); "
                          f"use --no-resume or another --out") from None
