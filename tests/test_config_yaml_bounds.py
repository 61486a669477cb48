"""A config's YAML is parsed within bounds (issue 25.6): an alias bomb, a recursive alias, deep
nesting, a duplicate key, a huge integer or a huge file is one line naming the file, at once,
in ``xmodal config`` and ``xmodal train``; never a MemoryError or RecursionError traceback."""

from __future__ import annotations

import resource
import time

import pytest

from xmodal.cli import main
from xmodal.config import MAX_YAML_DEPTH, MAX_YAML_NODES, load_config, parse_overrides


def _bomb(levels: int = 10, width: int = 9) -> str:
    """The "billion laughs": ``width ** levels`` scalars from ~600 bytes (9**10 = 3.5e9)."""
    lines = ["loss:", "  kwargs:", "    a0: &a0 [" + ", ".join(["x"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


CASES = {
    "bomb": (_bomb(), f"aliases expand to more than {MAX_YAML_NODES} values"),
    "recursive_list": ("a: &a [*a]\n", "recursive alias"),
    "recursive_map": ("loss:\n  kwargs: &a {x: *a}\n", "recursive alias"),
    "deep_lists": ("a: " + "[" * 10_000 + "]" * 10_000 + "\n", f"nested deeper than {MAX_YAML_DEPTH} levels"),
    "deep_maps": ("a: " + "{b: " * 10_000 + "1" + "}" * 10_000 + "\n", f"nested deeper than {MAX_YAML_DEPTH}"),
    # each anchor defined 3 levels deep, but the chain nests 40 levels once expanded
    "alias_chain": ("loss:\n  kwargs:\n    a0: &a0 [x]\n" + "".join(f"    a{i}: &a{i} [*a{i - 1}]\n"
                                                                    for i in range(1, 40)),
                    f"aliases nest deeper than {MAX_YAML_DEPTH} levels"),
    "duplicate_section": ("train: {epochs: 1}\ntrain: {epochs: 2}\n", "key 'train' given twice"),
    "duplicate_key": ("train:\n  epochs: 1\n  epochs: 2\n", "key 'epochs' given twice"),
    "huge_int": ("train: {epochs: " + "9" * 5000 + "}\n", "integer of 5000 digits"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("command", ["config", "train"])
def test_hostile_yaml_is_one_line_naming_the_file(case, command, tmp_path, capsys):
    text, expected = CASES[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    argv = [command, str(path)] + (["--out", str(tmp_path / "run")] if command == "train" else [])
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, hard))  # a bomb expanding would die here, not swap
    t0 = time.perf_counter()
    try:
        rc = main(argv)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert err.startswith(f"xmodal {command}: error: config: {path}") and "\n" not in err, err
    assert expected in err, err
    assert time.perf_counter() - t0 < 60  # not a guard on speed: a bomb expanding takes minutes
    assert not (tmp_path / "run").exists()


def test_anchors_and_merge_keys_within_bounds_still_work(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim: &o {lr: 0.002}\n"
                    "train: {<<: {epochs: 3, batch_size: 16}, epochs: 2}\n"  # an explicit key overrides a merged one
                    "test_time: {normalizers: &n [none, dn]}\n")
    cfg = load_config(path)
    assert cfg.optim.lr == 0.002 and cfg.train.epochs == 2 and cfg.train.batch_size == 16
    assert cfg.test_time.normalizers == ("none", "dn")


def test_nesting_up_to_the_bound_is_accepted(tmp_path):
    """The document's mapping is level 1, loss's 2, kwargs' 3, x's value 4: ``n`` lists put the
    innermost scalar at level ``4 + n``."""
    def nested(n: int) -> str:
        path = tmp_path / f"c{n}.yaml"
        path.write_text("loss:\n  kwargs:\n    x: " + "[" * n + "1" + "]" * n + "\n")
        try:
            load_config(path)
        except ValueError as exc:
            return str(exc)
        return ""

    assert "nested deeper" not in nested(MAX_YAML_DEPTH - 4)
    assert f"nested deeper than {MAX_YAML_DEPTH} levels" in nested(MAX_YAML_DEPTH - 3)


def test_bounded_overrides_name_the_override():
    with pytest.raises(ValueError, match=r"override 'loss.kwargs=.*: nested deeper"):
        parse_overrides(["loss.kwargs=" + "[" * 100 + "]" * 100])
    with pytest.raises(ValueError, match=r"override 'train.epochs=.*given twice"):
        parse_overrides(["train.epochs={a: 1, a: 2}"])


def test_a_huge_config_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * (2 << 20) + "\n")
    with pytest.raises(ValueError, match="bytes; a config is a few KB"):
        load_config(path)


@pytest.mark.parametrize("text, expected", [
    ("train: {seed: 99999999999999999999999}\n", "train.seed: must lie in [0, 2**32)"),
    ("train: {seed: -5}\n", "train.seed: must lie in [0, 2**32)"),
    ("data: {synthetic: {bogus: 1}}\n", "data.synthetic.bogus: unknown key"),
    ("data: {synthetic: {seed: 1}}\n", "data.synthetic.seed: the synthetic data's seed is train.seed"),
    ("data: {name: paired, root: " + "a" * 5000 + "}\n", "data.root: File name too long"),
    ("- a\n- b\n", "must hold a mapping of sections"),
    ("train: {epochs: !!python/object/apply:os.system ['true']}\n", "could not determine a constructor"),
])
def test_other_hostile_values_are_named(text, expected, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert main(["config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err, err


def test_synthetic_sizes_past_the_machines_memory_are_one_line(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("data: {synthetic: {num_train: 1000000000000}}\n")
    assert main(["train", str(path), "--out", str(tmp_path / "run"), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("xmodal train: error: num_train: 1000000000000 videos") and "GiB of memory" in err
    assert "\n" not in err


def test_a_memory_error_in_any_command_is_one_line(monkeypatch, capsys):
    import xmodal.commands.config as command

    def run(args):
        raise MemoryError("Unable to allocate 7.28 TiB for an array")

    monkeypatch.setattr(command, "run", run)
    assert main(["config"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "xmodal config: error: out of memory (Unable to allocate 7.28 TiB for an array)"
