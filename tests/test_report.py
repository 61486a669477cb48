"""``xmodal report``: a self-contained HTML page (structure always; a real browser render when
chromium is installed), the bench grid page, and the run plots it embeds."""
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from xmodal.cli import main
from xmodal.reporting.plots import plot_curves, selection_key

ROOT = Path(__file__).resolve().parents[1]


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.attrs, self.tables, self.classes = [], [], [], []
        self._cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        self.attrs.append((tag, a))
        self.classes.append(a.get("class", ""))
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = [a.get("class", ""), ""]

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1] += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(tuple(self._cell))
            self._cell = None


def _parse(path):
    p = _Page()
    p.feed(Path(path).read_text(encoding="utf-8"))
    return p


def _self_contained(p):
    assert not {"script", "link", "iframe", "object", "embed"} & set(p.tags)
    for tag, a in p.attrs:
        assert "href" not in a, f"<{tag}> has a link: {a['href'][:60]}"
        if "src" in a:
            assert a["src"].startswith(("data:image/png;base64,", "data:image/jpeg;base64,")), a["src"][:60]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    rc = main(["train", str(ROOT / "configs" / "synthetic.yaml"), "--out", str(out), "--quiet", "--threads", "1",
               "--no-plots", "train.epochs=2", "data.synthetic.num_train=400", "data.synthetic.num_val=120",
               "data.synthetic.num_test=120", "test_time.bank_size=200"])
    assert rc == 0
    return out


def test_run_report_is_self_contained_with_all_sections(run_dir, tmp_path):
    out = tmp_path / "r.html"
    assert main(["report", str(run_dir), "--out", str(out), "--examples", "5", "--threads", "1"]) == 0
    p = _parse(out)
    _self_contained(p)
    text = out.read_text()
    for heading in ("Summary", "Results per test-time normaliser", "Training curves", "Retrieval mass",
                    "Head / tail breakdown", "Example rankings"):
        assert f"<h2>{heading}" in text
    assert sum(1 for t, a in p.attrs if t == "img") >= 3      # curves, mass, FN/FP
    assert len(p.tables) >= 5
    # one query block per example, each with exactly one correct item marked
    assert sum(1 for c in p.classes if c == "query") == 5
    assert sum(1 for c in p.classes if c == "item hit") == 5
    # results table: the best t2v R@1 of the val table is the one marked best
    val = next(t for t in p.tables if t[0][0][1] == "normaliser" and "t2v R@1" in [c[1] for c in t[0]])
    j = [c[1] for c in val[0]].index("t2v R@1")
    vals = [float(r[j][1]) for r in val[1:]]
    marked = [float(r[j][1]) for r in val[1:] if "best" in r[j][0]]
    assert marked and all(m == max(vals) for m in marked)


def test_bench_report_marks_best_cells(tmp_path):
    from xmodal.reporting.benchgrid import METRIC_KEYS, write_tables

    rng = np.random.default_rng(0)
    rows = []
    for obj in ("infonce", "ncl"):
        for norm in ("none", "dn"):
            r = {"dataset": "synthetic", "noise": 0.0, "objective": obj, "normalizer": norm, "split": "test",
                 "n": 2, "selected": "dn"}
            for d in ("t2v", "v2t"):
                for k in METRIC_KEYS:
                    r[f"{d} {k}"] = (float(rng.uniform(1, 50)), float(rng.uniform(0, 2)))
            r["train s"] = (float(rng.uniform(1, 9)), 0.1)
            rows.append(r)
    write_tables(rows, tmp_path)
    out = tmp_path / "b.html"
    assert main(["report", str(tmp_path), "--out", str(out)]) == 0
    p = _parse(out)
    _self_contained(p)
    t = p.tables[0]
    header = [c[1] for c in t[0]]
    for col, better in (("t2v R@1", max), ("v2t MnR", min)):
        j = header.index(col)
        means = [float(r[j][1].split("±")[0]) for r in t[1:]]
        best = [float(r[j][1].split("±")[0]) for r in t[1:] if "best" in r[j][0]]
        assert best == [better(means)]


def test_report_cli_errors(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("xmodal report: error:") and "\n" not in err
    assert main(["report", str(tmp_path)]) == 2          # empty dir: neither run nor bench
    assert "neither a run directory" in capsys.readouterr().err


def test_report_data_is_refused_where_no_data_folder_is_read(run_dir, tmp_path, capsys):
    """--data on a synthetic run (or a run without config.yaml) was silently ignored."""
    import shutil

    data = tmp_path / "data"
    data.mkdir()
    no_config = tmp_path / "run"
    shutil.copytree(run_dir, no_config)
    (no_config / "config.yaml").unlink()
    for run, needle in ((run_dir, "synthetic"), (no_config, "no config.yaml")):
        assert main(["report", str(run), "--data", str(data), "--out", str(tmp_path / "r.html")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("xmodal report: error: --data: ") and needle in err and "\n" not in err, err
    assert not (tmp_path / "r.html").exists()


def test_curves_show_used_temperature_selection_terms_and_gap(tmp_path):
    from PIL import Image

    log = [{"epoch": e, "step": 10 * e, "train_loss": 3.0 / e, "lr": 1e-3, "temperature": 0.05,
            "scheduled": 0.03 + 0.01 * e, "val": {"t2v": {"R@1": 10.0 + e}, "v2t": {"R@1": 12.0 + e}},
            "val_r1": 11.0 + e, "best_epoch": e, "loss_terms": {"t2v": 1.5 / e, "v2t": 1.4 / e},
            "modality_gap": 0.8 - 0.1 * e} for e in (1, 2, 3)]
    assert selection_key(log) == "val_r1"
    assert selection_key([{**r, "val_rsum": 1.0} for r in log]) == "val_rsum"
    w4 = Image.open(plot_curves(log, tmp_path / "a.png")).size[0]
    plain = [{k: v for k, v in r.items() if k not in ("loss_terms", "modality_gap", "scheduled")}
             for r in log]
    w3 = Image.open(plot_curves(plain, tmp_path / "b.png")).size[0]
    assert w4 > w3 * 1.2                                   # the modality-gap panel is there


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="chromium not installed (apt-get install chromium) - browser render not checked")
def test_report_renders_in_headless_chromium(run_dir, tmp_path):
    from PIL import Image

    out = tmp_path / "r.html"
    assert main(["report", str(run_dir), "--out", str(out), "--examples", "2", "--threads", "1"]) == 0
    shot = tmp_path / "shot.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                        "--no-first-run", "--disable-background-networking", "--disable-component-update",
                        "--disable-sync", f"--user-data-dir={profile}", f"--screenshot={shot}",
                        "--window-size=1200,2400", out.resolve().as_uri()],
                       capture_output=True, timeout=180, check=False)
    assert shot.is_file()
    im = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    # text, tables and plots drawn: many dark pixels spread over the page, not a blank render
    dark = im < 128
    assert dark.mean() > 0.005
    assert dark[: im.shape[0] // 2].any() and dark[im.shape[0] // 2:].any()


def test_curves_read_the_keys_the_trainer_writes(run_dir, tmp_path):
    """The gap panel and the per-term losses come from the trainer's own log keys."""
    from PIL import Image

    from xmodal.reporting.plots import read_log

    log = read_log(run_dir)
    assert all("modality_gap" in r for r in log)  # loss_terms only for losses with last_terms (Cali-NCE)
    plain = [{k: v for k, v in r.items() if k not in ("loss_terms", "modality_gap")} for r in log]
    w_real = Image.open(plot_curves(log, tmp_path / "real.png")).size[0]
    w_plain = Image.open(plot_curves(plain, tmp_path / "plain.png")).size[0]
    assert w_real > w_plain * 1.2


def test_report_of_a_killed_run_shows_its_checkpoint(tmp_path, capsys, one_thread):
    """A run stopped after its first epoch (checkpoint.pt, log.jsonl, no metrics.json): the page is written and
    says the run has not finished (was numpy's "need at least one array to concatenate", no page)."""
    from xmodal.config import load_config
    from xmodal.training.loop import train

    run = tmp_path / "run"
    cfg = load_config(ROOT / "configs" / "synthetic.yaml", ["train.epochs=3", "data.synthetic.num_train=200",
                                                           "data.synthetic.num_val=60", "data.synthetic.num_test=60",
                                                           "test_time.bank_size=100", "train.progress=false"])
    assert train(cfg, run, stop_after_epochs=1, verbose=False) == {"stopped": True, "epoch": 1}
    assert not (run / "metrics.json").exists()
    capsys.readouterr()
    assert main(["report", str(run), "--out", str(tmp_path / "r.html"), "--threads", "1", "--examples", "2"]) == 0, \
        capsys.readouterr().err
    html = (tmp_path / "r.html").read_text()
    assert "This run has not finished" in html and "Retrieval mass" in html
