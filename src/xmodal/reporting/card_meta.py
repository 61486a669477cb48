"""The model card's Hugging Face metadata and the helpers every part of the card writes with.

- :func:`front_matter`: the YAML header ``huggingface_hub.ModelCard`` reads: ``license``, ``datasets``,
  ``base_model`` (:func:`hub_names`), ``pipeline_tag``, ``tags`` and ``model-index`` with the headline results
  and their intervals (:func:`intervals`: percentile bootstrap over the queries of ``per_query.npz``).
- :func:`plain` / :func:`code`: a value from a record or a flag as inert Markdown (no newline, no HTML).
- :func:`repository_url`: where the installed xmodal says it comes from.
"""

from __future__ import annotations

import html
import os
import re
from pathlib import Path
from typing import Any

#: Built-in extractors whose weights live on the Hugging Face Hub (``base_model`` of the card).
HUB_NAMES = {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")
_HUB_KEYS = ("hub_name", "hub_id", "hub", "repo_id", "hf_hub", "base_model")
#: The headline metrics of ``model-index`` (each with its per-query bootstrap interval).
HEADLINE = ("R@1", "R@5", "R@10")
_TASKS = {"t2v": ("text-to-video-retrieval", "Text-to-video retrieval"),
          "v2t": ("video-to-text-retrieval", "Video-to-text retrieval"),
          "p2v": ("paragraph-to-video-retrieval", "Paragraph-to-video retrieval"),
          "v2p": ("video-to-paragraph-retrieval", "Video-to-paragraph retrieval")}
#: A per_query.npz entry larger than this (uncompressed) is not read for the card's intervals.
MAX_RANK_BYTES = 256 << 20
#: Plain scalars a YAML 1.2 reader (core schema) resolves to null, a boolean, an integer or a float.
#: PyYAML writes YAML 1.1 and quotes only what 1.1 would read as another type: ``1e5`` (a 1.1 float
#: needs a dot) and ``0o17`` (a 1.2 octal) went out bare and came back as numbers.
_YAML12_NOT_STR = re.compile(r"""(?x)
    ~ | null | Null | NULL | true | True | TRUE | false | False | FALSE
  | [-+]?[0-9]+ | 0o[0-7]+ | 0x[0-9a-fA-F]+
  | [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
  | [-+]?\.(inf|Inf|INF) | \.nan | \.NaN | \.NAN""")
def plain(value: Any, limit: int = 300) -> str:
    """Text from a record or a flag as inert Markdown: control characters (a newline would start new Markdown
    or HTML) become spaces, ``& < >`` HTML entities, ``` ` ``` a quote, cut at ``limit`` characters.

    >>> plain("a\\n<script>`x`")
    "a &lt;script&gt;'x'"
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit: expected a positive integer, got {str(limit)[:40]!r}")
    text = re.sub(r"[\x00-\x1f\x7f\u2028\u2029]+", " ", str(value))[:limit]
    return html.escape(text, quote=False).replace("`", "'")


def code(value: Any, limit: int = 300) -> str:
    """``value`` as an inline code span (:func:`plain` first: no backtick can close it early)."""
    return f"`{plain(value, limit)}`"


def hub_names(encoders: Any) -> list[str]:
    """Hugging Face Hub names of the feature extractors an ``encoders`` record of config.json names, where
    known: a hub id the record carries (``hub_id`` ...), or a built-in encoder's (:data:`HUB_NAMES`). Read
    defensively: anything that is not a plain ``owner/name`` id is skipped."""
    found: list[str] = []
    records = []
    if isinstance(encoders, dict):
        records = [encoders.get("text"), encoders.get("video"), encoders.get("image")]
        experts = encoders.get("experts")
        if isinstance(experts, dict):
            records += list(experts.values())
    for rec in records:
        if not isinstance(rec, dict):
            continue
        names = [rec.get(k) for k in _HUB_KEYS] + [HUB_NAMES.get(rec.get("name")) if isinstance(rec.get("name"), str)
                                                   else None]
        spec = rec.get("spec")
        if isinstance(spec, str) and spec in HUB_NAMES:
            names.append(HUB_NAMES[spec])
        for name in names:
            if isinstance(name, str) and _HUB_ID.match(name) and name not in found:
                found.append(name)
                break
    return found


def intervals(run: str | os.PathLike, split: str, normalizer: str, *, n_boot: int = 2000, seed: int = 0
              ) -> dict[str, dict[str, list[float]]]:
    """``{direction: {metric: [value, ci_low, ci_high]}}`` of :data:`HEADLINE` for ``normalizer`` on ``split``
    from the run's ``per_query.npz`` (percentile bootstrap over the queries, 95%, ``n_boot`` resamples);
    only the rank entries used are read; a missing or unreadable file gives ``{}``."""
    import zipfile

    import numpy as np

    from xmodal.metrics.paired import bootstrap_interval

    from xmodal._validate import integer

    if not isinstance(run, (str, os.PathLike)):
        raise TypeError(f"run: expected a run directory, got {type(run).__name__}")
    for value, name in ((split, "split"), (normalizer, "normalizer")):
        if not isinstance(value, str):
            raise TypeError(f"{name}: expected a name, got {type(value).__name__}")
    n_boot = integer(n_boot, "n_boot", minimum=1, maximum=100_000)
    seed = integer(seed, "seed", minimum=0, maximum=2 ** 32 - 1)
    p = Path(run)
    path = (p if p.is_dir() else p.parent) / "per_query.npz"
    out: dict[str, dict[str, list[float]]] = {}
    try:
        with np.load(path, allow_pickle=False) as z:
            sizes = {i.filename.removesuffix(".npy"): i.file_size for i in z.zip.infolist()}
            for direction in _TASKS:
                key = f"{split}/{normalizer}/{direction}/rank"
                if key not in sizes or sizes[key] > MAX_RANK_BYTES:
                    continue
                ranks = z[key]
                if ranks.ndim != 1 or ranks.size == 0 or ranks.dtype.kind not in "iu" or int(ranks.min()) < 1:
                    continue
                out[direction] = {m: [round(v, 4) for v in bootstrap_interval(ranks, metric=m, n_boot=n_boot,
                                                                               seed=seed)] for m in HEADLINE}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, RuntimeError):
        return {}
    return out


def front_matter(config: dict, records: dict, tags: list[str]) -> str:
    """The card's YAML header (Hugging Face model card metadata), written by ``yaml.safe_dump`` (every value
    quoted as YAML 1.1 and 1.2 need: :func:`_card_dumper`): ``library_name``, ``license``, ``datasets``, ``base_model``, ``pipeline_tag``,
    ``tags`` and ``model-index`` with the headline results and their intervals."""
    import yaml

    for value, name in ((config, "config"), (records, "records")):
        if not isinstance(value, dict):
            raise TypeError(f"{name}: expected a dict, got {type(value).__name__}")
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise TypeError("tags: expected a list of strings")
    card = config.get("card") if isinstance(config.get("card"), dict) else {}
    meta: dict[str, Any] = {"library_name": "xmodal", "license": card.get("license") or "other"}
    if meta["license"] == "other":
        meta["license_name"] = "unstated"
    datasets = [d for d in card.get("datasets") or [] if isinstance(d, str)]
    if datasets:
        meta["datasets"] = datasets
    base = hub_names(config.get("encoders"))
    if base:
        meta["base_model"] = base
    meta["pipeline_tag"] = "feature-extraction"
    meta["tags"] = tags
    results = []
    found = records.get("intervals") or {}
    split = records.get("interval_split")
    data = (config.get("run_config") or {}).get("data") or {}
    dataset = {"type": datasets[0] if datasets else f"xmodal-{data.get('name') or 'features'}",
               "name": datasets[0] if datasets else str(data.get("name") or "features"), "split": split}
    for direction, values in found.items():
        task_type, task_name = _TASKS[direction]
        metrics = [{"type": m.lower().replace("@", "_at_").replace("r_at", "recall_at"),
                    "value": v, "name": f"{direction} {m} (95% CI {lo:.2f}-{hi:.2f})",
                    "args": {"ci_low": lo, "ci_high": hi, "level": 0.95, "normalizer": records.get("interval_normalizer"),
                             "interval": "percentile bootstrap over the queries, 2000 resamples, seed 0"}}
                   for m, (v, lo, hi) in values.items()]
        results.append({"task": {"type": task_type, "name": task_name}, "dataset": dict(dataset), "metrics": metrics})
    if results:
        meta["model-index"] = [{"name": plain(records.get("name") or "xmodal model", 96), "results": results}]
    return "---\n" + yaml.dump(meta, Dumper=_card_dumper(), sort_keys=False, allow_unicode=True,
                               width=1 << 16) + "---"


def _card_dumper():
    """``yaml.SafeDumper`` that also quotes a string YAML 1.2 would read as another type (``1e5``, ``0o17``):
    every text value of the card reads back as the same text under YAML 1.1 and 1.2 alike."""
    import yaml

    class CardDumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):
        if _YAML12_NOT_STR.fullmatch(value) or value == "":
            return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="'")
        return dumper.represent_str(value)

    CardDumper.add_representer(str, text)
    return CardDumper


def repository_url() -> str | None:
    """The ``Repository`` (else ``Homepage``/``Source``) URL of the installed xmodal's package metadata."""
    from importlib.metadata import PackageNotFoundError, metadata

    try:
        urls = metadata("xmodal").get_all("Project-URL") or []
    except PackageNotFoundError:
        return None
    found = dict(u.split(", ", 1) for u in urls if ", " in u)
    for key in ("Repository", "Source", "Homepage"):
        url = found.get(key)
        if url and re.fullmatch(r"https://[\w.-]+/[\w./-]+", url):
            return url.rstrip("/")
    return None


__all__ = ["front_matter", "hub_names", "intervals", "plain", "code", "repository_url", "HUB_NAMES", "HEADLINE"]
