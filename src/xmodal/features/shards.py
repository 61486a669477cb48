"""One machine's share of a video collection: ``xmodal encode videos DIR --out FEATS --shard K/N``.

N processes (a job array, ``torchrun --nnodes``, N terminals) given the same ``DIR`` and ``FEATS`` and
shards ``1/N`` .. ``N/N`` encode disjoint shares that together cover the collection once:

- a video belongs to shard ``K`` when the SHA-256 of its video id (its path under ``DIR`` without the
  extension), read as a number, is ``K - 1`` modulo ``N``: the share depends on the id alone, not on the
  other files or their order, so every shard agrees even while files are added, and a re-run of a shard
  takes the same videos (finished ones are skipped as always);
- under ``torchrun`` (``RANK`` / ``WORLD_SIZE`` in the environment, ``WORLD_SIZE`` > 1) and without
  ``--shard``, process ``RANK`` takes shard ``RANK + 1`` of ``WORLD_SIZE``;
- ``N`` is at most :data:`MAX_SHARDS` and at most the number of videos of the collection (more shards
  than videos leave shards empty), checked before any video is encoded;
- each shard writes what it did to ``FEATS/.encode-shards/shard-K-of-N.json`` when it ends (videos of its
  share, encoded, already there, failed with their names, truncated, frames, seconds, host, and a hash of
  the collection's video ids, so shards that saw different collections are told apart); any shard's end,
  and ``xmodal encode videos --out FEATS --summary``, adds up the files found: which shards finished,
  what they did together, and whether they cover the whole collection.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

from xmodal._files.jsonfile import loads_bounded

__all__ = ["parse_shard", "shard_from_env", "in_shard", "read_summaries", "combine", "check_shard_count",
           "SUMMARY_DIR", "MAX_SHARDS"]

#: The folder inside ``FEATS`` that holds one summary per shard (hidden: not a video's features).
SUMMARY_DIR = ".encode-shards"
#: Failed video names kept per shard summary (the count is always exact).
MAX_NAMES = 1000
#: Largest shard summary file read back (bytes).
MAX_SUMMARY_BYTES = 4 << 20
#: Deepest JSON nesting of a shard summary read back (what :func:`write_summary` writes holds 2).
MAX_SUMMARY_DEPTH = 4
#: Most shards a collection is split into (``N`` of ``--shard K/N`` and ``WORLD_SIZE``): the summaries
#: list every shard not finished, so ``N`` bounds their memory. An encode run also needs ``N`` at most
#: the videos of its collection (:func:`check_shard_count`): more shards than videos leaves shards empty.
MAX_SHARDS = 100_000
_COUNTS = ("videos", "written", "skipped", "failed", "truncated", "refused", "frames", "collection")


def parse_shard(text: Any, flag: str = "--shard") -> tuple[int, int]:
    """``"K/N"`` -> ``(K, N)`` with ``1 <= K <= N``.

    >>> parse_shard("2/8")
    (2, 8)
    """
    if not isinstance(flag, str):
        raise TypeError(f"flag: expected the option's name, got {type(flag).__name__}")
    m = re.fullmatch(r"\s*(\d{1,9})\s*/\s*(\d{1,9})\s*", text) if isinstance(text, str) else None
    if m is None:
        from xmodal._validate import short_repr

        raise ValueError(f"{flag}: expected K/N (shard K of N, e.g. 1/4), got {short_repr(text)}")
    k, n = int(m[1]), int(m[2])
    if not 1 <= k <= n:
        raise ValueError(f"{flag}: K must lie in 1..N, got {k}/{n}")
    if n > MAX_SHARDS:
        raise ValueError(f"{flag}: at most {MAX_SHARDS:,} shards, got N = {n:,}")
    return k, n


def check_shard_count(shard: tuple[int, int] | None, videos: int) -> None:
    """A one-line ValueError when ``shard``'s ``N`` is more than the ``videos`` of the collection.

    >>> check_shard_count((1, 300), 8)
    Traceback (most recent call last):
    ...
    ValueError: --shard / WORLD_SIZE: 300 shards of a collection of 8 videos: N must be at most the number of videos
    """
    from xmodal._validate import whole_number

    videos = whole_number(videos, "videos")
    if shard is not None and _check(shard)[1] > max(1, videos):
        raise ValueError(f"--shard / WORLD_SIZE: {shard[1]:,} shards of a collection of {videos:,} video"
                         f"{'s' if videos != 1 else ''}: N must be at most the number of videos")


def shard_from_env(env: Any = None) -> tuple[int, int] | None:
    """``(RANK + 1, WORLD_SIZE)`` from torchrun's environment when ``WORLD_SIZE`` > 1, else None.

    >>> shard_from_env({"RANK": "2", "WORLD_SIZE": "4"})
    (3, 4)
    """
    env = os.environ if env is None else env
    if not hasattr(env, "get"):
        raise TypeError(f"env: expected a mapping of environment variables, got {type(env).__name__}")
    size, rank = env.get("WORLD_SIZE"), env.get("RANK")
    if size is None or rank is None:
        return None
    try:
        if len(str(size)) > 12 or len(str(rank)) > 12:
            raise ValueError
        size, rank = int(size), int(rank)
    except ValueError:
        from xmodal._validate import short_repr

        raise ValueError(f"RANK/WORLD_SIZE: expected integers, got {short_repr(rank)}/{short_repr(size)}") from None
    if size <= 1:
        return None
    if size > MAX_SHARDS:
        raise ValueError(f"WORLD_SIZE: at most {MAX_SHARDS:,} processes (shards), got {size:,}")
    if not 0 <= rank < size:
        raise ValueError(f"RANK: must lie in 0..WORLD_SIZE-1, got {rank} of {size}")
    return rank + 1, size


def _check(shard: Any) -> tuple[int, int]:
    if not (isinstance(shard, tuple) and len(shard) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                   for x in shard) and 1 <= shard[0] <= shard[1]
            and shard[1] <= MAX_SHARDS):
        from xmodal._validate import short_repr

        raise ValueError(f"shard: expected (K, N) with 1 <= K <= N <= {MAX_SHARDS:,}, got {short_repr(shard)}")
    return shard


def in_shard(video_id: str, shard: tuple[int, int]) -> bool:
    """Whether the video ``video_id`` belongs to ``shard`` ``(K, N)`` (module doc).

    >>> sum(in_shard(f"clip{i}", (k, 3)) for i in range(30) for k in (1, 2, 3))  # each video in one shard
    30
    """
    if not isinstance(video_id, str):
        raise TypeError(f"video_id: expected a string, got {type(video_id).__name__}")
    k, n = _check(shard)
    return int.from_bytes(hashlib.sha256(video_id.encode("utf-8", "surrogatepass")).digest()[:8], "big") % n == k - 1


def collection_hash(video_ids: list[str]) -> str:
    """A short hash of a collection's video ids (in any order)."""
    h = hashlib.sha256()
    for vid in sorted(video_ids):
        h.update(vid.encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()[:16]


def _path(out: Path, shard: tuple[int, int]) -> Path:
    return out / SUMMARY_DIR / f"shard-{shard[0]}-of-{shard[1]}.json"


def write_summary(out: str | os.PathLike, shard: tuple[int, int], summary: dict, *, collection: list[str],
                  seconds: float, failed_names: list[str]) -> Path:
    """Write shard ``shard``'s summary into ``out`` (atomically) and return its path."""
    from xmodal.runs import atomic_write_text

    k, n = _check(shard)
    record = {"shard": [k, n], "videos": int(summary["written"] + summary["skipped"] + summary["failed"]
                                                + summary["refused"]),
              **{key: int(summary[key]) for key in ("written", "skipped", "failed", "truncated", "refused",
                                                     "frames")},
              "failed_names": list(failed_names[:MAX_NAMES]), "collection": len(collection),
              "collection_hash": collection_hash(collection), "seconds": round(float(seconds), 3),
              "host": socket.gethostname(), "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    path = _path(Path(out), (k, n))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")
    return path


def read_summaries(out: str | os.PathLike, n: int | None = None) -> tuple[dict[int, dict], list[str]]:
    """``({K: summary}, problems)`` of the shard summaries in ``out`` (of ``n`` shards; None: the ``N`` of
    the newest file). A file too large, unreadable or with values out of range is a problem, not read."""
    folder = Path(out) / SUMMARY_DIR
    found: dict[int, dict[int, Path]] = {}
    if folder.is_dir():
        for p in folder.iterdir():
            m = re.fullmatch(r"shard-(\d{1,9})-of-(\d{1,9})\.json", p.name)
            if m and p.is_file() and not p.is_symlink() and 1 <= int(m[1]) <= int(m[2]) <= MAX_SHARDS:
                found.setdefault(int(m[2]), {})[int(m[1])] = p
    if n is None:
        if not found:
            return {}, []
        n = max(found, key=lambda size: max(p.stat().st_mtime for p in found[size].values()))
    out_, problems = {}, []
    for k, p in sorted(found.get(n, {}).items()):
        try:
            if p.stat().st_size > MAX_SUMMARY_BYTES:
                raise ValueError(f"larger than {MAX_SUMMARY_BYTES} bytes")
            with open(p, "rb") as f:
                data = f.read(MAX_SUMMARY_BYTES + 1)
            if len(data) > MAX_SUMMARY_BYTES:
                raise ValueError(f"larger than {MAX_SUMMARY_BYTES} bytes")
            record = loads_bounded(data, "the file", max_depth=MAX_SUMMARY_DEPTH)
            out_[k] = _checked(record, k, n)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            problems.append(f"{p}: unreadable shard summary ({str(exc)[:120]})")
    if len(found) > 1:
        others = sorted(size for size in found if size != n)
        problems.append(f"{folder}: also summaries of {', '.join(f'{s} shards' for s in others)} (another "
                        f"split of the collection; only the {n}-shard one is counted)")
    return out_, problems


def _checked(record: Any, k: int, n: int) -> dict:
    if not isinstance(record, dict) or record.get("shard") != [k, n]:
        raise ValueError(f"not the summary of shard {k}/{n}")
    for key in _COUNTS:
        v = record.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{key}: expected an integer >= 0")
    names = record.get("failed_names", [])
    if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
        raise ValueError("failed_names: expected a list of strings")
    seconds = record.get("seconds", 0)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
        raise ValueError("seconds: expected a number >= 0")
    return record


def combine(summaries: dict[int, dict], n: int) -> dict:
    """What ``n`` shards did together: ``{"done": [K...], "missing": [K...], totals of each count,
    "failed_names", "seconds" (the slowest shard), "collection", "covered" (every video of the collection
    in a finished shard), "mixed" (shards saw different collections)}``."""
    if not isinstance(summaries, dict) or not all(isinstance(k, int) and isinstance(v, dict)
                                                  for k, v in summaries.items()):
        raise TypeError("summaries: expected {K: shard summary} (read_summaries)")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SHARDS:
        from xmodal._validate import short_repr

        raise ValueError(f"n: expected a number of shards in 1..{MAX_SHARDS:,}, got {short_repr(n)}")
    done = sorted(k for k in summaries if 1 <= k <= n)
    totals = {key: sum(summaries[k][key] for k in done) for key in _COUNTS if key != "collection"}
    hashes = {summaries[k].get("collection_hash") for k in done}
    collection = max((summaries[k]["collection"] for k in done), default=0)
    names = [x for k in done for x in summaries[k].get("failed_names", [])]
    return {"shards": n, "done": done, "missing": [k for k in range(1, n + 1) if k not in summaries], **totals,
            "failed_names": names, "seconds": max((summaries[k].get("seconds", 0) for k in done), default=0),
            "collection": collection, "mixed": len(hashes) > 1,
            "covered": len(done) == n and len(hashes) == 1 and totals["videos"] == collection}
