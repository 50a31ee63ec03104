"""Imports point one way: gem_pipelines -> gem_model -> kernels, and inside gem_model the
sub-packages are layered config (and yaml_strict) < store (and clock) < data < models < eval < train < distill; no module imports
itself back through a circle (function-level imports count too); the private APIs of Dagster and of Great
Expectations are each imported by one module only."""

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
    # the clock is state on disk; yaml_strict is how config reads its files
    return GEM_MODEL_LAYERS.index({"clock": "store", "yaml_strict": "config"}.get(part, part))


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


@pytest.mark.parametrize("packages", [("kernels",), ("gem_model",), ("gem_pipelines",)])
def test_no_import_circles(packages: tuple[str, ...]) -> None:
    assert find_cycle(project_graph(packages)) is None


def import_statements(path: Path) -> Iterator[tuple[str, str | None]]:
    """(module, name) of every absolute import at any depth: `import a.b` -> (a.b, None), `from a import c` -> (a, c)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((a.name, None) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield from ((node.module, a.name) for a in node.names)


def _private_dagster(module: str, name: str | None) -> bool:
    """dagster._core, dagster._utils, any `_x` of a dagster package, or dagster_shared (Dagster's shared
    internals): what the public `dagster` namespace (`import dagster as dg`) does not promise to keep."""
    parts = [*module.split("."), name or ""]
    return parts[0] == "dagster_shared" or (parts[0].startswith("dagster") and any(p.startswith("_") for p in parts))


# GX's documented surface: `import great_expectations as gx` and `import great_expectations.expectations as gxe`.
GX_PUBLIC = ("great_expectations", "great_expectations.expectations")


def _private_gx(module: str, name: str | None) -> bool:
    """Any other module of great_expectations, or an underscore name of the public ones."""
    if module.split(".")[0] != "great_expectations":
        return False
    return module not in GX_PUBLIC or (name or "").startswith("_")


def _importing(private) -> set[str]:
    return {
        str(p.relative_to(REPO))
        for pkg in ("gem_pipelines", "gem_model", "kernels", "bench")
        for p in (REPO / pkg).rglob("*.py")
        if any(private(m, n) for m, n in import_statements(p))
    }


def test_private_rules_see_private_imports(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import dagster as dg\nfrom dagster import AssetKey\nimport great_expectations as gx\n"
                   "import great_expectations.expectations as gxe\nfrom great_expectations import get_context\n"
                   "def f():\n    from dagster._core.execution.api import execute_run\n"
                   "    from dagster_shared.serdes import serialize_value\n    import great_expectations.util\n"
                   "    from great_expectations.validator.validator import Validator\n"
                   "    from great_expectations import _private\n")
    found = list(import_statements(src))
    assert [i for i in found if _private_dagster(*i)] == [("dagster._core.execution.api", "execute_run"),
                                                          ("dagster_shared.serdes", "serialize_value")]
    assert [i for i in found if _private_gx(*i)] == [("great_expectations.util", None),
                                                     ("great_expectations.validator.validator", "Validator"),
                                                     ("great_expectations", "_private")]


def test_private_dagster_api_is_used_by_two_modules() -> None:
    """Where Dagster has no public API (a run of the code location executed in this process, the schedules' and
    sensors' stored state), gem_pipelines/code_location.py holds all of it, pinned to one Dagster release and
    exercised by tests/pipelines/test_code_location.py; the run worker's health check, the run launcher's
    (exercised by tests/pipelines/test_run_launcher.py)."""
    assert _importing(_private_dagster) == {"gem_pipelines/code_location.py", "gem_pipelines/run_launcher.py"}


# Benchmarks that time GX's own phases by wrapping its internals: a changed internal breaks the benchmark, which
# decides nothing (bench/ prints ratios, never pass/fail).
GX_PROFILERS = {"bench/validation_cost.py"}


def test_great_expectations_internals_are_used_by_one_module() -> None:
    """GX's per-call rebuilds are memoised in gem_pipelines/data/gx_memo.py alone (pinned, with its own tests in
    tests/data/test_validation.py); every other module goes through `import great_expectations as gx`."""
    assert _importing(_private_gx) - GX_PROFILERS == {"gem_pipelines/data/gx_memo.py"}
