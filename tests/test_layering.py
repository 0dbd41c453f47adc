"""The package's layering: imports between nanopatch's own modules run one way only.

Read from the source (every ``import`` statement, those inside functions included), so a
cycle that only a rarely taken path would close is caught too."""

from __future__ import annotations

import ast
from pathlib import Path

import nanopatch

ROOT = Path(nanopatch.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the nanopatch modules it imports (anywhere in its source)."""
    modules = {_module_name(path): path for path in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.split(".")[0] == "nanopatch")
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                if base.split(".")[0] != "nanopatch":
                    continue
                for alias in node.names:
                    found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in done:
                visit(nxt, [*path, nxt])
        done.add(node)

    for node in sorted(graph):
        if node not in done:
            visit(node, [node])
    return found


def test_the_graph_is_read_from_the_source():
    graph = import_graph()
    assert "nanopatch.training.patch" in graph["nanopatch.parallel.patch"]
    assert "nanopatch._patching" in graph["nanopatch.training.discovery"]


def test_no_import_cycle_between_nanopatchs_modules():
    assert cycles(import_graph()) == []


def test_training_never_imports_data_parallel():
    """Data-parallel builds on training (it registers itself as training's data-parallel
    engine); training works without it."""
    graph = import_graph()
    for name, imported in graph.items():
        if name.startswith("nanopatch.training"):
            assert not {m for m in imported if m.startswith("nanopatch.parallel")}, name


def test_every_target_lives_in_a_patch_module_or_its_package():
    from nanopatch import _patching

    for target in _patching.targets():
        package = target.patcher.rsplit(".", 1)[0]
        assert target.patcher.endswith(".patch") or f"{package}.patch" in import_graph(), target
