"""The import layers: fl_app's wiring (its top-level modules) on top, strategies/ and clients/ below it and beside
each other, fl_app's core subpackages (run, data, supernet, models) below both, and kvtranslate/ apart from all
of them. Checked on the source (ast) so an import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# subpackages of fl_app that wire the app to the outside (the deployment tool), not parts of the core
WIRING_PACKAGES = frozenset({"deploy"})
WIRING = frozenset(p.stem for p in (ROOT / "fl_app").glob("*.py") if p.stem != "__init__") | WIRING_PACKAGES
CORE = frozenset(p.name for p in (ROOT / "fl_app").iterdir() if (p / "__init__.py").exists()) - WIRING_PACKAGES


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
    assert violations("fl_app.supernet.federation", "from fl_app.data.images import DATASETS\n") == []
