"""The documentation: a short README, a MkDocs site that builds with --strict, an API reference that
covers the public contract, docstring examples that run, commands in the docs that exist, and the
tours of the README and of "Getting started" run verbatim (issue 37)."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import json
import os
import pkgutil
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
API_MD = ROOT.parent / "shared" / "API.md"

# Every section of the 1,470-line README this site replaced, and where its content lives now
# (page#heading). The test checks that each target page has that heading, so a section cannot be
# dropped or renamed without this map saying where it went.
OLD_SECTIONS = {
    "xmodal (intro)": "index.md#xmodal",
    "Two commands": "getting-started.md#install-two-commands",
    "Library tour": "getting-started.md#the-library",
    "Using a trained run (run folder, watching a run)": "training.md#the-run-folder",
    "Using a trained run (normalisers fitted once, selection)": "normalisation.md#fitted-once-stored-with-the-run",
    "Using a trained run (eval, index, query, report)": "evaluation.md#evaluate-a-run",
    "Is a difference real? xmodal compare": "evaluation.md#is-a-difference-real-xmodal-compare",
    "Search page": "search.md#the-search-page",
    "Sharing a trained run": "sharing.md#export-a-run",
    "Sharing a trained run (experiment trackers)": "training.md#experiment-trackers",
    "Your data": "data.md#your-data",
    "The layout": "data.md#the-layout",
    "From a table of pairs": "data.md#from-a-table-of-pairs",
    "From video files": "video.md#from-video-files",
    "Several experts": "data.md#several-experts",
    "Clips inside long videos (CrossCLR / COOT hierarchy)": "data.md#clips-inside-long-videos-crossclr-coot-hierarchy",
    "In memory": "data.md#in-memory",
    "Millions of clips": "scale.md#millions-of-clips",
    "Millions of clips (torchrun)": "training.md#several-processes",
    "Millions of clips (index kinds, recall)": "search.md#index-kinds",
    "Package layout": "design.md#package-layout",
    "What is implemented, and how it is checked": "papers/index.md#what-is-implemented-and-how-it-is-checked",
    "Results": "results/index.md#results",
    "Main job on the synthetic default": "results/index.md#main-job-on-the-synthetic-default",
    "The papers' methods on Flickr8k": "results/index.md#the-papers-methods-on-flickr8k-train-dev-3-seeds",
    "The papers' other evaluations on Flickr8k": "results/index.md#the-papers-other-evaluations-on-flickr8k",
    "Best Flickr8k configuration": "results/index.md#best-flickr8k-configuration",
    "Selection off dev": "results/index.md#selection-off-dev-issue-18-item-7",
    "EPIC-KITCHENS-100 MIR text-text sanity run": "results/index.md#epic-kitchens-100-mir-text-text-sanity-run",
    "Encoders (equivalence)": "results/index.md#encoders",
    "Flickr8k dev: test-time normalisers on one linear InfoNCE model": (
        "results/index.md#flickr8k-dev-test-time-normalisers-on-one-linear-infonce-model-round-1"),
    "Round-1 grids": "results/index.md#round-1-grids-first-landings-code",
    "Noise robustness (Cali-NCE Table 7)": "results/index.md#noise-robustness-cali-nce-table-7",
    "Benchmarks": "benchmarks.md#benchmarks-bench",
    "Benchmarks: GPU": "benchmarks.md#gpu-one-nvidia-h100-80gb-torch-2110cu130-what-ran-and-what-did-not",
    "Benchmarks: video encoding": "benchmarks.md#video-encoding",
    "Design notes and deviations": "design.md#design-notes-and-deviations",
    "Design notes: per-paper deviations": "papers/index.md#what-is-implemented-and-how-it-is-checked",
}


def _slug(heading: str) -> str:
    from markdown.extensions.toc import slugify

    return slugify(heading, "-")


def _headings(text: str) -> list[str]:
    out, code = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            code = not code
        elif not code and re.match(r"^#{1,6} ", line):
            out.append(_slug(line.lstrip("#").strip()))
    return out


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end > 0 else None]


# ----------------------------------------------------------------------------- README and map

def test_readme_is_short_and_holds_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    block = _blocks(_section(readme, "## Two commands"), "bash")[0]
    assert "make demo" in block and "make test" in block
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test\s*$", ci, flags=re.M), ".ci/run must run the README's test command"


def test_every_old_readme_section_has_a_page():
    for old, target in OLD_SECTIONS.items():
        page, anchor = target.split("#")
        path = DOCS / page
        assert path.is_file(), (old, page)
        assert anchor in _headings(path.read_text()), (old, target, _headings(path.read_text()))


def test_every_page_is_in_the_nav_and_every_link_in_the_readme_resolves():
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", "#"))["nav"]

    def pages(item):
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for v in item.values():
                yield from pages(v)
        else:
            for v in item:
                yield from pages(v)

    listed = set(pages(nav))
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")
               if not p.name.startswith("_") and "_drafts" not in p.parts}
    assert on_disk == listed, (on_disk - listed, listed - on_disk)
    for link in re.findall(r"\]\((docs/[^)#]+)", (ROOT / "README.md").read_text()):
        assert (ROOT / link).exists(), link


# ----------------------------------------------------------------------------- the site

def _make_docs_command() -> list[str]:
    """The Makefile's ``docs`` recipe as an argument list (``$(BIN)/`` is the venv this test runs in)."""
    make = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^docs:.*\n\t(.+)$", make, flags=re.M).group(1)
    words = shlex.split(recipe.replace("$(BIN)/", str(Path(sys.executable).parent) + "/"))
    env = [w for w in words if re.fullmatch(r"[A-Z_0-9]+=.*", w)]
    assert env == ["NO_MKDOCS_2_WARNING=1"], recipe
    return words[len(env):]


def _build(cwd: Path, out: Path) -> subprocess.CompletedProcess:
    """``make docs``'s command, run as it is (no ``-q``: quiet mode drops the warnings strict mode counts),
    into ``out``."""
    if shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("mkdocs is not installed (extra [docs]; `make test` installs it)")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([*_make_docs_command(), "-d", str(out)], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=env)


def test_the_docs_command_is_strict_and_not_quiet():
    cmd = _make_docs_command()
    assert cmd[1:] == ["build", "--strict"] and Path(cmd[0]).name == "mkdocs", cmd


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    res = _build(ROOT, out)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "WARNING" not in res.stdout + res.stderr, res.stdout + res.stderr
    return out


def test_a_broken_anchor_link_or_number_fails_the_build(tmp_path):
    """The same command on a copy of the docs with one broken anchor, one link to a missing page, one
    placeholder naming a missing key and a typed number on a page whose numbers come from data: the
    build fails and names each."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    (tmp_path / "src").symlink_to(ROOT / "src")
    shutil.copytree(DOCS, tmp_path / "docs")
    broken = tmp_path / "docs" / "results" / "index.md"
    broken.write_text(broken.read_text() + "\n\nSee [the tables](paper_evals.md#no-such-heading), "
                      "[a page](no_such_page.md) and {{ albums_fixed:no.such.key }}.\n")
    typed = tmp_path / "docs" / "results" / "albums_related.md"
    text = typed.read_text()
    assert text.startswith("---\nnumbers: data\n---\n"), "the albums page renders its numbers from data files"
    typed.write_text(text + "\nA typed result: 49.6 vs 42.7.\n")
    part = tmp_path / "docs" / "data.md"
    text = part.read_text()
    assert "<!-- end numbers from data -->" in text, "data.md's albums part renders its numbers from data files"
    part.write_text(text.replace("<!-- end numbers from data -->", "Typed: 45.1 ± 1.1.\n<!-- end numbers from data -->"))
    res = _build(tmp_path, tmp_path / "site")
    log = res.stdout + res.stderr
    assert res.returncode != 0, log
    assert "Aborted with" in log and "strict mode" in log, log
    assert ("contains a link 'paper_evals.md#no-such-heading', but the doc 'results/paper_evals.md' does not "
            "contain an anchor") in log, log
    assert "no_such_page.md" in log, log
    assert "{{ albums_fixed:no.such.key }}: no key 'no'" in log, log
    assert "'49.6' in: A typed result" in log and "'42.7'" in log, log
    assert "data.md: a typed number where numbers come from data files: '45.1' in: Typed" in log, log


def test_site_builds_strict(site):
    for page in ("index.html", "getting-started/index.html", "reference/metrics/index.html",
                 "papers/ncl/index.html", "results/index.html", "search/index.html"):
        assert (site / page).is_file(), page
    assert "search_index.json" in {p.name for p in (site / "search").iterdir()}


def _hook():
    spec = importlib.util.spec_from_file_location("numbers_hook", DOCS / "hooks" / "numbers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_placeholders_render_the_data_files_values(tmp_path):
    """Issue 45.1: a page's numbers are read from a bench's JSON; a missing file, key or provenance is named."""
    hook = _hook()
    data = tmp_path / "results" / "data"
    data.mkdir(parents=True)
    prov = {"command": "python bench/x.py", "commit": "abc", "date": "2026-11-28T00:00:00Z", "machine": "m",
            "source": "bench/x.py --write"}
    (data / "x.json").write_text(json.dumps({**prov, "r": {"a": {"mean": 49.61, "std": 4.55, "per_seed": [47.64,
                                             46.3, 54.81]}, "d": -8.84, "n": 3, "t": {"columns": ["k", "v"],
                                             "rows": [["one", 1.25], ["two", {"mean": 2.0, "std": 0.5}]]}}}))
    (data / "bare.json").write_text(json.dumps({"r": 1}))
    page = ("R@1 {{ x:r.a }} (seeds {{ x:r.a.per_seed }}), B − A {{ x:r.d|+.2f }}, {{ x:r.n }} seeds, "
            "`{{ x:command }}`\n\n{{ table x:r.t }}\n")
    out, errors = hook.render(page, tmp_path, "p.md")
    assert not errors, errors
    assert out == ("R@1 49.6 ± 4.5 (seeds 47.6, 46.3, 54.8), B − A -8.84, 3 seeds, `python bench/x.py`\n\n"
                   "| k | v |\n|---|---|\n| one | 1.2 |\n| two | 2.0 ± 0.5 |\n")
    _, errors = hook.render("{{ x:r.zz }} {{ nofile:a }} {{ bare:r }} {{ table x:r.a }}", tmp_path, "p.md")
    assert len(errors) == 4, errors
    assert "no key 'zz'" in errors[0] and "no data file" in errors[1] and "lacks its provenance" in errors[2]
    assert "not a table" in errors[3]


def test_every_result_file_says_how_it_was_made_and_is_quoted():
    """Each bench result file under docs/results/data carries its provenance and a page renders it."""
    hook = _hook()
    pages = "\n".join(p.read_text() for p in DOCS.rglob("*.md"))
    files = sorted((DOCS / "results" / "data").glob("*.json"))
    assert files
    for f in files:
        data = json.loads(f.read_text())
        if "transcribed" in data:  # a paper's own values: each names its paper and place (the hook checks it)
            hook._cache.clear()
            hook.load(DOCS, f.stem)
        else:
            assert all(data.get(k) for k in hook.PROVENANCE), (f.name, {k: data.get(k) for k in hook.PROVENANCE})
        assert re.search(r"\{\{\s*(?:table\s+)?" + re.escape(f.stem) + ":", pages), f"no page quotes {f.name}"


def test_typed_numbers_are_found_in_prose_but_not_in_code_citations_or_placeholders():
    hook = _hook()
    text = ("DN sec. 4.3 and eqs. 6 and 8, Table 7, `tau 0.05`, [a](x.md#sec-4.4), {{ x:r.a|.2f }}, 95 % CI,\n"
            "```\n0.5\n```\nbut 49.6 ± 4.6 and 57 % are typed\n")
    hits = hook.typed_numbers(text)
    assert [h.split(" in:")[0] for h in hits] == ["'49.6'", "'4.6'", "'57 %'"], hits


def _contract_names() -> dict[str, str]:
    """``{name: module it belongs to}`` for every callable / class of API.md's code blocks."""
    text = API_MD.read_text()
    names: dict[str, str] = {}
    for section, module in (("## xmodal.metrics", "xmodal.metrics"), ("## xmodal.losses", "xmodal.losses"),
                            ("## xmodal.normalize", "xmodal.normalize"),
                            ("## More metrics", "xmodal.metrics")):
        body = _section(text, section)
        for block in _blocks(body, "python"):
            for name in re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)\(", block, flags=re.M):
                names[name] = module
    for name in re.findall(r"`([A-Z][A-Za-z]+)\(", _section(text, "## xmodal.losses")):
        names.setdefault(name, "xmodal.schedules")  # Schedules (`xmodal.schedules`): Constant(v), ...
    for dotted in re.findall(r"xmodal\.([a-z_]+(?:\.[a-z_]+)*)\.([A-Za-z_]+)\b", text):
        module, name = f"xmodal.{dotted[0]}", dotted[1]
        if module == "xmodal.encoders":  # moved in round 4 (API.md's round-4 contract says so)
            module = "xmodal.features.encoders"
        names[name] = module
    names["load_model"] = "xmodal"
    for method in ("encode_video", "encode_text", "similarity", "temperature", "test_time"):
        names[method] = "xmodal.models.TwoTower"
    names["from_arrays"] = "xmodal.data.PairedSplit"
    return names


def test_every_api_page_documents_members(site):
    """A package that exports its names lazily (``__getattr__``) renders no member through its own
    ``:::`` block: its page must name its modules, or it shows only the package docstring."""
    empty = [html.parent.name for html in (site / "reference").glob("*/index.html")
             if html.read_text().count("doc-heading") < 3]
    assert not empty, f"API pages without documented members: {empty}"


def test_api_reference_covers_the_contract(site):
    if not API_MD.is_file():
        pytest.skip(f"{API_MD} is absent (the shared folder is not next to this checkout)")
    ids = set()
    for html in (site / "reference").rglob("index.html"):
        ids |= set(re.findall(r'id="(xmodal[A-Za-z0-9_.]*)"', html.read_text()))
    names = _contract_names()
    assert len(names) >= 30, names
    missing = []
    for name, module in names.items():
        if module in ("xmodal",):
            ok = f"xmodal.{name}" in ids
        else:
            ok = f"{module}.{name}" in ids or any(i.endswith(f".{name}") and i.startswith(module) for i in ids)
        if not ok:
            missing.append(f"{module}.{name}")
    assert not missing, f"not in the API reference: {missing}"


# ----------------------------------------------------------------------------- docstring examples

def _modules_with_examples():
    import xmodal

    for info in pkgutil.walk_packages(xmodal.__path__, "xmodal."):
        spec = importlib.util.find_spec(info.name)
        if spec and spec.origin and ">>>" in Path(spec.origin).read_text():
            yield info.name


@pytest.mark.parametrize("module", sorted(_modules_with_examples()))
def test_docstring_examples_run(module, tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_the_core_api_has_examples():
    """STYLE.md: one short example per public function of the contract, run above."""
    from xmodal import losses, metrics, normalize, schedules

    for module, names in ((metrics, ["retrieval", "text_video", "mir", "normalization_error", "modality_gap"]),
                          (losses, ["InfoNCE", "NCL", "CrossCLR", "CaliNCE"]),
                          (normalize, ["DistributionNormalization", "SinkhornBias"]),
                          (schedules, ["Cosine", "ClassTemperature"])):
        for name in names:
            doc = getattr(module, name).__doc__ or ""
            assert ">>>" in doc, f"{module.__name__}.{name} has no example"


# ----------------------------------------------------------------------------- commands named in the docs

def _parser():
    from xmodal import cli

    return cli.build_parser()


def _subparsers(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def _check_command(parser, words: list[str], where: str) -> None:
    sub = _subparsers(parser)
    assert words and words[0] in sub, f"{where}: unknown command 'xmodal {' '.join(words[:2])}'"
    p = sub[words[0]]
    rest = words[1:]
    nested = _subparsers(p)
    if nested and rest and not rest[0].startswith("-"):
        if not re.fullmatch(r"[a-z]+", rest[0]):  # prose such as `xmodal data import/check`
            return
        assert rest[0] in nested, f"{where}: unknown command 'xmodal {words[0]} {rest[0]}'"
        p, rest = nested[rest[0]], rest[1:]
    known = set(p._option_string_actions)
    for w in rest:
        if w.startswith("--"):
            flag = w.split("=", 1)[0].rstrip(",.;:)")
            if flag.startswith("--") and not flag.endswith("-") and re.fullmatch(r"--[a-z0-9][a-z0-9-]*", flag) \
                    and not (flag.startswith("--optim.") or "." in flag):
                assert flag in known, f"{where}: 'xmodal {words[0]}' has no flag {flag}"


def _doc_commands():
    pages = [DOCS / "results" / "index.md", DOCS / "benchmarks.md", DOCS / "scale.md", DOCS / "getting-started.md",
             DOCS / "search.md", DOCS / "evaluation.md", DOCS / "training.md", DOCS / "sharing.md",
             DOCS / "normalisation.md", DOCS / "video.md", DOCS / "data.md", ROOT / "README.md",
             *sorted((DOCS / "results").glob("*.md")), *sorted((DOCS / "papers").glob("*.md"))]
    for page in pages:
        text = page.read_text()
        snippets = re.findall(r"`([^`\n]*(?:xmodal [a-z]|bench/)[^`\n]*)`", text)
        for block in _blocks(text, "bash") + _blocks(text, "sh"):
            snippets += [line.split("#")[0] for line in block.splitlines()]
        for s in snippets:
            yield page.relative_to(ROOT), s


def test_commands_named_in_the_docs_exist():
    parser = _parser()
    seen_bench = seen_cli = 0
    for where, snippet in _doc_commands():
        for script in re.findall(r"(bench/[A-Za-z0-9_]+\.(?:py|yaml))", snippet):
            assert (ROOT / script).is_file(), f"{where}: {script} does not exist"
            seen_bench += 1
        for part in re.split(r"&&|\|\||;|\|", snippet):
            m = re.search(r"(?:^|[\s(/])xmodal ([a-z]+(?: .*)?)$", part.strip())
            if not m:
                continue
            try:
                words = shlex.split(m.group(1).replace("\\", " "))
            except ValueError:
                words = m.group(1).split()
            if not words or words[0] not in _subparsers(parser) and words[0] in ("trains", "reads", "is", "the"):
                continue
            _check_command(parser, words, f"{where}: `{snippet.strip()}`")
            seen_cli += 1
    assert seen_bench >= 20 and seen_cli >= 40, (seen_bench, seen_cli)


# ----------------------------------------------------------------------------- the tours, verbatim

def _run_block(block: str, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", XMODAL_PROGRESS_SECONDS="3600")
    prelude = f'set -e\nxmodal() {{ "{sys.executable}" -m xmodal "$@"; }}\n'
    res = subprocess.run(["bash", "-c", prelude + block], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_briefly(line: str, cwd: Path) -> str:
    """Start the block's ``xmodal serve`` line on a free port, fetch the page, stop it."""
    port = _free_port()
    args = shlex.split(line.split("#")[0])[1:] + ["--port", str(port)]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "xmodal", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                    return r.read().decode()
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"xmodal serve did not start: {proc.stdout.read() if proc.stdout else ''}")
                time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _with_configs(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "configs", tmp_path / "configs")


@pytest.mark.slow
def test_getting_started_tour_runs(tmp_path):
    text = (DOCS / "getting-started.md").read_text()
    block = _blocks(_section(text, "## A tour on the synthetic default"), "bash")[0]
    _with_configs(tmp_path)
    res = _run_block(block, tmp_path)
    assert "ok: no problems" in res.stdout
    assert "| t2v | R@1 |" in res.stdout  # compare's table
    for f in ("runs/infonce/model.pt", "runs/ncl/metrics.json", "runs/idx/meta.json", "runs/top5.npy",
              "runs/ncl_model/model.safetensors", "runs/ncl/report.html"):
        assert (tmp_path / f).is_file(), f
    top = np.load(tmp_path / "runs" / "top5.npy")
    assert top.shape == (1500, 5) and top.min() >= 0 and top.max() < 500


def _write_video(path: Path, frames: np.ndarray) -> None:
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width, stream.height = frames[0].shape[1], frames[0].shape[0]
        stream.pix_fmt = "yuv420p"
        for a in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(a), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _video_folder(where: Path) -> None:
    """18 short clips in my_videos/ and a pairs.csv with train / val / test rows."""
    rng = np.random.default_rng(0)
    vids = where / "my_videos"
    vids.mkdir(parents=True)
    rows = ["video_id,caption,split"]
    words = ["red", "green", "blue", "dark", "bright", "striped"]
    for v in range(18):
        _write_video(vids / f"v{v}.mp4", rng.integers(0, 256, size=(3, 48, 48, 3), dtype=np.uint8))
        split = "train" if v < 10 else ("val" if v < 14 else "test")
        rows += [f"v{v},a {words[v % 6]} clip number {v},{split}", f"v{v},clip {v} seen again,{split}"]
    (where / "pairs.csv").write_text("\n".join(rows) + "\n")


def _video_tour(block: str, where: Path) -> tuple[subprocess.CompletedProcess, str]:
    """Run a tour block on the generated folder: trainings at test size (2 epochs, small batches;
    the rest of each line as written), every ``xmodal serve`` line started, its page fetched, stopped."""
    lines = block.splitlines()
    serve = [line for line in lines if line.startswith("xmodal serve")]
    rest = "\n".join(line for line in lines if not line.startswith("xmodal serve"))
    rest = rest.replace("model.kind=meanp", "model.kind=meanp train.epochs=2 train.batch_size=8 "
                                            "test_time.bank_size=8 --no-plots")
    _with_configs(where)
    _video_folder(where)
    res = _run_block(rest, where)
    assert serve, "the tour shows the search page"
    return res, _serve_briefly(serve[0], where)


def _needs_video_path():
    pytest.importorskip("av", reason="PyAV (extra [video]) writes the test videos")
    pytest.importorskip("sentence_transformers", reason="MiniLM (extra [encoders]) encodes the captions")
    pytest.importorskip("efficientnet_lite_pytorch", reason="EfficientNet-Lite0 (extra [encoders]) encodes frames")


@pytest.mark.slow
def test_readme_tour_runs(tmp_path):
    _needs_video_path()
    block = _blocks(_section((ROOT / "README.md").read_text(), "## A tour"), "bash")[0]
    res, page = _video_tour(block, tmp_path)
    assert "ok: no problems" in res.stdout and "| t2v | R@1 |" in res.stdout
    assert (tmp_path / "my_model" / "text_tower.onnx").is_file()
    assert (tmp_path / "idx" / "meta.json").is_file()
    assert "<html" in page.lower()


@pytest.mark.slow
def test_getting_started_video_path_runs(tmp_path):
    _needs_video_path()
    text = (DOCS / "getting-started.md").read_text()
    block = _blocks(_section(text, "## The same path with your videos"), "bash")[0]
    res, page = _video_tour(block, tmp_path)
    assert "ok: no problems" in res.stdout
    assert (tmp_path / "runs" / "mine" / "model.pt").is_file() and (tmp_path / "idx" / "index.faiss").is_file()
    assert "<html" in page.lower()
