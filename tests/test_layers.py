"""The package's layers import only downwards, at module top: read from the source, no exceptions list.

core → drafters → models → costs → training → lab → cli, dashboard. A module may import its own layer's modules
(without a circle) and any layer below; an import inside a function is refused whatever it names in specdec,
since that is how an upward import hides.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "specdec"
LAYERS = ["core", "drafters", "models", "costs", "training", "lab", "interfaces"]  # bottom first
INTERFACES = {"cli", "dashboard", "__main__"}
FACE = "specdec"  # the package's own __init__: the public API, imported by nothing inside it
STANDALONE = {"specdec.testing"}  # tiny models for tests and notebooks: imports nothing of specdec


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    if top in INTERFACES:
        return LAYERS.index("interfaces")
    return LAYERS.index(top)


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> list[tuple[str, int, bool]]:
    """(imported specdec module, line, at module top) for every import statement of `module`."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names = [f"{base}.{alias.name}" for alias in node.names] if base.startswith("specdec") else [base]
        else:
            continue
        for name in names:
            target = _resolve(name) if name.startswith("specdec") else None
            if target and target != module:
                found.append((target, node.lineno, id(node) in top_level))
    return found


GRAPH = {module: imports(module) for module in MODULES}


def test_every_module_belongs_to_a_layer():
    for module in MODULES:
        if module != FACE and module not in STANDALONE:
            layer(module)  # ValueError for a module outside every layer


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_and_sit_at_module_top(module):
    for target, line, at_top in GRAPH[module]:
        where = f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} imports {target}"
        assert at_top, f"{where} inside a function"
        assert target != FACE, f"{where}: the package face is for users, not for its own modules"
        if module == FACE:
            assert layer(target) <= LAYERS.index("drafters"), f"{where}: the face exposes the engine and drafters"
            continue
        assert module not in STANDALONE, f"{where}: {module} stands alone"
        assert layer(target) <= layer(module), f"{where}: {LAYERS[layer(module)]} imports {LAYERS[layer(target)]}"


def test_no_module_imports_in_a_circle():
    edges = {m: {t for t, _, _ in GRAPH[m]} for m in MODULES}
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                circle = path[path.index(target):] + [target]
                pytest.fail("imports in a circle: " + " -> ".join(circle))
            if target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(MODULES):
        if module not in state:
            visit(module, [module])


def test_the_graph_reader_sees_an_upward_import(tmp_path):
    """The check can fail: an import of the dashboard from core, read the same way, points up."""
    assert layer("specdec.dashboard.layout") > layer("specdec.core.engine")
    assert _resolve("specdec.core.engine.speculative_generate") == "specdec.core.engine"
