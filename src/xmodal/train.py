"""Training a two-tower head on pre-extracted features: one linear, readable loop.

    data -> model -> loss (+ TS++ temperatures) -> optimiser (cosine LR, warm-up,
    clipping) -> per-epoch validation, early stopping, atomic checkpoint -> test-time
    normaliser selected on validation -> ``model.pt``

Run directory (``out``): ``config.yaml`` (resolved config), ``log.jsonl`` (one JSON
object per epoch), ``checkpoint.pt`` (everything needed to resume exactly: model,
loss state incl. queues, optimiser, RNG, early-stopping state; rewritten atomically
every epoch), ``model.pt`` (the selected model with its test-time normaliser, what
:func:`xmodal.load_model` reads), ``metrics.json`` and PNG plots.

Exact resume: batches of epoch ``e`` come from a generator seeded with ``(seed, e)``,
the global torch RNG (dropout) is checkpointed, the LR is a function of the step,
so a run killed after any epoch and resumed ends with the same weights as an
uninterrupted run.

Distributed: launched with ``torchrun``, each rank takes an equal slice of every
global batch; the losses all-gather embeddings with gradient (``xmodal.dist``) and
gradients are averaged over ranks (what DDP does), so one step equals the
single-process step on the global batch.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from xmodal import dist
from xmodal.data import inputs as video_inputs  # h-data: frame masks / several experts
from xmodal.config import MARGIN_LOSSES, Config, save_config, to_dict
from xmodal.models import TwoTower, atomic_save, build_model, model_payload

# --------------------------------------------------------------------------- data


def load_splits(cfg: Config) -> dict:
    """``{"train", "val"[, "test"]}`` :class:`~xmodal.data.PairedSplit` s for ``cfg.data``,
    with ``data.noise`` of the training pairs shuffled and ``max_train_texts`` applied."""
    import xmodal.data as xdata

    d = cfg.data
    if d.name == "synthetic":
        all_splits = xdata.synthetic(**d.synthetic, seed=cfg.train.seed)
        splits = {"train": all_splits[d.train_split], "val": all_splits[d.val_split]}
        if d.test_split and d.test_split in all_splits:
            splits["test"] = all_splits[d.test_split]
    else:
        splits = {"train": xdata.load_paired_split(d.root, d.train_split),
                  "val": xdata.load_paired_split(d.root, d.val_split)}
        if d.test_split and not xdata.layout.missing_files(d.root, d.test_split):  # h-data: layout names
            splits["test"] = xdata.load_paired_split(d.root, d.test_split)
    train = splits["train"]
    if d.max_train_texts and train.num_texts > d.max_train_texts:
        keep = np.sort(np.random.default_rng(cfg.train.seed).choice(train.num_texts, d.max_train_texts,
                                                                     replace=False))
        # h-data: dataclasses.replace keeps the frame mask, experts and names
        train = dataclasses.replace(train, text=train.text[keep], text_to_video=train.text_to_video[keep],
                                    text_labels=None if train.text_labels is None else train.text_labels[keep],
                                    captions=None)
    if d.noise > 0:
        train = shuffle_pairs(train, d.noise, seed=cfg.train.seed)
    splits["train"] = train
    return splits


def shuffle_pairs(split, fraction: float, *, seed: int):
    """A copy of ``split`` where a ``fraction`` of the texts are re-assigned to the videos
    of other texts of that fraction (a random permutation among them): mismatched pairs."""
    rng = np.random.default_rng([seed, 7919])
    m = split.num_texts
    idx = rng.choice(m, int(round(fraction * m)), replace=False)
    t2v = split.text_to_video.copy()
    t2v[idx] = split.text_to_video[rng.permutation(idx)]
    return dataclasses.replace(split, text_to_video=t2v)  # h-data: keeps masks / experts


def epoch_batches(epoch: int, *, seed: int, text_to_video: np.ndarray, batch_size: int,
                  sampling: str) -> list[np.ndarray]:
    """Text indices of every (global) batch of one epoch, seeded by ``(seed, epoch)``.

    ``captions``: every caption once, shuffled; ``videos``: each video once with one
    of its captions drawn at random. The last incomplete batch is dropped (a few
    pairs would make a degenerate contrastive batch). The video of text ``i`` is
    ``text_to_video[i]``; that index is the ``ids`` passed to the losses, so two
    captions of one video in a batch are never each other's negatives.
    """
    g = np.random.default_rng([seed, epoch, 1])
    if sampling == "captions":
        order = g.permutation(len(text_to_video))
    else:
        by_video: dict[int, list[int]] = {}
        for i, v in enumerate(text_to_video.tolist()):
            by_video.setdefault(v, []).append(i)
        videos = g.permutation(sorted(by_video))
        order = np.array([by_video[v][g.integers(len(by_video[v]))] for v in videos.tolist()], dtype=np.int64)
    n = len(order) // batch_size
    return [order[i * batch_size:(i + 1) * batch_size] for i in range(n)]


# --------------------------------------------------------------------------- pieces


def build_loss_from_config(cfg: Config, *, video_dim: int | None = None, text_dim: int | None = None
                           ) -> nn.Module:
    """The loss of ``cfg.loss``: ``temperature``/``margin``/``learnable`` are passed
    when the loss's constructor takes them, ``kwargs`` always. Losses with their own
    layers (Cali-NCE's correspondence head) get ``embed_dim``/``input_dims`` so their
    parameters exist before the optimiser is built, and ``seed`` (private shuffling
    generator) from ``train.seed``, unless ``kwargs`` sets them."""
    from xmodal.losses import LOSSES, build_loss

    lc = cfg.loss
    if lc.name not in LOSSES:
        raise ValueError(f"loss.name: unknown loss {lc.name!r}; expected one of {', '.join(sorted(LOSSES))}")
    params = inspect.signature(LOSSES[lc.name].__init__).parameters
    kwargs: dict[str, Any] = {}
    if lc.temperature is not None and "temperature" in params:
        kwargs["temperature"] = lc.temperature
    if lc.margin is not None and "margin" in params:
        kwargs["margin"] = lc.margin
    if lc.learnable:
        if "learnable" not in params:
            raise ValueError(f"loss.learnable: loss {lc.name!r} has no learnable temperature")
        kwargs["learnable"] = True
    if "embed_dim" in params:
        kwargs["embed_dim"] = cfg.model.dim
    if "input_dims" in params and video_dim and text_dim:
        kwargs["input_dims"] = (video_dim, text_dim)
    if "seed" in params:
        kwargs["seed"] = cfg.train.seed
    kwargs.update(lc.kwargs)
    return build_loss(lc.name, **kwargs)


def generator_states(module: nn.Module) -> dict[str, torch.Tensor]:
    """States of the private ``torch.Generator`` s a loss keeps (not in its state_dict)."""
    return {f"{name}.{attr}" if name else attr: g.get_state()
            for name, m in module.named_modules() for attr, g in vars(m).items()
            if isinstance(g, torch.Generator)}


def set_generator_states(module: nn.Module, states: dict[str, torch.Tensor]) -> None:
    for key, state in states.items():
        name, _, attr = key.rpartition(".")
        getattr(module.get_submodule(name) if name else module, attr).set_state(state)


def base_value(cfg: Config, loss: nn.Module) -> float:
    """The scheduled quantity's base: the margin for margin losses, else the temperature."""
    if cfg.loss.name in MARGIN_LOSSES:
        return float(cfg.loss.margin if cfg.loss.margin is not None else getattr(loss, "margin", 0.2))
    return float(cfg.loss.temperature if cfg.loss.temperature is not None else 0.05)


def loss_temperature(cfg: Config, loss: nn.Module) -> float:
    """The temperature the trained model uses at test time (learned one if any)."""
    t = getattr(loss, "temperature", None)
    try:
        if t is not None and (not isinstance(t, torch.Tensor) or t.numel() == 1):
            return float(t.detach()) if isinstance(t, torch.Tensor) else float(t)
    except (TypeError, ValueError):
        pass
    return float(cfg.loss.temperature if cfg.loss.temperature is not None else 0.05)


def text_classes(cfg: Config, train) -> np.ndarray:
    """A class id per training text for TS++ class temperatures: dataset labels, or
    k-means over the training caption features (TS++ sec. 4.1.2)."""
    import xmodal.data as xdata

    s = cfg.schedule
    if s.classes == "labels":
        if train.text_labels is not None:
            return np.asarray(train.text_labels)
        if train.video_labels is not None:
            return np.asarray(train.video_labels)[train.text_to_video]
        raise ValueError("schedule.classes: 'labels' but the training split has no class labels; use kmeans")
    return np.asarray(xdata.kmeans_classes(train.text, k=min(s.k, train.num_texts), seed=cfg.train.seed))


class TemperaturePlan:
    """Per-step (and optionally per-sample) temperature or margin for the loss (TS++).

    Without class values: ``s(step)`` of a ``Constant``/``Cosine`` (eq. 4.1)/``Linear``
    (eq. 4.2) schedule around the loss's base value. With class values (eqs. 4.3/4.4):
    ``value_i = v(c_i) + corr(step)`` (eq. 4.5) for the class ``c_i`` of each text.
    Inactive (the loss keeps its own value) when nothing is scheduled.
    """

    def __init__(self, cfg: Config, loss: nn.Module, train, steps_per_epoch: int) -> None:
        s = cfg.schedule
        self.keyword = "margin" if cfg.loss.name in MARGIN_LOSSES else "temperature"
        wanted = s.kind != "constant" or s.class_temperature
        accepts = getattr(loss, "accepts", ())
        if wanted and self.keyword not in accepts:
            raise ValueError(f"schedule.kind: loss {cfg.loss.name!r} does not accept a per-step {self.keyword}")
        if wanted and cfg.loss.learnable:
            raise ValueError("schedule.kind: a temperature schedule is not combinable with loss.learnable")
        self.active = wanted
        self.base = base_value(cfg, loss)
        self.schedule = None
        self.classes: torch.Tensor | None = None
        self.class_values: np.ndarray | None = None
        self.class_counts: np.ndarray | None = None
        self.per_class = None
        if not self.active:
            return
        import xmodal.schedules as sch

        margin = self.keyword == "margin"
        try:
            if s.kind == "cosine":
                period = max(1, int(round(s.period_epochs * steps_per_epoch)))
                self.schedule = sch.Cosine(self.base, s.alpha, period, allow_zero=margin)
            elif s.kind == "linear":
                self.schedule = sch.Linear(self.base, s.alpha, max(1, cfg.train.epochs * steps_per_epoch),
                                           allow_zero=margin)
            else:
                self.schedule = sch.Constant(self.base, allow_zero=margin)
        except ValueError as exc:
            raise ValueError(f"schedule.alpha: {exc}") from None
        if s.class_temperature:
            import xmodal.data as xdata

            _, inverse = np.unique(text_classes(cfg, train), return_inverse=True)
            counts = np.asarray(xdata.class_counts(inverse), dtype=np.float64)
            cls = sch.ClassMargin if margin else sch.ClassTemperature
            self.per_class = cls(counts, s.t_min, s.t_max, schedule=self.schedule)
            self.class_counts = counts
            self.class_values = self.per_class.values.numpy()
            self.classes = torch.as_tensor(inverse, dtype=torch.long)
            self.per_class.per_sample(torch.arange(len(counts)), 0)  # fail early on a non-positive value

    def __call__(self, step: int, text_idx: np.ndarray) -> float | torch.Tensor | None:
        if not self.active:
            return None
        if self.per_class is None:
            return float(self.schedule(step))
        return self.per_class.per_sample(self.classes[torch.as_tensor(text_idx)], step)

    def mean_value(self, step: int) -> float:
        """The scheduled value at ``step`` (averaged over training texts with class values)."""
        if self.per_class is None:
            return float(self.schedule(step))
        return float(self.per_class.values[self.classes].mean() + self.schedule.correction(step))


def make_optimizer(cfg: Config, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    o = cfg.optim
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "radam": torch.optim.RAdam}[o.name]
    return cls(params, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)


def cosine_lr(step: int, *, base_lr: float, warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> float:
    """Linear warm-up to ``base_lr`` over ``warmup_steps``, then cosine decay to
    ``min_ratio * base_lr`` at ``total_steps`` (nanoGPT)."""
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return base_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def init_distributed_from_env(device: str = "auto") -> bool:
    """Initialise ``torch.distributed`` when launched by ``torchrun`` (``WORLD_SIZE`` > 1):
    gloo on CPU, nccl on GPU. Returns whether a process group is active."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_distributed():
        return dist.is_distributed()
    import torch.distributed as tdist

    backend = "nccl" if resolve_device(device).type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    tdist.init_process_group(backend)
    return True


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device: 'cuda' requested but no GPU is available")
    return torch.device(name)


def loss_extras(loss: nn.Module, *, ids: torch.Tensor, video_in: torch.Tensor, text_in: torch.Tensor,
                scheduled: float | torch.Tensor | None, keyword: str) -> dict[str, Any]:
    """The optional forward keywords this loss understands (its ``accepts``)."""
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


def average_gradients(params: list[nn.Parameter]) -> None:
    """DDP's gradient averaging, done explicitly (see the module docstring)."""
    if dist.world_size() == 1:
        return
    import torch.distributed as tdist

    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        tdist.all_reduce(p.grad)
        p.grad.div_(dist.world_size())


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def embed_split(model: TwoTower, split, batch_size: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """(text embeddings ``[M, D]``, video embeddings ``[N, D]``), L2-normalised, float32."""
    return (model.encode_text(split.text, batch_size),
            model.encode_video(*split.video_input(), batch_size=batch_size))  # h-data: + mask / experts


def retrieval_metrics(sim_t2v: torch.Tensor, sim_v2t: torch.Tensor | None, text_to_video: np.ndarray) -> dict:
    """``{"t2v": {...}, "v2t": {...}}`` as ``xmodal.metrics.text_video`` (v2t: all-captions
    protocol), where each direction may come from its own (normalised) similarity matrix
    ``[M, N]`` / ``[N, M]`` (``sim_v2t=None``: the transpose of ``sim_t2v``)."""
    from xmodal.metrics import retrieval, text_video

    if sim_v2t is None:
        return text_video(sim_t2v, text_to_video)
    t2v = torch.as_tensor(text_to_video)
    own = t2v[None, :] == torch.arange(sim_v2t.shape[0])[:, None]
    return {"t2v": retrieval(sim_t2v, t2v), "v2t": retrieval(sim_v2t, own)}


def score(metrics: dict, metric: str) -> float:
    """Early-stopping / selection score: ``rsum`` (sum of R@1,5,10 both ways) or
    ``r1`` (mean of t2v and v2t R@1)."""
    if metric == "r1":
        return 0.5 * (metrics["t2v"]["R@1"] + metrics["v2t"]["R@1"])
    return sum(metrics[d][f"R@{k}"] for d in ("t2v", "v2t") for k in (1, 5, 10))


def normalized_similarities(name: str, test_time: dict, text: torch.Tensor, video: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
    """Similarities ``(t2v [M, N], v2t [N, M] or None = the transpose)`` after the test-time normaliser ``name``,
    fitted on the query banks in ``test_time`` against this gallery.

    ``none``: raw; ``dn``: distribution normalisation of the embeddings (means of the
    banks); ``sinkhorn``/``ncl``: NCL Sinkhorn gallery biases from train queries (a
    random bank) or the NCL loss's query queues; ``qbnorm``/``is``: querybank
    normalisation / inverted softmax; ``dsl``: dual softmax over the test queries.
    Returns the fitted states too (``{"t2v": ..., "v2t": ...}``).
    """
    from xmodal.normalize import build_normalizer

    sim = text @ video.T
    if name == "none":
        return sim, None, {}
    kw = dict(test_time.get("kwargs", {}).get(name, {}))
    bank_t, bank_v = (test_time["ncl_text_bank"], test_time["ncl_video_bank"]) if name == "ncl" else (
        test_time["text_bank"], test_time["video_bank"])
    bank_t, bank_v = bank_t.to(text), bank_v.to(video)
    if name == "dn":
        norm = build_normalizer("dn", **kw).fit(bank_t, bank_v)
        q, g = norm.transform(text, video)
        return q @ g.T, None, {"t2v": norm.state_dict()}
    if name == "dsl":
        # Dual softmax uses the test queries themselves (uses_test_queries=True); fitting it on
        # the train bank would mislabel a bank prior as DSL.
        dsl = build_normalizer("dsl", **kw)
        return torch.as_tensor(dsl(sim)), torch.as_tensor(dsl(sim.T.contiguous())), {}
    key = "sinkhorn" if name == "ncl" else name
    n_t2v = build_normalizer(key, **kw).fit(bank_t, video)
    n_v2t = build_normalizer(key, **kw).fit(bank_v, text)
    return (torch.as_tensor(n_t2v(sim)), torch.as_tensor(n_v2t(sim.T.contiguous())),
            {"t2v": n_t2v.state_dict(), "v2t": n_v2t.state_dict()})


def build_test_time(cfg: Config, model: TwoTower, loss: nn.Module, train, *, seed: int) -> dict:
    """Query banks and normaliser keywords: ``bank_size`` random training texts/videos
    embedded by the final model, and (NCL) the loss's own query queues."""
    tc = cfg.test_time
    g = np.random.default_rng([seed, 4242])
    ti = np.sort(g.choice(train.num_texts, min(tc.bank_size, train.num_texts), replace=False))
    vi = np.sort(g.choice(train.num_videos, min(tc.bank_size, train.num_videos), replace=False))
    tt: dict[str, Any] = {
        "text_bank": model.encode_text(train.text[ti]).cpu(),
        "video_bank": model.encode_video(*train.video_input(vi)).cpu(),
        "temperature": model.temperature,
        "kwargs": {"dn": {"lam": tc.dn_lam},
                   "sinkhorn": {"temperature": model.temperature, "iters": tc.sinkhorn_iters},
                   "ncl": {"temperature": model.temperature, "iters": tc.sinkhorn_iters},
                   "qbnorm": {"k": tc.qb_k, "beta": tc.qb_beta},
                   "is": {"beta": tc.qb_beta},
                   "dsl": {"temperature": model.temperature}},
    }
    if hasattr(loss, "query_bank"):
        qt, qv = loss.query_bank()
        if len(qt) and len(qv):
            tt["ncl_text_bank"], tt["ncl_video_bank"] = qt.detach().float().cpu(), qv.detach().float().cpu()
    return tt


def candidate_normalizers(cfg: Config, test_time: dict) -> list[str]:
    names = [n for n in cfg.test_time.normalizers if n != "ncl" or "ncl_text_bank" in test_time]
    return names or ["none"]


def evaluate_normalizers(names: list[str], test_time: dict, model: TwoTower, split,
                         batch_size: int = 8192) -> dict[str, dict]:
    """Metrics of ``split`` under each normaliser: ``{name: {"t2v": ..., "v2t": ...}}``."""
    text, video = embed_split(model, split, batch_size)
    out = {}
    for name in names:
        s_t2v, s_v2t, _ = normalized_similarities(name, test_time, text, video)
        out[name] = retrieval_metrics(s_t2v, s_v2t, split.text_to_video)
    return out


def evaluate(model: TwoTower, split, normalizer: str | None = None, batch_size: int = 8192) -> dict:
    """Metrics of a loaded model on a split with its selected (or the given) normaliser."""
    name = normalizer or model.test_time.get("normalizer", "none")
    return evaluate_normalizers([name], model.test_time, model, split, batch_size)[name]


# --------------------------------------------------------------------------- the loop


def _rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def train(cfg: Config, out: str | os.PathLike, *, resume: bool = True, stop_after_epochs: int | None = None,
          progress: bool | None = None) -> dict:
    """Train, select the test-time normaliser on validation, write the run directory.

    Args:
        cfg: the resolved :class:`~xmodal.config.Config`.
        out: run directory (created). An existing ``checkpoint.pt`` with the same
            config is resumed from when ``resume``.
        resume: continue an interrupted run (else start over, overwriting).
        stop_after_epochs: return after this many epochs *of this call* without
            finishing (simulates a kill; used by the resume tests).
        progress: tqdm bars (default ``cfg.train.progress``, rank 0 only).

    Returns:
        A summary dict (also ``metrics.json``): best epoch, val/test metrics per
        normaliser, selected normaliser, train time.
    """
    from tqdm.auto import tqdm

    tc = cfg.train
    out = Path(out)
    is_main = dist.rank() == 0
    show = (tc.progress if progress is None else progress) and is_main
    device = resolve_device(tc.device)
    if is_main:
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.yaml")

    splits = load_splits(cfg)
    train_split, val_split = splits["train"], splits["val"]
    torch.manual_seed(tc.seed)
    model = build_model(video_dim=train_split.video.shape[-1], text_dim=train_split.text.shape[-1],
                        kind=cfg.model.kind, text_kind=cfg.model.text_kind or None, dim=cfg.model.dim,
                        width=cfg.model.width, depth=cfg.model.depth, dropout=cfg.model.dropout,
                        layers=cfg.model.layers, heads=cfg.model.heads, hidden=cfg.model.hidden,
                        temperature=cfg.loss.temperature or 0.05,
                        experts=train_split.expert_dims(), fusion=cfg.model.fusion)  # h-data
    video_all, mask_all = video_inputs.video_tensors(train_split)  # h-data: (features, mask), dicts w/ experts
    text_all = torch.as_tensor(np.asarray(train_split.text, dtype=np.float32))
    if cfg.model.standardize:
        model.fit_standardization(video_all, text_all, video_mask=mask_all)
    model.to(device)
    loss_fn = build_loss_from_config(cfg, video_dim=train_split.video.shape[-1],
                                     text_dim=train_split.text.shape[-1]).to(device)
    params = [p for p in list(model.parameters()) + list(loss_fn.parameters()) if p.requires_grad]
    optimizer = make_optimizer(cfg, params)

    world = dist.world_size()
    if tc.batch_size % world:
        raise ValueError(f"train.batch_size: {tc.batch_size} is not divisible by the world size {world}")
    local_bs = tc.batch_size // world
    t2v_np = train_split.text_to_video
    steps_per_epoch = len(epoch_batches(0, seed=tc.seed, text_to_video=t2v_np, batch_size=tc.batch_size,
                                        sampling=tc.sampling))
    if steps_per_epoch == 0:
        raise ValueError(f"train.batch_size: {tc.batch_size} exceeds the number of training pairs")
    total_steps = tc.epochs * steps_per_epoch
    warmup_steps = int(round(cfg.optim.warmup_epochs * steps_per_epoch))
    plan = TemperaturePlan(cfg, loss_fn, train_split, steps_per_epoch)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if (tc.amp and device.type == "cuda") else nullcontext()

    state = {"epoch": 0, "step": 0, "best_score": -math.inf, "best_epoch": -1, "bad_epochs": 0,
             "history": [], "best_model": None, "train_time": 0.0, "done": False}
    ckpt_path = out / "checkpoint.pt"
    if resume and ckpt_path.is_file():
        ckpt = torch.load(ckpt_path, map_location=device, weights_only=False)
        if ckpt.get("config") != to_dict(cfg):
            raise ValueError(f"out: {out} holds a run with a different config; use another --out or --no-resume")
        model.load_state_dict(ckpt["model"]["state_dict"])
        load_module_state(loss_fn, ckpt["loss"])
        optimizer.load_state_dict(ckpt["optimizer"])
        _set_rng_state(ckpt["rng"], device)
        set_generator_states(loss_fn, ckpt.get("generators", {}))
        state = ckpt["state"]
    elif is_main and (out / "log.jsonl").exists():
        (out / "log.jsonl").unlink()

    epochs_this_call = 0
    while not state["done"] and state["epoch"] < tc.epochs:
        epoch = state["epoch"]
        t0 = time.perf_counter()
        model.train()
        loss_fn.train()
        batches = epoch_batches(epoch, seed=tc.seed, text_to_video=t2v_np, batch_size=tc.batch_size,
                                sampling=tc.sampling)
        bar = tqdm(batches, desc=f"epoch {epoch + 1}/{tc.epochs}", disable=not show, leave=False, mininterval=0.5,
                   dynamic_ncols=True)
        losses = []
        for batch in bar:
            step = state["step"]
            lr = cosine_lr(step, base_lr=cfg.optim.lr, warmup_steps=warmup_steps, total_steps=total_steps,
                           min_ratio=cfg.optim.min_lr_ratio)
            for group in optimizer.param_groups:
                group["lr"] = lr
            mine = batch[dist.rank() * local_bs:(dist.rank() + 1) * local_bs]
            ids_np = t2v_np[mine]
            text_in = text_all[mine].to(device)
            video_in, mask_in = video_inputs.take(video_all, mask_all, ids_np, device)  # h-data
            ids = torch.as_tensor(ids_np, device=device)
            with amp:
                v = model.forward_video(video_in, mask_in)
                t = model.forward_text(text_in)
            extra = loss_extras(loss_fn, ids=ids, video_in=video_inputs.pooled(video_in, mask_in),  # h-data
                                text_in=text_in,
                                scheduled=plan(step, mine), keyword=plan.keyword)
            loss = loss_fn(v.float(), t.float(), **extra)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            average_gradients(params)
            if cfg.optim.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)
            optimizer.step()
            state["step"] += 1
            losses.append(float(loss.detach()))
            bar.set_postfix(loss=f"{losses[-1]:.4f}", lr=f"{lr:.2e}", refresh=False)
        train_loss = float(dist.all_reduce_mean(torch.tensor(float(np.mean(losses))))) if losses else float("nan")
        state["train_time"] += time.perf_counter() - t0

        val = retrieval_metrics(_raw_sim(model, val_split, tc.eval_batch_size), None, val_split.text_to_video)
        current = score(val, tc.metric)
        improved = current > state["best_score"]
        if improved:
            state.update(best_score=current, best_epoch=epoch, bad_epochs=0,
                         best_model={k: v.detach().clone().cpu() for k, v in model.state_dict().items()},
                         best_loss={k: v.detach().clone().cpu() for k, v in loss_fn.state_dict().items()})
        else:
            state["bad_epochs"] += 1
        record = {"epoch": epoch + 1, "step": state["step"], "train_loss": train_loss, "lr": lr,
                  "temperature": loss_temperature(cfg, loss_fn), "val": val, f"val_{tc.metric}": current,
                  "best_epoch": state["best_epoch"] + 1, "epoch_time": time.perf_counter() - t0}
        if plan.active:
            record["scheduled"] = plan.mean_value(max(0, state["step"] - 1))
        state["history"].append(record)
        state["epoch"] += 1
        if tc.patience and state["bad_epochs"] >= tc.patience:
            state["done"] = True
        if is_main:
            if show:
                tqdm.write(f"epoch {epoch + 1:3d}  loss {train_loss:.4f}  val t2v R@1 {val['t2v']['R@1']:.2f}  "
                           f"v2t R@1 {val['v2t']['R@1']:.2f}  {tc.metric} {current:.2f}"
                           + ("  *" if improved else ""))
            atomic_save({"config": to_dict(cfg), "model": model_payload(model), "loss": loss_fn.state_dict(),
                         "optimizer": optimizer.state_dict(), "rng": _rng_state(device),
                         "generators": generator_states(loss_fn), "state": state},
                        ckpt_path)
            write_log(out / "log.jsonl", state["history"])
        epochs_this_call += 1
        if stop_after_epochs is not None and epochs_this_call >= stop_after_epochs and state["epoch"] < tc.epochs \
                and not state["done"]:
            return {"stopped": True, "epoch": state["epoch"]}

    return finish(cfg, out, model, loss_fn, splits, state, show=show)


def write_log(path: Path, history: list[dict]) -> None:
    """``log.jsonl`` rewritten from the checkpointed history (temp file + rename), so the
    log always matches the checkpoint, even after a kill between the two writes."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in history))
    os.replace(tmp, path)


def load_module_state(module: nn.Module, state: dict) -> None:
    """``load_state_dict`` that also restores buffers whose size changes in training
    (the growing query queues of NCL / CrossCLR start empty)."""
    for name, buf in list(module.named_buffers()):
        if name in state and state[name].shape != buf.shape:
            owner = module.get_submodule(name.rpartition(".")[0]) if "." in name else module
            setattr(owner, name.rpartition(".")[2], state[name].clone().to(buf.device))
    module.load_state_dict(state)


def _raw_sim(model: TwoTower, split, batch_size: int) -> torch.Tensor:
    text, video = embed_split(model, split, batch_size)
    return text @ video.T


def finish(cfg: Config, out: Path, model: TwoTower, loss_fn: nn.Module, splits: dict, state: dict,
           *, show: bool = False) -> dict:
    """Restore the best epoch, select the test-time normaliser on val, write ``model.pt``."""
    if state["best_model"] is not None:
        model.load_state_dict(state["best_model"])
        load_module_state(loss_fn, state["best_loss"])
    model.temperature = loss_temperature(cfg, loss_fn)
    test_time = build_test_time(cfg, model, loss_fn, splits["train"], seed=cfg.train.seed)
    names = candidate_normalizers(cfg, test_time)
    val = evaluate_normalizers(names, test_time, model, splits["val"], cfg.train.eval_batch_size)
    best = max(names, key=lambda n: (score(val[n], cfg.train.metric), n == "none"))
    test_time["normalizer"] = best
    test_time["val"] = val
    model.test_time = test_time
    summary: dict[str, Any] = {
        "best_epoch": state["best_epoch"] + 1, "epochs_run": state["epoch"], "metric": cfg.train.metric,
        "val_score": state["best_score"], "train_time_s": state["train_time"], "temperature": model.temperature,
        "normalizer": best, "val": val,
    }
    if "test" in splits:
        summary["test"] = evaluate_normalizers(names, test_time, model, splits["test"], cfg.train.eval_batch_size)
    if dist.rank() == 0:
        atomic_save({"config": to_dict(cfg), "model": model_payload(model), "summary": summary}, out / "model.pt")
        (out / "metrics.json").write_text(json.dumps(summary, indent=1))
        if show:
            print(f"best epoch {summary['best_epoch']}, selected test-time normaliser: {best}")
    return summary
