"""The package's layering: imports between nanopatch's own modules run one way only, down the
floors of docs/architecture.md (read from the page's table).

Read from the source (every ``import`` statement, those inside functions included), so a
cycle that only a rarely taken path would close is caught too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nanopatch

from conftest import REPO_ROOT

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
    assert "nanopatch.targets.training.patch" in graph["nanopatch.targets.parallel.patch"]
    assert "nanopatch.engine" in graph["nanopatch.targets.training.plan"]


def test_no_import_cycle_between_nanopatchs_modules():
    assert cycles(import_graph()) == []


def test_every_target_lives_in_a_patch_module_or_its_package():
    from nanopatch import engine

    for target in engine.targets():
        module = target.target.partition(":")[0]
        package = module.rsplit(".", 1)[0]
        assert module.endswith(".patch") or f"{package}.patch" in import_graph(), target


# --- the floors of docs/architecture.md -----------------------------------------------

PAGE = REPO_ROOT / "docs" / "architecture.md"

#: imports between targets on floor 3 that the page allows (importer's package -> imported's)
BETWEEN_TARGETS = {
    ("nanopatch.targets.parallel", "nanopatch.targets.training"),
    ("nanopatch.targets.breakdown", "nanopatch.targets.training"),
}


def page_layers() -> dict[str, tuple[int, str]]:
    """Module or package name -> (floor, layer), from the page's table."""
    layers: dict[str, tuple[int, str]] = {}
    for floor, layer, names in re.findall(r"^\| (\d+) \| ([a-z ]+) \| (.+) \|$", PAGE.read_text(), re.M):
        for name in re.findall(r"`([\w.]+)`", names):
            assert name not in layers, f"{name} is in two rows of {PAGE.name}"
            layers[name] = (int(floor), layer)
    return layers


def owner(module: str, layers: dict[str, tuple[int, str]]) -> str | None:
    """The name of the page's row for ``module``: itself or its nearest package."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        if name in layers:
            return name
    return None


def test_the_page_names_every_module_and_only_real_ones():
    layers = page_layers()
    assert {layer for _, layer in layers.values()} == {
        "foundation",
        "engine",
        "runtime",
        "targets",
        "compatibility",
        "front door",
    }
    graph = import_graph()
    assert not [m for m in graph if owner(m, layers) is None], "modules in no row of docs/architecture.md"
    assert not [n for n in layers if n not in graph], "rows of docs/architecture.md that name no module"


def test_no_module_imports_a_floor_above_it():
    layers = page_layers()
    wrong = []
    for module, imported in import_graph().items():
        floor, layer = layers[owner(module, layers)]
        for other in imported:
            other_floor, other_layer = layers[owner(other, layers)]
            if other_floor > floor or (other_floor == floor and other_layer != layer):
                wrong.append(f"{module} ({layer}) imports {other} ({other_layer})")
    assert not wrong, "\n".join(wrong)


def test_targets_import_each_other_only_where_the_page_says():
    layers = page_layers()
    wrong = []
    for module, imported in import_graph().items():
        mine = owner(module, layers)
        if layers[mine][1] != "targets":
            continue
        for other in imported:
            theirs = owner(other, layers)
            if theirs != mine and layers[theirs][1] == "targets" and (mine, theirs) not in BETWEEN_TARGETS:
                wrong.append(f"{module} imports {other}")
    assert not wrong, "\n".join(wrong)


# --- public rooms ----------------------------------------------------------------------


def _private_imports(source: str, name: str, is_package: bool, modules: set[str]) -> list[str]:
    """What module ``name`` (its ``source``) imports with a leading underscore from outside the package
    that owns it: a module ``a.b._c`` may be imported from within ``a.b`` only, a name ``_x``
    of ``a.b.m`` from within ``a.b`` only."""
    package = name.split(".") if is_package else name.split(".")[:-1]

    def inside(owner: list[str]) -> bool:
        return name.split(".")[: len(owner)] == owner

    wrong = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (
                ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                if node.level
                else node.module or ""
            )
            targets = [
                (f"{base}.{a.name}", None) if f"{base}.{a.name}" in modules else (base, a.name) for a in node.names
            ]
        else:
            continue
        for module, attr in targets:
            parts = module.split(".")
            if parts[0] != "nanopatch":
                continue
            for i, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__") and not inside(parts[:i]):
                    wrong.append(f"{name} imports {module}")
            if (
                attr is not None
                and attr.startswith("_")
                and not inside(parts if module in _packages(modules) else parts[:-1])
            ):
                wrong.append(f"{name} imports {module}.{attr}")
    return wrong


def _packages(modules: set[str]) -> set[str]:
    return {m for m in modules if (ROOT.parent / m.replace(".", "/") / "__init__.py").exists()}


def test_no_module_imports_an_underscore_name_from_another_package():
    modules = {_module_name(path): path for path in ROOT.rglob("*.py")}
    wrong = [
        w
        for name, path in modules.items()
        for w in _private_imports(path.read_text(), name, path.name == "__init__.py", set(modules))
    ]
    assert not wrong, "\n".join(wrong)


def test_the_check_of_underscore_names_catches_one():
    modules = {_module_name(path) for path in ROOT.rglob("*.py")} | {"nanopatch.runtime._hidden"}
    probe = ROOT / "targets" / "training" / "patch.py"
    assert _private_imports(probe.read_text(), "nanopatch.targets.training.patch", False, modules) == []
    source = "from nanopatch.runtime import _hidden\nfrom nanopatch.runtime.tuning import _cpu_list\n"
    found = _private_imports(source, "nanopatch.targets.training.probe", False, modules)
    inside = _private_imports(source, "nanopatch.runtime.launch", False, modules)
    assert inside == []
    assert found == [
        "nanopatch.targets.training.probe imports nanopatch.runtime._hidden",
        "nanopatch.targets.training.probe imports nanopatch.runtime.tuning._cpu_list",
    ]


def test_the_engine_names_no_target():
    """The built-in targets are listed in nanopatch/targets/__init__.py; the engine knows none."""
    for path in (ROOT / "engine").glob("*.py"):
        assert not re.search(r"nanopatch\.targets", path.read_text()), path
    from nanopatch import engine

    assert [t.name for t in engine.targets()][:3] == ["cuda_to_cpu", "cuda_extensions", "vision"]


#: the longest a function (or method) of nanopatch may be, in lines with its docstring (issue 42):
#: past that, a function does several jobs and is split into named helpers
LONGEST_FUNCTION = 60


def test_no_function_is_longer_than_the_house_allows():
    long = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > LONGEST_FUNCTION:
                    long.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name}: {length} lines")
    assert not long, "\n".join(long)
