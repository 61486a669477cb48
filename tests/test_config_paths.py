"""Config paths: relative to the config file, overrides relative to the working directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from xmodal.config import load_config, save_config

REPO = Path(__file__).resolve().parents[1]
F8K = REPO.parent / "shared" / "data" / "flickr8k"


def _layout(root: Path) -> Path:
    """The files the config check asks for (empty files are enough for it)."""
    root.mkdir(parents=True)
    for split in ("train", "val"):
        for name in ("video_features", "text_features", "text_to_video"):
            (root / f"{split}_{name}.npy").write_bytes(b"")
    return root


def _cfg(path: Path, root: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"data": {"name": "paired", "root": root}}))
    return path


def test_relative_root_is_relative_to_the_config_file(tmp_path, monkeypatch):
    data = _layout(tmp_path / "datasets" / "mine")
    cfg_file = _cfg(tmp_path / "configs" / "deep" / "c.yaml", "../../datasets/mine")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the working directory plays no part
    cfg = load_config(cfg_file)
    assert Path(cfg.data.root) == data.resolve()
    # relative config path given from another working directory: same result
    monkeypatch.chdir(tmp_path / "configs")
    assert load_config("deep/c.yaml") == cfg


def test_absolute_root_is_kept(tmp_path, monkeypatch):
    data = _layout(tmp_path / "abs")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(_cfg(tmp_path / "x" / "c.yaml", str(data)))
    assert cfg.data.root == str(data)


def test_override_is_relative_to_the_working_directory(tmp_path, monkeypatch):
    _layout(tmp_path / "configs" / "d")       # what the file-relative reading would find
    data = _layout(tmp_path / "work" / "d")   # what the command line means
    cfg_file = _cfg(tmp_path / "configs" / "c.yaml", "d")
    monkeypatch.chdir(tmp_path / "work")
    assert Path(load_config(cfg_file).data.root) == (tmp_path / "configs" / "d").resolve()
    assert Path(load_config(cfg_file, ["data.root=d"]).data.root) == data.resolve()
    assert Path(load_config(None, ["data.name=paired", "data.root=d"]).data.root) == data.resolve()


def test_saved_run_config_reloads_from_anywhere(tmp_path, monkeypatch):
    _layout(tmp_path / "data")
    cfg = load_config(_cfg(tmp_path / "c.yaml", "data"))
    (tmp_path / "run").mkdir()
    save_config(cfg, tmp_path / "run" / "config.yaml")
    monkeypatch.chdir(tmp_path / "run")
    assert load_config(tmp_path / "run" / "config.yaml") == cfg


def test_missing_root_names_the_field_and_the_resolved_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"data.root: directory .*configs.*nope.* not found"):
        load_config(_cfg(tmp_path / "configs" / "c.yaml", "nope"))


def test_old_cwd_relative_config_still_loads_with_a_warning(tmp_path, monkeypatch):
    data = _layout(tmp_path / "data")
    cfg_file = _cfg(tmp_path / "runs" / "old" / "config.yaml", "data")  # written before the rule
    monkeypatch.chdir(tmp_path)
    with pytest.warns(FutureWarning, match="relative to the config file"):
        cfg = load_config(cfg_file)
    assert Path(cfg.data.root) == data.resolve()


@pytest.mark.parametrize("path", sorted(str(p.relative_to(REPO)) for p in (REPO / "configs").rglob("*.yaml")))
def test_shipped_flickr8k_configs_resolve_from_any_directory(path, tmp_path, monkeypatch):
    text = (REPO / path).read_text()
    if "shared/data" not in text:
        pytest.skip("no data path in this config")
    if not F8K.is_dir():
        pytest.skip("../shared/data/flickr8k not present on this machine")
    from xmodal.losses import LOSSES

    if (yaml.safe_load(text).get("loss") or {}).get("name", "infonce") not in LOSSES:
        pytest.skip("loss not registered in this install")
    monkeypatch.chdir(tmp_path)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no compatibility fallback: the path is file-relative
        cfg = load_config(REPO / path)
    assert Path(cfg.data.root).resolve() == F8K.resolve()
