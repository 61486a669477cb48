"""Fuzzing every CLI command (hypothesis, random seeds; see tests/conftest.py).

The commands and their options are enumerated from the parser itself (a new command or
flag is fuzzed without anyone adding it here). Property: bad input exits with status 2
and exactly one line on stderr, ``xmodal CMD: error: ...``, naming the argument; never
status 0, never a traceback. "Bad" is decided by the parser's own definition: a value
the option's type converter or choices reject, a flag the command does not have, a
required argument left out, and (for the commands reading arrays) a missing or
unreadable input file.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from xmodal.cli import _command_modules, build_parser, main  # noqa: E402

FUZZ = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.filter_too_much])


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


SUBPARSERS = _subparsers()
COMMANDS = sorted(SUBPARSERS)
#: A positional each command needs before its options (e.g. train's CONFIG), so that a
#: flag's value is reached by the parser.
POSITIONALS = {"train": ["configs/synthetic.yaml"], "report": ["."], "data": ["check"], "encode": ["images"]}


def _typed_options() -> list[tuple[str, str, argparse.Action]]:
    """(command, flag, action) of every option whose value a converter or choices check."""
    out = []
    for cmd, p in SUBPARSERS.items():
        for a in p._actions:
            if not a.option_strings or a.nargs == 0 or a.help == argparse.SUPPRESS:
                continue
            if a.choices is not None or (a.type is not None and a.type is not str):
                out.append((cmd, a.option_strings[-1], a))
    return out


TYPED = _typed_options()


def _rejected(action: argparse.Action, value: str) -> bool:
    """True when the parser itself refuses ``value`` for ``action``."""
    try:
        converted = action.type(value) if action.type is not None else value
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return True
    return action.choices is not None and converted not in action.choices


def _one_line(capsys, code: int, cmd: str) -> str:
    err = capsys.readouterr().err
    assert code == 2, f"exit {code}: {err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"xmodal {cmd}: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_every_command_is_enumerated():
    names = {m.NAME for m in _command_modules()}
    assert names == set(COMMANDS) and len(names) >= 10
    assert {c for c, _, _ in TYPED} >= {"eval", "normalize", "index", "query", "report", "bench"}


@pytest.mark.parametrize("cmd", COMMANDS)
def test_unknown_flag_is_one_line_naming_it(cmd, capsys):
    code = main([cmd, *POSITIONALS.get(cmd, []), "--no-such-flag-xyz", "1"])
    line = _one_line(capsys, code, cmd)
    required = [f for a in SUBPARSERS[cmd]._actions if a.option_strings and a.required for f in a.option_strings]
    # argparse names the missing required arguments first where there are any
    assert "--no-such-flag-xyz" in line or any(f in line for f in required), line


@pytest.mark.parametrize("cmd", [c for c in COMMANDS
                                 if any(a.required for a in SUBPARSERS[c]._actions if a.option_strings)])
def test_missing_required_argument_is_one_line(cmd, capsys):
    required = [a for a in SUBPARSERS[cmd]._actions if a.option_strings and a.required]
    line = _one_line(capsys, main([cmd, *POSITIONALS.get(cmd, [])]), cmd)
    assert any(flag in line for a in required for flag in a.option_strings), line


@pytest.mark.parametrize("cmd, flag", [(c, f) for c, f, _ in TYPED], ids=[f"{c} {f}" for c, f, _ in TYPED])
@FUZZ
@given(data=st.data())
def test_value_the_parser_rejects_is_one_line_naming_the_flag(cmd, flag, capsys, data):
    action = next(a for c, f, a in TYPED if (c, f) == (cmd, flag))
    value = data.draw(st.one_of(
        st.sampled_from(["x", "", "1.5", "-", "nan", "1e999", "0x10", "1,,2", "\u00e9", "--", " 1 "]),
        st.text(max_size=8)), label="value")
    assume(not value.startswith("-") or value in ("-",))  # "--x" would be read as another flag
    assume(_rejected(action, value))
    code = main([cmd, *POSITIONALS.get(cmd, []), f"{flag}={value}"])
    line = _one_line(capsys, code, cmd)
    assert flag in line or flag.lstrip("-") in line, line


# ----------------------------------------------------------------------------- input files
@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzzfiles")
    rng = np.random.default_rng(0)
    g = rng.standard_normal((6, 4)).astype(np.float32)
    arrays = {"q": g[[0, 1, 2, 3, 4, 5, 0, 1]] + 0.1, "g": g, "p": np.array([0, 1, 2, 3, 4, 5, 0, 1]),
              "b": g[:5], "sim": g @ g.T}
    paths = {}
    for name, arr in arrays.items():
        paths[name] = str(root / f"{name}.npy")
        np.save(paths[name], arr)
    np.savez(root / "several.npz", a=g, b=g)
    (root / "junk.npy").write_bytes(b"\x93NUMPY junk")
    return root, paths


BASES = {
    "eval": lambda p: ["eval", "--queries", p["q"], "--gallery", p["g"], "--positives", p["p"], "--json"],
    "normalize": lambda p: ["normalize", "--method", "sinkhorn", "--queries", p["q"], "--gallery", p["g"],
                            "--positives", p["p"], "--bank", p["b"], "--l2", "--json"],
}


@pytest.mark.parametrize("cmd", sorted(BASES))
@FUZZ
@given(data=st.data())
def test_bad_input_file_is_one_line_naming_the_flag(cmd, files, capsys, data):
    root, paths = files
    argv = BASES[cmd](paths)
    assert main(argv) == 0  # the base command line is good
    capsys.readouterr()
    flags = [i for i, a in enumerate(argv) if a in ("--queries", "--gallery", "--positives", "--bank")]
    i = data.draw(st.sampled_from(flags), label="flag")
    bad = data.draw(st.sampled_from([str(root / "missing.npy"), str(root / "junk.npy"), str(root / "several.npz"),
                                     str(root)]), label="file")
    argv = argv[:i + 1] + [bad] + argv[i + 2:]
    before = {k: np.load(v) for k, v in paths.items()}
    line = _one_line(capsys, main(argv), cmd)
    assert argv[i] in line, line
    for k, arr in before.items():  # the CLI never writes to its inputs
        np.testing.assert_array_equal(np.load(paths[k]), arr)


# ------------------------------------------------- index / query / report: junk input files
JUNK = ("empty", "random bytes", "npz for npy", "a directory", "wrong shape")


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A tiny trained run, an index of it and one junk file of each kind."""
    import torch

    from xmodal.config import load_config
    from xmodal.training.loop import train

    root = tmp_path_factory.mktemp("fuzzrun")
    run = root / "run"
    tiny = ["data.synthetic={num_train: 120, num_val: 60, num_test: 60, num_concepts: 10}", "train.epochs=1",
            "train.batch_size=32", "model.dim=16", "test_time.bank_size=100", "train.progress=false"]
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(load_config("configs/synthetic.yaml", tiny), run)
    finally:
        torch.set_num_threads(prev)
    rng = np.random.default_rng(0)
    np.save(root / "v.npy", rng.standard_normal((40, 64)).astype(np.float32))
    junk = {"empty": root / "empty.npy", "random bytes": root / "random.npy", "npz for npy": root / "z.npz",
            "a directory": root / "dir.npy", "wrong shape": root / "wrong.npy"}
    junk["empty"].write_bytes(b"")
    junk["random bytes"].write_bytes(rng.bytes(300))
    np.savez(junk["npz for npy"], a=np.zeros(3))
    junk["a directory"].mkdir()
    np.save(junk["wrong shape"], rng.standard_normal((5, 3, 2, 7)).astype(np.float32))
    assert main(["index", "--run", str(run), "--video-features", str(root / "v.npy"), "--out", str(root / "idx"),
                 "--threads", "1"]) == 0
    return root, run, junk


@pytest.mark.parametrize("junk", JUNK)
@pytest.mark.parametrize("flag", ["--video-features", "--video-mask", "--run"])
def test_index_bad_input_file_is_one_line_naming_the_flag(trained_run, capsys, flag, junk):
    root, run, files = trained_run
    capsys.readouterr()
    argv = {"--run": str(run), "--video-features": str(root / "v.npy"), "--out": str(root / "idx_bad"),
            flag: str(files[junk]), "--threads": "1"}
    line = _one_line(capsys, main(["index", *[x for kv in argv.items() for x in kv]]), "index")
    assert flag in line, line
    assert not (root / "idx_bad").exists()


@pytest.mark.parametrize("junk", JUNK)
@pytest.mark.parametrize("flag", ["--text-features", "--index"])
def test_query_bad_input_file_is_one_line_naming_the_flag(trained_run, capsys, flag, junk):
    root, _, files = trained_run
    capsys.readouterr()
    argv = {"--index": str(root / "idx"), "--text-features": str(files["wrong shape"]), flag: str(files[junk])}
    line = _one_line(capsys, main(["query", *[x for kv in argv.items() for x in kv], "--k", "3"]), "query")
    assert flag in line, line


@pytest.mark.parametrize("junk", ["empty", "random bytes", "npz"])
@pytest.mark.parametrize("name", ["model.pt", "metrics.json", "config.yaml", "log.jsonl", None])
def test_report_bad_run_file_is_one_line_naming_it(trained_run, capsys, tmp_path, name, junk):
    import shutil

    root, run, files = trained_run
    capsys.readouterr()
    if name is None:  # RUN itself is a junk file
        target = files["npz for npy" if junk == "npz" else junk]
    else:
        target = tmp_path / "run"
        shutil.copytree(run, target)
        data = {"empty": b"", "random bytes": np.random.default_rng(1).bytes(300),
                "npz": files["npz for npy"].read_bytes()}[junk]
        (target / name).write_bytes(data)
        (target / "checkpoint.pt").unlink()  # model.pt is what the report loads
    if (name, junk) == ("log.jsonl", "empty"):  # a run that died before its first epoch: no curves, no error
        assert main(["report", str(target), "--out", str(tmp_path / "r.html"), "--threads", "1",
                     "--examples", "2"]) == 0
        return
    line = _one_line(capsys, main(["report", str(target), "--out", str(tmp_path / "r.html"), "--threads", "1",
                                   "--examples", "2"]), "report")
    assert str(target / name if name else target) in line, line
    assert not (tmp_path / "r.html").exists()
