"""The index for a memory budget: ``xmodal index --max-memory SIZE``.

The peer is autofaiss (``build_index(max_index_memory_usage=...)``): it turns the budget into a
compression ratio and picks, without measuring, a factory from a fixed list (HNSW when its graph fits,
else ``IVF{nlist},Flat``, else ``OPQ{m}_{d'},IVF{nlist}[_HNSW32],PQ{m}x8`` with the largest ``m`` whose
code fits; ``get_optimal_index_keys_v2``), and searches it with every cell probed. Here every candidate's
file size is predicted (:func:`predicted_bytes`, from FAISS's serialised layout), the feasible ones are
built, and the one kept is the best *measured* recall@10 (on the run's recall queries) whose *written*
file is within the budget; candidates within ``RECALL_TOLERANCE`` of the best recall go to the smaller
file. Each candidate is measured at the best recall it reaches: without a target
(``target_recall="best"`` of :class:`~xmodal.retrieval.index.BiasedIndex`, the default here) its search
setting is doubled until the recall stops growing and the cheapest setting within ``BEST_TOLERANCE``
(0.001) of the best is kept. Measured at a target instead (``--target-recall``), every candidate reaching it
ties, and the smallest file wins: a budget then buys speed, not recall.

Candidates (``w``: the stored width, ``N`` vectors; :data:`~xmodal.retrieval.index.KINDS`):

- exact storage: ``flat`` (``4 w N`` bytes), ``ivf`` and ``hnsw`` (more bytes, same vectors). When ``flat``
  fits it is the choice, built alone: exact search is the best recall there is and ``flat`` the smallest
  file that holds it, so ``ivf`` and ``hnsw`` could at most tie on recall and lose on bytes (measuring
  them to their best recall took 37 of the 42 s of the synthetic 50k bench's float32 build at fd935f0).
- compressed: ``ivfpqr`` (4-bit codes + 8-bit re-ranking, about ``1.125 w + 8`` bytes a vector),
  ``opq`` with the largest code size ``m`` that fits (``m + 8`` bytes a vector: OPQ's rotation, Ge et al.
  2013, "Optimized Product Quantization", CVPR, sec. 3, then ``m`` one-byte sub-quantisers), ``ivfpq``
  (``w / 4 + 8``), ``rabitq`` with the most bits a value that fit (FAISS's ``IndexIVFRaBitQ``: about
  ``b w / 8`` bytes plus its factors and the id). At most these four are built. The coarse centroids are in the file too: where a
  kind fits only with fewer cells than the build would choose, its cell-count choice is bounded
  (``BiasedIndex(max_nlist=)``), so a tight budget holds a larger code with fewer cells.
  Where even the fewest candidate cells do not fit, the code is offered over the most cells that do
  (down to :data:`MIN_NLIST_DIVISOR` times fewer).

The choice records (``meta.json["budget"]``) every candidate measured (kind, factory, predicted and
written bytes, recall@10, queries/s at the kept setting) and the next budget up: the candidates that
did not fit, of a larger code or another kind than those measured (the same code over more cells is not
tried), built smallest first until one measures a higher recall, so its bytes and recall say what more
memory buys.

Monotone in the budget: a larger budget measures the same candidates or larger ones of the same
families (only ``opq``'s ``m`` and ``rabitq``'s bits grow), so its choice's recall is at least the smaller budget's unless a
larger OPQ code measures a lower recall than a smaller one (not observed; not guaranteed).
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

__all__ = ["parse_size", "choose_index", "budget_line"]

_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
          "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40, "K": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9}
#: Bytes FAISS writes per inverted-list entry beside its code (the int64 id).
ID_BYTES = 8
#: Candidates predicted over the budget built in search of the next budget up (a prediction is an upper
#: bound, so one may fit after all: it is then measured as a candidate).
MAX_NEXT_BUILDS = 3
#: Slack on a prediction: headers and rounding FAISS adds.
HEADER_BYTES = 4096
#: A budget may hold a code over fewer cells than the build's smallest cell-count candidate, down to this
#: many times fewer (fewer cells: coarser residuals and longer lists to scan).
MIN_NLIST_DIVISOR = 8


def parse_size(text: Any) -> int:
    """A byte count from ``"22MB"``, ``"1.5GB"``, ``"512MiB"``, ``"800000"`` (KB/MB/GB: powers of 1000;
    KiB/MiB/GiB: of 1024).

    >>> parse_size("22MB"), parse_size("1.5 GiB"), parse_size(4096)
    (22000000, 1610612736, 4096)
    """
    name = "--max-memory"
    if isinstance(text, bool):
        raise ValueError(f"{name}: expected a size such as 22MB or 1.5GB, got {text!r}")
    if isinstance(text, (int, np.integer)):
        value = int(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
        unit = m.group(2).upper() if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(f"{name}: expected a size such as 22MB, 1.5GB or 512MiB, got {str(text)[:40]!r}")
        number = float(m.group(1)) * _UNITS[unit]
        if not math.isfinite(number) or number > 2 ** 62:
            raise ValueError(f"{name}: expected a size below 4 EB, got {str(text)[:40]!r}")
        value = int(number)
    if value < 1:
        raise ValueError(f"{name}: must be at least 1 byte, got {text!r}")
    return value


def format_size(n: float) -> str:
    """``22.0 MB`` (powers of 1000, as :func:`parse_size` reads them)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.{3 if n < 10 * scale else 1}f} {unit}"
    return f"{int(n)} B"


def predicted_bytes(kind: str, n: int, width: int, nlist: int | None = None, pq_m: int | None = None,
                    bits: int | None = None) -> int:
    """The file size of a ``kind`` index of ``n`` vectors of stored ``width`` (an upper estimate: headers
    rounded up, every IVF list's size recorded), from FAISS's serialised layout: float32 vectors, int64 ids
    per IVF entry, float32 centroids (coarse ``nlist x width``, PQ ``256 x width`` for 8-bit codes), OPQ's
    ``d' x width`` rotation, HNSW's int32 links (``2 M`` on level 0, ``M / (M - 1)`` more on average above)
    and per-node level / offset; ``rabitq``: FAISS's own code size for ``bits`` (the bits per value and
    the per-vector factors) and a ``width`` centre.

    >>> predicted_bytes("flat", 1000, 128) - 1000 * 512
    4096
    """
    from xmodal.retrieval.index import HNSW_M, PQ_DSUB, opq_dim

    b = HEADER_BYTES
    nbits = 8 if n >= 256 * 39 else max(1, min(8, int(np.log2(max(2, n // 39)))))
    if kind == "flat":
        return b + 4 * width * n
    if kind == "hnsw":
        links = 2 * HNSW_M + HNSW_M / (HNSW_M - 1)
        return b + int(n * (4 * width + 4 * links * 1.02 + 12))
    nlist = int(nlist)
    coarse = 4 * width * nlist + 8 * nlist
    if kind == "ivf":
        return b + coarse + n * (4 * width + ID_BYTES)
    if kind == "ivfpq":
        m = width // PQ_DSUB
        return b + coarse + 4 * width * (1 << nbits) + n * (math.ceil(m * nbits / 8) + ID_BYTES)
    if kind == "ivfpqr":  # 4-bit fast-scan codes in blocks of 32 per list, SQ8 re-ranking codes
        m = width // PQ_DSUB
        return (b + coarse + 4 * width * 16 + nlist * 32 * m // 2 + n * (m // 2 + ID_BYTES)
                + n * width + 8 * width)
    if kind == "opq":
        d = opq_dim(width, pq_m)
        return (b + 4 * d * width + 4 * d + 4 * d * nlist + 8 * nlist + 4 * d * (1 << nbits)
                + n * (math.ceil(pq_m * nbits / 8) + ID_BYTES))
    if kind == "rabitq":
        return b + coarse + 4 * width + n * (rabitq_code_size(width, bits) + ID_BYTES)
    raise ValueError(f"kind: no size model for {kind!r}")


def rabitq_code_size(width: int, bits: int) -> int:
    """Bytes FAISS stores per ``rabitq`` vector of ``width`` values at ``bits`` bits a value (read from an
    untrained ``IndexIVFRaBitQ``: no data needed).

    >>> rabitq_code_size(128, 1), rabitq_code_size(128, 8)
    (24, 148)
    """
    from xmodal.retrieval.index import import_faiss

    faiss = import_faiss()
    factory = "IVF1,RaBitQ" + (str(int(bits)) if int(bits) > 1 else "")
    return int(faiss.index_factory(int(width), factory, faiss.METRIC_INNER_PRODUCT).code_size)


def candidates(n: int, dim: int, biased: bool, *, nlist: int | None = None, kinds: tuple | None = None,
               budget: int | None = None) -> list[dict]:
    """Every candidate ``{"kind", "pq_m", "bits", "max_nlist", "predicted_bytes"}``, smallest first: ``opq`` one
    per code size, ``rabitq`` one per bits a value (:data:`~xmodal.retrieval.index.RABITQ_BITS`); an IVF kind whose cell count the build chooses, one per bound on it
    (:func:`~xmodal.retrieval.index.nlist_candidates`: its coarse centroids are in the file too, so a tight
    budget may hold a larger code with fewer cells); bytes predicted at the bound. With ``budget``, a code whose
    fewest candidate cells do not fit is also offered with the most cells that do, down to
    :data:`MIN_NLIST_DIVISOR` times fewer than those fewest."""
    from xmodal.retrieval.index import COMPRESSED_KINDS, MIN_PQ_ROWS, OPQ_CODE_SIZES, RABITQ_BITS, _width, nlist_candidates

    out = []
    for kind in kinds or ("flat", "ivf", "hnsw", "ivfpqr", "ivfpq", "opq", "rabitq"):
        if kind in COMPRESSED_KINDS and n < MIN_PQ_ROWS:
            continue
        w = _width(dim, kind, biased)
        caps = [None] if kind in ("flat", "hnsw") else [int(nlist)] if nlist is not None else nlist_candidates(n)
        ms = [m for m in OPQ_CODE_SIZES if m <= w] if kind == "opq" else [None]
        for m in ms:
            for bits in RABITQ_BITS if kind == "rabitq" else [None]:
                for c in caps:
                    out.append({"kind": kind, "pq_m": m, "bits": bits, "max_nlist": None if nlist is not None else c,
                                "predicted_bytes": predicted_bytes(kind, n, w, c, m, bits)})
                if budget is None or nlist is not None or caps == [None] or out[-len(caps)]["predicted_bytes"] <= budget:
                    continue
                # the fewest cells do not fit: the most cells that do (the size grows with the cells)
                lo, hi = max(1, caps[0] // MIN_NLIST_DIVISOR), caps[0] - 1
                if lo > hi or predicted_bytes(kind, n, w, lo, m, bits) > budget:
                    continue
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    lo, hi = (mid, hi) if predicted_bytes(kind, n, w, mid, m, bits) <= budget else (lo, mid - 1)
                out.append({"kind": kind, "pq_m": m, "bits": bits, "max_nlist": lo,
                            "predicted_bytes": predicted_bytes(kind, n, w, lo, m, bits)})
    return sorted(out, key=lambda c: c["predicted_bytes"])


def _to_measure(cands: list[dict], budget: int) -> list[dict]:
    """The candidates built for ``budget``: ``flat`` alone when it fits (exact, and the smallest exact file);
    else per kind the largest that fits: the largest code (``opq``'s bytes, ``rabitq``'s bits), then the most
    cells."""
    fit = [c for c in cands if c["predicted_bytes"] <= budget]
    flat = [c for c in fit if c["kind"] == "flat"]
    if flat:
        return flat

    def larger(c: dict) -> tuple[int, int]:  # the code first, then the cells
        return c["pq_m"] or c.get("bits") or 0, c["max_nlist"] or 0

    best: dict[str, dict] = {}
    for c in fit:
        if c["kind"] not in best or larger(c) > larger(best[c["kind"]]):
            best[c["kind"]] = c
    return sorted(best.values(), key=lambda c: -c["predicted_bytes"])


def choose_index(gallery: Any, bias: Any = None, *, max_bytes: int, queries: Any, target_recall: float | None = None,
                 kinds: tuple | None = None, nlist: int | None = None, seed: int = 0, block_rows: int | None = None,
                 workdir: str | os.PathLike | None = None, next_up: bool = True,
                 log: Callable[[str], None] | None = None, scratch_prefix: str = ".budget",
                 progress: bool | None = False) -> tuple[Any, dict]:
    """Build the candidates for ``max_bytes`` and keep the best measured recall@10 whose file fits.

    Args:
        gallery: ``[N, D]`` embeddings or a row source (as :class:`~xmodal.retrieval.index.BiasedIndex`).
        bias: ``[N]`` folded bias or None (no bias column).
        max_bytes: the budget for the index file (``index.faiss``), bytes.
        queries: ``[Q, D]`` recall queries (shifted as searches are); the recall@10 of every candidate is
            measured on them against exact search.
        target_recall: each candidate's search setting target; None (the default): ``"best"``, each at the
            cheapest setting within ``BEST_TOLERANCE`` of the best recall it reaches.
        kinds: restrict the candidates to these kinds (``--kind`` given with ``--max-memory``).
        nlist: a fixed cell count (default: the build's own choice).
        workdir: where each candidate's file is written to be measured (default: a temporary folder).
        scratch_prefix: the name of that folder's own temporary folder starts so (``xmodal index``: one
            named after ``--out``, whose stale copies a killed build left it removes first).
        next_up: also build the candidates that do not fit, smallest first, up to :data:`MAX_NEXT_BUILDS`, until
            one measures a higher recall@10 than the choice (the record's ``"next_up"``; every one built:
            ``"over_budget"``).
        log: hears a line as each candidate's build starts and one with what it measured.
        progress: each candidate's long steps (adding, the settings measured) as
            :class:`~xmodal.retrieval.index.BiasedIndex`'s ``progress``.

    Returns:
        ``(index, record)``: the chosen :class:`~xmodal.retrieval.index.BiasedIndex` and
        ``{"max_bytes", "chosen": {...}, "measured": [{...}, ...], "next_up": {...} | None, "why": str,
        "over_budget": [{...}, ...]}``.

    Raises:
        ValueError: one line naming the smallest possible size when no candidate fits.
    """
    from xmodal._validate import float_matrix, whole_number
    from xmodal.retrieval.index import BEST_TOLERANCE, BLOCK_ROWS, KINDS, RECALL_TOLERANCE, BiasedIndex, _is_source

    if log is not None and not callable(log):
        raise TypeError(f"log: expected a callable or None, got {type(log).__name__}")
    say = log or (lambda line: None)
    max_bytes = whole_number(max_bytes, "max_bytes", minimum=1)
    if queries is None:
        raise ValueError("--max-memory: the recall of each candidate is measured on the run's stored text "
                         "embeddings, and this run has none")
    if kinds is not None and (not isinstance(kinds, (tuple, list)) or not kinds
                              or not all(isinstance(k, str) and k in KINDS for k in kinds)):
        raise ValueError(f"kinds: expected a tuple of {', '.join(KINDS)}, got {str(kinds)[:60]!r}")
    if not _is_source(gallery):
        gallery = float_matrix(gallery, "gallery")
    queries = float_matrix(queries, "queries").detach().cpu().numpy()
    n, d = int(gallery.shape[0]), int(gallery.shape[1])
    if n < 1 or queries.shape[1] != d:
        raise ValueError(f"queries: expected [Q, {d}] and a gallery of at least one row, got {tuple(queries.shape)}")
    cands = candidates(n, d, bias is not None, nlist=nlist, kinds=kinds, budget=max_bytes)
    if not cands:
        raise ValueError(f"--max-memory: no index kind of {', '.join(kinds or ())} suits {n} vectors")
    smallest = cands[0]
    todo = _to_measure(cands, max_bytes)
    if not todo:
        raise ValueError(f"--max-memory: {format_size(max_bytes)} is below the smallest index for {n} vectors of "
                         f"{d} values: {_label(smallest)} needs about {format_size(smallest['predicted_bytes'])} "
                         f"(give --max-memory {math.ceil(smallest['predicted_bytes'] / 1e6 * 100) / 100}MB or more)")
    rows: list[dict] = []
    chosen = kept = None
    with tempfile.TemporaryDirectory(dir=workdir, prefix=scratch_prefix) as tmp:
        def build(c: dict, why: str = "") -> tuple[Any, dict]:
            say(f"budget: building {_label(c)}" + (f" with at most {c['max_nlist']} cells" if c.get("max_nlist") else "")
                + f" (about {format_size(c['predicted_bytes'])}{why})")
            start = time.perf_counter()
            index = BiasedIndex(gallery, bias, kind=c["kind"], pq_m=c["pq_m"], bits=c.get("bits"),
                                max_nlist=c.get("max_nlist"), queries=queries,
                                target_recall=(target_recall or "best") if c["kind"] != "flat" else None, nlist=nlist,
                                seed=seed, block_rows=block_rows or BLOCK_ROWS, progress=progress)
            path = Path(tmp) / "candidate.faiss"
            index.save(path)
            size = path.stat().st_size
            path.unlink()
            row = {"kind": c["kind"], "factory": index.factory, "predicted_bytes": int(c["predicted_bytes"]),
                   "bytes": int(size), "fits": size <= max_bytes, "recall_at_10": float(index.recall_at_10 or 0.0),
                   "search_params": dict(index.search_params), "queries_per_s": _rate(index, queries),
                   "build_s": round(time.perf_counter() - start, 2)}
            say(f"budget: {row['factory']}: {format_size(size)}, recall@10 {row['recall_at_10']:.3f}"
                + ("" if row["fits"] else f" (over {format_size(max_bytes)})"))
            return index, row

        def consider(index: Any, row: dict) -> None:
            nonlocal kept, chosen
            if row["fits"] and (kept is None or _better(row, chosen, RECALL_TOLERANCE)):
                kept, chosen = index, row

        for i, c in enumerate(todo):
            index, row = build(c, f", candidate {i + 1} of {len(todo)}")
            rows.append(row)
            consider(index, row)
            del index
        nxt = None
        # a larger code or another kind: the same code over more cells buys speed at a target, hardly
        # recall at its best (every cell probed, the cells only change what the codes encode)
        codes = {(c["kind"], c["pq_m"], c.get("bits")) for c in todo}
        over = [c for c in cands if c["predicted_bytes"] > max_bytes and (c["kind"], c["pq_m"], c.get("bits")) not in codes
                and not any(r["kind"] == c["kind"] and r["predicted_bytes"] == c["predicted_bytes"] for r in rows)]
        beyond: list[dict] = []
        for c in over[:MAX_NEXT_BUILDS] if next_up else []:
            # the prediction is an upper bound: a candidate predicted over may still fit
            index, row = build(c, f", over {format_size(max_bytes)}: what the next budget up buys")
            if not row["fits"]:
                beyond.append(row)
                # a larger file that measures no better buys nothing: the next budget up is the first that does
                if chosen is None or row["recall_at_10"] > chosen["recall_at_10"] + RECALL_TOLERANCE:
                    nxt = row
                    break
                continue
            rows.append(row)
            consider(index, row)
            del index
    if chosen is None:
        least = min(r["bytes"] for r in rows)
        raise ValueError(f"--max-memory: {format_size(max_bytes)} holds none of the indexes built (the smallest "
                         f"written was {format_size(least)}); give --max-memory {math.ceil(least / 1e4) / 100}MB or more")
    at = (f"each at the cheapest setting reaching {target_recall:.3f}" if target_recall is not None
          else f"each at the cheapest setting within {BEST_TOLERANCE} of its best")
    why = (f"best recall@10 within {format_size(max_bytes)} among {len([r for r in rows if r['fits']])} measured "
           f"({at}; ties within {RECALL_TOLERANCE}: the smaller file)")
    record = {"max_bytes": int(max_bytes), "chosen": chosen, "measured": rows, "next_up": nxt, "why": why,
              "over_budget": beyond}
    return kept, record


def _better(row: dict, best: dict, tol: float) -> bool:
    if row["recall_at_10"] > best["recall_at_10"] + tol:
        return True
    if row["recall_at_10"] >= best["recall_at_10"] - tol:
        return row["bytes"] < best["bytes"]
    return False


def _rate(index: Any, queries: Any) -> float:
    """Queries/s of ``index`` at its kept setting over the recall queries (best of 3 passes)."""
    q = np.ascontiguousarray(np.asarray(queries, np.float32))
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        index.search(q, 10)
        best = min(best, time.perf_counter() - start)
    return float(q.shape[0] / max(best, 1e-9))


def _label(c: dict) -> str:
    return f"{c['kind']}" + (f" with {c['pq_m']}-byte codes" if c.get("pq_m") else "") + \
        (f" with {c['bits']}-bit values" if c.get("bits") else "")


def budget_line(record: dict) -> str:
    """The printed summary: the choice, why, and what the next budget up would buy."""
    if not isinstance(record, dict) or not isinstance(record.get("chosen"), dict):
        raise TypeError(f"record: expected choose_index's record (a dict with 'chosen'), got {type(record).__name__}")
    c = record["chosen"]
    line = (f"budget {format_size(record['max_bytes'])}: chose {c['factory']} ({format_size(c['bytes'])}, recall@10 "
            f"{c['recall_at_10']:.3f}, {c['queries_per_s']:.0f} queries/s): {record['why']}")
    nxt = record.get("next_up")
    beyond = record.get("over_budget") or []
    if nxt:
        line += (f"; the next budget up, {format_size(nxt['bytes'])}, buys {nxt['factory']} at recall@10 "
                 f"{nxt['recall_at_10']:.3f}")
    elif beyond:
        line += (f"; the {len(beyond)} larger candidate{'s' if len(beyond) > 1 else ''} built (up to "
                 f"{format_size(max(r['bytes'] for r in beyond))}) measure no higher recall@10")
    else:
        line += "; no larger candidate"
    return line
