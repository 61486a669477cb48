"""Every citation of a paper's section in the code and the docs names a section that exists, under the
heading this table expects, and a citation of a known topic names the section that holds it (issue 45
item 5). The citations are found by ``tests/citations.py``; the papers are ``../shared/papers``.

A new citation of a section not in :data:`HEADINGS` fails until someone has read that section and
added it; a wrong one (DN's protocol cited as "sec. 4.2", it is sec. 4.3) fails by its topic rule.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import citations as cit  # noqa: E402

pytestmark = pytest.mark.skipif(not cit.PAPERS_DIR.is_dir(),
                                reason=f"{cit.PAPERS_DIR} is absent (the shared folder is not next to this checkout): "
                                       "paper citations not checked")

#: (paper, section) -> the heading the paper gives it (read in ``../shared/papers``, case ignored).
HEADINGS = {
    ("calince", "3"): "Revisiting Cross-model Representation Learning Methods",
    ("calince", "3.1"): "Visual-textual Correspondence Modeling",
    ("calince", "3.2"): "Visual-textual Contrastive Learning",
    ("calince", "3.3"): "Visual-textual Predictive Coding",
    ("calince", "3.4"): "Analyses",
    ("calince", "4"): "Cali-NCE with Correspondence Modeling",
    ("calince", "5"): "Experiments",
    ("calince", "5.1"): "Downstream Tasks",
    ("calince", "5.2"): "Comparison with State-of-the-art Methods",
    ("calince", "5.3"): "Ablation Studies",
    ("crossclr", "3"): "CrossCLR",
    ("crossclr", "3.1"): "Inter-Modality and Intra-Modality Alignment",
    ("crossclr", "3.2"): "Avoiding Semantic Collision",
    ("crossclr", "4"): "Experiments",
    ("crossclr", "4.3"): "Implementation Details",
    ("crossclr", "A"): "Architecture",
    ("crossclr", "B"): "Hyper-parameters",
    ("crossclr", "B.1"): "Effect of Pruning Threshold",
    ("crossclr", "B.2"): "Effect of Weight Scale",
    ("crossclr", "C.1"): "Do multiple positives in CrossCLR help?",
    ("dn", "3"): "Methodology",
    ("dn", "3.1"): "Analysis of InfoNCE Loss",
    ("dn", "3.1.2"): "Efficient Approximation",
    ("dn", "3.2"): "Effortless Implementation as Distribution Normalization",
    ("dn", "4"): "Experiments",
    ("dn", "4.1"): "Downstream Tasks",
    ("dn", "4.3"): "Cross-modal Retrieval Results",
    ("dn", "4.4"): "Zero-shot Classification Results",
    ("dn", "4.5"): "Image Captioning Metric Results",
    ("dn", "4.6.1"): "Number of Samples for Mean Estimation",
    ("dn", "4.6.2"): "Effect of Fine-tuning on the Results",
    ("dn", "4.7"): "Comparison of Simplified Equation and Full Equation",
    ("ncl", "3.1"): "Cross-modal Contrastive Learning",
    ("ncl", "3.2"): "Normalization Errors in Retrieval",
    ("ncl", "3.3"): "Normalized Contrastive Learning",
    ("ncl", "3.4"): "Normalization at Test Time",
    ("ncl", "4.2"): "Analysis of NCL",
    ("ncl", "B"): "Implementation Details for CLIP4Clip",
    ("tspp", "4.1"): "Approach",
    ("tspp", "4.1.1"): "Temperature / margin schedule",
    ("tspp", "4.1.2"): "Distribution-aware Pseudo-supervision",
    ("tspp", "5.1.2"): "Multi-Instance retrieval task",
    ("tspp", "5.4"): "Implementation Details",
    ("tspp", "5.6.4"): "Experiments with asymmetric TS",
}

#: Topic rules: a citation of ``paper`` whose clause (``Citation.context``: up to 80 characters before it
#: and 40 after, never across another citation) matches ``topic`` must name one of ``sections``;
#: ``quote`` (whitespace, LaTeX dollars and emphasis ignored) is in the first of them, so the rule itself
#: is checked against the paper.
TOPICS = [
    ("dn", (r"(?i)paper's protocol|own protocol|\d+ random|random unlabeled|one (?:DN|normaliser) per|"
            r"\d\.\d protocol"), ("4.3",),
     "we estimated the mean with 100 random unlabeled samples from the validation set"),
    ("dn", r"(?i)zero-shot classification|final norm normalization", ("4.4",),
     "we perform DN before the final norm normalization layer"),
    ("dn", r"we fix|lambda = 0\.25", ("3.2",), "In all our experiments, we fix \\lambda = 0.25"),
    ("dn", r"captioned and the references", ("3.2",),
     "the mean can be estimated from the images to be captioned and the references provided"),
    ("dn", r"(?i)upper bound|sample-size ablation|number of samples", ("4.6.1",),
     "We use the performance achieved here as an upper bound"),
    ("dn", r"(?i)human judgements|full eq", ("4.7",), "compare DN and its original form in Eqn. 4"),
    ("ncl", r"(?i)used only at test time|queues? of the last train|stored queries", ("3.4",),
     "The stored queries are only used at test time"),
    ("ncl", r"(?i)queue size", ("4.2",), "Figure 5 presents the effect of the train query queue size"),
    ("ncl", r"(?i)retrieval mass|FN ?/ ?FP|false-negative", ("3.2",),
     "False negative/positive rates vs. sum of retrieval probabilities"),
    ("ncl", r"(?i)priors", ("3.3",), "we can easily modify the priors accordingly"),
    ("crossclr", r"(?i)factor of 10|RAdam|patience", ("4.3",),
     "It is reduced by a factor of 10 when validation performance saturates"),
    ("crossclr", r"(?i)divide all scores|max-normali[sz]ation|C / max", ("B.1", "3.2"),
     "we first divide all scores in each set by the maximum score"),
    ("crossclr", r"(?i)multiple positives|extra positives|num_positives", ("C.1",),
     "we empirically assess the effect of having multiple positives"),
    ("crossclr", r"0\.6 ?L_global|weight 0\.6", ("A",), "we train the model with the following objective"),
    ("crossclr", r"(?i)larger queue", ("B",), "retrieval performance to increase with larger queue capacity"),
    ("calince", r"theta3 = 200|theta1 = theta2", ("3.4",), "to balance the losses if it is used in the training"),
    ("calince", r"(?i)linear (?:probe|classifier)|action recognition|video-to-video|image-to-image",
     ("5.1", "5.2", "5"),
     "Video-to-video retrieval. In this task, we evaluate the learned video representation"),
    ("calince", r"(?i)shuffl", ("5.3",), "we conduct the experiment by deliberately injecting noises"),
    ("tspp", r"k = 200", ("5.4",), "the K-Means algorithm with k = 200"),
    ("tspp", r"(?i)base (?:tau|margin|values)", ("5.4",),
     "we set \\tau(c) = 0.07 and m(c) = 0.2 as the baseline values"),
    ("tspp", r"\[0\.04, 0\.1\]|(?i:asymmetric|one (?:InfoNCE )?direction|per direction)", ("5.6.4",),
     "oscillating in range [0.04, 0.1] over three periods"),
    ("tspp", r"(?i)three to five|3-5 cycles|period T", ("4.1.1",), "three to five complete cycles"),
    ("tspp", r"(?i)frequent classes (?:get )?high", ("4.1.2",), "frequent classes get higher temperatures"),
]


@pytest.fixture(scope="module")
def found() -> list[cit.Citation]:
    return cit.all_citations()


def _where(c: cit.Citation) -> str:
    return f"{c.path}:{c.line}: {c.paper} sec. {c.section}"


def problems(cites: list[cit.Citation]) -> list[str]:
    """One line per wrong or unchecked citation of a paper in ``../shared/papers``."""
    heads = {p: cit.headings(p) for p in cit.PAPERS}
    out = []
    for c in cites:
        if c.paper is None:
            out.append(f"{c.path}:{c.line}: sec. {c.section} names no paper (name it beside the citation, "
                       f"or add the file to FILE_PAPER): {c.text[:100]}")
        elif c.paper not in cit.PAPERS:
            continue
        elif c.section not in heads[c.paper]:
            out.append(f"{_where(c)}: the paper has no such section: {c.text[:100]}")
        else:
            out += [f"{_where(c)}: should cite {sorted(sections)} for {topic!r}: {c.text[:100]}"
                    for paper, topic, sections, _ in TOPICS
                    if paper == c.paper and re.search(topic, c.context) and c.section not in sections]
            if (c.paper, c.section) not in HEADINGS:
                out.append(f"{_where(c)} ({heads[c.paper][c.section][0]!r}) is not in HEADINGS: read it, check "
                           f"the citation, then add it")
    return out


def test_every_section_citation_names_a_section_of_the_paper_and_its_topic(found):
    assert len(found) > 150  # the scanner finds the citations (244 on 2026-11-28)
    bad = problems(found)
    assert not bad, f"{len(bad)} wrong or unchecked citation(s):\n" + "\n".join(bad)


def test_the_table_matches_the_papers_headings():
    for (paper, section), title in HEADINGS.items():
        got = [h.lower() for h in cit.headings(paper).get(section, [])]
        assert " ".join(title.lower().split()) in got, \
            f"{paper} sec. {section}: expected {title!r}, the paper has {got}"


@pytest.mark.parametrize("rule", TOPICS, ids=[f"{t[0]}-{t[2][0]}-{i}" for i, t in enumerate(TOPICS)])
def test_each_topic_rule_quotes_its_section(rule):
    paper, _, sections, quote = rule
    first = sections[0]
    body = cit.section_text(paper, first)
    assert body, f"{paper}: no section {first}"
    assert " ".join(quote.split()) in body, f"{paper} sec. {first} does not say {quote!r}"


def test_every_topic_rule_applies_somewhere(found):
    for paper, topic, sections, _ in TOPICS:
        assert any(c.paper == paper and re.search(topic, c.context) for c in found), \
            f"no {paper} citation matches {topic!r}: the rule checks nothing"


def test_a_wrong_citation_fails(tmp_path: Path):
    """The check can fail: the issue's wrong citation, a section the paper lacks, one not in the table,
    one naming no paper, and a correct one."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text(
        "DN's means follow the DN paper's protocol (sec. 4.2): 100 random validation rows.\n"
        "NCL sec. 9.9 is invented.\n"
        "DN sec. 2.1 is a real section that no citation here has been checked against.\n\n"
        "A citation of sec. 3.2 with no paper.\n\n"
        "The DN paper's protocol (sec. 4.3): 100 random unlabeled validation samples.\n")
    bad = problems(cit.citations("docs/x.md", root=tmp_path))
    assert len(bad) == 5, bad
    assert "should cite ['4.3']" in bad[0] and "sec. 4.2 ('Base Representation Models') is not in HEADINGS" in bad[1]
    assert "no such section" in bad[2] and "sec. 2.1 ('Contrastive Learning') is not in HEADINGS" in bad[3]
    assert "names no paper" in bad[4]


def test_every_file_paper_entry_exists():
    missing = [p for p in cit.FILE_PAPER if not (cit.ROOT / p).is_file()]
    assert not missing, f"FILE_PAPER names files that are gone: {missing}"


def _others() -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for c in cit.all_citations():
        if c.paper in cit.OTHER_PAPERS:
            out[c.paper].append(f"{c.path}:{c.line} sec. {c.section}")
    return out


@pytest.mark.parametrize("paper", sorted(cit.OTHER_PAPERS))
def test_citations_of_papers_not_in_shared_are_listed(paper):
    cites = _others().get(paper)
    pytest.skip(f"{paper} is not in ../shared/papers: " + (f"{len(cites)} citation(s) not checked: "
                                                         + ", ".join(cites) if cites else "not cited"))
