"""Config: YAML round-trip, overrides, one-line errors naming the bad field."""

from __future__ import annotations

from pathlib import Path

import pytest

from xmodal.config import Config, apply_overrides, from_dict, load_config, save_config, to_dict

REPO = Path(__file__).resolve().parents[1]


def test_defaults_round_trip(tmp_path):
    cfg = Config()
    save_config(cfg, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg


def test_round_trip_with_changes(tmp_path):
    cfg = load_config(None, ["loss.name=ntxent", "optim.lr=3e-4", "test_time.normalizers=[none,dn]",
                             "loss.kwargs.foo=1", "data.synthetic.num_train=300", "optim.betas=[0.8, 0.9]"])
    assert cfg.loss.name == "ntxent" and cfg.optim.lr == 3e-4
    assert cfg.test_time.normalizers == ("none", "dn")
    assert cfg.loss.kwargs == {"foo": 1} and cfg.data.synthetic == {"num_train": 300}
    save_config(cfg, tmp_path / "c.yaml")
    again = load_config(tmp_path / "c.yaml")
    assert again == cfg and to_dict(again) == to_dict(cfg)


def test_overrides_do_not_mutate_input():
    d = {"loss": {"name": "infonce"}}
    out = apply_overrides(d, ["loss.name=dcl"])
    assert d == {"loss": {"name": "infonce"}} and out["loss"]["name"] == "dcl"


@pytest.mark.parametrize("path", sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").rglob("*.yaml")))
def test_every_shipped_config_loads(path, monkeypatch):
    monkeypatch.chdir(REPO)
    text = (REPO / path).read_text()
    if "../shared/data" in text and not (REPO / "../shared/data/flickr8k").is_dir():
        pytest.skip("../shared/data/flickr8k not present on this machine")
    import yaml

    root = (yaml.safe_load(text).get("data") or {}).get("root")
    if root and Path(root).is_absolute() and not Path(root).is_dir():  # configs/scale: a generated layout
        pytest.skip(f"{root} not generated on this machine (bench/scale.py --only layout)")

    from xmodal.losses import LOSSES

    name = (yaml.safe_load(text).get("loss") or {}).get("name", "infonce")
    if name not in LOSSES:
        pytest.skip(f"loss {name!r} is not registered in this install")
    cfg = load_config(REPO / path)
    assert isinstance(cfg, Config)


@pytest.mark.parametrize("overrides, field", [
    (["loss.name=nope"], "loss.name"),
    (["loss.temperature=-0.1"], "loss.temperature"),
    (["loss.temperature=0"], "loss.temperature"),
    (["loss.margin=-1"], "loss.margin"),
    (["optim.lr=0"], "optim.lr"),
    (["optim.name=sgd9"], "optim.name"),
    (["optim.betas=[0.9]"], "optim.betas"),
    (["model.kind=cnn"], "model.kind"),
    (["model.dim=0"], "model.dim"),
    (["model.dropout=1.5"], "model.dropout"),
    (["train.batch_size=1"], "train.batch_size"),
    (["train.epochs=two"], "train.epochs"),
    (["train.seed=1.5"], "train.seed"),
    (["train.amp=yes please"], "train.amp"),
    (["schedule.kind=exp"], "schedule.kind"),
    (["schedule.t_min=0.5", "schedule.t_max=0.1"], "schedule.t_min"),
    (["test_time.normalizers=[none,magic]"], "test_time.normalizers"),
    (["data.noise=1.0"], "data.noise"),
    (["data.name=paired"], "data.root"),
    (["data.name=paired", "data.root=/nonexistent/dir"], "data.root"),
    (["loss.colour=red"], "loss.colour"),
    (["lossy.name=x"], "lossy"),
])
def test_bad_values_name_the_field(overrides, field):
    with pytest.raises(ValueError) as err:
        load_config(None, overrides)
    msg = str(err.value)
    assert field in msg and "\n" not in msg


def test_missing_data_files_name_the_split(tmp_path):
    (tmp_path / "train_caption_features.npy").write_bytes(b"")
    (tmp_path / "train_caption_to_image.npy").write_bytes(b"")
    (tmp_path / "train_image_features.npy").write_bytes(b"")  # h-data: the check now asks for every required file
    with pytest.raises(ValueError, match=r"data.val_split: missing file\(s\) .*dev_video_features.npy .*"
                                         r"dev_text_features.npy \(or dev_caption_features.npy\)"):
        from_dict({"data": {"name": "paired", "root": str(tmp_path), "val_split": "dev"}})


def test_missing_config_file_and_bad_yaml(tmp_path):
    with pytest.raises(FileNotFoundError, match="config"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("loss: [unclosed\n")
    with pytest.raises(ValueError, match="config"):
        load_config(tmp_path / "bad.yaml")
    with pytest.raises(ValueError, match="override"):
        load_config(None, ["no_equals_sign"])


def test_empty_folder_and_non_utf8_configs_are_refused_naming_the_file(tmp_path):
    """Never the defaults in disguise (an empty file) nor a UnicodeDecodeError; only comments: the defaults."""
    (tmp_path / "empty.yaml").write_text(" \n")
    (tmp_path / "latin1.yaml").write_bytes("loss: {name: caf\u00e9}\n".encode("latin-1"))
    (tmp_path / "folder.yaml").mkdir()
    for name, needle in (("empty.yaml", "is empty"), ("latin1.yaml", "is not UTF-8 text"),
                         ("folder.yaml", "is a directory")):
        with pytest.raises(ValueError, match=f"^config: .*{name} {needle}"):
            load_config(tmp_path / name)
    (tmp_path / "comments.yaml").write_text("# the defaults\n")
    assert load_config(tmp_path / "comments.yaml") == load_config(None)


def test_config_is_frozen():
    cfg = Config()
    with pytest.raises(Exception):
        cfg.loss.name = "dcl"  # type: ignore[misc]


def test_packaging_keeps_the_users_torch_and_no_extra_pulls_torchvision():
    """pyproject: torch is a range (installs beside a user's torch); no extra names a package whose
    torchvision requirement would replace torch (open_clip_torch is installed --no-deps by `make bench`)."""
    import tomllib
    from pathlib import Path

    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    torch_req = [d for d in meta["dependencies"] if d.replace(" ", "").startswith("torch")]
    assert torch_req and "==" not in torch_req[0] and ">=" in torch_req[0], torch_req
    for extra, reqs in meta["optional-dependencies"].items():
        for r in reqs:
            name = r.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip().lower()
            assert name not in {"torch", "torchvision", "open_clip_torch", "open-clip-torch"}, (extra, r)
