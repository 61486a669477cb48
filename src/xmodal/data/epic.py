"""EPIC-KITCHENS-100 multi-instance retrieval (MIR): relevancy from the annotation CSVs.

Relevancy between clip ``i`` and sentence ``j`` (Damen et al., "Rescaling Egocentric
Vision", IJCV 2022, Sec. 4.2 / the MIR baselines' relevancy script)::

    R_ij = ( IoU(verbs_i, verbs_j) + IoU(nouns_i, nouns_j) ) / 2

with ``IoU(A, B) = |A & B| / |A | B|`` over class-id sets. Every clip and sentence has
one verb class, so the verb term is 1 when the verb classes agree and 0 otherwise; the
noun term uses all noun classes (``all_noun_classes`` of a clip).

The released test-sentence CSV holds only ``narration_id`` and ``narration``. The official
sentence list (JPoSE's ``create_sentence_df``, used by the EPIC-100 MIR evaluation) trusts
``narration_id``: each sentence's text AND classes are those of the clip it names. In the
released file the ``narration`` column of the last rows is offset by one row against
``narration_id`` (0-based rows 3835-3841; on row 3837 the two texts happen to agree), so the
text column is not used for test sentences: ``repaired`` lists the rows whose released
text differs from the named clip's narration (the clip's text is used). The result has
3,842 rows, each the narration of a test clip (so every sentence has a clip of relevancy
1); 6 narrations appear twice with different classes (e.g. ``stir``), as in the official
list. A ``narration_id`` naming no clip raises ``ValueError``.
"""

from __future__ import annotations

import ast
import csv
import os
from pathlib import Path

import numpy as np

from xmodal._validate import short_repr

_CLIPS = "EPIC_100_retrieval_{split}.csv"
_SENTENCES = "EPIC_100_retrieval_{split}_sentence.csv"


def _read_csv(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    if not path.is_file():
        raise ValueError(f"{path}: file not found")
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
        return list(reader)


def _class_list(text: str, path: Path, row: int) -> tuple[int, ...]:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ValueError(f"{path}: row {row}: cannot parse class list {text!r}") from None
    if isinstance(value, int):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{path}: row {row}: expected a list of integer classes, got {text!r}")
    return tuple(value)


def _class_ids(v, name: str) -> np.ndarray:
    """A 1-D int64 array of class ids (integers, or floats holding whole numbers)."""
    if hasattr(v, "detach"):
        v = v.detach().cpu().numpy()
    if isinstance(v, (str, bytes, dict)) or v is None:
        raise TypeError(f"{name}: expected a 1-D sequence of integer classes, got {short_repr(v)}")
    try:
        a = np.asarray(v)
    except ValueError:  # ragged nesting
        raise ValueError(f"{name}: expected a 1-D sequence of integer classes") from None
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sequence of integer classes, got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        if not np.issubdtype(a.dtype, np.floating) or not (np.isfinite(a).all() and (a == np.round(a)).all()):
            raise TypeError(f"{name}: expected integer classes, got dtype {a.dtype}")
    return a.astype(np.int64)


def _noun_sets(v, name: str, count: int, per: str) -> list[frozenset]:
    """``count`` noun-class sets, one per row of the matching verb array."""
    if isinstance(v, (str, bytes, dict)) or not hasattr(v, "__len__") or not hasattr(v, "__iter__"):
        raise TypeError(f"{name}: expected a sequence of noun-class lists, got {short_repr(v)}")
    if len(v) != count:
        raise ValueError(f"{name}: expected one noun list per {per} ({count}), got {len(v)}")
    try:
        return [frozenset(int(x) for x in n) for n in v]
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"{name}: each entry must be a list of integer noun classes") from None


def relevancy_from_classes(clip_verbs, clip_nouns, sentence_verbs, sentence_nouns) -> np.ndarray:
    """Vectorised MIR relevancy ``(verb IoU + noun IoU) / 2`` for every clip/sentence pair.

    Args:
        clip_verbs: int ``[C]`` verb class per clip.
        clip_nouns: ``C`` sequences of noun classes.
        sentence_verbs: int ``[S]``.
        sentence_nouns: ``S`` sequences of noun classes.

    Returns:
        float32 ``[C, S]`` in ``[0, 1]``. An empty noun set on both sides gives noun
        IoU 0 (no evidence of relevance rather than NaN).

    Shape:
        ``[C, S]``.
    """
    cv = _class_ids(clip_verbs, "clip_verbs")
    sv = _class_ids(sentence_verbs, "sentence_verbs")
    # Few distinct noun sets (hundreds), so IoU is computed between unique sets only.
    c_sets = _noun_sets(clip_nouns, "clip_nouns", cv.shape[0], "clip verb")
    s_sets = _noun_sets(sentence_nouns, "sentence_nouns", sv.shape[0], "sentence verb")
    uniq = sorted(set(c_sets) | set(s_sets), key=lambda s: sorted(s))
    index = {s: i for i, s in enumerate(uniq)}
    vocab = sorted(set().union(*uniq)) if uniq else []
    col = {c: i for i, c in enumerate(vocab)}
    hot = np.zeros((len(uniq), max(len(vocab), 1)), dtype=np.float32)
    for i, s in enumerate(uniq):
        hot[i, [col[c] for c in s]] = 1.0
    inter = hot @ hot.T
    size = hot.sum(1)
    union = size[:, None] + size[None, :] - inter
    noun_iou = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    ci = np.fromiter((index[s] for s in c_sets), dtype=np.int64, count=len(c_sets))
    si = np.fromiter((index[s] for s in s_sets), dtype=np.int64, count=len(s_sets))
    rel = noun_iou[ci[:, None], si[None, :]]
    rel += cv[:, None] == sv[None, :]
    rel *= 0.5
    return rel.astype(np.float32, copy=False)


def epic_annotations(root: str | os.PathLike, split: str = "test") -> dict:
    """Clips and sentences of an EPIC-KITCHENS-100 MIR split with their classes.

    Returns:
        dict with ``clip_narrations``, ``clip_verbs`` (int ``[C]``), ``clip_nouns``
        (list of tuples), ``sentences``, ``sentence_verbs``, ``sentence_nouns``,
        ``sentence_ids`` (``narration_id`` per sentence), ``repaired`` (rows whose
        released text differs from the clip their ``narration_id`` names; that clip's
        narration is used, module docstring).
    """
    if not isinstance(split, str) or not split or "\n" in split:
        raise TypeError(f"split: expected a split name such as 'test', got {short_repr(split)}")
    root = Path(root)
    cpath, spath = root / _CLIPS.format(split=split), root / _SENTENCES.format(split=split)
    clips = _read_csv(cpath, ("narration_id", "narration", "verb_class", "all_noun_classes"))
    sents = _read_csv(spath, ("narration_id", "narration"))
    c_verbs, c_nouns, by_id = [], [], {}
    for r, row in enumerate(clips, start=2):
        verb = _class_list(row["verb_class"], cpath, r)
        if len(verb) != 1:
            raise ValueError(f"{cpath}: row {r}: expected one verb class, got {row['verb_class']!r}")
        nouns = _class_list(row["all_noun_classes"], cpath, r)
        c_verbs.append(verb[0])
        c_nouns.append(nouns)
        by_id[row["narration_id"]] = (row["narration"], verb[0], nouns)
    has_classes = "verb_class" in sents[0] and "noun_classes" in sents[0] if sents else False
    texts, s_verbs, s_nouns, repaired = [], [], [], []
    for j, row in enumerate(sents):
        if has_classes:
            texts.append(row["narration"])
            s_verbs.append(_class_list(row["verb_class"], spath, j + 2)[0])
            s_nouns.append(_class_list(row["noun_classes"], spath, j + 2))
            continue
        clip = by_id.get(row["narration_id"])
        if clip is None:
            raise ValueError(f"{spath}: row {j + 2}: narration_id {row['narration_id']!r} names no clip "
                             f"of {cpath.name}")
        if clip[0] != row["narration"]:
            repaired.append(j)
        texts.append(clip[0])
        s_verbs.append(clip[1])
        s_nouns.append(clip[2])
    return {"clip_narrations": [row["narration"] for row in clips], "clip_verbs": np.array(c_verbs, np.int64),
            "clip_nouns": c_nouns, "sentences": texts,
            "sentence_ids": [row["narration_id"] for row in sents],
            "sentence_verbs": np.array(s_verbs, np.int64), "sentence_nouns": s_nouns, "repaired": repaired}


def epic_relevancy(root: str | os.PathLike, split: str = "test") -> tuple[np.ndarray, list[str], list[str]]:
    """The clip x sentence MIR relevancy matrix of an EPIC-KITCHENS-100 split.

    Args:
        root: directory holding ``EPIC_100_retrieval_{split}.csv`` and
            ``EPIC_100_retrieval_{split}_sentence.csv`` (``../shared/data/epic100``).
        split: ``"test"`` (the only split whose clips are released here).

    Returns:
        ``(relevancy, clip_narrations, sentences)``: float32 ``[num_clips,
        num_sentences]`` = (verb IoU + noun IoU) / 2 (module docstring), the clip
        narrations (row order of the clip CSV) and the sentences (row order of the
        sentence CSV). Text -> video MIR queries are the sentences: use ``relevancy.T``.

    Raises:
        ValueError: a missing CSV or column, or an unparsable class list, naming the file.
    """
    ann = epic_annotations(root, split)
    rel = relevancy_from_classes(ann["clip_verbs"], ann["clip_nouns"], ann["sentence_verbs"],
                                 ann["sentence_nouns"])
    return rel, ann["clip_narrations"], ann["sentences"]


def epic_train_classes(root: str | os.PathLike) -> dict:
    """Verb / noun classes of the EPIC-KITCHENS-100 MIR train sentences (a real long tail).

    Returns:
        dict with ``sentences`` (list of 15,989 str), ``verb`` (int ``[S]``), ``noun``
        (int ``[S]``, the first = main noun class; -1 if none), ``nouns`` (list of
        tuples, all noun classes).
    """
    path = Path(root) / _SENTENCES.format(split="train")
    rows = _read_csv(path, ("narration", "verb_class", "noun_classes"))
    verb = np.empty(len(rows), np.int64)
    nouns = []
    for j, row in enumerate(rows):
        v = _class_list(row["verb_class"], path, j + 2)
        if len(v) != 1:
            raise ValueError(f"{path}: row {j + 2}: expected one verb class, got {row['verb_class']!r}")
        verb[j] = v[0]
        nouns.append(_class_list(row["noun_classes"], path, j + 2))
    noun = np.array([n[0] if n else -1 for n in nouns], np.int64)
    return {"sentences": [row["narration"] for row in rows], "verb": verb, "noun": noun, "nouns": nouns}
