"""Imports point one way: gem_pipelines -> gem_model -> kernels (DESIGN.md §1), and inside gem_model the
sub-packages are layered config < store (and clock) < data < models < eval < train < distill; no module imports
itself back through a circle (function-level imports count too)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "kernels": ("gem_model", "gem_pipelines", "dagster", "polars", "deltalake"),
    "gem_model": ("gem_pipelines", "dagster"),
}
# A sub-package may import only the layers before it (config.py and clock.py sit at the top level).
GEM_MODEL_LAYERS = ("config", "store", "data", "models", "eval", "train", "distill")


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def imports(path: Path) -> Iterator[str]:
    """Every absolute import of the file, at any depth; `from pkg import mod` yields `pkg.mod` too."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


def project_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    files = {module_name(p): p for pkg in packages for p in (REPO / pkg).rglob("*.py")}
    return {m: {i for i in imports(p) if i in files and i != m} for m, p in files.items()}


def layer(module: str) -> int:
    part = module.split(".")[1]
    return GEM_MODEL_LAYERS.index("store" if part == "clock" else part)  # the clock is state on disk


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_does_not_import_upstream_layers(package: str) -> None:
    offenders = {
        str(p.relative_to(REPO)): sorted({i.split(".")[0] for i in imports(p)} & set(FORBIDDEN[package]))
        for p in (REPO / package).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_gem_model_sub_packages_are_layered() -> None:
    upward = sorted(
        f"{m} -> {i}"
        for m, deps in project_graph(("gem_model",)).items() if m != "gem_model"
        for i in deps if i != "gem_model" and layer(i) > layer(m)
    )
    assert upward == []


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt, path)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [])):
            return cycle
    return None


def test_find_cycle_sees_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("packages", [("kernels",), ("gem_model",)])
def test_no_import_circles(packages: tuple[str, ...]) -> None:
    assert find_cycle(project_graph(packages)) is None
