"""``xmodal config``: the resolved config as commented YAML that loads back equal, every key
documented, and ``docs/config.md`` generated from the same help text."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from xmodal.cli import main
from xmodal.config import _SECTION_TYPES, Config, load_config, to_dict
from xmodal.config.doc import missing_help, to_markdown, to_yaml

ROOT = Path(__file__).resolve().parents[1]


def test_every_config_key_has_help_text():
    missing = missing_help()
    assert not missing, (
        "config keys without help text: " + ", ".join(missing) + ". Declare them in src/xmodal/config/__init__.py as "
        "`name: type = key(default, \"what it does\")` (field(metadata={'help': ...})), then regenerate the "
        "reference: xmodal config --markdown > docs/config.md")


def test_docs_config_md_is_up_to_date():
    page = ROOT / "docs" / "config.md"
    assert page.is_file(), "docs/config.md missing: run xmodal config --markdown > docs/config.md"
    assert page.read_text() == to_markdown(), (
        "docs/config.md is stale: regenerate it with `xmodal config --markdown > docs/config.md`")


def test_markdown_lists_every_key_once():
    text = to_markdown()
    for name, cls in _SECTION_TYPES.items():
        for f in fields(cls):
            assert text.count(f"| `{name}.{f.name}` |") == 1, f"{name}.{f.name}"


def _commented_keys(text: str) -> list[str]:
    """Keys of the YAML text whose previous line is a comment (naive line scan)."""
    lines = text.splitlines()
    keys, section = [], None
    for i, line in enumerate(lines):
        if line and not line.startswith((" ", "#")):
            section = line.rstrip(":")
        elif line.startswith("  ") and not line.lstrip().startswith("#"):
            key = line.strip().split(":", 1)[0]
            if lines[i - 1].lstrip().startswith("#"):
                keys.append(f"{section}.{key}")
    return keys


@pytest.mark.parametrize("overrides", [[], ["loss.name=ncl", "optim.lr=3e-4", "test_time.normalizers=[none,dn]",
                                             "loss.kwargs.queue_size=64", "train.log_to=[csv]",
                                             "loss.temperature=null"]])
def test_output_is_a_valid_config_equal_to_the_resolved_one(tmp_path, capsys, overrides):
    src = ROOT / "configs" / "synthetic.yaml"
    assert main(["config", str(src), *overrides]) == 0
    text = capsys.readouterr().out
    expected = load_config(src, overrides)
    out = tmp_path / "resolved.yaml"
    out.write_text(text)
    assert load_config(out) == expected
    assert yaml.safe_load(text) == to_dict(expected)  # every key present, nothing else
    all_keys = [f"{s}.{f.name}" for s, cls in _SECTION_TYPES.items() for f in fields(cls)]
    assert _commented_keys(text) == all_keys  # a comment on every key, in declaration order


def test_defaults_and_set_flag(capsys):
    assert main(["config", "--set", "train.epochs=3"]) == 0
    d = yaml.safe_load(capsys.readouterr().out)
    assert d["train"]["epochs"] == 3
    assert {k: v for k, v in d.items() if k != "train"} == {k: v for k, v in to_dict(Config()).items()
                                                            if k != "train"}
    assert to_yaml().startswith("#")


def test_bad_override_is_one_line_error(capsys):
    assert main(["config", "train.epochs=zero"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("xmodal config: error: train.epochs") and "\n" not in err


def test_pipe_to_head_ends_quietly():
    """``xmodal config | head -0``: the reader is gone before the first write; no traceback."""
    p = subprocess.Popen([sys.executable, "-m", "xmodal", "config"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")})
    p.stdout.close()  # like `head` exiting: the child's writes now fail with EPIPE
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert p.returncode == 141
