"""``RowStore.take`` on disk reads runs of nearby rows in one read each (issue 43 item 2: the fold check's
sample); the rows it returns equal numpy's fancy indexing of the same array, whatever the order, repeats,
gaps and read cap."""

from __future__ import annotations

import numpy as np
import pytest

from xmodal.retrieval import rowstore
from xmodal.retrieval.rowstore import RowStore


@pytest.mark.parametrize("read_bytes", [1 << 24, 40])
def test_take_equals_fancy_indexing(monkeypatch, read_bytes):
    monkeypatch.setattr(rowstore, "TAKE_READ_BYTES", read_bytes)  # 40 bytes: a read of at most 2 rows of 5
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3000, 5)).astype(np.float32)
    store = RowStore(3000, 5, in_memory_bytes=0)
    try:
        assert store.on_disk
        for start in range(0, 3000, 700):
            store.append(a[start:start + 700])
        for idx in (np.sort(rng.choice(3000, 200, replace=False)), rng.choice(3000, 500), [2999, 0, 0, 1, 5000 // 2],
                    np.arange(0, 3000, 4000 // rowstore.TAKE_GAP_BYTES + 7), np.zeros(0, np.int64)):
            got = store.take(idx)
            assert got.shape == (len(idx), 5) and np.array_equal(got, a[np.asarray(idx, dtype=np.int64)])
    finally:
        store.close()
