"""The house's floors (docs/architecture.md): the import-linter contracts hold, ktframe's own variant
plugins use the public plugin API alone, and nothing in ktframe swaps a module's class."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIRST_PARTY = sorted(p for p in (REPO / "plugins").glob("ktframe_*/__init__.py"))


def ktframe_imports(path: Path) -> list[tuple[int, str]]:
    """Every module of ktframe that ``path`` imports, at any depth of its code, with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ktframe":
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "ktframe"]
    return found


def test_the_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.skip("import-linter is not installed (it is in the test extra)")
    done = subprocess.run([lint, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in done.stdout, done.stdout[-2000:]


@pytest.mark.parametrize("plugin", FIRST_PARTY, ids=lambda p: p.parent.name)
def test_a_first_party_variant_imports_the_plugin_api_alone(plugin: Path):
    others = [(line, module) for line, module in ktframe_imports(plugin) if module != "ktframe.plugin"]
    assert others == [], f"{plugin.relative_to(REPO)} imports {others}; a variant plugin imports `ktframe.plugin` alone"


def test_every_first_party_variant_is_checked():
    assert {p.parent.name for p in FIRST_PARTY} >= {
        "ktframe_learned",
        "ktframe_lloyd",
        "ktframe_lloyd_dot",
        "ktframe_soft",
        "ktframe_spherical",
        "ktframe_trimmed",
        "ktframe_robust",
        "ktframe_kmedoids",
    }


def test_no_module_swaps_a_class():
    swaps = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in (REPO / "ktframe").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "__class__" for t in node.targets)
    ]
    assert swaps == [], f"a model is one class hierarchy; the fast path is a plan, not a class swap: {swaps}"
