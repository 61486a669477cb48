"""EPIC-KITCHENS-100 MIR relevancy: vectorised == naive loops, properties, CSV errors."""

from pathlib import Path

import numpy as np
import pytest

from xmodal.data import epic_relevancy, epic_train_classes
from xmodal.data.epic import epic_annotations, relevancy_from_classes

EPIC = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "epic100"
needs_epic = pytest.mark.skipif(not EPIC.is_dir(), reason=f"EPIC-KITCHENS-100 CSVs not available at {EPIC}")


def naive_relevancy(cv, cn, sv, sn):
    """Written from the definition: mean of verb-set IoU and noun-set IoU, loop per pair."""
    out = np.zeros((len(cv), len(sv)))
    for i in range(len(cv)):
        for j in range(len(sv)):
            va, vb = {cv[i]}, {sv[j]}
            na, nb = set(cn[i]), set(sn[j])
            verb = len(va & vb) / len(va | vb)
            noun = len(na & nb) / len(na | nb) if na | nb else 0.0
            out[i, j] = (verb + noun) / 2
    return out


def test_vectorised_equals_naive_random():
    rng = np.random.default_rng(0)
    cv = rng.integers(0, 4, 40)
    sv = rng.integers(0, 4, 30)
    cn = [tuple(rng.choice(8, size=rng.integers(0, 4), replace=False)) for _ in range(40)]
    sn = [tuple(rng.choice(8, size=rng.integers(0, 3), replace=False)) for _ in range(30)]
    got = relevancy_from_classes(cv, cn, sv, sn)
    assert got.dtype == np.float32 and got.shape == (40, 30)
    np.testing.assert_allclose(got, naive_relevancy(cv, cn, sv, sn), atol=1e-7)


def test_hand_computed():
    rel = relevancy_from_classes([0, 1], [(2,), (2, 3)], [0, 1, 1], [(2,), (3, 4), ()])
    expected = [[1.0, 0.0, 0.0],
                [(0 + 1 / 2) / 2, (1 + 1 / 3) / 2, 0.5]]
    np.testing.assert_allclose(rel, expected, atol=1e-7)


def test_length_mismatch_raises():
    with pytest.raises(ValueError, match="clip_nouns"):
        relevancy_from_classes([0, 1], [(1,)], [0], [(1,)])


def _fixture(root: Path, shifted: bool = False):
    (root / "EPIC_100_retrieval_test.csv").write_text(
        "narration_id,narration,verb_class,noun_class,all_noun_classes\n"
        'a_0,take plate,0,2,[2]\n'
        'a_1,put plate in sink,1,2,"[2, 9]"\n'
        'a_2,take plate,0,2,[2]\n'
        'a_3,wash cup,2,5,[5]\n'
        'a_4,open tap,3,0,[0]\n')
    if not shifted:
        body = "a_0,take plate\na_1,put plate in sink\na_3,wash cup\na_4,open tap\n"
    else:  # the released file's quirk: the last rows' text belongs to the id above
        body = "a_0,take plate\na_1,wash cup\na_3,put plate in sink\na_4,wash cup\n"
    (root / "EPIC_100_retrieval_test_sentence.csv").write_text("narration_id,narration\n" + body)


def test_fixture_relevancy(tmp_path):
    _fixture(tmp_path)
    rel, clips, sents = epic_relevancy(tmp_path)
    assert clips == ["take plate", "put plate in sink", "take plate", "wash cup", "open tap"]
    assert sents == ["take plate", "put plate in sink", "wash cup", "open tap"]
    cv, cn = [0, 1, 0, 2, 3], [(2,), (2, 9), (2,), (5,), (0,)]
    sv, sn = [0, 1, 2, 3], [(2,), (2, 9), (5,), (0,)]
    np.testing.assert_allclose(rel, naive_relevancy(cv, cn, sv, sn), atol=1e-7)


def test_fixture_offset_tail_trusts_narration_id(tmp_path):
    _fixture(tmp_path, shifted=True)
    ann = epic_annotations(tmp_path)
    # text and classes of the clip each narration_id names (JPoSE's create_sentence_df)
    assert ann["sentences"] == ["take plate", "put plate in sink", "wash cup", "open tap"]
    assert ann["sentence_ids"] == ["a_0", "a_1", "a_3", "a_4"]
    assert ann["repaired"] == [1, 2, 3]
    np.testing.assert_array_equal(ann["sentence_verbs"], [0, 1, 2, 3])
    assert ann["sentence_nouns"] == [(2,), (2, 9), (5,), (0,)]


@pytest.mark.parametrize("case, match", [
    ("no_clips", "EPIC_100_retrieval_test.csv: file not found"),
    ("no_column", "EPIC_100_retrieval_test.csv: missing column"),
    ("bad_list", "EPIC_100_retrieval_test.csv: row 2: cannot parse class list"),
    ("unknown_sentence", "EPIC_100_retrieval_test_sentence.csv: row 2: narration_id 'zz' names no clip"),
])
def test_csv_errors(tmp_path, case, match):
    _fixture(tmp_path)
    c = tmp_path / "EPIC_100_retrieval_test.csv"
    if case == "no_clips":
        c.unlink()
    elif case == "no_column":
        c.write_text("narration_id,narration,verb_class\na_0,take plate,0\n")
    elif case == "bad_list":
        c.write_text(c.read_text().replace("take plate,0,2,[2]", "take plate,0,2,[2", 1))
    elif case == "unknown_sentence":
        (tmp_path / "EPIC_100_retrieval_test_sentence.csv").write_text("narration_id,narration\nzz,fly away\n")
    with pytest.raises(ValueError, match=match):
        epic_relevancy(tmp_path)


@needs_epic
def test_real_relevancy_properties_and_naive_subset():
    rel, clips, sents = epic_relevancy(EPIC)
    assert rel.shape == (9668, 3842) and rel.dtype == np.float32
    assert len(clips) == 9668 and len(sents) == 3842
    assert rel.min() >= 0 and rel.max() <= 1
    ann = epic_annotations(EPIC)
    assert ann["repaired"] == [3835, 3836, 3838, 3839, 3840, 3841]
    rows = np.r_[0:150, 9600:9668]
    cols = np.r_[0:120, 3800:3842]
    naive = naive_relevancy(ann["clip_verbs"][rows], [ann["clip_nouns"][i] for i in rows],
                            ann["sentence_verbs"][cols], [ann["sentence_nouns"][j] for j in cols])
    np.testing.assert_allclose(rel[np.ix_(rows, cols)], naive, atol=1e-7)
    # A clip's own narration sentence has relevancy 1 whenever that narration has a
    # single class set among the clips (24 clips share a narration with other classes).
    by_text = {}
    for i, t in enumerate(clips):
        by_text.setdefault(t, set()).add((ann["clip_verbs"][i], ann["clip_nouns"][i]))
    col = {}
    for j, t in enumerate(sents):
        col.setdefault(t, []).append(j)
    unambiguous = [i for i, t in enumerate(clips) if len(by_text[t]) == 1]
    assert len(unambiguous) > 9600
    own = np.array([rel[i, col[clips[i]]].max() for i in unambiguous])
    np.testing.assert_array_equal(own, 1.0)
    # Every sentence is fully relevant to at least one clip.
    assert (rel.max(0) == 1).all()


def _official_sentences(root: Path):
    """Literal transcription of JPoSE's create_sentence_df for the test split: every row of
    the sentence CSV, text and classes taken from the clip its narration_id names."""
    import csv
    with open(root / "EPIC_100_retrieval_test.csv", newline="") as f:
        clips = {r["narration_id"]: r for r in csv.DictReader(f)}
    out = []
    with open(root / "EPIC_100_retrieval_test_sentence.csv", newline="") as f:
        for r in csv.DictReader(f):
            c = clips[r["narration_id"]]
            out.append((c["narration"], int(c["verb_class"]), tuple(eval(c["all_noun_classes"]))))
    return out


@needs_epic
def test_real_sentence_list_is_the_official_one():
    ann = epic_annotations(EPIC)
    got = [(t, int(v), tuple(n)) for t, v, n in zip(ann["sentences"], ann["sentence_verbs"],
                                                     ann["sentence_nouns"])]
    official = _official_sentences(EPIC)
    assert len(got) == 3842 and got == official
    assert len(set(got)) == 3842                     # no (text, classes) twice
    assert ann["sentences"].count("wash cooker") == 1
    stir = {(v, n) for t, v, n in got if t == "stir"}
    assert stir == {(10, (20,)), (10, (12,))}        # both 'stir' clips' class sets
    rel, _, _ = epic_relevancy(EPIC)
    assert (rel.max(0) == 1).all()                   # every sentence has a relevant clip
    row = {nid: i for i, nid in enumerate(_clip_ids(EPIC))}
    own = rel[[row[nid] for nid in ann["sentence_ids"]], np.arange(3842)]
    np.testing.assert_array_equal(own, 1.0)          # ... namely the clip it names


def _clip_ids(root: Path):
    import csv
    with open(root / "EPIC_100_retrieval_test.csv", newline="") as f:
        return [r["narration_id"] for r in csv.DictReader(f)]


@needs_epic
def test_real_train_classes_long_tail():
    c = epic_train_classes(EPIC)
    assert len(c["sentences"]) == 15989 == len(c["verb"]) == len(c["noun"]) == len(c["nouns"])
    assert c["verb"].min() >= 0 and c["verb"].max() < 97
    assert c["noun"].min() >= 0 and c["noun"].max() < 300
    counts = np.sort(np.bincount(c["verb"]))[::-1]
    assert counts[0] > 20 * np.median(counts[counts > 0])  # a long tail
