"""Imports point one way: gem_pipelines -> gem_model -> kernels (DESIGN.md §1)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "kernels": ("gem_model", "gem_pipelines", "dagster", "polars", "deltalake"),
    "gem_model": ("gem_pipelines", "dagster"),
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_does_not_import_upstream_layers(package: str) -> None:
    offenders = {
        str(p.relative_to(REPO)): sorted(imported_modules(p) & set(FORBIDDEN[package]))
        for p in (REPO / package).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
