"""The import graph (docs/architecture.md): every import, at the top of a module or inside a
function, points down the layers below or stays in its layer, and no package imports itself back
through another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"api": "stepml_evolve", "evaluator": "stepml_evolve.evaluator", "archive": "stepml_evolve.archive"}
FOLDERS["evolve"] = "stepml_evolve.evolve"

# bottom to top: a module may import modules of its own layer or of the layers below
LAYERS = [
    ["stepml_evolve.lazy"],
    [
        "stepml_evolve.evaluator.errors",
        "stepml_evolve.evaluator.numbers",
        "stepml_evolve.evaluator.readers",
        "stepml_evolve.evaluator.choices",
        "stepml_evolve.evaluator.say",
    ],
    ["stepml_evolve.evaluator.outputs", "stepml_evolve.evaluator.seeding"],
    ["stepml_evolve.evaluator.hardware"],
    ["stepml_evolve.evaluator.dsl"],
    ["stepml_evolve.evaluator.physics"],
    ["stepml_evolve.evaluator.data"],
    ["stepml_evolve.evaluator.replay", "stepml_evolve.evaluator.importers"],
    ["stepml_evolve.evaluator.scoring"],
    ["stepml_evolve.evaluator.fit"],
    ["stepml_evolve.evaluator.known_truth"],
    ["stepml_evolve.evaluator.datasets", "stepml_evolve.evaluator"],
    ["stepml_evolve.archive"],
    ["stepml_evolve.evolve.option_fields"],
    ["stepml_evolve.evolve.search"],
    ["stepml_evolve.evolve.deploy"],
    ["stepml_evolve.evolve.browse", "stepml_evolve.evolve.go"],
    ["stepml_evolve.evolve.blis", "stepml_evolve.evolve.openevolve"],
    ["stepml_evolve.evolve.commands"],
    ["stepml_evolve.evolve.cli"],
    ["stepml_evolve.evolve", "stepml_evolve"],  # the packages' lazy faces, the Python API, __main__
]


def _modules() -> dict[str, Path]:
    mods = {}
    for folder, package in FOLDERS.items():
        for f in (ROOT / folder).rglob("*.py"):
            parts = f.relative_to(ROOT / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            mods[".".join([package, *parts])] = f
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The modules of the project that `name` imports anywhere (a name imported from a package
    counts as its submodule when there is one)."""
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = (
                ".".join(base[: len(base) - node.level + 1] + [node.module or ""]).strip(".")
                if node.level
                else node.module
            )
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in MODULES else module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> int:
    """The layer of the longest prefix of `module` that LAYERS names."""
    best, rank = -1, None
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    if rank is None:
        raise AssertionError(f"{module} is in no layer of LAYERS: add it")
    return rank


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)


def test_no_import_points_up_a_layer():
    upward = [
        f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)})"
        for a, targets in sorted(GRAPH.items())
        for b in sorted(targets)
        if _layer(b) > _layer(a)
    ]
    assert not upward, "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


@pytest.mark.parametrize("depth", [None, 3, 4], ids=["modules", "packages", "subpackages"])
def test_no_circle(depth):
    """No module imports itself back, nor does a package (evaluator.fit, evolve.search, ...)."""
    graph: dict[str, set[str]] = {}
    for a, targets in GRAPH.items():
        ga = a if depth is None else ".".join(a.split(".")[:depth])
        for b in targets:
            gb = b if depth is None else ".".join(b.split(".")[:depth])
            if ga != gb:
                graph.setdefault(ga, set()).add(gb)
    assert _cycles(graph) == []


def test_the_checks_find_a_circle_and_an_upward_import():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _layer("stepml_evolve.evaluator.fit.fitting") > _layer("stepml_evolve.evaluator.replay.state")
