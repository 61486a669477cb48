"""``xmodal encode text|images --cluster``: captions or images encoded in shards of whole blocks
(:func:`xmodal.features.blocks.shard_span`) as tasks on a Dask cluster (:mod:`xmodal.execute.cluster`).

Shard ``K`` of ``N`` is the task :func:`encode_rows_shard`: it encodes its rows block by block exactly as one
process does (:func:`xmodal.features.blocks.encode_blocks`) and writes them to ``shard-K-of-N.npy`` in a
staging folder beside the output; the driver concatenates the shards in order, so the features are the bytes
one process computes. A task that fails or whose worker dies is run again (whole: its part is written only
at its end, through a temporary name). Each task reports its blocks to the one progress line. The staging
folder is removed at the end, and a killed run's is removed by the next.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["encode_rows_on_cluster", "encode_rows_shard", "KINDS"]

#: What ``encode_rows_shard`` encodes: the encoder function's name in :mod:`xmodal.features.encoders`.
KINDS = {"text": "encode_text", "images": "encode_images"}
#: The encoder kind (:func:`xmodal.features.encoders.get_encoder`) of each.
ENCODER_KINDS = {"text": "text", "images": "image"}


def encode_rows_shard(*, shard: tuple[int, int], topic: str | None, kind: str, items: list, first: int, stage: str,
                      model: str, batch_size: int, threads: int | None, device: str | None = None,
                      precision: str | None = None) -> dict:
    """One shard's task (on a worker): ``items`` (the shard's captions or image paths, row ``first`` of the
    collection first) encoded block by block into ``stage/shard-K-of-N.npy``; ``{"path", "rows", "pid"}``.
    ``device`` / ``precision``: where and in which dtype an ``hf:`` / ``open_clip:`` model runs on the worker
    (:func:`xmodal.features.encoders.get_encoder`)."""
    from xmodal._validate import option, positive_int
    from xmodal.execute.cluster import kill_once, report_item
    from xmodal.features import encoders
    from xmodal.features.blocks import encode_blocks
    from xmodal.runs import atomic_save_npy

    kind = option(kind, "kind", tuple(KINDS))
    if threads is not None:
        import torch

        torch.set_num_threads(positive_int(threads, "threads"))
    encode = getattr(encoders, KINDS[kind])
    if not items:  # more shards than blocks: this one has no row
        return {"path": None, "rows": 0, "pid": os.getpid(), "runtime": None}
    encoders.reset_runtime(model, ENCODER_KINDS[kind], device=device, precision=precision)  # this shard's first batch

    def on_block(rows: int) -> None:
        report_item(topic, items=rows)
        kill_once()

    feats = encode_blocks(lambda part: encode(part, model=model, batch_size=batch_size, progress=False, device=device,
                                              precision=precision), items,
                          batch_size=batch_size, start=first, on_block=on_block)
    path = Path(stage) / f"shard-{shard[0]}-of-{shard[1]}.npy"
    atomic_save_npy(path, feats)
    return {"path": str(path), "rows": len(feats), "pid": os.getpid(), "runtime": _runtime(model, kind, device, precision)}


def _runtime(model: str, kind: str, device: str | None, precision: str | None) -> dict | None:
    """This process's runtime record of an ``hf:`` / ``open_clip:`` encoder (device, precision and the
    first batch's difference to float32 below float32); None for the other encoders."""
    from xmodal.features import encoders

    if not model.startswith(("hf:", "open_clip:")):
        return None
    return dict(encoders.get_encoder(model, ENCODER_KINDS[kind], device=device, precision=precision).runtime or {})


def _stage(out: Path) -> Path:
    return out.with_name(f".{out.name}.shards")


def encode_rows_on_cluster(items: Sequence, out: str | os.PathLike, *, kind: str, model: str, batch_size: int,
                           cluster: str, shards: int | None = None, threads: int | None = 1,
                           progress: bool | None = None, retries: int | None = None, device: str | None = None,
                           precision: str | None = None) -> np.ndarray:
    """The features of ``items`` (captions, or image paths every worker can read) computed as ``shards`` tasks
    on ``cluster`` (``local:N`` or a scheduler address); the staging folder lies beside ``out``.

    Args:
        shards: N (None: 4 per worker, at most the blocks).
        threads: torch threads of each task.
        retries: attempts after the first per shard (None: the executor's default).
        device, precision: passed to each task (``device`` ``auto``: each worker's own CUDA when present).

    Returns:
        float32 ``[len(items), D]``: what one process computes (:mod:`xmodal.features.blocks`).
    """
    from xmodal._validate import option, whole_number
    from xmodal.execute import cluster as engine
    from xmodal.features.blocks import block_rows, shard_span
    from xmodal.progress import progress as progress_bar

    kind = option(kind, "kind", tuple(KINDS))
    spec = engine.parse_cluster(cluster)
    retries = engine.DEFAULT_RETRIES if retries is None else whole_number(retries, "retries", minimum=0)
    items = [str(p) for p in items] if kind == "images" else list(items)
    if not items:
        raise ValueError(f"{kind}: nothing to encode")
    stage = _stage(Path(out))
    shutil.rmtree(stage, ignore_errors=True)  # a killed run's parts: never mixed with this run's
    stage.mkdir(parents=True)
    try:
        with engine.connect(spec, retries=retries) as client:
            blocks = -(-len(items) // block_rows(batch_size))
            n = shards if shards is not None else min(blocks, max(1, 4 * len(client.scheduler_info().get("workers", {}))))
            n = whole_number(n, "--cluster-shards", minimum=1)

            def share(k: int) -> dict:
                a, b = shard_span(len(items), (k, n), batch_size)
                return {"items": items[a:b], "first": a}

            unit = "caption" if kind == "text" else "image"
            with progress_bar(total=len(items), desc=f"encode {kind} ({n} shards)", unit=unit, show=progress) as bar:
                done = engine.run_shards(client, encode_rows_shard, n, retries=retries, bar=bar, shard_kwargs=share,
                                         kwargs=dict(kind=kind, stage=str(stage), model=model, batch_size=batch_size,
                                                     threads=threads, device=device, precision=precision))
        first = next((done[k].get("runtime") for k in range(1, n + 1) if done[k]["rows"]), None)
        if first:  # the collection's first batch is the first shard's: its difference to float32 is the one stated
            from xmodal.features import encoders

            encoders.get_encoder(model, ENCODER_KINDS[kind], device=device, precision=precision).runtime.update(first)
        parts = [np.load(done[k]["path"], allow_pickle=False) for k in range(1, n + 1) if done[k]["rows"]]
        return np.concatenate(parts).astype(np.float32, copy=False)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
