"""A model's video and text towers as ONNX graphs (optional extra ``xmodal[onnx]``), checked with onnxruntime.

Each graph takes raw features with a frame (token) axis and its mask, and returns what
``encode_video`` / ``encode_text`` return, L2-normalised joint-space embeddings:

| input / output | shape, dtype | meaning |
|---|---|---|
| ``features`` | ``[batch, frames, dim]`` float32 | frames (tokens); a video of one feature, an image or a sentence feature: ``frames`` = 1 |
| ``mask`` | ``[batch, frames]`` bool | True = a real frame (token); padded ones, whatever they hold, change nothing |
| ``embeddings`` | ``[batch, joint]`` float32 | unit-norm embeddings; score = dot product |

``batch`` and ``frames`` (``tokens`` in the text graph) are dynamic axes (at most the tower's position
table for a ``transformer`` tower). A text tower trained on sentence features (one vector per caption,
not ``tokens``) takes ``features`` ``[batch, dim]`` only, without a mask. A run with several video experts has per-expert inputs
``features.<expert>`` / ``mask.<expert>`` (an expert missing for a video: a row of False). The
test-time normaliser is not in the graphs: a search applies it as ``xmodal index`` folds it
(``query_shift.npy`` and the gallery's bias column), see ``examples/onnx_search.py``. A hierarchical
run exports its local (clip / sentence) towers only.

Each graph carries ``metadata_props`` (:func:`graph_metadata`): ``opset``, ``xmodal_version``, ``tower``,
``inputs`` / ``input_dims``, ``embedding_dim``, ``max_frames``, ``l2_normalised``, the run's selected
``normalizer`` (applied outside the graph) and ``temperature``, and the ``encoder`` that made the features
where config.json names one; ``onnx.load(path).metadata_props`` reads them.

The export uses ``torch.onnx.export(..., dynamo=True)`` (the exporter built on ``torch.export``, which needs
``onnxscript``): the TorchScript-based one (``dynamo=False``) cannot export the transformer encoder's
inference fast path (``aten::_transformer_encoder_layer_fwd``) in torch 2.13.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

VIDEO_ONNX = "video_tower.onnx"
TEXT_ONNX = "text_tower.onnx"
ONNX_FILES = (VIDEO_ONNX, TEXT_ONNX)
OPSET = 18


class _TowerGraph(nn.Module):
    """One tower + the final L2 norm, taking ``(features, mask)`` (or per-expert pairs) positionally."""

    def __init__(self, tower: nn.Module, experts: list[str] | None = None) -> None:
        super().__init__()
        self.tower, self.experts = tower, experts

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        if self.experts is None:
            features, mask = inputs if len(inputs) == 2 else (inputs[0], None)
            return F.normalize(self.tower(features, mask), dim=-1)
        feats = {k: inputs[2 * i] for i, k in enumerate(self.experts)}
        masks = {k: inputs[2 * i + 1] for i, k in enumerate(self.experts)}
        return F.normalize(self.tower(feats, masks), dim=-1)


def _copy(model: Any) -> Any:
    """A float32 CPU copy in eval mode (the caller's model is never converted or moved)."""
    import copy

    from xmodal._validate import duck

    duck(model, "model", "a loaded xmodal model", ("encode_video", "encode_text"), ("video_tower", "text_tower"))
    return copy.deepcopy(model).float().cpu().eval()


def _folder(folder: Any) -> Path:
    if not isinstance(folder, (str, os.PathLike)) or not Path(folder).is_dir():
        raise ValueError(f"folder: expected an existing directory, got {str(folder)[:80]!r}")
    return Path(folder)


def _need(module: str, extra: str = "onnx"):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"ONNX export needs {module}: pip install 'xmodal[{extra}]' ({exc})") from None


def has_mask(model: Any, which: str) -> bool:
    """Whether the ``which`` graph takes frames and a mask: every video graph, and a text graph of a tower
    trained on token features; a sentence-feature text tower takes ``features [batch, dim]`` alone."""
    _which(which)
    _model(model)
    return which != "text" or bool(model.text_tower.spec.tokens)


def _which(which: Any) -> str:
    from xmodal._validate import choice

    if not isinstance(which, str):
        raise TypeError(f"which: expected 'video' or 'text', got {type(which).__name__}")
    return choice(which, "which", ("video", "text"))


def _model(model: Any) -> Any:
    from xmodal._validate import duck

    return duck(model, "model", "a loaded xmodal model", ("encode_video", "encode_text"),
                ("video_tower", "text_tower", "dim"))


def graph_inputs(model: Any, which: str) -> list[tuple[str, int, int | None]]:
    """``[(input name, feature dim, max frames or None)]`` of the ``which`` (``video``/``text``) graph."""
    if which == "text":
        spec = model.text_tower.spec
        return [("features", spec.in_dim, spec.max_frames if spec.kind == "transformer" else None)]
    experts = model.experts
    if not experts:
        spec = model.video_tower.spec
        return [("features", spec.in_dim, spec.max_frames if spec.kind == "transformer" else None)]
    towers = model.video_tower.towers
    return [(f"features.{k}", towers[k].spec.in_dim,
             towers[k].spec.max_frames if towers[k].spec.kind == "transformer" else None) for k in experts]


def example_inputs(model: Any, which: str, *, batch: int = 3, frames: int = 5, seed: int = 0,
                   garbage: bool = True) -> dict[str, np.ndarray]:
    """Random float32 features and masks for the ``which`` graph, by input name: every row of the first input
    has at least one real frame; with ``garbage``, padded frames hold huge values (they must change nothing)
    and a further expert may be missing for a video (a row of False)."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    if not has_mask(model, which):  # sentence features: one vector per caption, no mask
        (name, dim, _), = graph_inputs(model, which)
        return {name: rng.standard_normal((batch, dim)).astype(np.float32)}
    for i, (name, dim, max_frames) in enumerate(graph_inputs(model, which)):
        f = min(frames, max_frames) if max_frames else frames
        x = rng.standard_normal((batch, f, dim)).astype(np.float32)
        # the main input has a real frame in every row; a further expert may be missing (no real frame)
        lengths = rng.integers(0 if i and garbage else 1, f + 1, size=batch)
        mask = np.arange(f)[None, :] < lengths[:, None]
        if garbage:
            x[~mask] = 1e6
        out[name] = x
        out[name.replace("features", "mask", 1)] = mask
    return out


def torch_reference(model: Any, which: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """What the public API returns for ``inputs`` (``model.encode_video`` / ``encode_text``), float32."""
    if which == "text":
        mask = inputs.get("mask")
        return model.encode_text(torch.from_numpy(inputs["features"]),
                                 None if mask is None else torch.from_numpy(mask)).cpu().numpy()
    experts = model.experts
    if not experts:
        return model.encode_video(torch.from_numpy(inputs["features"]), torch.from_numpy(inputs["mask"])).cpu().numpy()
    feats = {k: torch.from_numpy(inputs[f"features.{k}"]) for k in experts}
    masks = {k: torch.from_numpy(inputs[f"mask.{k}"]) for k in experts}
    return model.encode_video(feats, masks).cpu().numpy()


def graph_metadata(model: Any, which: str, extra: dict | None = None) -> dict[str, str]:
    """The ``metadata_props`` of the ``which`` graph (strings, as ONNX stores them)."""
    from xmodal.models.export import _version

    _model(model)
    _which(which)
    if extra is not None and not isinstance(extra, dict):
        raise TypeError(f"extra: expected a dict of further properties or None, got {type(extra).__name__}")

    inputs = graph_inputs(model, which)
    frames = [m for _, _, m in inputs if m]
    tt = getattr(model, "test_time", None)
    props = {"opset": str(OPSET), "xmodal_version": _version(), "tower": which, "producer": "xmodal export --onnx",
             "inputs": ", ".join(n + (f", {n.replace('features', 'mask', 1)}" if has_mask(model, which) else "")
                                 for n, _, _ in inputs),
             "input_dims": ", ".join(f"{n}={d}" for n, d, _ in inputs), "embedding_dim": str(model.dim),
             "max_frames": str(min(frames)) if frames else "any", "l2_normalised": "true",
             "normalizer": str(getattr(tt, "selected", "none")),
             "normalizer_note": "the test-time normaliser is not in the graph: apply it as xmodal index folds it "
                                "(query_shift.npy and the gallery's bias column)",
             "temperature": repr(float(model.temperature))}
    props.update({str(k): str(v) for k, v in (extra or {}).items() if v is not None})
    return props


def _export_one(model: Any, which: str, path: Path, props: dict[str, str]) -> None:
    import logging
    import warnings

    from torch.export import Dim

    _need("onnxscript")  # the dynamo-based exporter's; the TorchScript one cannot export the transformer's fast path
    tower = model.text_tower if which == "text" else model.video_tower
    experts = model.experts if which == "video" and model.experts else None
    graph = _TowerGraph(tower, experts).eval()
    # batch >= 2 and frames >= 2: torch.export specialises axes of size 0 and 1
    ex = example_inputs(model, which, batch=3, frames=5, garbage=False)
    names = list(ex)
    args = tuple(torch.from_numpy(ex[n]) for n in names)
    batch = Dim("batch", min=1)
    axis = "tokens" if which == "text" else "frames"
    shapes = []
    for name, _dim, max_frames in graph_inputs(model, which):
        if not has_mask(model, which):
            shapes.append({0: batch})
            continue
        label = axis if name == "features" else f"{axis}_{name.split('.', 1)[1]}"
        frames = Dim(label, min=1, max=max_frames) if max_frames else Dim(label, min=1)
        shapes += [{0: batch, 1: frames}, {0: batch, 1: frames}]
    quiet = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")]
    levels = [lg.level for lg in quiet]
    try:
        for lg in quiet:
            lg.setLevel(logging.ERROR)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(graph, args, input_names=names, output_names=["embeddings"],
                                        dynamic_shapes=(tuple(shapes),), dynamo=True, opset_version=OPSET,
                                        external_data=False, verbose=False)
            program.save(str(path))
    finally:
        for lg, level in zip(quiet, levels):
            lg.setLevel(level)
    import onnx

    proto = onnx.load(str(path))
    onnx.helper.set_model_props(proto, props)
    onnx.save(proto, str(path))


def export_onnx(model: Any, folder: str | os.PathLike, *, write: Any = None,
                metadata: dict[str, dict[str, str]] | None = None) -> dict[str, dict]:
    """Write ``video_tower.onnx`` and ``text_tower.onnx`` of ``model`` into ``folder``.

    Args:
        model: a loaded :class:`~xmodal.models.TwoTower` (a hierarchical model: its local towers).
        folder: an existing directory.
        write: ``write(path, fn)`` placing a file (default :func:`xmodal.runs.atomic_write`: a
            temporary name renamed at the end).
        metadata: ``{"video": {key: value}, "text": {...}}`` further ``metadata_props`` of each graph
            (e.g. its ``encoder``), beside :func:`graph_metadata`'s.

    Returns:
        ``{file name: {"inputs": {name: [axes]}, "output": ...}}``, the graphs' interface (config.json).
    """
    _need("onnx")
    from xmodal.runs import atomic_write

    if write is not None and not callable(write):
        raise TypeError(f"write: expected a callable write(path, fn) or None, got {type(write).__name__}")
    if metadata is not None and (not isinstance(metadata, dict) or not set(metadata) <= {"video", "text"}
                                 or not all(isinstance(v, dict) for v in metadata.values())):
        raise TypeError('metadata: expected {"video": {key: value}, "text": {...}} or None')
    write = write or atomic_write
    folder = _folder(folder)
    model = _copy(model)
    out = {}
    for which, name in (("video", VIDEO_ONNX), ("text", TEXT_ONNX)):
        props = graph_metadata(model, which, (metadata or {}).get(which))
        write(Path(folder) / name, lambda tmp, w=which, pr=props: _export_one(model, w, Path(tmp), pr))
        inputs = {}
        axis = "tokens" if which == "text" else "frames"
        for feat, dim, max_frames in graph_inputs(model, which):
            if not has_mask(model, which):
                inputs[feat] = {"shape": ["batch", dim], "dtype": "float32", "meaning": "one sentence feature"}
                continue
            label = axis if feat == "features" else f"{axis}_{feat.split('.', 1)[1]}"
            inputs[feat] = {"shape": ["batch", label, dim], "dtype": "float32",
                            **({f"max_{axis}": max_frames} if max_frames else {})}
            inputs[feat.replace("features", "mask", 1)] = {"shape": ["batch", label], "dtype": "bool",
                                                           "meaning": f"True = a real {axis[:-1]}"}
        out[name] = {"inputs": inputs, "output": {"embeddings": {"shape": ["batch", model.dim],
                                                                 "dtype": "float32", "l2_normalised": True}},
                     "metadata_props": props}
    return out


def run_onnx(path: str | os.PathLike, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """``embeddings`` of an exported tower graph under onnxruntime (CPU)."""
    if not isinstance(path, (str, os.PathLike)) or not Path(path).is_file():
        raise ValueError(f"path: expected an .onnx file written by export_onnx, got {str(path)[:80]!r}")
    if not isinstance(inputs, dict) or not all(isinstance(k, str) and isinstance(v, np.ndarray)
                                               for k, v in inputs.items()):
        raise TypeError("inputs: expected {input name: numpy array}")
    ort = _need("onnxruntime")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, torch.get_num_threads())
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    return session.run(["embeddings"], {k: v for k, v in inputs.items() if k in wanted})[0]


def check_onnx(model: Any, folder: str | os.PathLike, inputs: dict[str, dict[str, np.ndarray]] | None = None,
               *, seed: int = 0) -> dict[str, float]:
    """Max abs difference between the ONNX towers under onnxruntime and ``model``'s
    ``encode_video`` / ``encode_text`` on ``inputs`` (``{"video": {...}, "text": {...}}``, as
    :func:`example_inputs` makes them; default: random inputs with ragged masks and garbage in
    the padded frames). Returns ``{"video": diff, "text": diff}``."""
    folder = _folder(folder)
    if inputs is not None and (not isinstance(inputs, dict) or not set(inputs) <= {"video", "text"}
                               or not all(isinstance(v, dict) for v in inputs.values())):
        raise TypeError('inputs: expected {"video": {name: array}, "text": {name: array}} or None')
    from xmodal._validate import integer

    seed = integer(seed, "seed", minimum=0, maximum=2 ** 32 - 1)
    model = _copy(model)
    out = {}
    for which, name in (("video", VIDEO_ONNX), ("text", TEXT_ONNX)):
        x = (inputs or {}).get(which) or example_inputs(model, which, batch=7, frames=9, seed=seed)
        got = run_onnx(Path(folder) / name, x)
        want = torch_reference(model, which, x)
        out[which] = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max())
    return out


__all__ = ["VIDEO_ONNX", "TEXT_ONNX", "ONNX_FILES", "OPSET", "export_onnx", "check_onnx", "run_onnx", "graph_metadata",
           "has_mask"]
