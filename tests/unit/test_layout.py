"""The package layout is the architecture: imports point one way, as each subpackage's
``__init__`` docstring says ("May import: ..."), lazy imports included; few top-level modules;
no long functions."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "gpuhook"
SUBPACKAGES = sorted(p.parent.name for p in SRC.glob("*/__init__.py") if p.parent.name[0] != "_")
TOP = "top-level"
MAX_TOP_LEVEL_MODULES = 12
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 600


def _allowed(package: str) -> set[str]:
    doc = ast.get_docstring(ast.parse((SRC / package / "__init__.py").read_text())) or ""
    match = re.search(r"May import: (.*?)(?:\.\s|\.$)", " ".join(doc.split()))
    assert match, f"gpuhook/{package}/__init__.py must say 'May import: ...'"
    text = match.group(1)
    if text.startswith("everything"):
        return {*SUBPACKAGES, TOP}
    allowed = {package}
    if "the top-level modules" in text:
        allowed.add(TOP)
    allowed.update(re.findall(r"gpuhook\.([a-z_]+(?:\.[a-z_]+)?)", text))
    return allowed


def _owner(module: str) -> str:
    """'gpuhook.pipeline.policy' -> 'pipeline'; 'gpuhook.errors' -> top-level."""
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in SUBPACKAGES:
        return parts[1]
    return TOP


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every gpuhook module a file imports, at any depth (lazy imports count)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            base = node.module
            if base.startswith("gpuhook"):
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    found.append((node.lineno, full if _owner(full) != TOP else base))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("gpuhook")]
    return found


def _relative_imports(root: Path) -> list[str]:
    """Every ``from . import x`` (any level) under ``root``: the rules above read absolute names."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def _granted(allowed: set[str], module: str) -> bool:
    owner = _owner(module)
    if owner in allowed or (owner == TOP and TOP in allowed):
        return True
    dotted = module.split(".", 1)[1] if "." in module else module
    return any(dotted == a or dotted.startswith(a + ".") for a in allowed if "." in a)


def test_every_subpackage_imports_only_what_its_docstring_allows() -> None:
    wrong = []
    for package in SUBPACKAGES:
        allowed = _allowed(package)
        for path in sorted((SRC / package).rglob("*.py")):
            for line, module in _imports(path):
                if not _granted(allowed, module):
                    wrong.append(f"{path.relative_to(SRC)}:{line} imports {module}")
    assert wrong == []


def test_no_module_imports_relatively() -> None:
    """A relative import would slip past the checks above (they read gpuhook.* names)."""
    assert _relative_imports(SRC) == []


ENTRY_POINTS = {"__main__.py", "_cli_entry.py", "_shim_entry.py", "_service_entry.py"}


def test_top_level_modules_are_leaves_and_few() -> None:
    modules = sorted(p.name for p in SRC.glob("*.py"))
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, modules
    wrong = []
    for name in set(modules) - ENTRY_POINTS:
        for line, module in _imports(SRC / name):
            if _owner(module) not in (TOP, "model"):
                wrong.append(f"{name}:{line} imports {module}")
    assert wrong == []


def test_the_check_catches_a_wrong_import(tmp_path: Path) -> None:
    """The rule above can fail: an upward import is reported, a lazy one too."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from gpuhook.runtime import shim\n")
    assert not _granted(_allowed("pipeline"), _imports(bad)[0][1])
    assert _granted(_allowed("runtime"), "gpuhook.pipeline.policy")
    assert _granted(_allowed("pipeline"), "gpuhook.inventory.catalog")
    assert not _granted(_allowed("pipeline"), "gpuhook.inventory.store")
    assert _granted(_allowed("runtime"), "gpuhook.config.loading")
    bad.write_text("def f():\n    from ..runtime import shim\n")
    assert _relative_imports(tmp_path) == ["bad.py:2"]


def test_the_pure_core_imports_config_values_and_no_config_io() -> None:
    """pipeline/ and model/ may read the config's types and size units, never its loading, its
    /run cache or the runtime lookup (docs/architecture.md, "Data flows one way")."""
    pure = _allowed("pipeline")
    assert _granted(pure, "gpuhook.config.types") and _granted(pure, "gpuhook.config.units")
    for io_module in ("loading", "cache"):
        assert not _granted(pure, f"gpuhook.config.{io_module}")
    assert not _granted(pure, "gpuhook.config.locate")
    assert not _granted(_allowed("model"), "gpuhook.config.types")


# Cold code: never imported on the container-create path (test_hot_path_imports.py holds what is).
COLD = ("cli", "engines", "node", "selftest")


def test_cold_packages_write_ordinary_imports() -> None:
    """The create path's rules (lazy imports, the TYPE_CHECKING = False trick that spares the
    typing import) stay on the modules it imports; the cold packages import at the top."""
    wrong = []
    for package in COLD:
        for path in sorted((SRC / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in tree.body:
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "TYPE_CHECKING" for t in node.targets
                ):
                    wrong.append(f"{path.relative_to(SRC)}:{node.lineno} TYPE_CHECKING = ...")
            for fn in ast.walk(tree):
                if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    wrong += [
                        f"{path.relative_to(SRC)}:{n.lineno} import in {fn.name}"
                        for n in ast.walk(fn)
                        if isinstance(n, ast.Import | ast.ImportFrom)
                    ]
    assert wrong == []


def _long_functions(root: Path) -> list[str]:
    long = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length})")
    return long


def test_no_function_is_longer_than_60_lines() -> None:
    assert _long_functions(SRC) == []


def test_no_module_is_longer_than_600_lines() -> None:
    """One owner per concept at module scale: a module past this holds more than one."""
    long = [
        f"{p.relative_to(SRC)} ({n})"
        for p in sorted(SRC.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert long == []


# --- no import cycles --------------------------------------------------------------------------


def _module_name(path: Path, root: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph(root: Path = SRC) -> dict[str, set[str]]:
    """Every module under ``root`` -> the modules of that package it imports, at any depth (lazy
    and ``TYPE_CHECKING`` imports count: a cycle there is still two modules that need each
    other). ``from pkg import mod`` is an edge to ``pkg.mod``; ``from pkg.mod import name`` to
    ``pkg.mod``."""
    paths = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}

    def resolve(dotted: str) -> str | None:
        parts = dotted.split(".")
        found = (".".join(parts[:i]) for i in range(len(parts), 0, -1))
        return next((name for name in found if name in paths), None)

    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        edges: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                edges |= {resolve(f"{node.module}.{alias.name}") for alias in node.names}
            elif isinstance(node, ast.Import):
                edges |= {resolve(alias.name) for alias in node.names}
        graph[name] = {e for e in edges if e is not None and e != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = [stack.pop()]
            while component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_cycles() -> None:
    """Modules read one way: no two need each other, lazy imports included (the configuration
    does not reach up into the runtime, doctor's checks import what a check is, not doctor)."""
    assert import_cycles(module_graph()) == []


def test_the_cycle_check_catches_a_lazy_cycle(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from pkg.sub.a import name\n")
    (package / "c.py").write_text("import pkg.sub.a\n")
    graph = module_graph(package)
    assert graph["pkg.c"] == {"pkg.sub.a"}
    assert import_cycles(graph) == [["pkg.sub.a", "pkg.sub.b"]]
