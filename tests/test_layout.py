"""The package's layout (issue 23): the product's parts are packages, no alias modules, no import circle."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import xmodal

SRC = Path(xmodal.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    out = {}
    for p in SRC.rglob("*.py"):
        parts = list(p.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the xmodal modules it imports, anywhere in its body (function-level imports count)."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for m, p in modules.items():
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names = []
            if isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                names = [f"{n.module}.{a.name}" for a in n.names]
            for name in names:
                target = resolve(name)
                if target and target != m and target.startswith("xmodal"):
                    graph[m].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    assert _cycles(_import_graph(_modules())) == []


def test_top_level_shows_the_parts():
    loose = sorted(p.name for p in SRC.glob("*.py"))
    assert len(loose) <= 8, loose
    for part in ("features", "retrieval", "reporting", "training", "models", "data", "config", "commands"):
        assert (SRC / part / "__init__.py").is_file(), part


@pytest.mark.parametrize("old", ["train", "trainparts", "sampling", "schedule_plan", "encoders", "video",
                                 "evaluate", "testtime", "index", "report", "plots", "benchgrid", "configdoc"])
def test_no_alias_modules(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"xmodal.{old}")


def test_every_package_says_what_lives_there_and_what_it_may_import():
    for info in pkgutil.walk_packages(xmodal.__path__, "xmodal."):
        if not info.ispkg:
            continue
        doc = importlib.import_module(info.name).__doc__ or ""
        assert doc.strip(), info.name
    for name in ("features", "retrieval", "reporting", "training", "config", "commands"):
        doc = importlib.import_module(f"xmodal.{name}").__doc__
        assert "import" in doc, name  # the rule of what it may import


def test_commands_import_no_other_command():
    graph = _import_graph(_modules())
    commands = {m for m in graph if m.startswith("xmodal.commands.") and not m.rpartition(".")[2].startswith("_")}
    for m in commands:
        assert not (graph[m] & commands), (m, graph[m] & commands)


def test_api_names_stay_importable():
    from xmodal.features.encoders import encode_videos  # noqa: F401
    from xmodal.features.video import decode_frames  # noqa: F401
    from xmodal.retrieval.index import BiasedIndex  # noqa: F401
    from xmodal.retrieval.testtime import TestTime  # noqa: F401

    assert xmodal.features.encode_videos is encode_videos
    assert xmodal.retrieval.BiasedIndex is BiasedIndex
    assert callable(xmodal.load_model)
    for name in ("metrics", "losses", "normalize", "data", "schedules", "models", "training"):
        assert getattr(xmodal, name).__name__ == f"xmodal.{name}"
