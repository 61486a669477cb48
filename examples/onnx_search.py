"""Search an 'xmodal index' with an exported text tower, using onnxruntime and numpy only (no torch, no
FAISS, no xmodal).

  xmodal export RUN --out MODEL --onnx
  xmodal index --run MODEL --data DATA --split test --out INDEX            (--kind flat, the default)
  python examples/onnx_search.py --model MODEL --index INDEX --text-features T.npy [--text-mask M.npy] --k 5

What it does, step by step, as 'xmodal query' does it:
1. MODEL/text_tower.onnx turns caption features into unit embeddings (a sentence-feature tower: features
   [batch, dim]; a token tower: features [batch, tokens, dim] and mask [batch, tokens]);
2. the index's test-time normaliser is already folded in: subtract INDEX/query_shift.npy from each query and
   append a 1 (for DN: the query mean; zero otherwise); the gallery rows of INDEX/index.faiss carry the
   per-video bias in their last coordinate (NCL / Sinkhorn), so a score is one dot product;
3. top-k by score.

INDEX/index.faiss of a flat index (FAISS IndexFlatIP) is read with numpy: a 45-byte header ("IxFI", the
dimension, the number of vectors, ...) and then the vectors as float32. Other index kinds need FAISS.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort


def read_flat_index(path: Path) -> np.ndarray:
    """The vectors of a FAISS ``IndexFlatIP`` file: ``[N, D]``, or ``[N, D + 1]`` when a bias is folded
    (its last column)."""
    data = path.read_bytes()
    if data[:4] != b"IxFI":
        raise SystemExit(f"{path}: not a flat inner-product FAISS index (rebuild it with 'xmodal index --kind flat')")
    d, n = struct.unpack("<iq", data[4:16])
    metric = struct.unpack("<i", data[33:37])[0]
    count = struct.unpack("<Q", data[37:45])[0]
    if metric != 0 or count != d * n or len(data) < 45 + 4 * count:
        raise SystemExit(f"{path}: unexpected FAISS header (metric {metric}, {count} values for {n} x {d})")
    return np.frombuffer(data, dtype="<f4", count=count, offset=45).reshape(n, d)


def encode_texts(model: Path, features: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Unit text embeddings ``[T, D]`` from the exported text tower."""
    session = ort.InferenceSession(str(model / "text_tower.onnx"), providers=["CPUExecutionProvider"])
    if "mask" not in {i.name for i in session.get_inputs()}:  # a sentence-feature tower: features [T, Dt] only
        if features.ndim != 2:
            raise SystemExit(f"--text-features: this text tower takes sentence features [T, Dt], got {features.shape}")
        return session.run(["embeddings"], {"features": features.astype(np.float32)})[0]
    if features.ndim == 2:  # sentence features into a token tower: one token each
        features, mask = features[:, None, :], np.ones((features.shape[0], 1), dtype=bool)
    elif mask is None:
        mask = np.ones(features.shape[:2], dtype=bool)
    return session.run(["embeddings"], {"features": features.astype(np.float32), "mask": mask.astype(bool)})[0]


def search(model: Path, index: Path, features: np.ndarray, mask: np.ndarray | None, k: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """``(scores [T, k], indices [T, k])``, best first."""
    gallery = read_flat_index(index / "index.faiss")
    shift = np.load(index / "query_shift.npy", allow_pickle=False).astype(np.float32)
    queries = encode_texts(model, features, mask) - shift[None, :]
    if gallery.shape[1] == queries.shape[1] + 1:  # a folded bias: its column, times 1
        queries = np.hstack([queries, np.ones((len(queries), 1), np.float32)])
    elif gallery.shape[1] != queries.shape[1]:
        raise SystemExit(f"{index}: vectors of width {gallery.shape[1]} do not fit text embeddings of size "
                         f"{queries.shape[1]}")
    scores = queries @ gallery.T
    k = min(k, gallery.shape[0])
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, top, axis=1), top


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, type=Path, help="folder written by 'xmodal export --onnx'")
    p.add_argument("--index", required=True, type=Path, help="folder written by 'xmodal index' (flat)")
    p.add_argument("--text-features", required=True, type=Path, help="caption features [T, Dt] or tokens [T, L, Dt]")
    p.add_argument("--text-mask", type=Path, help="bool [T, L] of token features (True = real token)")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--json", action="store_true", help="print {indices, scores} as JSON")
    args = p.parse_args(argv)
    features = np.load(args.text_features, allow_pickle=False)
    mask = np.load(args.text_mask, allow_pickle=False).astype(bool) if args.text_mask else None
    scores, indices = search(args.model, args.index, features, mask, args.k)
    if args.json:
        print(json.dumps({"indices": indices.tolist(), "scores": scores.tolist()}))
        return 0
    names_file = args.index / "names.txt"
    names = names_file.read_text(encoding="utf-8").splitlines() if names_file.is_file() else None
    for q, (row_s, row_i) in enumerate(zip(scores, indices)):
        print(f"text {q}: " + ", ".join(f"{names[j] if names else j} ({s:.4f})" for s, j in zip(row_s, row_i)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
