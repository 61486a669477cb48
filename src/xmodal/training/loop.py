"""Training a two-tower head on pre-extracted features: the loop plus wiring.

    data (:mod:`xmodal.training.sampling`) -> model -> loss (+ TS++ values, :mod:`xmodal.training.schedule_plan`)
    -> optimiser (cosine LR, warm-up, clipping) -> per-epoch validation, early stopping,
    atomic checkpoint (:mod:`xmodal.runs`) -> test-time normalisers fitted once and one
    selected on validation (:mod:`xmodal.retrieval.testtime`) -> ``model.pt``

Run directory (``out``): ``config.yaml`` (resolved config), ``log.jsonl`` (one JSON
object per epoch; ``log.csv`` and ``tensorboard/`` with ``train.log_to``, see
:mod:`xmodal.training.runlog`), ``provenance.json`` (command, versions, git revision,
sha256 of the data files, :mod:`xmodal.training.provenance`), ``checkpoint.pt`` (everything needed to resume exactly: model,
loss state incl. queues, optimiser, RNG, early-stopping state; rewritten atomically
every epoch and every ``train.checkpoint_minutes`` inside one, :mod:`xmodal.training.checkpoints`), ``model.pt`` (the selected model with its fitted test-time normalisers,
what :func:`xmodal.load_model` reads), ``metrics.json`` (with each split's protocol card),
``per_query.npz`` (each query's rank per split, normaliser and direction: what ``xmodal
compare`` tests), PNG plots, and ``.lock`` (one writer at a time). Every checkpoint read is weights-only.

Exact resume: batches of epoch ``e`` come from a generator seeded with ``(seed, e)``,
the global torch RNG (dropout) is checkpointed, the LR is a function of the step,
so a run killed after any checkpoint (an epoch's end, or a batch inside an epoch) and
resumed ends with the same weights as an uninterrupted run.

Progress: one line per epoch on stdout (:mod:`xmodal.training.runlog`); on stderr a bar on a
terminal, else a line every ``XMODAL_PROGRESS_SECONDS`` (30) seconds while the data loads and is
checked, inside each epoch (batches, clips/s, time left) and while the run is evaluated
(:mod:`xmodal.progress`).

Data: the training split's arrays stay where the loader put them (memory-mapped files
in their stored dtype); each step's rows are gathered and upcast as the batch is drawn
(:mod:`xmodal.training.batches`, a ``DataLoader`` with ``train.workers`` processes).

Distributed: launched with ``torchrun``, each rank takes an equal slice of every
global batch (and reads only those rows); the losses all-gather embeddings with gradient and gradients are
averaged over ranks (:mod:`xmodal.dist`), so one step equals the single-process step
on the global batch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from xmodal import dist
from xmodal.config import Config, save_config, to_dict
from xmodal.data import inputs as video_inputs
from xmodal.data.check import check_same_sizes
from xmodal.retrieval.evaluate import (embed_split, evaluate, evaluate_normalizers,  # noqa: F401  (former home)
                             group_metrics, retrieval_metrics, score)
from xmodal.metrics import modality_gap
from xmodal.models import TwoTower, build_model, model_payload
from xmodal.models.hierarchy import with_global_towers
from xmodal.training import hierarchy
from xmodal.runs import (DivergedError, RunDirError, RunLock, atomic_save, atomic_write_text, check_run_dir,  # noqa: F401
                         clear_run_outputs, load_checkpoint, prepare_run_dir, remove_stale_temporaries)
from xmodal.training import checkpoints, finetune
from xmodal.training.gradcache import cached_backward
from xmodal.training import provenance
from xmodal.training.batches import EpochBatches, batch_loader, to_device
from xmodal.training.runlog import RunLog
from xmodal.training.sampling import epoch_batches, shuffle_pairs  # noqa: F401  (former home)
from xmodal.training.schedule_plan import (TemperaturePlan, base_value, loss_temperature,  # noqa: F401
                                  text_classes)
from xmodal.retrieval.testtime import ORACLE_NAMES, TestTime, fit_test_time, select, uses_test_queries  # noqa: F401
from xmodal.training.parts import (average_gradients, bounded_warmup, build_loss_from_config,  # noqa: F401
                                   cosine_lr, generator_states, init_distributed_from_env, load_module_state,
                                   loss_extras, make_ema, make_optimizer, make_plateau, resolve_device,
                                   set_generator_states)

# --------------------------------------------------------------------------- data


def load_splits(cfg: Config, splits: dict | None = None) -> dict:
    """``{"train", "val"[, "test"]}`` :class:`~xmodal.data.PairedSplit` s for ``cfg.data``
    (or the in-memory ``splits`` given instead of its files), with ``data.noise`` of the
    training pairs shuffled and ``max_train_texts`` applied."""
    import xmodal.data as xdata

    d = cfg.data
    if splits is not None:
        splits = _given_splits(splits, need_val=not d.val_from_train)
    elif d.name == "synthetic":
        all_splits = xdata.synthetic(**d.synthetic, seed=cfg.train.seed)
        splits = {"train": all_splits[d.train_split], "val": all_splits[d.val_split]}
        if d.test_split and d.test_split in all_splits:
            splits["test"] = all_splits[d.test_split]
    else:
        from xmodal.config import zero_shot_without_train

        splits = {} if zero_shot_without_train(cfg) else {"train": xdata.load_paired_split(d.root, d.train_split)}
        if not d.val_from_train:
            splits["val"] = xdata.load_paired_split(d.root, d.val_split)
        if d.test_split and not xdata.layout.missing_files(d.root, d.test_split):
            splits["test"] = xdata.load_paired_split(d.root, d.test_split)
        if "train" not in splits:  # a zero-shot run on val / test alone: nothing to shuffle or cut
            return splits
    train = splits["train"]
    if d.val_from_train:
        train, splits["val"] = carve_validation(train, d.val_from_train)
    if d.max_train_texts and train.num_texts > d.max_train_texts:
        keep = np.sort(np.random.default_rng(cfg.train.seed).choice(train.num_texts, d.max_train_texts,
                                                                     replace=False))
        train = dataclasses.replace(train, text=train.text[keep], text_to_video=train.text_to_video[keep],
                                    text_mask=None if train.text_mask is None else train.text_mask[keep],
                                    text_labels=None if train.text_labels is None else train.text_labels[keep],
                                    captions=None,
                                    relevancy=None if train.relevancy is None else train.relevancy[keep])
    if d.noise > 0:
        train = shuffle_pairs(train, d.noise, seed=cfg.train.seed)
    splits["train"] = train
    return splits


def carve_validation(train, num_videos: int, seed: int = 0x7A1) -> tuple:
    """``(train without the held-out videos, held-out validation split)``: ``num_videos``
    training videos drawn with a fixed ``seed``, each with all its texts, so selection on the
    validation split never sees the test split (``data.val_from_train``)."""
    if not 0 < num_videos < train.num_videos:
        raise ValueError(f"data.val_from_train: must lie in [1, {train.num_videos - 1}] "
                         f"(the training split has {train.num_videos} videos), got {num_videos}")
    keep, held = carved_rows(train.num_videos, num_videos, seed)
    return train.subset(keep), train.subset(held)


def carved_rows(n: int, num_videos: int, seed: int = 0x7A1) -> tuple[np.ndarray, np.ndarray]:
    """Sorted video rows ``(kept for training, held out)`` of :func:`carve_validation`
    for a training split of ``n`` videos (the report maps the held-out rows to names)."""
    held = np.random.default_rng(seed).permutation(n)
    return np.sort(held[num_videos:]), np.sort(held[:num_videos])


def _given_splits(splits: Any, need_val: bool = True) -> dict:
    from xmodal.data import PairedSplit

    need = {"train", "val"} if need_val else {"train"}
    if not isinstance(splits, dict) or not need <= set(splits):
        raise ValueError("splits: expected a dict with 'train' and 'val' (and optionally 'test') PairedSplits"
                         + ("" if need_val else " ('val' may be left out: data.val_from_train carves it)"))
    out = {}
    for key, value in splits.items():
        if key not in ("train", "val", "test"):
            raise ValueError(f"splits: unknown key {key!r}; expected train, val, test")
        if not isinstance(value, PairedSplit):
            raise TypeError(f"splits[{key!r}]: expected a PairedSplit, got {type(value).__name__}")
        out[key] = value
    return out


# --------------------------------------------------------------------------- pieces


def normalized_similarities(name: str, test_time: TestTime | dict, text: torch.Tensor, video: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
    """Former API: ``(t2v [M, N], v2t [N, M] or None = the transpose, {})`` under the
    normaliser ``name`` of ``test_time`` (see :meth:`xmodal.retrieval.testtime.TestTime.similarities`)."""
    tt = test_time if isinstance(test_time, TestTime) else TestTime.from_state_dict(
        {"normalizer": name, **test_time, "val": {name: None}})
    return (*tt.similarities(text, video, name), {})


def build_test_time(cfg: Config, model: TwoTower, loss: nn.Module, train, *, seed: int, val=None) -> TestTime:
    """Fit the candidate normalisers once: banks of ``bank_size`` random training texts /
    videos embedded by the final model, and (NCL) the loss's own query queues (``train`` None: a
    zero-shot run without a train split; only ``none``, DN from ``val`` and the oracles are fitted). DN's means
    come from the train banks, or with ``test_time.dn_source: val`` from the embedded
    ``val`` split (the DN paper's protocol: ``dn_num_samples`` random rows, ``dn_seeds`` seeds)."""
    tc = cfg.test_time
    dn_bank = None
    if tc.dn_source == "val" and "dn" in tc.normalizers:
        if val is None:
            raise ValueError("test_time.dn_source: 'val' needs the validation split")
        dn_bank = embed_split(model, val, cfg.train.eval_batch_size)
    if train is None:  # a zero-shot run without a train split: no train bank, no held-out queries
        return fit_test_time(tc.normalizers, text_bank=None, video_bank=None, temperature=model.temperature,
                             iters=tc.sinkhorn_iters, lam=tc.dn_lam, k=tc.qb_k, beta=tc.qb_beta, dn_bank=dn_bank,
                             dn_num_samples=tc.dn_num_samples, dn_seeds=tc.dn_seeds, dn_source=tc.dn_source)
    g = np.random.default_rng([seed, 4242])
    ti = np.sort(g.choice(train.num_texts, min(tc.bank_size, train.num_texts), replace=False))
    vi = np.sort(g.choice(train.num_videos, min(tc.bank_size, train.num_videos), replace=False))
    video_bank = model.encode_video(*train.video_input(vi))
    ncl_bank = loss.query_bank() if hasattr(loss, "query_bank") else None
    # up to HELDOUT_QUERIES further train texts that no normaliser sees, with the video of each: an
    # approximate index measures its recall on the texts, and the index build measures whether folding
    # the normaliser helps text -> video on its gallery with their videos added (xmodal.retrieval.build)
    rest_t = np.setdiff1d(np.arange(train.num_texts), ti)
    hi = np.sort(g.choice(rest_t, min(HELDOUT_QUERIES, rest_t.size), replace=False))
    hv = np.asarray(train.text_to_video)[hi]
    heldout = (model.encode_text(*train.text_input(hi)), model.encode_video(*train.video_input(hv))) \
        if hi.size else None
    return fit_test_time(tc.normalizers, text_bank=model.encode_text(*train.text_input(ti)), video_bank=video_bank,
                         ncl_bank=ncl_bank, temperature=model.temperature, iters=tc.sinkhorn_iters,
                         lam=tc.dn_lam, k=tc.qb_k, beta=tc.qb_beta, dn_bank=dn_bank,
                         dn_num_samples=tc.dn_num_samples, dn_seeds=tc.dn_seeds, dn_source=tc.dn_source,
                         heldout_bank=heldout, heldout_pairs=True)


#: Train texts (and videos) embedded at the end of training besides the normalisers' banks.
HELDOUT_QUERIES = 1000


def candidate_normalizers(cfg: Config, test_time: TestTime) -> list[str]:
    return list(test_time.names)


# --------------------------------------------------------------------------- the loop


_rng_state, _set_rng_state = checkpoints.rng_state, checkpoints.set_rng_state  # former homes


def train(cfg: Config, out: str | os.PathLike, *, resume: bool = True, stop_after_epochs: int | None = None,
          progress: bool | None = None, verbose: bool = True, command: str | None = None,
          splits: dict | None = None, accept_changed_data: bool = False) -> dict:
    """Train, select the test-time normaliser on validation, write the run directory.

    Args:
        cfg: the resolved :class:`~xmodal.config.Config`.
        out: run directory (created; locked while this call writes it). An existing
            ``checkpoint.pt`` with the same config is resumed from when ``resume``.
        resume: continue an interrupted run (else start over, overwriting).
        stop_after_epochs: return after this many epochs *of this call* without
            finishing (simulates a kill; used by the resume tests).
        progress: True: tqdm bars on stderr; False: nothing on stderr; None (default): bars when
            ``cfg.train.progress`` and stderr is a terminal, else a progress line every
            ``XMODAL_PROGRESS_SECONDS`` (30) seconds before, inside and after the epochs (rank 0 only).
        verbose: print one line per epoch on stdout (rank 0), terminal or not.
        command: the command line recorded in ``provenance.json`` (default ``sys.argv``).
        splits: in-memory ``{"train", "val"[, "test"]}`` PairedSplits used instead of the
            files of ``cfg.data`` (see :func:`xmodal.training.fit`).
        accept_changed_data: resume even when a data file's content changed since the run
            started (default: refused, naming the file); ``provenance.json`` then keeps the
            earlier hashes in ``data_history`` (:func:`xmodal.training.provenance.check_resume`).

    Returns:
        A summary dict (also ``metrics.json``): best epoch, val/test metrics per
        normaliser, selected normaliser, oracle metrics, train time.

    Raises:
        ValueError: bad config, a run directory in use by another process, an
            unreadable or unsafe checkpoint, a resume over changed data, or a diverged loss (NaN/inf).
        OSError: ``ENOSPC`` "no space left on device" when a write fails on a full disk.
    """
    is_main = dist.rank() == 0
    lock = None
    if is_main:
        out = check_run_dir(prepare_run_dir(out))  # refuses a folder holding the user's files
        lock = RunLock(out).acquire()
    try:
        if is_main:
            remove_stale_temporaries(out)
            if not (resume and (Path(out) / "checkpoint.pt").is_file()):
                clear_run_outputs(out)  # a fresh run: nothing of the previous one stays to be served
        return _train(cfg, Path(out), resume=resume, stop_after_epochs=stop_after_epochs, progress=progress,
                      verbose=verbose, command=command, splits=splits, accept_changed_data=accept_changed_data)
    finally:
        if lock is not None:
            lock.release()


def _train(cfg: Config, out: Path, *, resume: bool, stop_after_epochs: int | None, progress: bool | None,
           verbose: bool = True, command: str | None = None, splits: dict | None = None,
           accept_changed_data: bool = False) -> dict:
    from xmodal.progress import Stages

    tc = cfg.train
    is_main = dist.rank() == 0
    mode = _progress_mode(progress, tc.progress, is_main)
    # the steps before, between and after the epochs: a line every 30 s while one lasts (also on a terminal)
    with Stages(show=None if mode else False) as stage:
        return _run(cfg, out, resume=resume, stop_after_epochs=stop_after_epochs, mode=mode, stage=stage,
                    verbose=verbose, command=command, splits=splits, accept_changed_data=accept_changed_data)


def _progress_mode(progress: bool | None, configured: bool, is_main: bool) -> str | None:
    """``"bar"`` (tqdm on a terminal), ``"lines"`` (a line every 30 s, for log files) or None (silent)."""
    if not is_main or progress is False:
        return None
    if progress is True or (configured and sys.stderr.isatty()):
        return "bar"
    return "lines"


def _run(cfg: Config, out: Path, *, resume: bool, stop_after_epochs: int | None, mode: str | None, stage,
         verbose: bool, command: str | None, splits: dict | None, accept_changed_data: bool) -> dict:
    tc = cfg.train
    is_main = dist.rank() == 0
    show = mode == "bar"
    device = resolve_device(tc.device)

    in_memory = splits is not None
    stage("train: loading the data" + ("" if in_memory or cfg.data.name != "paired" else f" ({cfg.data.root})"))
    splits = load_splits(cfg, splits) if in_memory else load_splits(cfg)
    stage("train: checking the splits' feature sizes")
    check_same_sizes(splits)  # a mismatched val / test split fails now, not after training
    torch.manual_seed(tc.seed)
    finetuning = finetune.is_finetune(cfg)
    if finetuning:  # the encoder itself (xmodal.models.clip4clip): frames and the captions' token ids in
        stage(f"train: loading the encoder {cfg.model.encoder}")
        model, processor = finetune.build(cfg)
        splits = finetune.tokenized(splits, processor.tokenizer, cfg.data.max_words)
    val_split = splits["val"]
    # a zero-shot run without a train split (xmodal.config.zero_shot_without_train): the val split gives the
    # sizes, no batch is drawn, and the normalisers fitted on train queries are skipped (finish)
    train_split = splits.get("train", val_split)
    model = model if finetuning else build_model(video_dim=train_split.video.shape[-1], text_dim=train_split.text.shape[-1],
                        kind=cfg.model.kind, text_kind=cfg.model.text_kind or None, dim=cfg.model.dim,
                        width=cfg.model.width, depth=cfg.model.depth, dropout=cfg.model.dropout,
                        layers=cfg.model.layers, heads=cfg.model.heads, hidden=cfg.model.hidden,
                        temperature=cfg.loss.temperature or 0.05,
                        experts=train_split.expert_dims(), fusion=cfg.model.fusion,
                        text_tokens=train_split.text.shape[1] if train_split.has_tokens else None,
                        block=cfg.model.block, local_pooling=cfg.model.local_pooling,
                        pool_heads=cfg.model.pool_heads, pool_hidden=cfg.model.pool_hidden)
    if cfg.model.hierarchy:  # clips inside videos: global towers (CrossCLR app. A, xmodal.training.hierarchy)
        model = with_global_towers(model, hierarchy.global_spec(cfg))
    # the split's own arrays (memory-mapped when read from files): never upcast whole; each batch's
    # rows are gathered and upcast to float32 as it is drawn (xmodal.training.batches)
    video_all, mask_all = train_split.video_input()  # (features, mask); dicts with experts
    text_all, text_mask_all = train_split.text_input()  # [T, Dt] or tokens [T, L, Dt] + mask
    if cfg.model.standardize:
        stage(f"train: fitting the input standardisation on {train_split.num_videos:,} videos and "
              f"{train_split.num_texts:,} texts")
        model.fit_standardization(video_all, text_all, video_mask=mask_all, text_mask=text_mask_all)
    model.to(device)
    build = hierarchy.build_hierarchical_loss if cfg.model.hierarchy else build_loss_from_config
    loss_fn = build(cfg, video_dim=model.dim if finetuning else train_split.video.shape[-1],
                    text_dim=model.dim if finetuning else train_split.text.shape[-1]).to(device)
    params = [p for p in list(model.parameters()) + list(loss_fn.parameters()) if p.requires_grad]
    zero_shot = tc.epochs == 0  # model.kind identity: nothing to train, the test-time pipeline only
    if zero_shot and not in_memory and cfg.data.name != "synthetic":
        _check_one_embedding(cfg)
    optimizer = None if zero_shot else make_optimizer(cfg, finetune.param_groups(cfg, model, list(loss_fn.parameters())))
    scaler = finetune.grad_scaler(cfg, device)  # train.precision fp16
    plateau = None if zero_shot else make_plateau(cfg, optimizer)
    ema = make_ema(cfg, model)  # optim.ema: the weights validated and kept are the moving average

    world = dist.world_size()
    if tc.batch_size % world:
        raise ValueError(f"train.batch_size: {tc.batch_size} is not divisible by the world size {world}")
    local_bs = tc.batch_size // world
    t2v_np = train_split.text_to_video
    sampler = dict(seed=tc.seed, text_to_video=t2v_np, batch_size=tc.batch_size, sampling=tc.sampling,
                   captions_per_video=tc.captions_per_video)
    hier = None
    if cfg.model.hierarchy:
        if world > 1:
            raise ValueError("model.hierarchy: single-process training only (no torchrun)")
        hier = hierarchy.HierarchyData(train_split, video_all, mask_all, text_all, seed=tc.seed,
                                       batch_size=tc.batch_size, text_mask_all=text_mask_all)
    batches_of = hier.batches if hier is not None else (lambda e: epoch_batches(e, **sampler))
    stage("train: drawing the epoch's batches")
    steps_per_epoch = len(batches_of(0))
    if steps_per_epoch == 0 and not zero_shot:
        raise ValueError(f"train.batch_size: {tc.batch_size} exceeds the number of training pairs")
    total_steps = tc.epochs * steps_per_epoch
    warmup_steps = int(round(cfg.optim.warmup_proportion * total_steps if cfg.optim.warmup_proportion
                             else cfg.optim.warmup_epochs * steps_per_epoch))
    warmup_steps, warmup_note = bounded_warmup(warmup_steps, total_steps)
    plan = TemperaturePlan(cfg, loss_fn, train_split, steps_per_epoch)
    val_relevancy = val_split.mir_relevancy()  # per-epoch mAP / nDCG when present (TS++ Table 5.1)
    if tc.metric == "map" and val_relevancy is None:
        raise ValueError(f"train.metric: 'map' needs a relevancy for the validation split "
                         f"({cfg.data.val_split}_relevancy.npy or video labels)")
    if tc.metric == "p2v_rsum" and val_split.video_to_group is None:
        raise ValueError(f"train.metric: 'p2v_rsum' needs groups in the validation split "
                         f"({cfg.data.val_split}_video_to_group.npy)")
    amp = finetune.autocast(cfg, device)

    state = {"epoch": 0, "step": 0, "best_score": -math.inf, "best_epoch": -1, "bad_epochs": 0,
             "history": [], "best_model": None, "train_time": 0.0, "done": False, "batch": 0}
    ckpt_path = out / "checkpoint.pt"
    resumed = resume and ckpt_path.is_file()
    if resumed:
        stage(f"train: resuming from {ckpt_path}")
        state = checkpoints.restore(ckpt_path, cfg, device, model, loss_fn, optimizer, plateau, ema,
                                    epoch_steps=lambda e: len(batches_of(e)))
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
    data_files = [] if in_memory else provenance.data_files(cfg)
    if data_files and is_main:
        stage(f"train: hashing the {len(data_files)} data files for provenance.json")
    hashes = provenance.hash_files(data_files) if is_main else {}
    changed = provenance.check_resume(out, hashes, epoch=state["epoch"], batch=state.get("batch", 0),
                                      step=state["step"], accept=accept_changed_data) \
        if resumed and is_main else None  # a resume over changed data: refused before anything is written
    logs = RunLog(out, log_to=tc.log_to, metric=tc.metric, epochs=tc.epochs, history=state["history"],
                  enabled=is_main, echo=verbose, resume_step=state["step"] if state.get("batch") else None)
    for note in [warmup_note, *_unfitted_notes(cfg, loss_fn, has_train="train" in splits)]:
        if note and is_main and (verbose or mode):
            print(f"xmodal train: note: {note}", file=sys.stderr, flush=True)
    prov = provenance.start(out, data_files, command=command, resumed=resumed, hashes=hashes,
                            changed=changed) if is_main else {}
    logs.describe(to_dict(cfg), prov)  # TensorBoard text / tracker params (rank 0; a no-op elsewhere)
    if is_main:  # after the resume check: a refused resume leaves the run's config.yaml alone
        save_config(cfg, out / "config.yaml")
        _record_encoders(cfg, out, in_memory)

    epochs_this_call = 0
    clock = checkpoints.CheckpointClock(tc.checkpoint_minutes if is_main else 0)  # rank 0 writes checkpoints

    def save_checkpoint() -> None:
        if scaler is not None:
            state["scaler"] = scaler.state_dict()
        if is_main:
            atomic_save(checkpoints.payload(cfg, model=model, loss_fn=loss_fn, optimizer=optimizer, device=device,
                                            state=state, plateau=plateau, ema=ema), ckpt_path)
        clock.reset()

    per_second = "groups" if hier is not None else "clips"
    while not state["done"] and state["epoch"] < tc.epochs:
        epoch = state["epoch"]
        t0 = time.perf_counter()
        model.train()
        loss_fn.train()
        epoch_list = batches_of(epoch)
        first = state.pop("batch", 0)  # > 0: a checkpoint inside this epoch; its first batches are done
        partial = state.pop("partial", None) or {}
        t0 -= partial.get("seconds", 0.0)
        todo = epoch_list[first:]
        items = todo if hier is not None else batch_loader(
            EpochBatches(todo, text=text_all, text_mask=text_mask_all, video=video_all, video_mask=mask_all,
                         text_to_video=t2v_np, rank=dist.rank(), local_batch=local_bs), workers=tc.workers,
            seed=tc.seed * 100003 + epoch)
        stage.clear()  # the epoch's own lines from here
        bar = _epoch_bar(items, len(todo), mode, f"epoch {epoch + 1}/{tc.epochs}"
                         + (f" from batch {first + 1:,}/{len(epoch_list):,}" if first else ""))
        losses, terms = list(partial.get("losses", [])), dict(partial.get("terms", {}))
        tick = time.perf_counter()
        for done, batch in enumerate(bar, start=first + 1):
            step = state["step"]
            if plateau is None or step < warmup_steps:  # plateau: warm-up here, then ReduceLROnPlateau
                lr = cosine_lr(step, base_lr=cfg.optim.lr, warmup_steps=warmup_steps, total_steps=total_steps,
                               min_ratio=cfg.optim.min_lr_ratio,
                               epoch_steps=steps_per_epoch if cfg.optim.warmup_unit == "epoch" else 0)
                for group in optimizer.param_groups:
                    group["lr"] = lr * group.get("lr_scale", 1.0)
            else:
                lr = optimizer.param_groups[0]["lr"]
            optimizer.zero_grad(set_to_none=True)
            cached = False
            if hier is not None:  # batches of whole groups: L_local + w L_global
                loss = hier.loss(model, loss_fn, batch, device=device, amp=amp,
                                 scheduled=plan(step, hier.texts(batch)), keyword=plan.keyword)
            else:
                mine, ids_np = batch.rows, batch.ids  # this rank's rows of the global batch, gathered
                text_in, tmask_in = to_device(batch.text, batch.text_mask, device)
                video_in, mask_in = to_device(batch.video, batch.video_mask, device)
                ids = torch.as_tensor(ids_np, device=device)
                scheduled = plan(step, mine)

                def loss_of(v: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
                    # a trained encoder has no frozen input features: losses that read them (CrossCLR,
                    # Cali-NCE) get its embeddings, detached
                    raw_v, raw_t = (v.detach(), t.detach()) if finetuning else (
                        video_inputs.pooled(video_in, mask_in), video_inputs.pooled_text(text_in, tmask_in))
                    extra = loss_extras(loss_fn, ids=ids, video_in=raw_v, text_in=raw_t, scheduled=scheduled,
                                        keyword=plan.keyword)
                    return loss_fn(v.float(), t.float(), **extra)

                if tc.chunk_size:  # gradient caching: the backward happens here, chunk by chunk
                    loss = cached_backward(model.forward_video, model.forward_text, loss_of, video=video_in,
                                           video_mask=mask_in, text=text_in, text_mask=tmask_in,
                                           chunk_size=tc.chunk_size, autocast=amp,
                                           scale=None if scaler is None else scaler.scale)
                    cached = True
                else:
                    with amp:
                        v = model.forward_video(video_in, mask_in)
                        t = model.forward_text(text_in, tmask_in)
                    loss = loss_of(v, t)
            value = float(loss.detach())  # the step's one host sync
            if not math.isfinite(value):
                raise DivergedError(f"training diverged at epoch {epoch + 1} step {step + 1}: the loss is "
                                    f"{value}; lower optim.lr or check the features")
            if not cached:
                (loss if scaler is None else scaler.scale(loss)).backward()
            dist.average_gradients(params)
            if scaler is not None:
                scaler.unscale_(optimizer)
            if cfg.optim.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            if ema is not None:
                ema.update_parameters(model)
            state["step"] += 1
            losses.append(value)
            for k, x in (getattr(loss_fn, "last_terms", None) or {}).items():
                terms[k] = terms.get(k, 0.0) + (x.detach() if isinstance(x, torch.Tensor) else float(x))
            if mode is not None:
                rate = (done - first) * tc.batch_size / max(time.perf_counter() - tick, 1e-9)
                bar.set_postfix_str(f"{rate:,.0f} {per_second}/s, loss {value:.4f}, lr {lr:.2e}", refresh=False)
            if logs.per_step:
                logs.step(step, loss=value, lr=lr, temperature=plan.mean_value(step) if plan.active
                          else loss_temperature(cfg, loss_fn), terms=getattr(loss_fn, "last_terms", None))
            if clock.due() and done < len(epoch_list):  # a checkpoint inside the epoch (train.checkpoint_minutes)
                state.update(batch=done, partial={"losses": losses, "terms": terms,
                                                  "seconds": time.perf_counter() - t0})
                save_checkpoint()
                del state["batch"], state["partial"]  # an epoch's end checkpoints whole epochs
                logs.checkpoint(len(state["history"]))  # steps before it reach the trackers / event file now
                if mode is not None:
                    bar.write(f"train: checkpoint at epoch {epoch + 1}/{tc.epochs}, batch "
                              f"{done:,}/{len(epoch_list):,} (step {state['step']:,}): {ckpt_path}")
        bar.close()
        train_loss = float(dist.all_reduce_mean(torch.tensor(float(np.mean(losses))))) if losses else float("nan")
        state["train_time"] += time.perf_counter() - t0

        kept = model if ema is None else ema.module  # the weights validated and snapshotted
        stage(f"train: epoch {epoch + 1}/{tc.epochs}: validating on {val_split.num_texts:,} texts")
        val_text, val_video = embed_split(kept, val_split, tc.eval_batch_size)
        if not bool(torch.isfinite(val_text).all() & torch.isfinite(val_video).all()):
            raise DivergedError(f"training diverged in epoch {epoch + 1}: the weights became NaN/inf; "
                                f"lower optim.lr or check the features")
        val = retrieval_metrics(val_text @ val_video.T, None, val_split.text_to_video, val_relevancy)
        val.update(group_metrics(kept, val_split, tc.eval_batch_size))  # p2v / v2p where val has groups
        current = score(val, tc.metric)
        if plateau is not None and state["step"] >= warmup_steps:
            plateau.step(current)
        improved = current > state["best_score"] or tc.keep == "last"  # keep last: every epoch replaces
        if improved:
            state.update(best_score=current, best_epoch=epoch, bad_epochs=0,
                         best_model={k: v.detach().clone().cpu() for k, v in kept.state_dict().items()},
                         best_loss={k: v.detach().clone().cpu() for k, v in loss_fn.state_dict().items()})
        else:
            state["bad_epochs"] += 1
        record = {"epoch": epoch + 1, "step": state["step"], "train_loss": train_loss, "lr": lr,
                  "temperature": loss_temperature(cfg, loss_fn), "val": val, f"val_{tc.metric}": current,
                  "best_epoch": state["best_epoch"] + 1, "epoch_time": time.perf_counter() - t0,
                  "modality_gap": float(modality_gap(val_text, val_video))}  # TS++ Fig. 5.6
        if terms:
            record["loss_terms"] = {k: float(x) / max(1, len(losses)) for k, x in terms.items()}
        if plan.active:
            record["scheduled"] = plan.mean_value(max(0, state["step"] - 1))
        state["history"].append(record)
        state["epoch"] += 1
        if tc.patience and state["bad_epochs"] >= tc.patience:
            state["done"] = True
        save_checkpoint()
        logs.epoch(state["history"], improved=improved)  # log.jsonl (+ csv, tensorboard), the epoch line
        epochs_this_call += 1
        if stop_after_epochs is not None and epochs_this_call >= stop_after_epochs and state["epoch"] < tc.epochs \
                and not state["done"]:
            logs.close()
            return {"stopped": True, "epoch": state["epoch"]}

    if not is_main:  # rank 0 alone fits the test-time normalisers and evaluates (no collective follows):
        logs.close()  # the other ranks neither repeat that work nor hold its memory
        return {"rank": dist.rank(), "best_epoch": state["best_epoch"] + 1, "epochs_run": state["epoch"],
                "val_score": state["best_score"]}
    summary = finish(cfg, out, model, loss_fn, splits, state, show=show, stage=stage)
    logs.final(summary, state["step"])
    if is_main:
        provenance.finish(out, prov)
    return summary


def _epoch_bar(items, total: int, mode: str | None, desc: str):
    """The epoch's progress: a tqdm bar (``"bar"``), a line every 30 s (``"lines"``) or nothing."""
    from xmodal.progress import Lines, progress

    if mode == "bar":
        bar = progress(items, total=total, desc=desc, unit="batch", show=True)
        bar.leave = False
        return bar
    return Lines(items, total=total, desc=f"train: {desc}", unit="batch", enabled=mode == "lines")


def _unfitted_notes(cfg: Config, loss_fn: nn.Module, has_train: bool = True) -> list[str]:
    """Normalisers the config lists that this run cannot fit, said before training (not only after it):
    one line each."""
    if not has_train:
        return [f"{n}: {why}" for n, why in no_train_reasons(cfg).items()]
    if "ncl" in cfg.test_time.normalizers and not hasattr(loss_fn, "query_bank"):
        return ["test_time.normalizers lists ncl, which is fitted on the NCL loss's query queue "
                f"(loss.name: ncl); with loss {cfg.loss.name} it is left out"]
    return []


def no_train_reasons(cfg: Config) -> dict[str, str]:
    """``{normaliser: why it is skipped}`` for the listed normalisers a zero-shot run without a train
    split cannot fit: those fitted on a bank of train queries (Sinkhorn / QB-Norm / IS on ``bank_size``
    train queries, NCL on its loss's train-query queue, DN with ``dn_source: train``)."""
    from xmodal.retrieval.testtime import bank_of

    split = cfg.data.train_split
    out = {}
    for name in dict.fromkeys(cfg.test_time.normalizers):
        bank = bank_of(name)
        if name == "dn" and cfg.test_time.dn_source == "val":
            continue  # DN's means from the val split (DN Sec. 4.3): no train split needed
        if bank == "ncl":
            out[name] = (f"fitted on the NCL loss's queue of train queries; this zero-shot run has no train split "
                         f"{split!r}, so it is skipped")
        elif bank == "train":
            fix = " (test_time.dn_source: val fits DN on the val split, DN Sec. 4.3)" if name == "dn" else ""
            out[name] = (f"fitted on a bank of train queries (test_time.bank_size); this zero-shot run has no train "
                         f"split {split!r}, so it is skipped{fix}")
    return out


def dn_per_seed(cfg: Config, test_time: TestTime, model: TwoTower, splits: dict, evaluated: list[str]) -> dict | None:
    """DN's own protocol (Zhou et al. 2023, Sec. 4.3: "we estimated the mean with 100 random unlabeled
    samples from the validation set and calculated standard deviations and average recalls with 5
    random seeds"): one DN per sampling seed ``0 .. dn_seeds - 1``, each fitted on ``dn_num_samples``
    embedded validation texts and videos, each split's metrics per seed, their mean and sample
    standard deviation (ddof 1). Only for ``test_time.dn_source: val`` with ``dn_seeds > 1`` and
    ``dn`` among the normalisers; the run's own ``dn`` (selected or not) averages the seeds' means."""
    tc = cfg.test_time
    if "dn" not in test_time.names or tc.dn_source != "val" or tc.dn_seeds < 2:
        return None
    from xmodal.normalize import DistributionNormalization

    bs = cfg.train.eval_batch_size
    val_text, val_video = embed_split(model, splits["val"], bs)
    fits = DistributionNormalization.fit_per_seed(val_text, val_video, lam=tc.dn_lam, num_samples=tc.dn_num_samples,
                                                  seeds=tc.dn_seeds, seed=0)
    out: dict[str, Any] = {"lam": tc.dn_lam, "num_samples": tc.dn_num_samples, "seeds": list(range(tc.dn_seeds)),
                           "source": "val", "std": "sample standard deviation over the seeds (ddof 1)"}
    n = tc.dn_num_samples
    held = {"text": int(val_text.shape[0]), "video": int(val_video.shape[0])}
    out["num_samples_used"] = {k: v if n is None else min(int(n), v) for k, v in held.items()}
    # every seed draws all rows of both sides: the seeds are one fit, and a spread of 0 would be no measurement
    one_fit = n is None or all(int(n) >= v for v in held.values())
    if one_fit:
        out["seeds_identical"] = True
        out["std"] = None
        out["note"] = (f"the val split holds {held['text']} texts and {held['video']} videos, no more than "
                       f"dn_num_samples {n}: every seed takes all of them, so the {tc.dn_seeds} seeds are one fit "
                       f"and there is no spread to report (lower dn_num_samples or use a larger val split)")
    for s in evaluated:
        runs = [evaluate_normalizers(["dn"], dataclasses.replace(test_time, dn=f.state_dict()), model, splits[s],
                                     bs)["dn"] for f in fits]
        mean = {d: {m: float(np.mean([r[d][m] for r in runs])) for m in runs[0][d] if _number(runs[0][d][m])}
                for d in runs[0] if isinstance(runs[0][d], dict)}
        std = {d: {m: None if one_fit else float(np.std([r[d][m] for r in runs], ddof=1)) for m in mean[d]}
               for d in mean}
        out[s] = {"per_seed": runs, "mean": mean, "std": std}
    return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_one_embedding(cfg: Config) -> None:
    """A zero-shot run compares text and video features as they are, so both must come from one
    encoder's two towers (CLIP, Radford et al. 2021 Sec. 2.3: one joint embedding space): where
    ``DATA/encoders.json`` records two encoders with other weights (or, without hashes, other specs),
    the run is refused before anything is written, whatever their sizes."""
    from xmodal.features.identity import read_encoders, shown_spec

    records = read_encoders(cfg.data.root, "data.root") or {}
    text, video = records.get("text"), records.get("video")
    if not text or not video:
        return
    a, b = text.get("weights_sha256"), video.get("weights_sha256")
    same = a == b if (a and b) else text.get("spec") == video.get("spec")
    if not same:
        raise ValueError(f"model.kind: identity compares text and video features directly, but "
                         f"{cfg.data.root}/encoders.json records text from {shown_spec(text.get('spec'), text)} and "
                         f"video from {shown_spec(video.get('spec'), video)}: two encoders, two embedding spaces "
                         f"(encode both with one CLIP-family model, or train a model that maps one onto the other)")


def _record_encoders(cfg: Config, out: Path, in_memory: bool) -> None:
    """``RUN/encoders.json``: the layout's ``DATA/encoders.json`` (which encoders made the features,
    :mod:`xmodal.features.identity`), so export, index, query and serve know them; nothing for
    synthetic or in-memory data."""
    from xmodal.features.identity import ENCODERS_NAME, read_encoders, write_encoders

    records = None if in_memory or cfg.data.name == "synthetic" else read_encoders(cfg.data.root, "data.root")
    if records is not None:
        write_encoders(out, records)
    else:
        (out / ENCODERS_NAME).unlink(missing_ok=True)


def finish(cfg: Config, out: Path, model: TwoTower, loss_fn: nn.Module, splits: dict, state: dict,
           *, show: bool = False, stage=None) -> dict:
    """Restore the best epoch, fit the test-time normalisers once, select one on val (a candidate
    replaces ``none`` only when its gain is clear, :mod:`xmodal.retrieval.selection`), write
    ``model.pt``, ``metrics.json`` (with each split's protocol card) and ``per_query.npz``."""
    from xmodal.retrieval.perquery import NAME as PER_QUERY, protocol_card, query_ids, split_sha256, write_per_query
    from xmodal.retrieval.selection import select_normalizer

    stage = stage or (lambda text: None)
    if state["best_model"] is not None:
        model.load_state_dict(state["best_model"])
        load_module_state(loss_fn, state["best_loss"])
    model.temperature = loss_temperature(cfg, loss_fn)
    bs, metric = cfg.train.eval_batch_size, cfg.train.metric
    stage("train: fitting the test-time normalisers")
    test_time = build_test_time(cfg, model, loss_fn, splits.get("train"), seed=cfg.train.seed, val=splits["val"])
    names = list(test_time.names)
    per_query: dict[str, dict] = {"val": {}}
    stage(f"train: evaluating val under {len(names)} normaliser(s)")
    val = evaluate_normalizers(names, test_time, model, splits["val"], bs, per_query=per_query["val"])
    test_time.val = val
    selection = select_normalizer(names, val, per_query["val"], metric, rule=cfg.test_time.selection,
                                  seed=cfg.train.seed)
    test_time.selected = best = selection["selected"]
    test_time.selection = selection
    model.test_time = test_time
    summary: dict[str, Any] = {
        "best_epoch": state["best_epoch"] + 1, "epochs_run": state["epoch"], "metric": metric,
        # a zero-shot run (train.epochs 0) has no epoch: its score is the val split's without normaliser
        "val_score": state["best_score"] if math.isfinite(state["best_score"]) else score(val["none"], metric),
        "train_time_s": state["train_time"], "temperature": model.temperature,
        "normalizer": best, "val": val, "uses_test_queries": [n for n in names if uses_test_queries(n)],
        "index_normalizer": selection["index_normalizer"], "selection": selection,
    }
    dropped = [n for n in cfg.test_time.normalizers if n not in names]
    no_train = no_train_reasons(cfg) if "train" not in splits else {}
    if dropped:  # e.g. ncl listed in the config, but only an NCL loss keeps the query queue it is fitted on
        summary["dropped_normalizers"] = {n: no_train.get(n) or ("needs the NCL loss's query queue (loss.name: ncl)"
                                          if n == "ncl" else "not fitted for this run") for n in dropped}
    if "train" not in splits:
        summary["no_train_split"] = cfg.data.train_split
    if selection.get("index_note"):
        summary["index_note"] = selection["index_note"]
    evaluated = [s for s in ("val", "test") if s in splits]
    if "test" in splits:
        per_query["test"] = {}
        stage(f"train: evaluating test under {len(names)} normaliser(s)")
        summary["test"] = evaluate_normalizers(names, test_time, model, splits["test"], bs,
                                               per_query=per_query["test"])
    per_seed = dn_per_seed(cfg, test_time, model, splits, evaluated)
    if per_seed is not None:
        summary["dn_per_seed"] = per_seed
    if cfg.test_time.oracle:  # reported beside the table, never selected
        summary["oracle"] = {s: evaluate_normalizers(list(ORACLE_NAMES), test_time, model, splits[s], bs,
                                                     per_query=per_query[s])
                             for s in evaluated}
    if dist.rank() == 0:
        stage("train: writing model.pt, metrics.json and per_query.npz")
        git = provenance.git_revision()
        cards = {s: protocol_card(splits[s], test_time, list(per_query[s]), selected=best,
                                  sha256=split_sha256(splits[s]), git=git, per_query=per_query[s])
                 for s in evaluated}
        for s in evaluated:  # a copy: test_time.val (model.pt) stays {normaliser: metrics}
            summary[s] = {**summary[s], "protocol": cards[s]}
        atomic_save({"config": to_dict(cfg), "model": model_payload(model), "summary": summary}, out / "model.pt")
        write_per_query(out / PER_QUERY, per_query, cards, ids={s: query_ids(splits[s]) for s in evaluated})
        atomic_write_text(out / "metrics.json", json.dumps(summary, indent=1))
        if show:
            print(f"best epoch {summary['best_epoch']}, selected test-time normaliser: {best}", flush=True)
    return summary
