"""Clips of one long video in two splits (issue 25.4) are named by ``data import`` and ``data
check``; ids and group names that cannot be one line of a names file (issue 25.7: a newline,
U+2028, ...) are refused at import instead of breaking ``train`` / ``query`` later."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from xmodal.cli import main
from xmodal.data.groups import shared_groups
from xmodal.data.importer import import_pairs, read_pairs


def _hier_table(tmp: Path, rows: list[tuple[str, str, str]]) -> Path:
    """pairs.jsonl of (group, clip, split) rows, feats/<clip>.npy, text_features.npy."""
    rng = np.random.default_rng(0)
    (tmp / "feats").mkdir(exist_ok=True)
    with open(tmp / "pairs.jsonl", "w", encoding="utf-8") as f:
        for i, (group, clip, split) in enumerate(rows):
            f.write(json.dumps({"video_id": group, "clip_id": clip, "start": i, "caption": f"step {i}",
                                "split": split}) + "\n")
            np.save(tmp / "feats" / f"{clip}.npy", rng.standard_normal((2, 4)).astype(np.float32))
    np.save(tmp / "tf.npy", rng.standard_normal((len(rows), 3)).astype(np.float32))
    return tmp / "pairs.jsonl"


LEAKY = [("cake", "c1", "train"), ("cake", "c2", "val"), ("soup", "s1", "train"), ("soup", "s2", "train"),
         ("bread", "b1", "val"), ("bread", "b2", "val"), ("pie", "p1", "test"), ("pie", "p2", "train")]


def _shared_by_loops(rows):
    """Independent reference: for each pair of splits, the groups with clips in both."""
    where: dict[str, set] = {}
    for group, _, split in rows:
        where.setdefault(group, set()).add(split)
    return {tuple(sorted(s)): sorted(g for g, w in where.items() if set(s) <= w)
            for s in [("train", "val"), ("test", "train"), ("test", "val")]}


def test_import_notes_and_check_names_groups_in_two_splits(tmp_path, capsys):
    pairs = _hier_table(tmp_path, LEAKY)
    summary = import_pairs(pairs, features=tmp_path / "feats", out=tmp_path / "data", text_features=tmp_path / "tf.npy")
    notes = summary["train"]["notes"]
    leaks = [n for n in notes if "long video(s) have clips in both" in n]
    want = _shared_by_loops(LEAKY)
    assert len(leaks) == sum(bool(v) for v in want.values()) == 2
    assert any("'train' and 'val'" in n and "'cake'" in n and "'soup'" not in n for n in leaks)
    assert any("'train' and 'test'" in n and "'pie'" in n for n in leaks)

    assert main(["data", "check", str(tmp_path / "data")]) == 1
    out = capsys.readouterr().out
    assert "1 long video(s) have clips in both 'train' and 'val'" in out and "'cake'" in out
    assert "'pie'" in out and "'bread'" not in out.split("long video(s)")[1].split("\n")[0]


def test_groups_in_one_split_each_are_not_flagged(tmp_path, capsys):
    rows = [("cake", "c1", "train"), ("cake", "c2", "train"), ("soup", "s1", "val"), ("soup", "s2", "val")]
    summary = import_pairs(_hier_table(tmp_path, rows), features=tmp_path / "feats", out=tmp_path / "data",
                           text_features=tmp_path / "tf.npy")
    assert not [n for n in summary["train"]["notes"] if "long video" in n]
    assert main(["data", "check", str(tmp_path / "data")]) == 0
    assert "have clips in both" not in capsys.readouterr().out


def test_shared_groups_against_loops():
    rng = np.random.default_rng(5)
    for _ in range(50):
        names = {s: [f"g{int(i)}" for i in rng.choice(12, size=rng.integers(0, 6), replace=False)]
                 for s in ("train", "val", "test")}
        got = shared_groups(names)
        for a, b in [("train", "val"), ("train", "test"), ("val", "test")]:
            both = [g for g in names[a] if g in names[b]]
            msg = [m for m in got if f"both {a!r} and {b!r}" in m]
            assert len(msg) == (1 if both else 0)
            if both:
                assert msg[0].startswith(f"{len(both)} long video(s)")
                assert all(repr(g) in msg[0] for g in both[:5])


@pytest.mark.parametrize("bad", ["g\n1", "g\u20281", "g\u20291", "g\x851", "g\x001", "g\t1", "g\r1"])
def test_a_group_name_that_is_not_one_line_is_refused_at_import(tmp_path, bad, capsys):
    pairs = _hier_table(tmp_path, [(bad, "c1", "train"), (bad, "c2", "train"), ("ok", "c3", "train")])
    with pytest.raises(ValueError, match="line 1: group .long video. name .* must be one line of text"):
        read_pairs(pairs)
    rc = main(["data", "import", str(pairs), "--features", str(tmp_path / "feats"), "--out", str(tmp_path / "d"),
               "--text-features", str(tmp_path / "tf.npy")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "must be one line of text" in err
    assert not (tmp_path / "d").exists()


def test_a_blank_group_name_is_a_row_without_a_group(tmp_path):
    pairs = _hier_table(tmp_path, [("  ", "c1", "train"), ("ok", "c2", "train")])
    with pytest.raises(ValueError, match=r"1 row\(s\) without a video id, caption or group \(lines \[1\]\)"):
        read_pairs(pairs)


@pytest.mark.parametrize("bad", ["a\u2028b", "a\u2029b", "a\x85b", "a\nb", "a\x7fb"])
def test_a_video_id_with_a_line_break_is_refused_at_import(tmp_path, bad):
    (tmp_path / "feats").mkdir()
    with open(tmp_path / "pairs.jsonl", "w", encoding="utf-8") as f:
        for v in (bad, "c"):
            f.write(json.dumps({"video_id": v, "caption": "a caption"}) + "\n")
    with pytest.raises(ValueError, match=r"line 1: video id .* \(no absolute path, '\.\.', control character or line break\)"):
        read_pairs(tmp_path / "pairs.jsonl")


def test_query_reads_names_with_a_line_separator_from_an_index(tmp_path, capsys, one_thread):
    """A layout written by other tools may hold U+2028 in a name (S_videos.txt lines split on \\n):
    the index keeps one name per row, and ``query`` reads it back (it split at U+2028 and refused)."""
    from xmodal.config import from_dict
    from xmodal.data import synthetic
    from xmodal.training import fit

    s = synthetic(num_train=40, num_val=20, num_test=20, num_concepts=4, seed=0)
    cfg = from_dict({"model": {"dim": 8}, "train": {"epochs": 1, "batch_size": 16, "device": "cpu"},
                     "test_time": {"normalizers": ["none"], "bank_size": 20}})
    fit(cfg, {"train": s["train"], "val": s["val"]}, out=tmp_path / "run", verbose=False, progress=False)
    names = [f"clip\u2028{i}" if i % 3 == 0 else f"clip {i}\x85" if i % 3 == 1 else f"v{i}"
             for i in range(s["val"].num_videos)]
    (tmp_path / "names.txt").write_text("".join(n + "\n" for n in names), encoding="utf-8")
    np.save(tmp_path / "v.npy", s["val"].video)
    np.save(tmp_path / "t.npy", s["val"].text[:3])
    assert main(["index", "--run", str(tmp_path / "run"), "--video-features", str(tmp_path / "v.npy"),
                 "--names", str(tmp_path / "names.txt"), "--out", str(tmp_path / "idx"), "--threads", "1"]) == 0
    capsys.readouterr()
    assert main(["query", "--index", str(tmp_path / "idx"), "--text-features", str(tmp_path / "t.npy"),
                 "--k", "3"]) == 0
    table = capsys.readouterr().out
    assert any(n in table for n in names)
    from xmodal.retrieval.search import SearchIndex

    assert SearchIndex(tmp_path / "idx").names == names
