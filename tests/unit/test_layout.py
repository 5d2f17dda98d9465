"""The package layout is the architecture: imports point one way, as each subpackage's
``__init__`` docstring says ("May import: ..."), lazy imports included; no import cycle; every
module in one layer (base, core, sources, front ends, CLI: docs/architecture.md, "Layers and
front ends"), importing down only, and no front end importing another; few top-level modules;
no long functions."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

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


# --- layers and front ends (docs/architecture.md, "Layers and front ends") ---------------------

# Each module's layer is the longest prefix below that names it. Lowest first: a module imports
# its own layer and the ones below it, never one above (lazy imports included).
LAYERS: dict[str, tuple[str, ...]] = {
    # leaves every layer shares: errors, logging, atomic writes, markers, where programs are
    "base": (
        *(f"gpuhook.{p.stem}" for p in SRC.glob("*.py") if p.name not in ENTRY_POINTS),
        "gpuhook.config.locate",
    ),
    # the decision, pure: values, request, policy, edits, the formats it reads
    "core": (
        "gpuhook.model",
        "gpuhook.pipeline",
        "gpuhook.config.types",
        "gpuhook.config.units",
        "gpuhook.inventory.catalog",
    ),
    # what a decision reads from the node, each behind runtime/decide's source functions
    "sources": (
        "gpuhook.config.loading",
        "gpuhook.config.cache",
        "gpuhook.inventory",
        "gpuhook.mps",
        "gpuhook.records",
        "gpuhook.runtime.decide",
        "gpuhook.runtime.ocispec",
        "gpuhook.runtime.imagefs",
        # the driver folders prepared at inventory refresh, with the ldconfig run and cache
        # format they need (the hook reads what they prepared)
        "gpuhook.runtime.prepared",
        "gpuhook.runtime.ldmerge",
        "gpuhook.runtime.ldrun",
        "gpuhook.dra",  # the kubelet's DRA state (issue 35), where it lands as a package
    ),
    "front ends": (),  # FRONT_ENDS below
    # the command line and what only it runs: engine registration, the node installer, selftest
    "cli": (
        "gpuhook.cli",
        "gpuhook.engines",
        "gpuhook.node",
        "gpuhook.selftest",
        "gpuhook.nodeview",  # the node view and metrics: records x NVML x /proc, read-only
        "gpuhook.__main__",
        "gpuhook._cli_entry",
    ),
}
# The ways into the core. Each turns its input into the core's Request and the core's
# ContainerEdits into its output at one translation point (docs/architecture.md names it, and a
# docstring of the front end cites that section); no front end imports another.
FRONT_ENDS: dict[str, tuple[str, ...]] = {
    "OCI runtime": ("gpuhook.runtime", "gpuhook._shim_entry", "gpuhook._service_entry"),
    "CDI spec": ("gpuhook.engines.cdi",),
    "NRI plugin": ("gpuhook.nri",),  # issue 34: declared before it lands
}
FRONT_END_CITATION = 'docs/architecture.md, "Layers and front ends"'


def _longest_prefix(module: str, table: dict[str, tuple[str, ...]]) -> tuple[str, int]:
    """The table's entry with the longest prefix of ``module``, and that prefix's length."""
    found = ("", -1)
    for name, prefixes in table.items():
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > found[1]:
                found = (name, len(prefix))
    return found


def layer_of(module: str) -> str:
    """A module's layer; a new module outside every prefix above fails, to be named there."""
    if module in ("gpuhook", "gpuhook.config"):  # the package's and config's docstring-only inits
        return "base"
    layer, length = _longest_prefix(module, LAYERS)
    front_length = _longest_prefix(module, FRONT_ENDS)[1]
    if front_length > length:
        return "front ends"
    assert layer, f"{module} is in no layer: name it in test_layout.LAYERS or FRONT_ENDS"
    return layer


def front_end_of(module: str) -> str:
    return _longest_prefix(module, FRONT_ENDS)[0] if layer_of(module) == "front ends" else ""


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    rank = {name: i for i, name in enumerate(LAYERS)}
    wrong = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if rank[layer_of(target)] > rank[layer_of(module)]:
                wrong.append(f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})")
            ends = (front_end_of(module), front_end_of(target))
            if all(ends) and ends[0] != ends[1]:
                wrong.append(f"front end {ends[0]}: {module} imports {target} ({ends[1]})")
    return wrong


def test_layers_import_downward_and_front_ends_not_each_other() -> None:
    assert layer_violations(module_graph()) == []


def test_the_layer_check_catches_a_front_end_importing_another() -> None:
    graph = {
        "gpuhook.engines.cdi": {"gpuhook.runtime.shim"},
        "gpuhook.nri.plugin": {"gpuhook.runtime.decide", "gpuhook.cli.tables"},
        "gpuhook.pipeline.policy": {"gpuhook.mps.admission"},
    }
    assert layer_violations(graph) == [
        "front end CDI spec: gpuhook.engines.cdi imports gpuhook.runtime.shim (OCI runtime)",
        "gpuhook.nri.plugin (front ends) imports gpuhook.cli.tables (cli)",
        "gpuhook.pipeline.policy (core) imports gpuhook.mps.admission (sources)",
    ]
    assert layer_of("gpuhook.runtime.decide") == "sources"
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("gpuhook.newpackage.module")
    assert front_end_of("gpuhook.runtime.service") == "OCI runtime"


def test_only_runtime_decide_runs_the_core() -> None:
    """Every front end reaches the decision through ``runtime.decide.run`` (the node's sources
    bound to ``pipeline.flow.run``): one call of ``flow.run`` in the tree."""
    callers = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            func = node.func if isinstance(node, ast.Call) else None
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "run"
                and isinstance(func.value, ast.Name)
                and func.value.id == "flow"
            ):
                callers.append(str(path.relative_to(SRC)))
    assert callers == ["runtime/decide.py"]


def test_each_front_end_is_in_the_architecture_and_cites_its_translation_point() -> None:
    doc = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    section = doc.split("## Layers and front ends", 1)[1].split("\n## ", 1)[0]
    graph = module_graph()
    for name, prefixes in FRONT_ENDS.items():
        assert f"| {name} |" in section, f"docs/architecture.md has no row for {name}"
        modules = [m for m in graph if front_end_of(m) == name]
        if not modules:
            continue  # declared ahead of its code
        cited = [m for m in modules if FRONT_END_CITATION in _docstring_of(m)]
        assert cited, f"no module of {name} ({', '.join(prefixes)}) cites {FRONT_END_CITATION}"


def _docstring_of(module: str) -> str:
    parts = module.split(".")[1:]
    path = SRC.joinpath(*parts).with_suffix(".py")
    if not path.exists():
        path = SRC.joinpath(*parts, "__init__.py")
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return " ".join(doc.split())
