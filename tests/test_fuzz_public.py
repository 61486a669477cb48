"""Fuzzing every public callable of the API (hypothesis, random seeds; see tests/conftest.py).

The callables are enumerated from the ``__all__`` of the public modules, and the test
asserts that the list it covers is that enumeration, so a new public function is fuzzed
without anyone remembering to add it. Each one is called with arguments drawn from
its signature: well-formed small arrays and tensors mixed with junk (NaN/inf, empty,
wrong rank, wrong dtype, bools, negative numbers, unknown strings, missing paths).

Property: a call returns, or raises ``ValueError`` / ``TypeError`` (``FileNotFoundError``
for paths; ``ImportError`` naming a missing optional extra) whose message is one line;
never another exception (IndexError, KeyError, RuntimeError, ZeroDivisionError ...), and
never modifies an input array.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import signal

import numpy as np
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

#: Not fuzzed here: the command line (tests/test_fuzz_cli.py, tests/test_fuzz_cli_files.py).
NOT_API = ("xmodal.commands", "xmodal.cli")
#: Modules the suite must reach (issue 25.8: they were missing from the old hand-written list).
REQUIRED_MODULES = ("xmodal.metrics", "xmodal.losses", "xmodal.functional", "xmodal.normalize", "xmodal.data",
                    "xmodal.schedules", "xmodal.models", "xmodal.retrieval.index", "xmodal.retrieval.evaluate",
                    "xmodal.retrieval.testtime", "xmodal.reporting.report", "xmodal.serve", "xmodal.features.video",
                    "xmodal.features.encoders", "xmodal.training", "xmodal.config", "xmodal.data.importer",
                    "xmodal.data.groups")


def public_modules() -> list[str]:
    """Every importable ``xmodal`` module with an ``__all__`` (no ``_private`` part, not the CLI).

    A module that cannot be imported because an optional extra is missing is left out (its
    callables cannot run either); any other import error fails the suite.
    """
    import pkgutil

    import xmodal

    out = []
    for info in pkgutil.walk_packages(xmodal.__path__, "xmodal."):
        name = info.name
        if any(part.startswith("_") for part in name.split(".")[1:]) or name.startswith(NOT_API):
            continue
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(mod, "__all__"):
            out.append(name)
    return sorted(out, key=lambda n: (n.count("."), n))


PUBLIC_MODULES = tuple(public_modules())

#: Called with junk only where the junk cannot start something long or outside the test:
#: these read or write whole run directories, load encoder models or train classifiers;
#: the property is checked for them on paths and junk values that cannot (see SAFE_ONLY).
_NO_MODEL = st.sampled_from(["bogus", "", 3, None])  # an encoder that does not exist: nothing is loaded
SAFE_ONLY = {
    "xmodal.data.synthetic": dict(num_train=st.integers(-2, 40), num_val=st.integers(-2, 20),
                                  num_test=st.integers(-2, 20), num_concepts=st.integers(-2, 8)),
    "xmodal.data.zipf_probabilities": dict(num_concepts=st.integers(-2, 50)),
    # a real encoder would load a model (seconds to minutes) on any list of strings
    "xmodal.features.encode_text": dict(model=_NO_MODEL),
    "xmodal.features.encode_text_tokens": dict(model=_NO_MODEL),
    "xmodal.features.encode_images": dict(model=_NO_MODEL),
    "xmodal.features.encode_videos": dict(model=_NO_MODEL),
    "xmodal.features.iter_encode_videos": dict(model=_NO_MODEL),
    # never a socket on every interface ("" / 0.0.0.0), nor a name lookup
    "xmodal.serve.bind_socket": dict(host=st.sampled_from(["127.0.0.1", "::1", None, 3, ["127.0.0.1"], "999.0.0.1"]),
                                     port=st.sampled_from([0, -1, 70000, 1.5, "80", None, float("inf")])),
}
#: Found by this suite and not fixed yet: the first exception each raised on junk instead of a
#: one-line ValueError/TypeError. Listed, not hidden: each is an xfail that does not run (its
#: shrinking alone takes minutes); remove an entry once fixed and the test runs again.
#: HYPOTHESIS_PROFILE=deep XMODAL_FUZZ_KNOWN=run runs them.
#: Round 5 (issue 25.8) reached features.* and serve.* for the first time; what still fails there is
#: being fixed by the branches that own those modules (video: features.*, serve: serve.*).
KNOWN: dict[str, str] = {}  # empty: every public callable gives a one-line error on junk
#: Exceptions a call may raise on bad input.
ALLOWED = (ValueError, TypeError, FileNotFoundError, ImportError, NotADirectoryError, IsADirectoryError)


def public_callables() -> dict[str, object]:
    """``{"module.name": callable}`` of every public module's ``__all__``; a callable exported by
    several modules (``xmodal.metrics.retrieval`` is ``xmodal.metrics.ranking.retrieval``) is
    fuzzed once, under its shortest module name."""
    out, seen = {}, set()
    for name in PUBLIC_MODULES:
        mod = importlib.import_module(name)
        for attr in mod.__all__:
            obj = getattr(mod, attr)
            if callable(obj) and id(obj) not in seen:
                seen.add(id(obj))
                out[f"{name}.{attr}"] = obj
    out["xmodal.load_model"] = importlib.import_module("xmodal").load_model
    return out


CALLABLES = public_callables()

finite = st.floats(-3, 3, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def arrays(draw):
    """A small array or tensor: mostly well-formed, sometimes junk."""
    rank = draw(st.sampled_from([1, 2, 2, 2, 3, 0]))
    shape = tuple(draw(st.integers(0 if draw(st.booleans()) and rank else 1, 5)) for _ in range(rank))
    kind = draw(st.sampled_from(["float32", "float32", "float64", "int64", "bool", "float16"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    if kind == "int64":
        arr = rng.integers(-1, 5, size=shape)
    elif kind == "bool":
        arr = rng.random(shape) < 0.5
    else:
        arr = rng.standard_normal(shape).astype(kind)
        if arr.size and draw(st.integers(0, 5)) == 0:
            arr.flat[draw(st.integers(0, arr.size - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    return torch.from_numpy(np.array(arr)) if draw(st.booleans()) else arr


JUNK = st.one_of(
    arrays(), arrays(), arrays(),
    st.none(), st.booleans(), st.integers(-3, 12), finite, st.sampled_from([float("nan"), float("inf"), -1.0]),
    st.sampled_from(["", "bogus", "none", "t2v", "mean", "missing_dir/x.npy", "selected"]),
    st.lists(st.integers(-1, 6), max_size=4), st.dictionaries(st.sampled_from(["a", "k"]), st.integers(0, 3),
                                                              max_size=2),
)


#: A call on these tiny inputs taking longer than this is a hang (a junk size not refused).
CALL_SECONDS = 20


class Hang(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: int, qualname: str, kwargs: dict):
    def fire(*_):
        raise Hang(f"{qualname} ran over {seconds} s on {kwargs!r}")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _copy(v):
    if isinstance(v, np.ndarray):
        return v.copy()
    if isinstance(v, torch.Tensor):
        return v.clone()
    return None


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    return a.shape == b.shape and bool(torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))) \
        and bool(torch.equal(a.isnan(), b.isnan()))


def _params(fn) -> list[inspect.Parameter]:
    target = fn.__init__ if inspect.isclass(fn) else fn
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    return [p for p in sig.parameters.values() if p.name != "self"
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


@st.composite
def call_arguments(draw, qualname: str):
    fn = CALLABLES[qualname]
    special = SAFE_ONLY.get(qualname, {})
    kwargs = {}
    for p in _params(fn):
        required = p.default is inspect.Parameter.empty
        if p.name in special:
            kwargs[p.name] = draw(special[p.name])
        elif required or draw(st.integers(0, 3)) == 0:
            kwargs[p.name] = draw(JUNK)
    return kwargs


def test_the_fuzzed_list_is_every_public_callable():
    """The enumeration covers every public module's ``__all__`` (and is not trivially small)."""
    import xmodal

    assert set(REQUIRED_MODULES) <= set(PUBLIC_MODULES), set(REQUIRED_MODULES) - set(PUBLIC_MODULES)
    fuzzed = {id(obj) for obj in CALLABLES.values()}
    for name in PUBLIC_MODULES:
        mod = importlib.import_module(name)
        for attr in mod.__all__:
            obj = getattr(mod, attr)  # every exported name resolves
            if callable(obj):
                assert id(obj) in fuzzed, f"{name}.{attr}"
    # every public sub-package named by the package itself is either listed or not an API
    lazily = {f"xmodal.{m}" for m in xmodal._SUBMODULES}
    assert {".".join(m.split(".")[:2]) for m in PUBLIC_MODULES} <= lazily
    assert len(CALLABLES) >= 150, len(CALLABLES)


def _cases():
    run_known = os.environ.get("XMODAL_FUZZ_KNOWN") == "run"
    return [pytest.param(q, marks=pytest.mark.xfail(reason=f"known: {KNOWN[q]}", run=run_known))
            if q in KNOWN else q for q in sorted(CALLABLES)]


def test_known_failures_are_public_callables():
    assert set(KNOWN) <= set(CALLABLES), set(KNOWN) - set(CALLABLES)


@pytest.mark.parametrize("qualname", _cases())
def test_public_callable_on_junk(qualname, tmp_path, monkeypatch, request):
    monkeypatch.chdir(tmp_path)  # anything a junk path makes a function write lands here
    # A registration a junk call may make must not leak into later tests (order-independent suite).
    import xmodal.features.encoders
    import xmodal.losses

    saved = [(r, dict(r)) for r in (xmodal.losses.LOSSES, xmodal.losses._MODEL_KWARGS, xmodal.features.encoders.ENCODERS)]

    def restore():
        for registry, content in saved:
            registry.clear()
            registry.update(content)

    request.addfinalizer(restore)
    fn = CALLABLES[qualname]

    @settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(kwargs=call_arguments(qualname))
    def check(kwargs):
        before = {k: _copy(v) for k, v in kwargs.items() if _copy(v) is not None}
        try:
            with _time_limit(CALL_SECONDS, qualname, kwargs):
                fn(**kwargs)
        except ALLOWED as exc:
            assert "\n" not in str(exc).strip(), f"{qualname}: several lines: {exc}"
        except MemoryError:  # numpy refuses a junk size before allocating: acceptable
            pass
        for k, v in before.items():
            assert _same(v, kwargs[k]), f"{qualname} modified its argument {k}"

    torch.set_num_threads(1)
    check()
