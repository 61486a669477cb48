"""MkDocs hook: pages quote numbers from the result files benches write (issue 45 item 1).

A bench writes its results as JSON under ``docs/results/data/NAME.json`` (the command, commit, date,
machine and per-seed rows beside its summaries); a page quotes them with placeholders that this hook
replaces at build time:

- ``{{ NAME:KEY.PATH }}``: one value. A float prints with one decimal, ``{"mean", "std"}`` as
  ``mean ± std``, a list of numbers comma-separated, text as it is. ``{{ NAME:KEY.PATH|.2f }}``
  gives a format (``+.1f`` signs a difference); with a format, a text cell that starts with a number
  (``24.16 (qbnorm)``) prints that number.
- ``{{ NAME:KEY.PATH - NAME2:KEY.PATH|+.2f }}``: the difference of two stored numbers (a ``mean ± std`` by
  its mean, a text cell such as ``840 MB`` or ``28,056`` by the number it starts with), so a gain or a gap
  quoted in prose follows both values; ``{{ A:KEY / B:KEY|.2f }}`` their ratio (``0.97x``).
- ``{{ table NAME:KEY.PATH }}``: a Markdown table from ``{"columns": [...], "rows": [[...], ...]}``
  (``"formats"``, one per column, prints each column as the bench printed it).

A placeholder that names a missing file or key, or a data file without its provenance
(:data:`PROVENANCE`), is a warning, so ``mkdocs build --strict`` fails.

Every page is checked: a typed result in its prose (a decimal number, a percentage, or a whole number with a
unit of measure, :data:`TYPED_UNIT`: a size ``811 MiB``, a time ``631 s`` / ``16 min``, a rate ``175 queries/s``
or a ratio ``17x``, outside code, links, HTML comments and placeholders; section, equation and table citations
and a confidence level excepted) is a warning too. A product of dimensions (``224 x 224``, ``100,000 x N``) is
not a ratio and passes; a size or time that is a setting (``--max-bytes 64 MiB``, ``every 30 s``) goes in a
code span with its name, like any setting. A page not yet converted says so in its front matter, ``numbers: typed`` (the list of such pages
is kept in ``tests/test_docs_numbers.py`` and may only shrink); in it, a part between ``<!-- numbers from
data -->`` and ``<!-- end numbers from data -->`` is still checked. (``numbers: data``, the old opt-in, is
accepted and means the default.)

Numbers that are not results of our commands are written in one of two ways:

- **A setting, a default, a threshold or target, a version, an address or a constant of arithmetic**
  (``tau 0.07``, a paper's hyper-parameter ``lambda 0.25``, ``--noise 0.3``, ``p < 0.05``, ``>= 0.9x``,
  ``Python >= 3.10``, ``127.0.0.1``, ``2 / 2**5 = 0.0625``) is something a user types or could check by
  hand: it goes in a code span, which the check skips. Write the setting's name with its value, so the
  span says what it is: a measured number hidden in a code span passes the check, which cannot tell; a
  reviewer must.
- **A paper's own reported value** comes from ``docs/results/data/paper_reported.json`` (its data file,
  :data:`TRANSCRIBED`): instead of a command, the file says ``transcribed`` (how) and ``source``, and each
  entry is ``{"value": "+1.9", "paper": FILE, "where": "sec. 4.4", "quote": "..."}`` naming the paper in
  ``../shared/papers/``, the section or table it was read from and the sentence that holds it;
  ``{{ paper_reported:KEY }}`` prints its value as written there. ``tests/test_docs_numbers.py`` finds each
  quote in that section of the paper's text and the value's digits in the quote.

A result no file holds (an earlier run's output, a figure from a log) is not typed: the page says in words
what was measured and names the command that measures it.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.numbers")

#: Every data file says how it was made.
PROVENANCE = ("command", "commit", "date", "machine", "source")
#: A file of other people's numbers (a paper's reported values) says instead how they were transcribed and
#: from where; each of its entries names the paper and the place in it.
TRANSCRIBED = ("value", "paper", "where")
_META = ("transcribed", "source")
DATA_DIR = Path("results") / "data"
_REF = r"([A-Za-z0-9_-]+):([^|}\s]+)"
PLACEHOLDER = re.compile(r"\{\{\s*(table\s+)?" + _REF + r"(?:\s+([-/])\s+" + _REF + r")?\s*(?:\|\s*([^}\s]+)\s*)?\}\}")
#: A decimal number or a percentage (a ``m ± s`` holds two decimals); what precedes it may make it a
#: citation (``sec. 4.3``).
TYPED = re.compile(r"(?<![\w.])(?:\d+\.\d+(?:\.\d+)*|\d+(?:\.\d+)?\s?%(?!\s*(?:CI|interval|confidence)))")
#: A whole number with a unit of measure (a size, a time, a rate, a ratio ``3x``): ``811 MiB``, ``5,020 MiB``,
#: ``175 queries/s``, ``631 s``. A product of dimensions (``224 x 224``, ``100,000 x N``) is not a ratio: ``x`` counts
#: only written against the number (``3x``).
UNITS = r"(?:[kKMGT]i?B|ms|s|min|h|q/s|queries/s|frames/s|videos/s|clips/s|steps/s|images/s|rows/s)"
TYPED_UNIT = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\s?" + UNITS + r"|x)(?![\w/])")
#: A section of a page whose numbers come from data files (the whole page: front matter ``numbers: data``).
REGION = re.compile(r"<!-- numbers from data -->(.*?)<!-- end numbers from data -->", re.DOTALL)
#: The number a text cell starts with (``24.16 (qbnorm)``), which a placeholder with a format prints.
LEAD = re.compile(r"[+-]?\d+(?:\.\d+)?(?=\s|$)")
#: The number a text cell starts with in a difference or ratio, thousands separators allowed (``28,056``).
OPERAND = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?=\s|$)|[+-]?\d+(?:\.\d+)?(?=\s|$)")
_cache: dict[Path, dict] = {}


class Missing(KeyError):
    """A placeholder names a file or key that does not exist."""


def load(docs_dir: Path, name: str) -> dict:
    """The data file ``docs/results/data/NAME.json`` (read once per build)."""
    path = Path(docs_dir) / DATA_DIR / f"{name}.json"
    if path not in _cache:
        if not path.is_file():
            raise Missing(f"no data file {DATA_DIR / (name + '.json')}")
        data = json.loads(path.read_text())
        if "transcribed" in data:
            missing = [k for k in _META if not data.get(k)]
            missing += [f"{key}.{k}" for key, entry in data.items() if key not in _META
                        for k in TRANSCRIBED if not (isinstance(entry, dict) and entry.get(k) not in (None, ""))]
        else:
            missing = [k for k in PROVENANCE if not data.get(k)]
        if missing:
            raise Missing(f"{path.name} lacks its provenance: {', '.join(missing)}")
        _cache[path] = data
    return _cache[path]


def lookup(data: Any, key: str) -> Any:
    """``data[k1][k2]...`` for ``key = "k1.k2..."`` (a list takes an index)."""
    for part in key.split("."):
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            raise Missing(f"no key {part!r} (of {key!r})")
    return data


def fmt(value: Any, spec: str | None = None) -> str:
    """A value as the page shows it (see the module docstring)."""
    if isinstance(value, bool) or value is None:
        raise Missing(f"not a number or text: {value!r}")
    if isinstance(value, str):
        lead = LEAD.match(value)
        return format(float(lead.group(0)), spec) if spec and lead else value
    if isinstance(value, int) and spec is None:
        return str(value)
    if isinstance(value, (int, float)):
        if math.isnan(value):
            return "–"
        return format(value, spec or ".1f")
    if isinstance(value, dict) and set(TRANSCRIBED) <= set(value):
        return fmt(value["value"], spec)  # a paper's value, as the paper writes it
    if isinstance(value, dict) and {"mean", "std"} <= set(value):
        return f"{fmt(value['mean'], spec)} ± {fmt(value['std'], (spec or '.1f').lstrip('+'))}"
    if isinstance(value, list) and value and all(isinstance(v, (int, float)) for v in value):
        return ", ".join(fmt(v, spec) for v in value)
    raise Missing(f"cannot print {type(value).__name__} {str(value)[:60]!r}")


def _cell(value: Any, spec: str | None) -> str:
    """A table cell: an integer in a column printed with decimals (a bare ``0`` among gains) as the bench
    printed it."""
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool) and spec
                                  and not spec.endswith(".0f")):
        return str(value)
    return fmt(value, spec)


def difference(a: Any, b: Any, op: str = "-") -> float:
    """``a - b`` (or ``a / b``) of two stored numbers (a ``{"mean", "std"}`` summary by its mean, a text cell
    by the number it starts with)."""
    a, b = (v["mean"] if isinstance(v, dict) and "mean" in v
            else float(OPERAND.match(v).group(0).replace(",", "")) if isinstance(v, str) and OPERAND.match(v)
            else v for v in (a, b))
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
        raise Missing(f"a {'difference' if op == '-' else 'ratio'} of two numbers, not {str(a)[:30]!r} and "
                      f"{str(b)[:30]!r}")
    if op == "/":
        if b == 0:
            raise Missing("a ratio to zero")
        return a / b
    return a - b


def table(value: Any, spec: str | None = None) -> str:
    if not (isinstance(value, dict) and isinstance(value.get("columns"), list)
            and isinstance(value.get("rows"), list)):
        raise Missing("not a table ({'columns': [...], 'rows': [[...]]})")
    cols = value["columns"]
    align = value.get("align") or ["---"] * len(cols)
    formats = value.get("formats") or [None] * len(cols)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(align) + "|"]
    for row in value["rows"]:
        if len(row) != len(cols):
            raise Missing(f"a row of {len(row)} cells under {len(cols)} columns")
        lines.append("| " + " | ".join(_cell(c, spec or f) for c, f in zip(row, formats)) + " |")
    return "\n".join(lines)


def render(markdown: str, docs_dir: Path, where: str = "") -> tuple[str, list[str]]:
    """The page with every placeholder replaced, and one message per placeholder that failed."""
    errors: list[str] = []

    def one(m: re.Match) -> str:
        is_table, name, key, op, name_b, key_b, spec = m.groups()
        try:
            value = lookup(load(docs_dir, name), key)
            if name_b:
                value = difference(value, lookup(load(docs_dir, name_b), key_b), op)
            return table(value, spec) if is_table else fmt(value, spec)
        except (Missing, ValueError, json.JSONDecodeError) as exc:
            msg = exc.args[0] if isinstance(exc, Missing) else str(exc)
            errors.append(f"{where}: {m.group(0)}: {msg}")
            return "**[missing number]**"

    return PLACEHOLDER.sub(one, markdown), errors


def typed_numbers(markdown: str) -> list[str]:
    """Decimal numbers, percentages and whole numbers with a unit (``811 MiB``, ``3x``) in the prose of a page's Markdown source: not in code
    (fenced or inline), link targets, HTML comments or placeholders, and not a citation (sec. 4.3)."""
    text = re.sub(r"^[ \t]*(```|~~~).*?^[ \t]*\1", "", markdown, flags=re.S | re.M)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = PLACEHOLDER.sub("", text)
    text = re.sub(r"`[^`\n]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    out = []
    for line in text.splitlines():
        hits = sorted([*TYPED.finditer(line), *TYPED_UNIT.finditer(line)], key=lambda m: m.start())
        for m in hits:
            if _cited(line[:m.start()]):
                continue
            out.append(f"{m.group(0)!r} in: {line.strip()[:100]}")
    return out


def _cited(before: str) -> bool:
    """Whether the number after ``before`` continues a citation (``sec. 4.2 / 4.3``, ``eqs. 6 and 8``)."""
    words = re.findall(r"[A-Za-z]+\.?|\d+(?:\.\d+)*|[,/-]", before)[-6:]
    for w in reversed(words):
        if re.fullmatch(r"\d+(?:\.\d+)*|[,/-]|and", w):
            continue
        return bool(re.fullmatch(r"(?:[Ss]ec(?:tion)?s?|[Ii]ssues?|[Ii]tems?|[Ii]ssues?|[Ii]tems?|[Ee]qs?|Tables?|Figs?|Figure|Alg|Ch|v|version)\.?", w))
    return False


def on_page_markdown(markdown: str, page, config, files) -> str:
    where = page.file.src_uri
    checked = REGION.findall(markdown) if page.meta.get("numbers") == "typed" else [markdown]
    for hit in (h for part in checked for h in typed_numbers(part)):
        log.warning(f"{where}: a typed number where numbers come from data files: {hit}")
    out, errors = render(markdown, Path(config["docs_dir"]), where)
    for e in errors:
        log.warning(e)
    return out


def on_pre_build(config) -> None:
    _cache.clear()  # `mkdocs serve` rebuilds: a bench's new file is read again
