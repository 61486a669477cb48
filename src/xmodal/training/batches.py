"""Training batches gathered from the split's arrays as they are drawn.

The trainer never holds a float32 copy of a training split: the features stay where
the split keeps them (memory-mapped ``.npy`` files in their stored dtype, as
:func:`xmodal.data.load_paired_split` opens them, or arrays in memory), and each step
gathers its rows and upcasts them to float32 (:func:`xmodal.data.inputs.gather_rows`).
Gathering then upcasting gives the same float32 values as upcasting the whole array
first, so a memory-mapped float16 layout trains to bit-identical weights as the same data
held in memory as float32 (``tests/test_scale_data.py``).

:class:`EpochBatches` is a map-style ``torch.utils.data.Dataset`` whose item ``i`` is this
rank's share of the epoch's ``i``-th global batch: under ``torchrun`` rank ``r`` reads only
rows ``r * b:(r + 1) * b`` of every global batch of ``world * b`` texts, i.e. its own
rows of the epoch's permutation (the ``DistributedSampler`` idea), so no rank reads or
holds the other ranks' rows and per-rank memory does not grow with the world size.
:func:`batch_loader` wraps it in a ``DataLoader`` (``train.workers`` worker processes
gather the next batches while the model steps; 0 = in the training process).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from xmodal.data.inputs import gather_rows

__all__ = ["Batch", "EpochBatches", "batch_loader", "to_device"]


class Batch(NamedTuple):
    """One rank's share of a global batch: text rows, their video rows (``ids``) and the
    gathered float32 inputs (``video`` / ``video_mask`` dicts with several experts)."""

    rows: np.ndarray
    ids: np.ndarray
    text: torch.Tensor
    text_mask: torch.Tensor | None
    video: Any
    video_mask: Any


class EpochBatches(Dataset):
    """The batches of one epoch for one rank (a map-style dataset; item ``i`` = batch ``i``).

    Args:
        batches: the epoch's global batches, int ``[world * local_batch]`` text indices each
            (:func:`xmodal.training.sampling.epoch_batches`).
        text, text_mask: ``split.text_input()`` (arrays, possibly memory-mapped).
        video, video_mask: ``split.video_input()`` (arrays or dicts of arrays).
        text_to_video: int ``[T]``.
        rank, local_batch: this rank's slice ``[rank * local_batch, (rank + 1) * local_batch)``.
    """

    def __init__(self, batches: list[np.ndarray], *, text: Any, text_mask: Any, video: Any, video_mask: Any,
                 text_to_video: np.ndarray, rank: int = 0, local_batch: int | None = None) -> None:
        from xmodal._validate import short_repr, whole_number

        if not isinstance(batches, (list, tuple)):
            raise TypeError(f"batches: expected a list of index arrays, got {short_repr(batches)}")
        self.batches = [_indices(b, f"batches[{i}]") for i, b in enumerate(batches)]
        for name, x in (("text", text), ("video", video)):
            if not (hasattr(x, "shape") and len(x.shape) >= 2) and not isinstance(x, dict):
                raise TypeError(f"{name}: expected an array [N, ...] (or a dict of them), got {short_repr(x)}")
        rank = whole_number(rank, "rank")
        if local_batch is not None:
            local_batch = whole_number(local_batch, "local_batch", minimum=1)
        self.text, self.text_mask, self.video, self.video_mask = text, text_mask, video, video_mask
        self.text_to_video = _indices(text_to_video, "text_to_video")
        self.rank = rank
        self.local_batch = local_batch

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> Batch:
        batch = self.batches[i]
        b = len(batch) if self.local_batch is None else self.local_batch
        rows = batch[self.rank * b:(self.rank + 1) * b]
        ids = self.text_to_video[rows]
        return Batch(rows, ids, gather_rows(self.text, rows), gather_rows(self.text_mask, rows),
                     gather_rows(self.video, ids), gather_rows(self.video_mask, ids))


def _indices(x: Any, name: str) -> np.ndarray:
    """A 1-D integer row array as given (a memory-mapped text -> video map stays on disk, the
    epoch's batches are not copied), anything else through :func:`~xmodal._validate.int_array`."""
    from xmodal._validate import int_array

    if isinstance(x, np.ndarray) and x.ndim == 1 and x.dtype != np.bool_ and np.issubdtype(x.dtype, np.integer):
        return x
    return int_array(x, name)


def _as_is(item: Batch) -> Batch:
    return item  # batch_size=None: the dataset's item is the batch (no numpy -> tensor conversion)


def batch_loader(dataset: EpochBatches, *, workers: int = 0, seed: int = 0) -> DataLoader:
    """A ``DataLoader`` over the batches of ``dataset`` in order; ``workers`` processes
    gather ahead (``prefetch_factor`` 2 each), 0 gathers in this process.

    The loader draws its workers' base seed from a generator of its own, seeded with ``seed``:
    ``iter(DataLoader)`` otherwise draws one number from the *global* torch RNG, which shifts
    every later dropout mask, so a run's trajectory would depend on whether batches pass
    through a loader (issue 35: the albums flat rows moved when the loader came in).
    """
    from xmodal._validate import short_repr, whole_number

    if not isinstance(dataset, EpochBatches):
        raise TypeError(f"dataset: expected an EpochBatches, got {short_repr(dataset)}")
    workers = whole_number(workers, "workers")
    kwargs: dict[str, Any] = {"prefetch_factor": 2} if workers else {}
    seed = whole_number(seed, "seed")
    generator = torch.Generator().manual_seed(int(seed))
    return DataLoader(dataset, batch_size=None, shuffle=False, num_workers=int(workers),
                      collate_fn=_as_is, generator=generator, **kwargs)


def to_device(features: Any, mask: Any, device: torch.device | str) -> tuple[Any, Any]:
    """``(features, mask)`` moved to ``device`` (tensors or dicts of tensors; None stays None)."""
    from xmodal._validate import short_repr

    try:
        device = torch.device(device)
    except (TypeError, RuntimeError, ValueError):
        raise ValueError(f"device: expected a torch device, got {short_repr(device)}") from None

    def move(x: Any) -> Any:
        if x is None:
            return None
        if not isinstance(x, (torch.Tensor, dict)) or (isinstance(x, dict) and not all(
                isinstance(v, torch.Tensor) for v in x.values())):
            raise TypeError(f"features, mask: expected tensors (or dicts of tensors), got {short_repr(x)}")
        return {k: v.to(device) for k, v in x.items()} if isinstance(x, dict) else x.to(device)

    return move(features), move(mask)
