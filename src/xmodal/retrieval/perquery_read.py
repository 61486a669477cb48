"""Reading a ``per_query.npz`` (and a run's ``metrics.json``) that someone else wrote: bounded and checked.

A per-query file decides verdicts, so a file that is truncated, forged or merely from another run
must be refused in one line, not turned into a difference. :class:`PerQueryFile` opens the zip's
directory only; each array is read when it is asked for (an unused entry, however large, is never
decompressed), after its header is checked against the split's protocol card and the settings
below (memory is bounded by these settings, never by what the file declares), and its values are
checked: ranks are integers in ``1 .. gallery_size``, AP / nDCG percentages in ``[0, 100]`` or NaN,
query ids ``uint8 [Q, 16]``. Cards are JSON texts of bounded size and nesting whose fields are
type-checked (:func:`check_card`); :func:`load_json` does the same for ``metrics.json``.
"""

from __future__ import annotations

import json
import math
import os
import re
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from xmodal._validate import short_repr
from xmodal.retrieval.perquery import KINDS, WRITER_KEY

__all__ = ["PerQueryFile", "read_per_query", "check_card", "load_json", "MAX_QUERIES", "MAX_ENTRIES", "MAX_JSON_BYTES",
           "MAX_JSON_DEPTH"]

#: Largest number of queries of one direction that is read (an int32 rank array of 100 MB).
MAX_QUERIES = 25_000_000
#: Largest number of entries of a per-query file.
MAX_ENTRIES = 10_000
#: Largest JSON text read (a protocol card, metrics.json), and its deepest nesting.
MAX_JSON_BYTES = 16 << 20
MAX_JSON_DEPTH = 64
_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,100}")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_ZIP_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError, UnicodeDecodeError,
               RecursionError, NotImplementedError, OverflowError)


def load_json(data: bytes, what: str, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse JSON ``data`` (bytes) of at most ``max_bytes`` and ``max_depth`` nested levels (the depth
    is measured before parsing, outside strings, so a 100,000-deep file never reaches the parser);
    anything else is a one-line ``ValueError`` starting with ``what``.

    >>> load_json(b'{"a": [1, 2]}', "x.json")
    {'a': [1, 2]}
    """
    if not isinstance(what, str):
        raise TypeError(f"what: expected the file's name, got {short_repr(what)}")
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"{what}: expected bytes, got {type(data).__name__}")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or isinstance(max_depth, bool) or \
            not isinstance(max_depth, int):
        raise TypeError("max_bytes, max_depth: expected integers")
    if len(data) > max_bytes:
        raise ValueError(f"{what}: {len(data)} bytes of JSON, more than the {max_bytes} read")
    bare = np.frombuffer(_STRING.sub(b'""', bytes(data)), dtype=np.uint8)
    step = (np.isin(bare, (ord("{"), ord("["))).astype(np.int64) - np.isin(bare, (ord("}"), ord("]"))))
    if bare.size and int(np.cumsum(step).max(initial=0)) > max_depth:
        raise ValueError(f"{what}: JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(bytes(data).decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"{what}: not valid JSON ({str(exc).splitlines()[0][:80]})") from None


def _counts(card: dict, key: str, what: str, minimum: int) -> dict:
    value = card.get(key)
    if not isinstance(value, dict) or not value or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and minimum <= v <= MAX_QUERIES
            for k, v in value.items()):
        raise ValueError(f"{what}: protocol card field {key!r} must map directions to integers in "
                         f"[{minimum}, {MAX_QUERIES}], got {short_repr(value)}")
    return dict(value)


def check_card(card: Any, what: str) -> dict:
    """A protocol card (:func:`xmodal.retrieval.perquery.protocol_card`) with its fields type-checked,
    reduced to the fields xmodal reads; one-line ``ValueError`` naming ``what`` and the field."""
    if not isinstance(what, str):
        raise TypeError(f"what: expected the card's source, got {short_repr(what)}")
    if not isinstance(card, dict):
        raise ValueError(f"{what}: the protocol card is not a JSON object ({short_repr(card)})")
    out: dict[str, Any] = {"num_queries": _counts(card, "num_queries", what, 0),
                           "gallery_size": _counts(card, "gallery_size", what, 1)}
    chance = card.get("chance_r1")
    if not isinstance(chance, dict) or not all(isinstance(k, str) and isinstance(v, (int, float))
                                               and not isinstance(v, bool) and math.isfinite(v)
                                               for k, v in chance.items()):
        raise ValueError(f"{what}: protocol card field 'chance_r1' must map directions to numbers, "
                         f"got {short_repr(chance)}")
    out["chance_r1"] = dict(chance)
    for key in ("caption_policy", "v2t", "tie_rule", "split_sha256", "normalizer"):
        if not isinstance(card.get(key), str) or len(card[key]) > 200:
            raise ValueError(f"{what}: protocol card field {key!r} must be a short string, got "
                             f"{short_repr(card.get(key))}")
        out[key] = card[key]
    if not isinstance(card.get("uses_test_queries"), bool):
        raise ValueError(f"{what}: protocol card field 'uses_test_queries' must be true or false, got "
                         f"{short_repr(card.get('uses_test_queries'))}")
    out["uses_test_queries"] = card["uses_test_queries"]
    names = card.get("normalizers", {})
    if not isinstance(names, dict) or len(names) > 100 or not all(
            isinstance(n, str) and isinstance(v, dict) and isinstance(v.get("uses_test_queries"), bool)
            for n, v in names.items()):
        raise ValueError(f"{what}: protocol card field 'normalizers' must map names to "
                         f"{{'uses_test_queries': true|false, ...}}, got {short_repr(names)}")
    out["normalizers"] = {n: {"uses_test_queries": v["uses_test_queries"],
                              "bank_source": str(v.get("bank_source", ""))[:200]} for n, v in names.items()}
    for key, kinds in (("git_revision", (str, type(None))), ("git_dirty", (bool, type(None))),
                       ("captions_per_video", (int, float)), ("bank_source", (str,))):
        if key in card:
            if not isinstance(card[key], kinds) or (isinstance(card[key], str) and len(card[key]) > 200):
                raise ValueError(f"{what}: protocol card field {key!r} has a value of the wrong kind: "
                                 f"{short_repr(card[key])}")
            out[key] = card[key]
    return out


class PerQueryFile:
    """A ``per_query.npz`` opened for reading: its entry names, writer and protocol cards at once,
    each array on demand (:meth:`array`, :meth:`query_ids`), checked.

    Args:
        path: the file.
        max_queries: the most queries of one direction that is read.

    Raises:
        ValueError: one line naming the file: not a zip of ``.npy`` entries, too many entries, an
            entry name that is not ``split/normalizer/direction/kind``, ``split/protocol``,
            ``split/query_id/direction`` or the writer's mark, or a card that does not check.
    """

    def __init__(self, path: str | os.PathLike, *, max_queries: int = MAX_QUERIES):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path: expected a file path, got {short_repr(path)}")
        if isinstance(max_queries, bool) or not isinstance(max_queries, int) or max_queries < 1:
            raise ValueError(f"max_queries: expected a positive integer, got {short_repr(max_queries)}")
        self._zip = None
        self.path = Path(path)
        self.max_queries = int(max_queries)
        self.entries: dict[str, dict[str, dict[str, set[str]]]] = {}  # split -> normaliser -> direction -> kinds
        self.id_entries: dict[str, set[str]] = {}
        self.cards: dict[str, dict] = {}
        self.writer: str | None = None
        try:
            self._zip = zipfile.ZipFile(self.path)
        except _ZIP_ERRORS as exc:
            raise self._error(f"not a per-query file written by xmodal ({_first(exc)})") from None
        try:
            self._index()
        except BaseException:
            self.close()
            raise

    def _error(self, text: str) -> ValueError:
        return ValueError(f"{self.path}: {text}")

    def _index(self) -> None:
        infos = self._zip.infolist()
        if len(infos) > MAX_ENTRIES:
            raise self._error(f"{len(infos)} entries, more than the {MAX_ENTRIES} a per-query file may hold")
        self._info = {}
        for info in infos:
            if not info.filename.endswith(".npy"):
                raise self._error(f"not a per-query file written by xmodal (entry {info.filename[:80]!r})")
            key = info.filename[:-4]
            self._info[key] = info
            parts = key.split("/")
            if not all(_NAME.fullmatch(p) for p in parts):
                raise self._error(f"unexpected entry {key[:80]!r}")
            if key == WRITER_KEY:
                continue
            if len(parts) == 2 and parts[1] == "protocol":
                continue
            if len(parts) == 3 and parts[1] == "query_id":
                self.id_entries.setdefault(parts[0], set()).add(parts[2])
            elif len(parts) == 4 and parts[3] in KINDS:
                split, name, direction, kind = parts
                self.entries.setdefault(split, {}).setdefault(name, {}).setdefault(direction, set()).add(kind)
            else:
                raise self._error(f"unexpected entry {key[:80]!r}")
        if WRITER_KEY in self._info:
            mark = self._json(WRITER_KEY)
            if not isinstance(mark, dict) or not isinstance(mark.get("writer"), str):
                raise self._error(f"entry {WRITER_KEY!r} is not xmodal's writer mark")
            self.writer = mark["writer"][:100]
        for key in self._info:
            parts = key.split("/")
            if len(parts) == 2 and parts[1] == "protocol":
                self.cards[parts[0]] = check_card(self._json(key), f"{self.path} ({parts[0]} card)")

    def _raw(self, key: str, max_bytes: int) -> np.ndarray:
        """The entry's array: its ``.npy`` header is read and bounded first (``max_bytes`` of data,
        never the size the header or the zip directory declares), then exactly that many bytes."""
        info = self._info[key]
        fmt = np.lib.format
        try:
            with self._zip.open(info) as f:
                version = fmt.read_magic(f)
                read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
                shape, fortran, dtype = read(f)
                if dtype.hasobject:
                    raise self._error(f"entry {key!r} holds Python objects (pickle), which are never read")
                nbytes = math.prod(shape) * dtype.itemsize
                if nbytes > max_bytes:
                    raise self._error(f"entry {key!r} declares {nbytes} bytes ({dtype} of shape {list(shape)}), "
                                      f"more than the {max_bytes} it may hold")
                data = f.read(nbytes)
        except _ZIP_ERRORS as exc:
            if isinstance(exc, ValueError) and str(exc).startswith(f"{self.path}: "):
                raise
            raise self._error(f"entry {key!r} is unreadable ({_first(exc)})") from None
        if len(data) != nbytes:
            raise self._error(f"entry {key!r} is truncated ({len(data)} of {nbytes} bytes)")
        return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C").copy()

    def _json(self, key: str) -> Any:
        raw = self._raw(key, MAX_JSON_BYTES + 1024)
        if raw.ndim != 0 or raw.dtype.kind != "U":
            raise self._error(f"entry {key!r} is not a JSON text")
        return load_json(str(raw).encode("utf-8"), f"{self.path} ({key})")

    def _count(self, split: str, direction: str, what: str) -> tuple[int, int]:
        card = self.cards.get(split)
        if card is None:
            raise self._error(f"has no protocol card for {split!r} (written before cards existed, or not by xmodal)")
        q, g = card["num_queries"].get(direction), card["gallery_size"].get(direction)
        if q is None or g is None:
            raise self._error(f"the {split} protocol card gives no query / gallery count for {direction}")
        if q > self.max_queries:
            raise self._error(f"{q} {direction} queries on {split}, more than the {self.max_queries} read")
        return q, g

    def array(self, split: str, normalizer: str, direction: str, kind: str) -> np.ndarray | None:
        """One checked array (``kind``: ``rank``, ``ap`` or ``ndcg``), or None when the file has none."""
        if kind not in self.entries.get(split, {}).get(normalizer, {}).get(direction, ()):
            return None
        key = f"{split}/{normalizer}/{direction}/{kind}"
        q, g = self._count(split, direction, key)
        x = self._raw(key, 8 * q + 4096)
        if kind == "rank":
            if x.dtype.kind not in "iu" or x.shape != (q,):
                raise self._error(f"entry {key!r} must hold {q} integer ranks (the card's query count), got "
                                  f"{x.dtype} of shape {list(x.shape)}")
            if q and (x.min() < 1 or x.max() > g):
                raise self._error(f"entry {key!r} holds ranks outside 1..{g} (the card's gallery size): "
                                  f"{x.min()}..{x.max()}")
            return x.astype(np.int64)
        if x.dtype.kind != "f" or x.shape != (q,):
            raise self._error(f"entry {key!r} must hold {q} real percentages, got {x.dtype} of shape {list(x.shape)}")
        x = x.astype(np.float64)
        bad = ~np.isnan(x) & ((x < 0) | (x > 100 + 1e-3))
        if bad.any():
            raise self._error(f"entry {key!r} holds {kind} values outside [0, 100] (or infinite): {x[bad][0]}")
        return x

    def query_ids(self, split: str, direction: str) -> np.ndarray | None:
        """``uint8 [Q, 16]``: each query's identity (:func:`xmodal.retrieval.perquery.query_ids`), or None."""
        if direction not in self.id_entries.get(split, ()):
            return None
        key = f"{split}/query_id/{direction}"
        q, _ = self._count(split, direction, key)
        x = self._raw(key, 16 * q + 4096)
        if x.dtype != np.uint8 or x.shape != (q, 16):
            raise self._error(f"entry {key!r} must hold {q} query ids (uint8 [{q}, 16]), got {x.dtype} of shape "
                              f"{list(x.shape)}")
        return x

    def results(self) -> dict:
        """Every array: ``{split: {normalizer: {direction: {kind: array}}}}`` (checked)."""
        return {s: {n: {d: {k: self.array(s, n, d, k) for k in sorted(kinds)} for d, kinds in dirs.items()}
                    for n, dirs in names.items()} for s, names in self.entries.items()}

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()

    def __enter__(self) -> "PerQueryFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _first(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:120]


def read_per_query(path: str | os.PathLike) -> tuple[dict, dict]:
    """``(results, cards)`` of a ``per_query.npz`` (the inverse of :func:`xmodal.retrieval.perquery.write_per_query`), every
    array and card checked (:class:`PerQueryFile`); a file that is
    not one is a one-line ValueError naming it."""
    with PerQueryFile(path) as f:
        return f.results(), f.cards
