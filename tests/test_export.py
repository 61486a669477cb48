"""``xmodal export`` (issue 29): safetensors + config.json + model card; ``xmodal.load_model(DIR)`` gives the
run's model bit for bit, without pickle, and every command that takes a run takes DIR."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import xmodal
from xmodal.cli import main
from xmodal.models import build_model, model_payload
from xmodal.models.hierarchy import GlobalSpec, with_global_towers
from xmodal.retrieval.testtime import NAMES, fit_test_time
from xmodal.runs import atomic_save

pytestmark = pytest.mark.usefixtures("one_thread")


def _with_test_time(model, *, seed: int = 0):
    """Every storable normaliser fitted on random banks (a DN state, train and NCL banks)."""
    g = torch.Generator().manual_seed(seed)
    d = model.dim
    t, v = torch.randn(40, d, generator=g), torch.randn(30, d, generator=g)
    tt = fit_test_time(["none", "dn", "sinkhorn", "ncl", "qbnorm", "is", "dsl"], text_bank=t, video_bank=v,
                       ncl_bank=(torch.randn(12, d, generator=g), torch.randn(9, d, generator=g)),
                       temperature=0.07, dn_num_samples=None)
    tt.selected, tt.val = "sinkhorn", {n: {"t2v": {"R@1": 1.0 + i}, "v2t": {"R@1": 2.0}}
                                       for i, n in enumerate(tt.names)}
    model.test_time = tt
    model.temperature = 0.07
    return model


def _randomize(model, seed: int = 1):
    """Non-trivial weights and standardisation (a fresh model's buffers are zeros and ones)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point() and t.ndim >= 1:
                t.copy_(torch.randn(t.shape, generator=g) * 0.3 + (1.0 if t.ndim == 1 else 0.0))
    return model.eval()


VARIANTS = {
    "linear": lambda: build_model(video_dim=12, text_dim=8, dim=6),
    "mlp_experts_gated": lambda: build_model(video_dim=12, text_dim=8, dim=6, kind="mlp", width=10,
                                             experts={"audio": 5, "flow": 7}, fusion="gated"),
    "transformer_tokens": lambda: build_model(video_dim=12, text_dim=8, dim=6, kind="transformer",
                                              text_kind="transformer", hidden=16, heads=2, text_tokens=7),
    "hierarchical": lambda: with_global_towers(build_model(video_dim=12, text_dim=8, dim=8, kind="meanp"),
                                               GlobalSpec(dim=8, heads=2, pooling="max")),
}


def _inputs(model, seed: int = 2):
    g = torch.Generator().manual_seed(seed)
    tspec = model.text_tower.spec
    text = torch.randn(9, 4, tspec.in_dim, generator=g) if tspec.tokens else torch.randn(9, tspec.in_dim, generator=g)
    tmask = (torch.arange(4)[None] < torch.tensor([1, 2, 3, 4, 4, 3, 2, 1, 4])[:, None]) if tspec.tokens else None
    if model.experts:
        video = {k: torch.randn(6, 3, model.video_tower.towers[k].spec.in_dim, generator=g) for k in model.experts}
        vmask = {"audio": torch.tensor([True, False, True, True, False, True])}
    else:
        video = torch.randn(6, 3, model.video_tower.spec.in_dim, generator=g)
        vmask = torch.arange(3)[None] < torch.tensor([1, 2, 3, 3, 2, 1])[:, None]
    return text, tmask, video, vmask


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_export_round_trip_is_bit_identical(tmp_path, variant):
    model = _with_test_time(_randomize(VARIANTS[variant]()))
    atomic_save({"model": model_payload(model)}, tmp_path / "model.pt")
    assert main(["export", str(tmp_path / "model.pt"), "--out", str(tmp_path / "ex")]) == 0
    run, ex = xmodal.load_model(tmp_path / "model.pt"), xmodal.load_model(tmp_path / "ex")
    assert type(ex) is type(run) and ex.architecture() == run.architecture()
    a, b = run.state_dict(), ex.state_dict()
    assert list(a) == list(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
    ta, tb = run.test_time, ex.test_time
    assert (ta.names, ta.selected, ta.val, ta.hparams, ta.temperature) == (tb.names, tb.selected, tb.val, tb.hparams,
                                                                           tb.temperature)
    for bank in ta.banks:
        assert all(torch.equal(x, y) for x, y in zip(ta.banks[bank], tb.banks[bank]))
    text, tmask, video, vmask = _inputs(run)
    assert torch.equal(run.encode_text(text, tmask), ex.encode_text(text, tmask))
    assert torch.equal(run.encode_video(video, vmask), ex.encode_video(video, vmask))
    for name in ("selected", *[n for n in NAMES if n in ta.names or n == "sinkhorn_oracle"]):
        for direction in ("t2v", "v2t"):
            sa = run.similarity(text, video, name, direction=direction, video_mask=vmask, text_mask=tmask)
            sb = ex.similarity(text, video, name, direction=direction, video_mask=vmask, text_mask=tmask)
            assert torch.equal(sa, sb), (name, direction)


def test_config_json_is_plain_and_dn_means_are_inline(tmp_path):
    model = _with_test_time(_randomize(VARIANTS["linear"]()))
    atomic_save({"model": model_payload(model)}, tmp_path / "model.pt")
    main(["export", str(tmp_path / "model.pt"), "--out", str(tmp_path / "ex")])
    cfg = json.loads((tmp_path / "ex" / "config.json").read_text())
    assert cfg["format"] == "xmodal-export" and cfg["feature_sizes"]["video"] == 12 and cfg["feature_sizes"]["text"] == 8
    assert cfg["architecture"] == model.architecture()
    dn = cfg["test_time"]["dn"]["tensors"]
    want = model.test_time.dn["tensors"]
    for k, rec in dn.items():  # the fitted means as plain lists, exactly
        assert torch.equal(torch.tensor(rec["values"], dtype=getattr(torch, rec["dtype"])), want[k].flatten())
    from safetensors.torch import load_file

    tensors = load_file(str(tmp_path / "ex" / "model.safetensors"))
    assert torch.equal(tensors[cfg["test_time"]["banks"]["ncl"]["text"]["tensor"]], model.test_time.banks["ncl"][0])
    assert set(tensors) - set(model.state_dict()) == {"test_time.banks.train.text", "test_time.banks.train.video",
                                                      "test_time.banks.ncl.text", "test_time.banks.ncl.video"}


# --------------------------------------------------------------------------- a trained run, handed on

def _paired(root: Path, rng) -> None:
    root.mkdir()
    for split, n in (("train", 60), ("val", 30), ("test", 30)):
        np.save(root / f"{split}_video_features.npy", rng.standard_normal((n, 10)).astype(np.float32))
        np.save(root / f"{split}_text_features.npy", rng.standard_normal((2 * n, 6)).astype(np.float32))
        np.save(root / f"{split}_text_to_video.npy", np.repeat(np.arange(n), 2))
        (root / f"{split}_videos.txt").write_text("".join(f"{split}/v{i}.mp4\n" for i in range(n)))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from xmodal.config import from_dict
    from xmodal.training.loop import train

    root = tmp_path_factory.mktemp("handon")
    _paired(root / "data", np.random.default_rng(0))
    cfg = from_dict({"data": {"name": "paired", "root": str(root / "data")}, "model": {"kind": "linear", "dim": 8},
                     "loss": {"name": "infonce", "temperature": 0.1}, "optim": {"lr": 3e-3},
                     "test_time": {"normalizers": ["none", "dn", "sinkhorn", "qbnorm"], "bank_size": 50},
                     "train": {"seed": 1, "epochs": 3, "batch_size": 20, "patience": 0, "device": "cpu"}})
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(cfg, root / "run", verbose=False, command="xmodal train c.yaml --out run")
    finally:
        torch.set_num_threads(before)
    return root


def _json(capsys, argv) -> dict:
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_export_is_loaded_indexed_and_searched_elsewhere_without_the_run_or_pickle(trained, tmp_path, capsys,
                                                                                    monkeypatch):
    run, data = trained / "run", trained / "data"
    assert main(["export", str(run), "--out", str(tmp_path / "ex")]) == 0
    # the run's own numbers, before the run folder goes away
    want_eval = _json(capsys, ["eval", "--run", str(run), "--data", str(data), "--split", "test", "--json"])
    assert main(["index", "--run", str(run), "--data", str(data), "--split", "test", "--out", str(tmp_path / "i1"),
                 "--normalizer", "sinkhorn"]) == 0
    t = np.load(data / "test_text_features.npy")
    np.save(tmp_path / "t.npy", t[:7])
    want_query = _json(capsys, ["query", "--index", str(tmp_path / "i1"), "--text-features", str(tmp_path / "t.npy"),
                                "--k", "5", "--json"])
    model_run = xmodal.load_model(run)
    want_sim = {n: model_run.similarity(t, np.load(data / "test_video_features.npy"), n) for n in model_run.test_time.names}

    # "another machine": only the export folder, moved; no run folder; pickle refused outright
    other = tmp_path / "elsewhere" / "model"
    other.parent.mkdir()
    shutil.copytree(tmp_path / "ex", other)
    shutil.rmtree(tmp_path / "ex")
    hidden = trained / "run_hidden"
    run.rename(hidden)
    try:
        import pickle

        def refuse(*a, **k):
            raise AssertionError("pickle used")

        monkeypatch.setattr(torch, "load", refuse)
        monkeypatch.setattr(pickle, "load", refuse)
        monkeypatch.setattr(pickle, "loads", refuse)
        monkeypatch.setattr(pickle, "Unpickler", refuse)
        model = xmodal.load_model(other)
        for name, sim in want_sim.items():
            assert torch.equal(model.similarity(t, np.load(data / "test_video_features.npy"), name), sim), name
        got_eval = _json(capsys, ["eval", "--run", str(other), "--data", str(data), "--split", "test", "--json"])
        assert main(["index", "--run", str(other), "--data", str(data), "--split", "test",
                     "--out", str(tmp_path / "i2"), "--normalizer", "sinkhorn"]) == 0
        assert sorted(p.name for p in (tmp_path / "i2").iterdir()) == ["config.json", "index.faiss", "meta.json",
                                                                      "model.safetensors", "names.txt",
                                                                      "query_shift.npy", "texts.faiss", "texts.json", "texts.npy",
                                                                      "videos.npy"]
        got_query = _json(capsys, ["query", "--index", str(tmp_path / "i2"), "--text-features",
                                   str(tmp_path / "t.npy"), "--k", "5", "--json"])
    finally:
        hidden.rename(run)
    for key in ("t2v", "v2t"):
        assert got_eval[key] == want_eval[key]
    assert got_query == want_query  # same indices, bit-identical scores


def test_index_from_a_run_after_an_export_index_drops_the_other_head(trained, tmp_path):
    run, data = trained / "run", trained / "data"
    main(["export", str(run), "--out", str(tmp_path / "ex")])
    idx = str(tmp_path / "idx")
    main(["index", "--run", str(tmp_path / "ex"), "--data", str(data), "--split", "val", "--out", idx])
    main(["index", "--run", str(run), "--data", str(data), "--split", "val", "--out", idx, "--overwrite"])
    names = sorted(p.name for p in Path(idx).iterdir())
    assert "model.pt" in names and "model.safetensors" not in names and "config.json" not in names
    main(["index", "--run", str(tmp_path / "ex"), "--data", str(data), "--split", "val", "--out", idx, "--overwrite"])
    names = sorted(p.name for p in Path(idx).iterdir())
    assert "model.pt" not in names and "model.safetensors" in names
    from xmodal.retrieval.search import SearchIndex

    assert torch.equal(SearchIndex(idx).model.state_dict()["text_tower.net.weight"],
                       xmodal.load_model(run).state_dict()["text_tower.net.weight"])


def test_model_card_is_written_from_the_run(trained, tmp_path):
    from xmodal.metrics import format_metric

    run = trained / "run"
    assert main(["export", str(run), "--out", str(tmp_path / "ex")]) == 0
    card = (tmp_path / "ex" / "README.md").read_text()
    prov = json.loads((run / "provenance.json").read_text())
    metrics = json.loads((run / "metrics.json").read_text())
    assert card.startswith("---\nlibrary_name: xmodal\n")
    assert len(prov["data"]) >= 9  # train/val/test features, maps, names
    for path, digest in prov["data"].items():  # the data's provenance: every file's hash
        assert f"`{Path(path).name}` | `{digest}`" in card
    assert prov["command"] in card and prov["git_revision"] in card
    selected = metrics["normalizer"]
    for split in ("val", "test"):
        for name, dirs in metrics[split].items():
            if name == "protocol":
                continue
            label = f"**{name}** (selected)" if name == selected else name
            for direction, vals in dirs.items():
                row = " | ".join([label, direction, *(format_metric(k, v) for k, v in vals.items())])
                assert f"| {row} |" in card, (split, name, direction)
    assert "Protocol card: not recorded" not in card  # the trainer records one per split
    for split in ("val", "test"):
        assert f"| `num_queries` | {metrics[split]['protocol']['num_queries']} |" in card, split
    assert "## Intended use" in card and "## Limitations" in card and "huggingface-cli upload" in card
    assert "a different extractor" in card.lower() or "another extractor" in card.lower()
    assert f"Selected: **{selected}**" in card

    # a run written before the protocol card (val has none) and a card given by hand for test
    copy = tmp_path / "run2"
    shutil.copytree(run, copy)
    m = json.loads((copy / "metrics.json").read_text())
    del m["val"]["protocol"]
    m["test"]["protocol"] = {"num_queries": 60, "gallery_size": 30, "chance_r1": 100 / 30, "caption_policy": "all",
                             "tie_rule": "pessimistic", "normalizer": selected, "bank_source": "train",
                             "uses_test_queries": False, "split_sha256": "ab" * 32, "git_revision": None}
    (copy / "metrics.json").write_text(json.dumps(m))
    assert main(["export", str(copy), "--out", str(tmp_path / "ex2")]) == 0
    card2 = (tmp_path / "ex2" / "README.md").read_text()
    assert card2.count("Protocol card: not recorded") == 1
    for key, value in (("num_queries", "60"), ("gallery_size", "30"), ("tie_rule", "pessimistic"),
                       ("split_sha256", "ab" * 32), ("git_revision", "not recorded"), ("chance_r1", "3.333")):
        assert f"| `{key}` | {value} |" in card2, key
    assert "| protocol |" not in card2  # never a row of the metric table


# --------------------------------------------------------------------------- issue 35.3: a card to follow

def test_card_front_matter_parses_with_huggingface_hub(trained, tmp_path):
    """license, datasets, base_model, pipeline_tag and model-index results (with their intervals) as
    huggingface_hub's ModelCard reads them; each value and interval recomputed from per_query.npz."""
    hub = pytest.importorskip("huggingface_hub", reason="huggingface_hub (comes with transformers) not installed")
    from xmodal.metrics.paired import bootstrap_interval

    run = trained / "run"
    assert main(["export", str(run), "--out", str(tmp_path / "ex"), "--license", "cc-by-4.0", "--dataset",
                 "nlphuji/flickr30k", "--dataset", "my-features"]) == 0
    card = hub.ModelCard.load(tmp_path / "ex" / "README.md")
    data = card.data
    assert data.license == "cc-by-4.0" and data.datasets == ["nlphuji/flickr30k", "my-features"]
    assert data.pipeline_tag == "feature-extraction" and data.library_name == "xmodal"
    metrics = json.loads((run / "metrics.json").read_text())
    selected = metrics["normalizer"]
    with np.load(run / "per_query.npz") as z:
        ranks = {d: z[f"test/{selected}/{d}/rank"] for d in ("t2v", "v2t")}
    results = data.eval_results
    assert len(results) == 6  # t2v and v2t x R@1, R@5, R@10
    for r in results:
        direction = "t2v" if r.task_type == "text-to-video-retrieval" else "v2t"
        metric = {"recall_at_1": "R@1", "recall_at_5": "R@5", "recall_at_10": "R@10"}[r.metric_type]
        value, lo, hi = bootstrap_interval(ranks[direction], metric=metric, n_boot=2000, seed=0)
        assert r.metric_value == pytest.approx(value, abs=1e-4) and r.dataset_split == "test"
        assert r.metric_value == pytest.approx(metrics["test"][selected][direction][metric], abs=1e-3)
        assert (r.metric_args["ci_low"], r.metric_args["ci_high"]) == (pytest.approx(lo, abs=1e-4),
                                                                       pytest.approx(hi, abs=1e-4))
        assert r.dataset_type == "nlphuji/flickr30k" and f"{lo:.2f}-{hi:.2f}" in r.metric_name
    text = (tmp_path / "ex" / "README.md").read_text()
    assert 'pip install "xmodal==' in text and "## Citation" in text and "Repository:" in text
    assert "## License" in text and "`cc-by-4.0`" in text

    assert main(["export", str(run), "--out", str(tmp_path / "plain")]) == 0  # no licence stated
    card = hub.ModelCard.load(tmp_path / "plain" / "README.md")
    assert card.data.license == "other" and card.data.datasets is None
    assert "no licence was stated at export" in card.text


def _leaves(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, path + (str(k),))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, path + (str(i),))
    else:
        yield path, node


def test_card_values_read_back_as_text_under_yaml_1_2(trained, tmp_path):
    """Issue 44 item 9: ``--license 1e5`` / ``--dataset 0o17`` went out bare; a YAML 1.2 reader (ruamel.yaml)
    read them back as numbers. Every text value must read back as the same text under 1.2 and 1.1."""
    ruamel = pytest.importorskip("ruamel.yaml", reason="ruamel.yaml (YAML 1.2; the dev extra) not installed")
    import yaml

    stated = ["0o17", "0x1F", "1e3", "123", "1.5", "true", "null", "Yes", "my-features"]
    assert main(["export", str(trained / "run"), "--out", str(tmp_path / "ex"), "--license", "1e5",
                 *[a for d in stated for a in ("--dataset", d)]]) == 0
    text = (tmp_path / "ex" / "README.md").read_text()
    head = text.split("---\n")[1]
    v12 = ruamel.YAML(typ="safe", pure=True).load(head)
    v11 = yaml.safe_load(head)
    assert v12["license"] == "1e5" and v12["datasets"] == stated
    assert v12["model-index"][0]["results"][0]["dataset"]["type"] == "0o17"
    numbers = 0
    for (path, a), (path11, b) in zip(_leaves(v12), _leaves(v11), strict=True):
        assert path == path11 and type(a) is type(b) and a == b, (path, a, b)  # one meaning for both readers
        if path[0] != "model-index" or path[-2] == "dataset" or path[-1] in ("type", "name", "normalizer",
                                                                             "interval"):
            assert isinstance(a, str), (path, a)  # every text value, compared as text
        else:
            numbers += isinstance(a, float)
    assert numbers > 0  # the metric values themselves stay numbers


def test_base_model_names_the_hub_encoders(tmp_path):
    hub = pytest.importorskip("huggingface_hub", reason="huggingface_hub (comes with transformers) not installed")
    m = _with_test_time(_randomize(build_model(video_dim=1280, text_dim=384, dim=4)))
    atomic_save({"model": model_payload(m)}, tmp_path / "model.pt")
    assert main(["export", str(tmp_path / "model.pt"), "--out", str(tmp_path / "a")]) == 0
    assert hub.ModelCard.load(tmp_path / "a" / "README.md").data.base_model == ["sentence-transformers/all-MiniLM-L6-v2"]
    assert 'pip install "xmodal[encoders]==' in (tmp_path / "a" / "README.md").read_text()  # to compute such features
    # a record with a hub id (as the encoder identity carries it), read defensively: junk ids are skipped
    from xmodal.reporting.card import hub_names

    assert hub_names({"text": {"spec": "hf:/models/clip", "hub_id": "openai/clip-vit-base-patch32"},
                      "video": {"hub_id": "../../etc"}, "experts": {"a": {"hub_id": "x/y\nz"}}}) == [
        "openai/clip-vit-base-patch32"]
    assert hub_names(["junk"]) == [] and hub_names({"text": "minilm"}) == []


def test_no_absolute_path_in_the_export_folder(trained, tmp_path):
    """The data folder becomes the data's SHA-256; the command's paths keep their last component."""
    import hashlib

    run = trained / "run"
    assert main(["export", str(run), "--out", str(tmp_path / "ex")]) == 0
    prov = json.loads((run / "provenance.json").read_text())
    for f in (tmp_path / "ex").iterdir():
        text = f.read_text(errors="replace")
        for root in {str(trained), str(trained.resolve()), str(tmp_path), "/tmp/"}:
            assert root not in text, (f.name, root)
    cfg = json.loads((tmp_path / "ex" / "config.json").read_text())
    lines = sorted(f"{Path(k).name} {v}" for k, v in prov["data"].items())
    assert cfg["run_config"]["data"]["root"] == "sha256:" + hashlib.sha256("\n".join(lines).encode()).hexdigest()
    card = (tmp_path / "ex" / "README.md").read_text()
    assert cfg["run_config"]["data"]["root"] in card and "data: paired from /" not in card


def test_card_values_are_inert_markdown(tmp_path, capsys):
    """issue 36.12: a newline in --text-encoder injected HTML into the card; flags are refused, and what a
    config.json carries is written inert."""
    run = _small(tmp_path)
    capsys.readouterr()
    for flag, value in (("--text-encoder", "x\n<script>alert(1)</script>"), ("--video-encoder", "a`b"),
                        ("--license", "MIT License"), ("--dataset", "a b")):
        assert main(["export", str(run), "--out", str(tmp_path / "ex"), flag, value]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"xmodal export: error: {flag}: ") and err.count("\n") == 1, err
    assert not (tmp_path / "ex").exists()
    assert main(["export", str(run), "--out", str(tmp_path / "ex"), "--video-encoder", "clip <b>|bold</b>"]) == 0
    card = (tmp_path / "ex" / "README.md").read_text()
    assert "<b>" not in card and "`clip &lt;b&gt;\\|bold&lt;/b&gt;`" in card
    # records a config.json or a run carries (an encoder identity, a metrics.json) are written inert too
    from xmodal.reporting.card import model_card

    cfg = json.loads((tmp_path / "ex" / "config.json").read_text())
    cfg["encoders"]["text"] = {"name": "m\n\n<img src=x onerror=alert(1)>", "description": "d\n# heading",
                               "source": "`code` | cell", "spec": "hf:/home/me/models/clip"}
    metrics = {"normalizer": "none", "metric": "rsum\n<script>", "test": {"none\n# x": {"t2v": {"R@1": 1.0}}}}
    card = model_card(cfg, {"name": "r\n<h1>", "metrics": metrics, "provenance": {"command": "a\n<p>"}})
    assert "<img" not in card and "<script>" not in card and "<h1>" not in card and "<p>" not in card
    assert "\n# heading" not in card and "\n# x" not in card and "/home/me" not in card
    assert "&lt;img src=x onerror=alert(1)&gt;" in card and "hf:…/clip" in card


def test_encoders_stated_inferred_or_not_recorded(tmp_path, capsys):
    m = _with_test_time(_randomize(build_model(video_dim=1280, text_dim=384, dim=4)))
    atomic_save({"model": model_payload(m)}, tmp_path / "model.pt")
    main(["export", str(tmp_path / "model.pt"), "--out", str(tmp_path / "a")])
    enc = json.loads((tmp_path / "a" / "config.json").read_text())["encoders"]
    assert enc["text"]["name"] == "minilm" and enc["text"]["source"].startswith("inferred")
    assert enc["video"]["name"] == "efficientnet-lite0" and enc["video"]["source"].startswith("inferred")
    main(["export", str(tmp_path / "model.pt"), "--out", str(tmp_path / "a"), "--video-encoder", "my-clip"])
    enc = json.loads((tmp_path / "a" / "config.json").read_text())["encoders"]
    assert enc["video"] == {"name": "my-clip", "spec": "my-clip", "source": "stated with --video-encoder at export"}
    m2 = _with_test_time(_randomize(build_model(video_dim=10, text_dim=6, dim=4)))
    atomic_save({"model": model_payload(m2)}, tmp_path / "m2.pt")
    capsys.readouterr()
    assert main(["export", str(tmp_path / "m2.pt"), "--out", str(tmp_path / "b"), "--text-encoder", "minilm"]) == 2
    assert "--text-encoder: minilm makes 384-d features but the run's text tower takes 6-d" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "m2.pt"), "--out", str(tmp_path / "b")]) == 0
    assert "| text | not recorded | 6 |" in (tmp_path / "b" / "README.md").read_text()


# --------------------------------------------------------------------------- the folder's rules

def _small(tmp_path) -> Path:
    m = _with_test_time(_randomize(VARIANTS["linear"]()))
    (tmp_path / "run").mkdir()
    atomic_save({"model": model_payload(m)}, tmp_path / "run" / "model.pt")
    return tmp_path / "run"


def test_export_twice_replaces_its_files_and_refuses_foreign_folders(tmp_path, capsys):
    run = _small(tmp_path)
    out = tmp_path / "ex"
    assert main(["export", str(run), "--out", str(out)]) == 0
    first = (out / "model.safetensors").read_bytes()
    (out / "video_tower.onnx").write_bytes(b"stale tower of another model")
    assert main(["export", str(run), "--out", str(out)]) == 0
    assert (out / "model.safetensors").read_bytes() == first  # deterministic
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    capsys.readouterr()
    (out / "notes.txt").write_text("mine")
    assert main(["export", str(run), "--out", str(out)]) == 2
    assert "holds files that are not an xmodal export's (notes.txt)" in capsys.readouterr().err
    assert main(["export", str(run), "--out", str(run / "export")]) == 2
    assert "inside the run directory" in capsys.readouterr().err
    assert main(["export", str(run), "--out", str(run / "model.pt")]) == 2
    assert main(["export", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")]) == 2
    assert "xmodal export: error: RUN:" in capsys.readouterr().err


def test_a_killed_re_export_leaves_the_previous_export_whole(tmp_path, monkeypatch, capsys):
    """issue 36.4: the folder is built beside --out and swapped in at the end; a re-export killed before its
    last file (the old code removed config.json first) leaves the previous export as it was, loadable."""
    import xmodal.runs

    run = _small(tmp_path)
    out = tmp_path / "ex"
    real = xmodal.runs.atomic_write_text

    def die_on_config(path, text):
        if Path(path).name == "config.json":
            raise KeyboardInterrupt  # killed just before the last file
        real(path, text)

    assert main(["export", str(run), "--out", str(out), "--license", "mit"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(xmodal.runs, "atomic_write_text", die_on_config)
    with pytest.raises(KeyboardInterrupt):
        main(["export", str(run), "--out", str(out), "--license", "apache-2.0"])
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the previous export, byte for byte
    xmodal.load_model(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ex", "run"]  # the staging folder went too
    # a kill -9 leaves the staging folder: the next export removes it
    stale = tmp_path / ".ex.tmp999999"
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    assert main(["export", str(run), "--out", str(out), "--license", "apache-2.0"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ex", "run"]
    assert "license: apache-2.0" in (out / "README.md").read_text()


def _rewrite(folder: Path, fn) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    fn(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("damage, words", [
    (lambda f: (f / "config.json").write_text("{not json"), "is not valid JSON"),
    (lambda f: _rewrite(f, lambda c: c.update(format="other")), "was not written by 'xmodal export'"),
    (lambda f: _rewrite(f, lambda c: c.update(version=99)), "export version 99"),
    (lambda f: _rewrite(f, lambda c: c["architecture"]["video"].update(in_dim=10 ** 9)),
     "holds video_tower.standardize.mean as float32 [12]; config.json declares float32 [1000000000]"),
    (lambda f: _rewrite(f, lambda c: c["test_time"]["banks"]["train"]["text"].update(tensor="test_time.nope")),
     "lacks test_time.nope, which config.json declares"),
    (lambda f: _rewrite(f, lambda c: c["test_time"]["banks"]["train"]["text"].update(tensor="nope")),
     "test_time.banks.train.text.tensor: expected a test_time.* entry of model.safetensors, got 'nope'"),
    (lambda f: _rewrite(f, lambda c: c["test_time"]["dn"]["tensors"]["mu_q"].update(shape=[3])),
     "values where the record says shape [3]"),
    (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:100]),
     "is not a readable safetensors file"),
    (lambda f: (f / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}"),
     "is not a readable safetensors file"),
])
def test_a_damaged_export_is_one_line_naming_the_flag(tmp_path, capsys, damage, words):
    run = _small(tmp_path)
    out = tmp_path / "ex"
    main(["export", str(run), "--out", str(out)])
    damage(out)
    with pytest.raises(ValueError, match="is not a loadable xmodal export") as err:
        xmodal.load_model(out)
    assert words in str(err.value) and "\n" not in str(err.value)
    np.save(tmp_path / "v.npy", np.zeros((3, 12), np.float32))
    capsys.readouterr()
    assert main(["index", "--run", str(out), "--video-features", str(tmp_path / "v.npy"),
                 "--out", str(tmp_path / "idx")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("xmodal index: error: --run:") and words in err and err.count("\n") == 1


def test_export_of_an_export(tmp_path):
    run = _small(tmp_path)
    main(["export", str(run), "--out", str(tmp_path / "a")])
    assert main(["export", str(tmp_path / "a"), "--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    a = json.loads((tmp_path / "a" / "config.json").read_text())
    b = json.loads((tmp_path / "b" / "config.json").read_text())
    assert a["test_time"] == b["test_time"] and a["architecture"] == b["architecture"]


def test_report_of_an_export_points_at_its_card(tmp_path, capsys):
    run = _small(tmp_path)
    main(["export", str(run), "--out", str(tmp_path / "ex")])
    capsys.readouterr()
    assert main(["report", str(tmp_path / "ex"), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "a folder written by 'xmodal export': its model card is" in err and "README.md" in err
    assert not (tmp_path / "r.html").exists()
