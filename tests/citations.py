"""Finding the paper section citations of the code and the docs, and the headings of the papers
(issue 45 item 5; the checks are in ``tests/test_citations.py``).

A citation is ``sec. N``, ``Sec. N.M``, ``Section N``, ``secs. N-M``, ``§N`` or ``appendix X.N``
(with continuations ``3.1-3.4``, ``4.2 / 4.3``, ``3.2 and 4.3``, ``3.1.2, 3.2, 4.7``). Its paper is
the name nearest before it on its line, else the paper the file is about (:data:`FILE_PAPER`), else
the name nearest before it in its paragraph (up to :data:`CONTEXT_LINES` lines back, to a blank
line); a citation with none of these is reported, never guessed.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _papers_dir() -> Path:
    """``../shared/papers`` beside this checkout, or beside the main checkout of a git worktree."""
    try:
        common = subprocess.run(["git", "rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=ROOT,
                                capture_output=True, text=True, check=False).stdout.strip()
    except OSError:  # no git: a plain copy of the repository
        common = ""
    for top in (ROOT, Path(common).parent if common else ROOT):
        if (top.parent / "shared" / "papers").is_dir():
            return top.parent / "shared" / "papers"
    return ROOT.parent / "shared" / "papers"


PAPERS_DIR = _papers_dir()

#: The papers in ``../shared/papers`` and the names that point at them.
PAPERS = {
    "ncl": ("ncl_park2022.md", r"\bNCL\b|Park et al"),
    "calince": ("calince_zhao.md", r"Cali-?NCE|Zhao et al"),
    "dn": ("distribution_normalization_zhou2023.md", r"\bDN\b|Zhou et al|Distribution Normali[sz]ation"),
    "tspp": ("tspp_sheludzko2025_thesis.md", r"TS\+\+|\bthesis\b|Sheludzko"),
    "crossclr": ("crossclr_zolfaghari2021.md", r"(?i:crossclr)|Zolfaghari"),
}
#: Papers cited but not in ``../shared/papers``: their citations cannot be checked and are listed as skipped.
OTHER_PAPERS = {
    "COOT": r"\bCOOT\b|Ginzburg",
    "CLIP4Clip": r"CLIP4Clip|Luo et al",
    "Gao et al.": r"Gao et al",
    "MIL-NCE": r"MIL-NCE|Miech et al",
    "Collaborative Experts": r"\bCE\b|Collaborative Experts|Liu et al",
    "MEE": r"\bMEE\b",
    "EPIC-KITCHENS-100": r"EPIC|Damen et al|IJCV",
    "Good 2005 (permutation tests)": r"Good 2005|Good,? \(?2005",
    "inverted softmax (Smith et al.)": r"Smith et al",
    "QB-Norm": r"QB-?Norm|Bogolin",
    "CLIP": r"Radford et al",
    "OPQ (Ge et al. 2013)": r"Ge et al|Optimized Product Quantization",
}
#: The paper a file is about, for its citations that name no paper (checked: a file listed here must cite).
FILE_PAPER = {
    "docs/papers/calince.md": "calince", "docs/papers/crossclr.md": "crossclr", "docs/papers/dn.md": "dn",
    "docs/papers/ncl.md": "ncl", "docs/papers/tspp.md": "tspp",
    "src/xmodal/functional/calince.py": "calince", "src/xmodal/losses/calince.py": "calince",
    "src/xmodal/functional/crossclr.py": "crossclr", "src/xmodal/losses/crossclr.py": "crossclr",
    "bench/crossclr_weights.py": "crossclr", "src/xmodal/functional/ncl.py": "ncl",
    "src/xmodal/normalize/dn.py": "dn", "src/xmodal/normalize/sinkhorn.py": "ncl",
    "src/xmodal/retrieval/testtime.py": "dn", "src/xmodal/schedules.py": "tspp",
    "src/xmodal/training/schedule_plan.py": "tspp", "src/xmodal/training/parts.py": "crossclr",
    "configs/crossclr/coot_youcook2.yaml": "crossclr", "configs/flickr8k/calince.yaml": "calince",
    "configs/ts/ts_infonce_synthetic.yaml": "tspp", "configs/ts/ts_mimaxmargin_synthetic.yaml": "tspp",
    "bench/f8k_ts_thesis.yaml": "tspp",
    "tests/test_calince.py": "calince", "tests/test_crossclr.py": "crossclr", "tests/test_docs_numbers.py": "dn",
    "tests/test_crossclr_module.py": "crossclr", "tests/test_normalize.py": "dn",
    "tests/test_ts_dn_trainer.py": "tspp", "tests/test_ts_directions.py": "tspp",
}
#: Files scanned (folder, suffixes): code (docstrings, comments, --help texts), configs, tests and the docs.
SCANNED = (("src/", (".py",)), ("bench/", (".py", ".yaml")), ("configs/", (".yaml",)), ("tests/", (".py",)),
           ("docs/", (".md",)), ("README.md", (".md",)))
#: Files never scanned: this scanner and its test (they quote citations as examples).
SKIP = {"tests/citations.py", "tests/test_citations.py"}

_NUM = r"(?:[A-D]|\d+)(?:\.\d+)*"
_CITE = re.compile(r"(?:\b(?:[Ss]ecs?\.|[Ss]ections?)\s*|§\s*|\b[Aa]ppendi(?:x|ces)\s+)"
                   rf"(?P<first>{_NUM})(?P<rest>(?:\s*(?:-|–|/|,|and)\s*(?:{_NUM})\b)*)")
_SEC_ONLY = re.compile(r"\d+(?:\.\d+)*")  # after "sec.", a letter is no section (sec. A is an appendix's)
_APPENDIX = re.compile(r"[A-D](?:\.\d+)*")
#: Lines before a citation searched for a paper's name (within its paragraph).
CONTEXT_LINES = 8


@dataclass(frozen=True)
class Citation:
    path: str
    line: int
    paper: str | None  # a key of PAPERS, a name of OTHER_PAPERS, or None (unattributed)
    section: str
    text: str  # the line, stripped
    context: str  # its clause: up to 80 characters before (from the last ";") and 40 after (to a parenthesis
    # or ";"), never across another citation of the line


def scanned_files() -> list[str]:
    """The repository's files of :data:`SCANNED` (git's, untracked work in progress included; every file
    under the folders outside a git checkout)."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file under the folders
        out = [str(p.relative_to(ROOT)) for top, _ in SCANNED
               for p in ([ROOT / top] if (ROOT / top).is_file() else (ROOT / top).rglob("*")) if p.is_file()]
    return sorted(p for p in out if p not in SKIP and (ROOT / p).is_file()
                  and any(p.startswith(top) and p.endswith(ends) for top, ends in SCANNED))


def _sections(m: re.Match) -> list[str]:
    """The section numbers one citation names (a range gives both ends)."""
    appendix = m.group(0).lower().lstrip().startswith(("appendi",))
    parts = [m.group("first")] + re.findall(_NUM, m.group("rest"))
    ok = _APPENDIX if appendix else _SEC_ONLY
    return [p for p in parts if ok.fullmatch(p) or (not appendix and _APPENDIX.fullmatch(p))]


def _named(before: str) -> str | None:
    """The paper named last in ``before`` (a key of :data:`PAPERS` or a name of :data:`OTHER_PAPERS`)."""
    best, where = None, -1
    for key, (_, names) in PAPERS.items():
        for m in re.finditer(names, before):
            if m.end() > where:
                best, where = key, m.end()
    for key, names in OTHER_PAPERS.items():
        for m in re.finditer(names, before):
            if m.end() > where:
                best, where = key, m.end()
    return best


def citations(path: str, root: Path = ROOT) -> list[Citation]:
    """Every section citation of one file (a citation broken across two lines included)."""
    text = (root / path).read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    out = []
    found = list(_CITE.finditer(text))
    for n, m in enumerate(found):
        i = text.count("\n", 0, m.start())
        own = text[text.rfind("\n", 0, m.start()) + 1:m.start()]
        start = i
        while start > 0 and i - start < CONTEXT_LINES and lines[start - 1].strip() not in ("", '"""', "#"):
            start -= 1
        paper = _named(own) or FILE_PAPER.get(path) or _named(" ".join(lines[start:i] + [own]))
        lo = max(m.start() - 80, found[n - 1].end() if n else 0, m.start() - len(own))
        end = text.find("\n", m.end())
        hi = min(m.end() + 40, found[n + 1].start() if n + 1 < len(found) else len(text),
                 end if end >= 0 else len(text))
        before, after = text[lo:m.start()], text[m.start():hi]
        before = before[before.rfind(";") + 1:]  # a clause of its own: "...; sec. N" is about what follows
        cut = re.search(r"[();]", after[len(m.group(0)):])
        after = after[:len(m.group(0)) + cut.start()] if cut else after
        for sec in _sections(m):
            out.append(Citation(path, i + 1, paper, sec, lines[i].strip(), before + after))
    return out


def all_citations() -> list[Citation]:
    return [c for p in scanned_files() for c in citations(p)]


_STRIP = re.compile(r"</?b>|\*\*|<[^>]+>")
_HEADING = re.compile(rf"^\s*(?:#+\s*)?(?P<num>{_NUM})\.?\s+(?P<title>[A-Z(].*?)\s*(?:(?:\.\s*){{3,}}.*)?$")


def _clean(text: str) -> str:
    """Text compared with a quote: LaTeX dollars, emphasis and HTML tags dropped, whitespace collapsed."""
    return " ".join(_STRIP.sub("", text).replace("$", "").split())


def section_text(paper: str, section: str) -> str:
    """The body of one section (its heading line up to the next heading that is not a subsection),
    cleaned (:func:`_clean`); "" when the paper has no such heading. Markdown headings are preferred
    to plain numbered lines; table-of-contents lines (dot leaders) are never a section's start."""
    lines = (PAPERS_DIR / PAPERS[paper][0]).read_text(encoding="utf-8").splitlines()
    marks = []
    for k, raw in enumerate(lines):
        line = _STRIP.sub("", raw).replace("\t", " ")
        m = _HEADING.match(line)
        if m and len(line) <= 120 and not re.search(r"(?:\.\s*){3,}", line):
            marks.append((k, m.group("num"), raw.lstrip().startswith("#")))
    mine = [x for x in marks if x[1] == section]
    if not mine:
        return ""
    k0 = next((x for x in mine if x[2]), mine[0])[0]
    nxt = next((k for k, num, _ in marks if k > k0 and not (num + ".").startswith(section + ".")), len(lines))
    return _clean("\n".join(lines[k0:nxt]))


def headings(paper: str) -> dict[str, list[str]]:
    """``{section: [heading texts]}`` of a paper's text: its Markdown headings, its numbered heading lines
    (``3.4 Normalization at Test Time``) and table-of-contents lines, page numbers and dot leaders cut."""
    out: dict[str, list[str]] = {}
    text = (PAPERS_DIR / PAPERS[paper][0]).read_text(encoding="utf-8")
    for raw in text.splitlines():
        line = _STRIP.sub("", raw).replace("\t", " ")
        m = _HEADING.match(line)
        if m is None or len(line) > 120:
            continue
        title = re.sub(r"\s+\d+$", "", m.group("title")).strip().rstrip(".")
        out.setdefault(m.group("num"), []).append(title)
    return out
