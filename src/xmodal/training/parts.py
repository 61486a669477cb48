"""Wiring pieces of the trainer: config -> loss / optimiser / LR / device, the loss's
forward keywords from its declaration, and state helpers for exact resume."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from xmodal import dist
from xmodal.config import Config


def build_loss_from_config(cfg: Config, *, video_dim: int | None = None, text_dim: int | None = None
                           ) -> nn.Module:
    """The loss of ``cfg.loss``, from its declaration (:func:`xmodal.losses.loss_spec`):
    ``temperature`` or ``margin`` goes to the loss that schedules it, ``learnable`` when
    set, the model-derived keywords the loss registered (``embed_dim``, ``input_dims``,
    ``seed``) unless ``kwargs`` sets them, ``kwargs`` always."""
    from xmodal.losses import build_loss, loss_spec

    lc = cfg.loss
    spec = loss_spec(lc.name)
    kwargs: dict[str, Any] = {}
    if spec.keyword == "temperature" and lc.temperature is not None:
        kwargs["temperature"] = lc.temperature
    if lc.margin is not None:
        if spec.keyword != "margin":
            raise ValueError(f"loss.margin: loss {lc.name!r} has no margin")
        kwargs["margin"] = lc.margin
    if lc.learnable:
        kwargs["learnable"] = True
    known = {"embed_dim": cfg.model.dim, "seed": cfg.train.seed,
             "input_dims": (video_dim, text_dim) if video_dim and text_dim else None}
    kwargs.update({k: known[k] for k in spec.model_kwargs if known[k] is not None})
    kwargs.update(lc.kwargs)
    try:
        return build_loss(lc.name, **kwargs)
    except TypeError as exc:
        if lc.learnable and "learnable" in str(exc):
            raise ValueError(f"loss.learnable: loss {lc.name!r} has no learnable temperature") from None
        raise ValueError(f"loss.kwargs: {exc}") from None


def generator_states(module: nn.Module) -> dict[str, torch.Tensor]:
    """States of the private ``torch.Generator`` s a loss keeps (not in its state_dict)."""
    return {f"{name}.{attr}" if name else attr: g.get_state()
            for name, m in module.named_modules() for attr, g in vars(m).items()
            if isinstance(g, torch.Generator)}


def set_generator_states(module: nn.Module, states: dict[str, torch.Tensor]) -> None:
    for key, state in states.items():
        name, _, attr = key.rpartition(".")
        getattr(module.get_submodule(name) if name else module, attr).set_state(state)


def make_optimizer(cfg: Config, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    o = cfg.optim
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "radam": torch.optim.RAdam}[o.name]
    return cls(params, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)


def make_ema(cfg: Config, model: nn.Module):
    """An exponential moving average of ``model``'s weights for ``optim.ema > 0``, else None.

    ``torch.optim.swa_utils.AveragedModel`` with the EMA update ``w_avg <- d w_avg + (1 - d) w``
    once per optimisation step (buffers, e.g. the standardisation statistics, are averaged too; they
    are constant after the fit). The first update copies the weights. Validation, the best-epoch
    snapshot and ``model.pt`` read the averaged copy; its state is checkpointed for exact resume.
    """
    if not cfg.optim.ema:
        return None
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(float(cfg.optim.ema)), use_buffers=True)


def make_plateau(cfg: Config, optimizer: torch.optim.Optimizer):
    """``ReduceLROnPlateau`` on the validation score (mode max) for ``optim.scheduler: plateau``
    (CrossCLR sec. 4.3: "reduced by a factor of 10 when validation performance saturates";
    Table 7: patience 6, cooldown 4), else None. Stepped once per epoch after the warm-up;
    its state is checkpointed for exact resume."""
    o = cfg.optim
    if o.scheduler != "plateau":
        return None
    return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=o.plateau_factor,
                                                      patience=o.plateau_patience, cooldown=o.plateau_cooldown)


def cosine_lr(step: int, *, base_lr: float, warmup_steps: int, total_steps: int, min_ratio: float = 0.0,
              epoch_steps: int = 0) -> float:
    """Linear warm-up to ``base_lr`` over ``warmup_steps``, then cosine decay to
    ``min_ratio * base_lr`` at ``total_steps`` (nanoGPT).

    ``epoch_steps > 0`` (``optim.warmup_unit: epoch``): the warm-up rises once per epoch of that
    many steps, ``base_lr * (e + 1) * epoch_steps / warmup_steps`` for every step of epoch ``e``
    (``(e + 1) / W`` with ``warmup_steps = W * epoch_steps``), as the CrossCLR / COOT release's
    ``ReduceLROnPlateauWarmup`` (``trainer/optimizer.py``) sets it before each epoch; 0: it rises
    every step, ``base_lr * (step + 1) / warmup_steps``.

    >>> [cosine_lr(s, base_lr=1.0, warmup_steps=4, total_steps=8, epoch_steps=2) for s in range(4)]
    [0.5, 0.5, 1.0, 1.0]
    """
    if step < warmup_steps:
        if epoch_steps > 0:
            return base_lr * (step // epoch_steps + 1) * epoch_steps / warmup_steps
        return base_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return base_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device: 'cuda' requested but no GPU is available")
    return torch.device(name)


def init_distributed_from_env(device: str = "auto") -> bool:
    """:func:`xmodal.dist.init_from_env` with nccl for a GPU ``train.device``, else gloo."""
    return dist.init_from_env(cuda=resolve_device(device).type == "cuda")


average_gradients = dist.average_gradients  # former home


def loss_extras(loss: nn.Module, *, ids: torch.Tensor, video_in: torch.Tensor, text_in: torch.Tensor,
                scheduled: float | torch.Tensor | None, keyword: str) -> dict[str, Any]:
    """The optional forward keywords this loss declares in ``accepts``."""
    accepts = getattr(loss, "accepts", ())
    extra: dict[str, Any] = {}
    if "ids" in accepts:
        extra["ids"] = ids
    if "video_input" in accepts:
        extra["video_input"] = video_in.mean(1) if video_in.ndim == 3 else video_in
    if "text_input" in accepts:
        extra["text_input"] = text_in
    if "relevancy" in accepts:
        extra["relevancy"] = (ids[:, None] == ids[None, :]).float()
    if scheduled is not None and keyword in accepts:
        extra[keyword] = scheduled.to(video_in.device) if isinstance(scheduled, torch.Tensor) else scheduled
    return extra


def load_module_state(module: nn.Module, state: dict) -> None:
    """``load_state_dict`` that also restores buffers whose size changes in training
    (the growing query queues of NCL / CrossCLR start empty)."""
    for name, buf in list(module.named_buffers()):
        if name in state and state[name].shape != buf.shape:
            owner = module.get_submodule(name.rpartition(".")[0]) if "." in name else module
            setattr(owner, name.rpartition(".")[2], state[name].clone().to(buf.device))
    module.load_state_dict(state)


def bounded_warmup(warmup_steps: int, total_steps: int) -> tuple[int, str | None]:
    """``(warm-up steps, note or None)``: a warm-up that would last the whole run (``optim.warmup_epochs``
    >= ``train.epochs``, e.g. ``train.epochs=1`` over a config's one-epoch warm-up) never reaches the peak
    LR before the last step nor decays; it is cut to a tenth of the run, and the note says so.

    >>> bounded_warmup(100, 100)
    (10, 'optim.warmup_epochs: the warm-up (100 steps) would last the whole run (100 steps) and never decay; cut to 10 steps, a tenth of the run')
    >>> bounded_warmup(5, 100)
    (5, None)
    """
    from xmodal._validate import whole_number

    warmup_steps = whole_number(warmup_steps, "warmup_steps")
    total_steps = whole_number(total_steps, "total_steps")
    if total_steps < 2 or warmup_steps < total_steps:
        return warmup_steps, None
    cut = max(1, total_steps // 10)
    return cut, (f"optim.warmup_epochs: the warm-up ({warmup_steps} steps) would last the whole run "
                 f"({total_steps} steps) and never decay; cut to {cut} steps, a tenth of the run")
