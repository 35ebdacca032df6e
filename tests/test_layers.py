"""The import layers: fl_app's wiring (its top-level modules) on top, strategies/ and clients/ below it and beside
each other, fl_app's core subpackages below both, and kvtranslate/ apart from all of them. Inside the core the
folders are ordered too (``CORE_FOLDER_RANKS``: io, then data and models, then run, then supernet), so no two
folders import each other, and no two modules of fl_app import each other, directly or around a cycle (an import
kept inside a function to break one still counts). Checked on the source (ast) so an import inside a function counts
too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# subpackages of fl_app that wire the app to the outside (the deployment tool, the report), not parts of the core
WIRING_PACKAGES = frozenset({"deploy", "report"})
WIRING = frozenset(p.stem for p in (ROOT / "fl_app").glob("*.py") if p.stem != "__init__") | WIRING_PACKAGES
CORE = frozenset(p.name for p in (ROOT / "fl_app").iterdir() if (p / "__init__.py").exists()) - WIRING_PACKAGES
# a core folder imports only folders of a lower rank: io (file writes, bundled files, CLI helpers) under everything;
# data and models side by side; run above them (the run config checks values against their tables); supernet on top
CORE_FOLDER_RANKS = {"io": 0, "data": 1, "models": 1, "run": 2, "supernet": 3}


def imported_modules(source: str, module: str) -> set[str]:
    """Every module ``source`` (the text of ``module``) imports, as absolute dotted names; ``from pkg import name``
    yields ``pkg.name`` too, since ``name`` may be a module."""
    package = module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def layer_of(module: str) -> str | None:
    """The layer a dotted module name belongs to (None: outside the project)."""
    parts = module.split(".")
    top = parts[0]
    if top == "fl_app":
        if len(parts) == 1:
            return None  # the package itself (its __init__ is empty)
        if parts[1] in CORE:
            return "core"
        return "wiring" if parts[1] in WIRING else None
    return top if top in ("strategies", "clients", "kvtranslate", "experiments") else None


FORBIDDEN = {
    "core": {"wiring", "strategies", "clients", "experiments"},
    "strategies": {"wiring", "clients", "experiments"},
    "clients": {"wiring", "strategies", "experiments"},
    "kvtranslate": {"core", "wiring", "strategies", "clients", "experiments"},
}


def violations(module: str, source: str) -> list[str]:
    own = layer_of(module)
    return sorted(
        f"{module} ({own}) imports {name} ({layer_of(name)})"
        for name in imported_modules(source, module)
        if layer_of(name) in FORBIDDEN.get(own, ())
    )


def core_folder(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if layer_of(module) == "core" else None


def folder_violations(module: str, source: str) -> list[str]:
    """Imports from ``module`` (a core module) into a core folder of the same or a higher rank, its own excepted."""
    own = core_folder(module)
    if own is None:
        return []
    return sorted(
        f"{module} ({own}, rank {CORE_FOLDER_RANKS[own]}) imports {name} "
        f"({core_folder(name)}, rank {CORE_FOLDER_RANKS[core_folder(name)]})"
        for name in imported_modules(source, module)
        if core_folder(name) not in (None, own) and CORE_FOLDER_RANKS[core_folder(name)] >= CORE_FOLDER_RANKS[own]
    )


def folder_cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The cycles of a folder graph, each as the list of folders on it (found by depth-first search)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def module_imports(source: str, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``source`` (the text of ``module``) imports, inside functions too: ``from pkg
    import name`` is ``pkg.name`` where that is a module, else ``pkg``; imports under ``if TYPE_CHECKING:`` never run
    and are left out."""
    package = module if is_package else module.rsplit(".", 1)[0]
    tree = ast.parse(source)
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(ast.Module(body=node.body, type_ignores=[]))
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    found.add(f"{base}.{alias.name}")
                elif base in modules:
                    found.add(base)
    return found - {module}


def fl_app_import_edges() -> set[tuple[str, str]]:
    """(importer, imported) for every import between two modules of fl_app."""
    paths = {}
    for path in sorted((ROOT / "fl_app").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return {
        (name, imported)
        for name, path in paths.items()
        for imported in module_imports(path.read_text(), name, path.name == "__init__.py", set(paths))
    }


def project_modules():
    for folder in ("fl_app", "strategies", "clients", "kvtranslate"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            yield name, path


def test_layers_hold_in_the_tree():
    modules = list(project_modules())
    assert any(layer_of(name) == "core" for name, _ in modules) and any(
        layer_of(name) == "wiring" for name, _ in modules
    )
    problems = [line for name, path in modules for line in violations(name, path.read_text())]
    assert problems == []


def test_every_core_folder_has_a_rank():
    assert set(CORE_FOLDER_RANKS) == set(CORE), "place a new fl_app folder in CORE_FOLDER_RANKS"


def test_core_folders_import_only_lower_ranks_and_form_no_cycle():
    modules = list(project_modules())
    assert [line for name, path in modules for line in folder_violations(name, path.read_text())] == []
    edges = {
        (core_folder(name), core_folder(imported))
        for name, path in modules
        if core_folder(name)
        for imported in imported_modules(path.read_text(), name)
        if core_folder(imported) not in (None, core_folder(name))
    }
    assert ("supernet", "models") in edges and ("run", "data") in edges  # the graph is read, not empty
    assert folder_cycles(edges) == []


@pytest.mark.parametrize(
    "module, source, bad",
    [
        ("fl_app.data.partition", "from fl_app.supernet.subnets import SubnetCache\n", "fl_app.supernet.subnets"),
        ("fl_app.models.elastic_resnet", "from fl_app.supernet import slicing\n", "fl_app.supernet.slicing"),
        ("fl_app.run.config", "from fl_app.supernet.evaluation import accuracy\n", "fl_app.supernet.evaluation"),
        ("fl_app.data.images", "from fl_app.models.multiarch import MODEL_FAMILIES\n", "fl_app.models.multiarch"),
        ("fl_app.io.files", "from ..run.config import RunConfig\n", "fl_app.run.config"),
    ],
)
def test_each_upward_folder_import_is_caught(module, source, bad):
    found = folder_violations(module, source)
    assert any(f"imports {bad} " in line for line in found), found


def test_folder_cycles_are_found():
    assert folder_cycles({("run", "supernet"), ("supernet", "run"), ("data", "io")}) == [["run", "supernet", "run"]]
    assert folder_cycles({("a", "b"), ("b", "c"), ("c", "a")}) == [["a", "b", "c", "a"]]
    assert folder_cycles({("a", "b"), ("b", "c"), ("a", "c")}) == []
    assert folder_violations("fl_app.supernet.search", "from fl_app.run.device import preferred_device\n") == []


@pytest.mark.parametrize(
    "module, source, bad",
    [
        ("fl_app.supernet.slicing", "def f():\n    from fl_app import server_app\n", "fl_app.server_app"),
        ("fl_app.run.config", "import strategies.rounds\n", "strategies.rounds"),
        ("fl_app.data.images", "from clients.feast import LocalSettings\n", "clients.feast"),
        ("strategies.feast", "from clients import feast\n", "clients.feast"),
        ("clients.fedtopo", "from strategies.rounds import RoundLog\n", "strategies.rounds"),
        ("clients.feast", "from fl_app.client_app import app\n", "fl_app.client_app"),
        ("fl_app.supernet.slicing", "from .. import server_app\n", "fl_app.server_app"),
        ("kvtranslate.train", "from fl_app.run.outputs import write_json\n", "fl_app.run.outputs"),
        ("kvtranslate.train", "import experiments.runner\n", "experiments.runner"),
    ],
)
def test_each_forbidden_direction_is_caught(module, source, bad):
    found = violations(module, source)
    assert any(f"imports {bad} " in line for line in found), found


def test_allowed_directions_pass():
    assert violations("fl_app.server_app", "from strategies.feast import FeastStrategy\nimport clients.feast\n") == []
    assert violations("strategies.feast", "from fl_app.supernet.slicing import slice_state\n") == []
    assert violations("clients.fedtopo", "from .feast import LocalSettings\nfrom fl_app.data import augment\n") == []
    assert violations("fl_app.supernet.shared_setup", "from fl_app.data.images import DATASETS\n") == []


def test_no_two_fl_app_modules_import_each_other():
    edges = fl_app_import_edges()
    assert ("fl_app.report.plots", "fl_app.report.rows") in edges  # the graph is read, not empty
    cycles = folder_cycles(edges)
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_module_imports_resolve_submodules_and_skip_type_checking():
    modules = {"fl_app.report", "fl_app.report.plots", "fl_app.report.read", "fl_app.run.config"}
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import plots\n"
        "from fl_app.report import find_runs\n"
        "if TYPE_CHECKING:\n"
        "    from fl_app.run.config import RunConfig\n"
        "def f():\n"
        "    from .read import load_run\n"
    )
    found = module_imports(source, "fl_app.report.writing", False, modules)
    assert found == {"fl_app.report.plots", "fl_app.report", "fl_app.report.read"}
    assert module_imports("from . import read\n", "fl_app.report", True, modules) == {"fl_app.report.read"}
    assert folder_cycles({("fl_app.a", "fl_app.b"), ("fl_app.b", "fl_app.a")}) == [["fl_app.a", "fl_app.b", "fl_app.a"]]
