"""The package's imports point one way, and stay so: no cycles, nothing imports the CLI,
nothing imports up the layers, nothing imports sideways between training, viz and interop.

    cli -> experiments, serve -> families -> training / viz / interop -> models -> nn
           (tokenizers, config, presets, data, io, errors at the side: only each other)

Every import counts, those inside functions too (a lazy import is still a dependency).
A new sub-package gets a row in LAYERS.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import minitransformer

ROOT = Path(minitransformer.__file__).parent
SIDE = {"tokenizers", "config", "presets", "data", "io", "errors", "corpora"}
MIDDLE = {"training", "viz", "interop"}
# layer -> the layers it may import (itself always allowed)
LAYERS: dict[str, set[str]] = {
    "__main__": {"cli"},
    "cli": {"experiments", "serve", "families", "toy", *MIDDLE, "models", "nn", *SIDE},
    "experiments": {"families", *MIDDLE, "models", "nn", *SIDE},
    "serve": {"families", *MIDDLE, "models", "nn", *SIDE},
    "toy": {"models", "nn", *SIDE},  # python -m minitransformer.toy: the copy task
    "families": {*MIDDLE, "models", "nn", *SIDE},
    "training": {"models", "nn", *SIDE},
    "viz": {"models", "nn", *SIDE},
    "interop": {"models", "nn", *SIDE},
    "models": {"nn", *SIDE},
    "nn": {"config", "errors"},
    **{side: SIDE for side in SIDE},
}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


MODULES = _modules()


def _targets(module: str, node) -> list[str]:
    """The package modules an import statement names (resolved to existing modules)."""
    base = module.split(".")
    if MODULES[module].name != "__init__.py":
        base = base[:-1]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            stem = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module
                                                                   else []))
        else:
            stem = node.module or ""
        names = [stem] + [f"{stem}.{a.name}" for a in node.names]
    else:
        names = [a.name for a in node.names]
    found = []
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name.startswith("minitransformer"):
            found.append(name)
    return found


def _edges() -> dict[str, set[str]]:
    edges = {m: set() for m in MODULES}
    for m, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges[m] |= {t for t in _targets(m, node) if t != m}
    return edges


EDGES = _edges()


def layer(module: str) -> str:
    """The layer of a module: its first name under the package ('__init__' for the face)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_walk_sees_imports_inside_functions():
    assert "minitransformer.families" in EDGES["minitransformer.cli.inspect"]
    assert len(MODULES) > 60 and sum(map(len, EDGES.values())) > 200


def test_every_layer_has_a_row():
    missing = {layer(m) for m in MODULES} - set(LAYERS) - {"__init__"}
    assert not missing, f"add a row to LAYERS for {missing}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_layers(module):
    here = layer(module)
    if here == "__init__":  # the package's face may re-export anything but the CLI
        assert not any(layer(t) == "cli" for t in EDGES[module])
        return
    allowed = LAYERS[here] | {here}
    wrong = sorted(t for t in EDGES[module] if layer(t) not in allowed and layer(t) != "__init__")
    assert not wrong, f"{module} ({here}) imports {wrong}"


def test_no_import_cycles():
    """Tarjan's strongly connected components over modules (package __init__ files, which
    only re-export, are left out)."""
    graph = {m: {t for t in ts if MODULES[t].name != "__init__.py"}
             for m, ts in EDGES.items() if MODULES[m].name != "__init__.py"}
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_a_cycle_or_an_upward_import_would_be_caught(monkeypatch):
    """The checks can fail: an import of the CLI from the models is reported."""
    monkeypatch.setitem(EDGES, "minitransformer.models.gpt",
                        EDGES["minitransformer.models.gpt"] | {"minitransformer.cli"})
    with pytest.raises(AssertionError, match="imports"):
        test_imports_point_down_the_layers("minitransformer.models.gpt")
    monkeypatch.setitem(EDGES, "minitransformer.cli.flags",
                        EDGES["minitransformer.cli.flags"] | {"minitransformer.cli.train"})
    monkeypatch.setitem(EDGES, "minitransformer.cli.train",
                        EDGES["minitransformer.cli.train"] | {"minitransformer.cli.flags"})
    with pytest.raises(AssertionError):
        test_no_import_cycles()
