"""The model card (``README.md``) of an ``xmodal export`` folder, written from the run.

Read from the run directory: ``metrics.json`` (metrics per split and normaliser, and the
protocol card ``metrics.json[split]["protocol"]`` where the run recorded one), ``provenance.json``
(command, code revision, data file hashes) and the run's config (the one stored with the model);
from the export: ``config.json`` (architecture, feature sizes, encoders, test-time record). What
the run does not record is written as "not recorded", never guessed.

The card follows the Hugging Face layout (YAML front matter, then Markdown), so ``huggingface-cli
upload USER/NAME DIR`` publishes it as the model's page.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from xmodal.metrics.formatting import format_metric, markdown_table

NOT_RECORDED = "not recorded"
#: metrics.json keys that are not a split's table of normalisers.
_SUMMARY_SPLITS = ("val", "test")
_PROTOCOL_KEYS = ("num_queries", "gallery_size", "chance_r1", "caption_policy", "tie_rule", "normalizer",
                  "bank_source", "uses_test_queries", "split_sha256", "git_revision")
_NORMALIZER_HOW = {
    "none": "cosine similarity of the two towers' unit embeddings; nothing is fitted",
    "dn": "Distribution Normalization (Zhou et al. 2023, eq. 7): the stored means of the query and gallery "
          "embeddings are subtracted (scaled by lam) before the dot product; gallery-independent",
    "sinkhorn": "Sinkhorn test-time gallery biases (NCL, Park et al. 2022, eq. 13), computed against the gallery "
                "being searched with the stored bank of embedded train queries",
    "ncl": "as sinkhorn, with the bank of queries the NCL loss kept in its queue during training (NCL's own "
           "test-time method)",
    "qbnorm": "Querybank Normalisation (Bogolin et al. 2022) with the stored bank of embedded train queries",
    "is": "Inverted Softmax (Smith et al. 2017) with the stored bank of embedded train queries",
    "dsl": "dual softmax over the test queries themselves (uses the test queries: reported, never selected)",
    "sinkhorn_oracle": "Sinkhorn biases fitted on the test queries themselves (an oracle: reported, never "
                       "selected)",
}


def read_json(path: Path) -> dict | None:
    """A JSON object from ``path``, or None when it is missing or unreadable."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def run_records(run: str | os.PathLike) -> dict[str, Any]:
    """``{"name", "metrics", "provenance"}`` of a run directory (a checkpoint file: its folder);
    a missing file is None."""
    p = Path(run)
    folder = p if p.is_dir() else p.parent
    return {"name": folder.resolve().name, "metrics": read_json(folder / "metrics.json"),
            "provenance": read_json(folder / "provenance.json")}


def _value(v: Any) -> str:
    if v is None:
        return NOT_RECORDED
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _seconds(v: Any) -> str:
    return f"{float(v):.1f} s" if isinstance(v, (int, float)) and not isinstance(v, bool) else NOT_RECORDED


def _text_table(header: list[str], rows: list) -> str:
    """A Markdown table of text columns (left-aligned; :func:`markdown_table` right-aligns numbers)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows])


def _protocol(metrics: dict | None, split: str) -> list[str]:
    block = (metrics or {}).get(split)
    protocol = block.get("protocol") if isinstance(block, dict) else None
    if not isinstance(protocol, dict):
        return [f"Protocol card: {NOT_RECORDED} (this run's metrics.json has no `{split}.protocol`).", ""]
    keys = [k for k in _PROTOCOL_KEYS if k in protocol] + sorted(k for k in protocol if k not in _PROTOCOL_KEYS)
    return ["Protocol card:", "", _text_table(["key", "value"], [(f"`{k}`", _value(protocol[k])) for k in keys]), ""]


def _metric_table(table: dict, selected: str | None) -> str:
    """Rows normaliser x direction, columns the metrics of the first row."""
    rows, cols = [], []
    for name, dirs in table.items():
        if name == "protocol" or not isinstance(dirs, dict):
            continue
        for direction, vals in dirs.items():
            if not isinstance(vals, dict):
                continue
            cols = cols or [k for k, v in vals.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
            label = f"**{name}** (selected)" if name == selected else name
            rows.append((label, direction, *(format_metric(c, vals.get(c)) for c in cols)))
    return markdown_table(["normaliser", "direction", *cols], rows) if rows else f"({NOT_RECORDED})"


def _evaluation(metrics: dict | None, selected: str | None) -> list[str]:
    out = ["## Evaluation", ""]
    if metrics is None:
        return out + [f"Metrics: {NOT_RECORDED} (the run directory has no readable metrics.json).", ""]
    out += ["Recall in %, ranks 1-based, as `xmodal train` wrote them to `metrics.json` (each direction "
            "scored with the normaliser fitted for it). `val` chose the epoch and the normaliser, so its "
            "numbers are optimistic; `test` (where present) was never used for a choice.", ""]
    for split in _SUMMARY_SPLITS:
        table = metrics.get(split)
        if not isinstance(table, dict):
            out += [f"### {split}", "", f"{NOT_RECORDED} (no `{split}` split was evaluated).", ""]
            continue
        out += [f"### {split}", ""] + _protocol(metrics, split) + [_metric_table(table, selected), ""]
    oracle = metrics.get("oracle")
    if isinstance(oracle, dict) and oracle:
        out += ["### Oracles (use the test queries themselves; not deployable, never selected)", ""]
        for split, table in oracle.items():
            if isinstance(table, dict):
                out += [f"{split}:", "", _metric_table(table, None), ""]
    return out


def _provenance(prov: dict | None, run_config: dict | None) -> list[str]:
    out = ["## Training data and provenance", ""]
    data = (run_config or {}).get("data") or {}
    if data:
        name = data.get("name")
        where = "the built-in synthetic generator" if name == "synthetic" else f"`{data.get('root') or '?'}`"
        out += [f"- data: `{name}` from {where}; splits train `{data.get('train_split')}`, val "
                f"`{data.get('val_split')}`" + (f" ({data['val_from_train']} videos held out of train)"
                                                  if data.get("val_from_train") else "")
                + f", test `{data.get('test_split') or '(none)'}`"]
    else:
        out += [f"- data: {NOT_RECORDED}"]
    if prov is None:
        return out + [f"- provenance: {NOT_RECORDED} (the run directory has no readable provenance.json)", ""]
    rev = prov.get("git_revision")
    dirty = " (with uncommitted changes)" if prov.get("git_dirty") else ""
    out += [f"- command: `{prov.get('command', NOT_RECORDED)}`",
            f"- xmodal {prov.get('xmodal_version', '?')}, torch {prov.get('torch_version', '?')}, Python "
            f"{prov.get('python_version', '?')}; code revision: {('`' + rev + '`' + dirty) if rev else NOT_RECORDED}",
            f"- trained from {prov.get('started') or NOT_RECORDED} to {prov.get('finished') or NOT_RECORDED}"
            + (f" (resumed {len(prov['resumed'])} time(s))" if prov.get("resumed") else ""), ""]
    files = prov.get("data") or {}
    if files:
        out += ["The data files the run read (SHA-256 of each, as `provenance.json` recorded them; check a "
                "copy with `sha256sum`):", "",
                _text_table(["file", "sha256"], [(f"`{Path(k).name}`", f"`{v}`") for k, v in sorted(files.items())]),
                ""]
    else:
        out += ["Data file hashes: none recorded (synthetic or in-memory data reads no files).", ""]
    return out


def _test_time(config: dict, metric: str | None) -> list[str]:
    tt = config.get("test_time") or {}
    selected = tt.get("selected", "none")
    hp = tt.get("hparams") or {}
    banks = tt.get("banks") or {}
    out = ["## Test-time normaliser", "",
           f"Selected: **{selected}**, chosen on the validation split by `{metric or NOT_RECORDED}` among the "
           f"fitted candidates {', '.join(f'`{n}`' for n in tt.get('names', [])) or NOT_RECORDED} (never one "
           "that uses the test queries). It was fitted once, at the end of training, and is stored with the "
           "weights; `model.similarity(...)` applies it, `normalizer=\"none\"` switches it off.", ""]
    rows = []
    for name in tt.get("names", []):
        how = _NORMALIZER_HOW.get(name, "")
        if name == "dn":
            how += f"; lam {hp.get('lam')}, means from the {hp.get('dn_source', 'train')} embeddings"
        if name in ("sinkhorn", "ncl"):
            bank = banks.get("ncl" if name == "ncl" else "train", {})
            size = (bank.get("text") or {}).get("shape", ["?"])[0]
            how += f"; {hp.get('iters')} iterations, temperature {_value(tt.get('temperature'))}, bank of {size} queries"
        if name in ("qbnorm", "is"):
            size = (banks.get("train", {}).get("text") or {}).get("shape", ["?"])[0]
            how += f"; k {hp.get('k')}, beta {hp.get('beta')}, bank of {size} queries"
        rows.append((f"**{name}**" if name == selected else name, how))
    if rows:
        out += [_text_table(["normaliser", "how it is computed"], rows), ""]
    out += ["Gallery-dependent normalisers (sinkhorn, ncl, qbnorm, is) compute their gallery biases against "
            "the gallery being searched from the stored banks (no refitting of anything learned); `xmodal "
            "index` folds `none`, `dn`, `sinkhorn` and `ncl` into a FAISS inner-product index.", ""]
    return out


def _encoder(record: Any) -> str:
    """An encoder record of config.json (``{"name", "description", "source"}``) as one cell."""
    if not isinstance(record, dict):
        return NOT_RECORDED if not record else str(record)
    name = f"`{record['name']}`" if record.get("name") else NOT_RECORDED
    parts = [p for p in (record.get("description"), record.get("source")) if p and not (
        p.startswith("not recorded") and not record.get("name"))]
    return name + (f": {'; '.join(parts)}" if parts else "")


def _inputs(config: dict) -> list[str]:
    sizes = config.get("feature_sizes") or {}
    enc = config.get("encoders") or {}
    rows = [("video / image", _encoder(enc.get("video")), sizes.get("video"),
             f"up to {sizes['max_frames']}" if sizes.get("max_frames") else "any (mean-pooled)"),
            ("text", _encoder(enc.get("text")), sizes.get("text"),
             ("tokens, up to " + str(sizes.get("max_tokens"))) if sizes.get("text_tokens") else "one sentence feature")]
    rows += [(f"video expert `{k}`", _encoder((enc.get("experts") or {}).get(k)), d, "")
             for k, d in (sizes.get("experts") or {}).items()]
    return ["## Inputs: frozen features", "",
            "This is a head on pre-extracted features, not an end-to-end model: it never sees pixels or "
            "words. It maps the features below into a "
            f"{sizes.get('joint', '?')}-dimensional joint space where retrieval is a dot product.", "",
            _text_table(["input", "extractor", "feature size", "frames / tokens"],
                           [(a, b, "?" if c is None else c, d) for a, b, c, d in rows]), "",
            "**Only features of these exact extractors work.** Features of another extractor (another "
            "model, checkpoint, preprocessing or pooling), even of the same size, lie in another space: the "
            "scores are then meaningless, and nothing raises an error.", ""]


def _usage(config: dict, files: dict[str, str]) -> list[str]:
    out = ["## How to use", "", "```python", "import xmodal", "",
           "model = xmodal.load_model(\"THIS_FOLDER\")  # model.safetensors + config.json, no pickle",
           "scores = model.similarity(text_features, video_features)  # [T, V], the selected normaliser",
           "text = model.encode_text(text_features)        # [T, D] unit vectors",
           "video = model.encode_video(video_features)     # [V, D] unit vectors ([V, F, Dv] + mask for frames)",
           "```", "", "Every command that takes a run takes this folder:", "", "```",
           "xmodal eval --run THIS_FOLDER --data DATA --split test",
           "xmodal index --run THIS_FOLDER --data DATA --split test --out INDEX",
           "xmodal query --index INDEX --captions \"a dog runs on the beach\"",
           "xmodal serve --index INDEX", "```", ""]
    if any(name.endswith(".onnx") for name in files):
        out += ["`video_tower.onnx` / `text_tower.onnx` are the towers as ONNX graphs (inputs `features` "
                "`[batch, frames, dim]` float32 and `mask` `[batch, frames]` bool, output unit `embeddings`); "
                "`examples/onnx_search.py` in the xmodal repository searches an index with onnxruntime and "
                "numpy only. The test-time normaliser is not in the graphs (see `config.json`, `test_time`).", ""]
    out += ["Publishing is a separate, explicit step (xmodal itself never uses the network): "
            "`huggingface-cli upload USER/NAME THIS_FOLDER`.", ""]
    return out


def model_card(config: dict, records: dict, files: dict[str, str] | None = None) -> str:
    """The ``README.md`` of an export folder.

    Args:
        config: the export's ``config.json`` content (:func:`xmodal.models.export.export_state`).
        records: :func:`run_records` of the run (``name``, ``metrics``, ``provenance``).
        files: ``{file name: sha256}`` of the folder's other files, listed at the end.
    """
    for value, name in ((config, "config"), (records, "records")):
        if not isinstance(value, dict):
            raise TypeError(f"{name}: expected a dict, got {type(value).__name__}")
    if files is not None and (not isinstance(files, dict)
                              or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())):
        raise TypeError(f"files: expected {{file name: sha256}} or None, got {type(files).__name__}")
    files = files or {}
    run_config = config.get("run_config") or {}
    metrics = records.get("metrics")
    metric = (metrics or {}).get("metric") or (run_config.get("train") or {}).get("metric")
    arch = config.get("architecture") or {}
    video, text = arch.get("video") or {}, arch.get("text") or {}
    loss = run_config.get("loss") or {}
    tags = ["xmodal", "cross-modal-retrieval", "text-to-video-retrieval", "contrastive-learning", "safetensors"]
    if any(n.endswith(".onnx") for n in files):
        tags.append("onnx")
    kind = "hierarchical two-tower" if "hierarchy" in arch else "two-tower"
    out = ["---", "library_name: xmodal", "tags:", *(f"- {t}" for t in tags), "---", "",
           f"# {records.get('name') or 'xmodal model'}: an xmodal {kind} retrieval head", "",
           f"Video tower `{video.get('kind', '?')}` ({video.get('in_dim', '?')} -> {video.get('out_dim', '?')}), "
           f"text tower `{text.get('kind', '?')}` ({text.get('in_dim', '?')} -> {text.get('out_dim', '?')})"
           + (f", video experts {', '.join(arch['experts'])} fused by `{arch.get('fusion')}`" if arch.get("experts")
              else "")
           + f", trained with `xmodal train` (loss `{loss.get('name', NOT_RECORDED)}`), exported with "
             f"`xmodal export` (xmodal {config.get('xmodal_version', '?')}).", "",
           "## Intended use", "",
           "Text -> video (or image) and video -> text retrieval, for research and prototyping, over galleries "
           "whose features were made by the same extractors as the training data (below). Scores rank items; "
           "they are not calibrated probabilities. Not intended for decisions about people, nor for features of "
           "other extractors.", ""]
    out += _inputs(config) + _usage(config, files) + _provenance(records.get("provenance"), run_config)
    summary = ["## Training", ""]
    if metrics is not None:
        summary += [f"- best epoch {metrics.get('best_epoch', '?')} of {metrics.get('epochs_run', '?')} run, "
                    f"selected on val by `{metric}`; training time {_seconds(metrics.get('train_time_s'))}",
                    f"- test-time temperature {_value(metrics.get('temperature'))}"]
    else:
        summary += [f"- epochs and selection: {NOT_RECORDED}"]
    if run_config:
        optim = run_config.get("optim") or {}
        train = run_config.get("train") or {}
        summary += [f"- loss `{loss.get('name')}` (temperature {_value(loss.get('temperature'))}, learnable "
                    f"{loss.get('learnable')}), optimiser lr {_value(optim.get('lr'))}, batch "
                    f"{train.get('batch_size')}, up to {train.get('epochs')} epochs, seed {train.get('seed')}",
                    "- the whole training config is in `config.json` under `run_config`"]
    out += summary + [""]
    out += _evaluation(metrics, (config.get("test_time") or {}).get("selected"))
    out += _test_time(config, metric)
    out += ["## Limitations", "",
            "- Frozen features: the head is only as good as the extractors' features, and only valid for "
            "them (see Inputs). Changing the extractor means training a new head.",
            "- The metrics above come from the run's own splits; other data (other domains, caption styles, "
            "languages) may rank very differently.",
            "- Gallery-dependent normalisers assume the searched gallery resembles the training gallery; on a "
            "very different gallery compare with `normalizer=\"none\"`.",
            "- The licence and terms of the training data are not recorded by xmodal: check the dataset's "
            "own terms before publishing or using this model.", ""]
    if files:
        out += ["## Files", "", _text_table(["file", "sha256"], [(f"`{k}`", f"`{v}`") for k, v in files.items()]),
                "", "`config.json` holds the architecture, the feature sizes, the encoders, the run's config and "
                "the test-time record (plain numbers; the query banks are named tensors of `model.safetensors`).",
                ""]
    return "\n".join(out)


__all__ = ["model_card", "run_records", "read_json", "NOT_RECORDED"]
