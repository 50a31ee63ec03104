"""One strict config: every spec in assets/ goes through a loader that refuses unknown keys (naming the file
and the key), every field of those models is read by code, and every GEM_* variable is in ENV_VARS."""

from __future__ import annotations

import ast
import dataclasses
import re
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from gem_model.config import (
    ASSETS_DIR,
    ENV_VARS,
    REPO_ROOT,
    CalendarConfig,
    ConfigError,
    FeaturesConfig,
    SimulatorConfig,
    SurfacesConfig,
    env,
    load_calendar,
    load_features,
    load_simulator,
    load_surfaces,
)
from gem_model.distill.config import StudentsFile, _overlay, load_student_preset, load_students_file
from gem_model.models.config import GEMConfig
from gem_model.train.config import RunConfig
from gem_pipelines.catalog import CatalogConfig, load_catalog
from gem_pipelines.k8s import KubernetesConfig, load_kubernetes
from gem_pipelines.settings import QualityConfig, RetriesConfig, load_quality, load_retries
from gem_pipelines.sources.common import SourceConfig

SHARED_STUDENTS = ASSETS_DIR / "models" / "students.yaml"


def _students_overlay(path: Path) -> object:
    return _overlay(load_students_file(SHARED_STUDENTS), path)


# (file name pattern relative to assets/, loader); the first match wins.
LOADERS: list[tuple[str, Callable[[Path], object]]] = [
    (r"(sources/[a-z0-9_]+/)?surfaces\.yaml", load_surfaces),
    (r"(sources/[a-z0-9_]+/)?calendar\.yaml", load_calendar),
    (r"(sources/[a-z0-9_]+/)?features\.yaml", load_features),
    (r"simulator(_[a-z0-9_]+)?\.yaml", load_simulator),
    (r"quality\.yaml", load_quality),
    (r"retries\.yaml", load_retries),
    (r"kubernetes\.yaml", load_kubernetes),
    (r"catalog\.yaml", load_catalog),
    (r"models/students\.yaml", load_students_file),
    (r"sources/[a-z0-9_]+/models/students\.yaml", _students_overlay),
]
# Specs whose loaders and tests live elsewhere (named there).
OWNED_ELSEWHERE = [
    r"sources/[a-z0-9_]+/source\.yaml",  # gem_pipelines/sources/common.py: SourceConfig, tests/sources/
    r"(sources/[a-z0-9_]+/)?models/(?!students\.yaml)[a-z0-9_]+\.yaml",  # model/training presets: gem_model.train
]


def _loader(rel: str) -> Callable[[Path], object] | None:
    return next((fn for pattern, fn in LOADERS if re.fullmatch(pattern, rel)), None)


def _yaml_files() -> list[str]:
    return sorted(p.relative_to(ASSETS_DIR).as_posix() for p in ASSETS_DIR.rglob("*.y*ml"))


def test_every_yaml_in_assets_has_a_strict_loader_and_loads() -> None:
    files = _yaml_files()
    assert "surfaces.yaml" in files and "models/students.yaml" in files
    loaded = []
    for rel in files:
        fn = _loader(rel)
        if fn is None:
            assert any(re.fullmatch(p, rel) for p in OWNED_ELSEWHERE), f"assets/{rel} has no loader in LOADERS"
            continue
        assert fn(ASSETS_DIR / rel) is not None, rel
        loaded.append(rel)
    assert {"calendar.yaml", "features.yaml", "simulator.yaml", "quality.yaml", "retries.yaml",
            "kubernetes.yaml", "catalog.yaml", "models/students.yaml"} <= set(loaded)


def _mappings(node: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every mapping inside a parsed YAML document, by its path (the root first)."""
    if isinstance(node, dict):
        yield path
        for k, v in node.items():
            yield from _mappings(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _mappings(v, (*path, i))


def _typo_paths(raw: dict) -> list[tuple]:
    """Where a typo can go: the root and the first mapping of each depth (fields, not free-form dicts)."""
    free_form = ("node_selector", "tolerations", "owners", "kinds", "traffic_share")
    out: dict[int, tuple] = {}
    for path in _mappings(raw):
        if any(k in free_form for k in path if isinstance(k, str)) or (path and path[-1] == "presets"):
            continue
        out.setdefault(len(path), path)
    return list(out.values())


@pytest.mark.parametrize("rel", [r for r in _yaml_files() if _loader(r)])
def test_a_typo_key_raises_naming_the_file_and_the_key(rel: str, tmp_path: Path) -> None:
    raw = yaml.safe_load((ASSETS_DIR / rel).read_text())
    paths = _typo_paths(raw)
    assert paths and paths[0] == ()
    for depth, at in enumerate(paths):
        doc = yaml.safe_load((ASSETS_DIR / rel).read_text())
        node = doc
        for k in at:
            node = node[k]
        node[f"typo_key_{depth}"] = 1
        copy = tmp_path / f"d{depth}" / rel
        copy.parent.mkdir(parents=True)
        copy.write_text(yaml.safe_dump(doc))
        with pytest.raises(ConfigError) as err:
            _loader(rel)(copy)  # type: ignore[misc]
        assert str(copy) in str(err.value) and f"typo_key_{depth}" in str(err.value), (rel, at, str(err.value))


def test_students_overrides_and_unknown_overlay_presets_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"train\.max_stepz"):
        load_student_preset("tiny", overrides={"train": {"max_stepz": 1}})
    with pytest.raises(ConfigError, match="trian"):
        load_student_preset("tiny", overrides={"trian": {"max_steps": 1}})
    own = tmp_path / "students.yaml"
    own.write_text("presets:\n  smal:\n    train:\n      epochs: 3\n")
    with pytest.raises(ConfigError, match=r"presets\.smal") as err:
        _students_overlay(own)
    assert str(own) in str(err.value)
    assert load_student_preset("tiny", overrides={"train": {"max_steps": 3}})["train"]["max_steps"] == 3


def test_students_preset_is_the_yaml_verbatim() -> None:
    """Every value comes from the YAML; the one default is the tests' failure injection, off."""
    raw = yaml.safe_load(SHARED_STUDENTS.read_text())["presets"]
    for name, preset in raw.items():
        expected = {**preset, "train": {**preset["train"], "fail_at_step": None},
                    "domain": {**preset["domain"], "fail_at_step": None}}
        assert {k: v for k, v in load_student_preset(name, SHARED_STUDENTS).items() if k != "preset"} == expected


# ------------------------------------------------------------------------------------------------
# Every field is read by code

# the specs of assets/, a run's training config (preset + overrides: model, train, data, tracking, start-up fits),
# the model's dimensions (a dataclass), the students' and distillation's presets and a real dataset's spec
ROOT_MODELS = [SurfacesConfig, CalendarConfig, FeaturesConfig, SimulatorConfig, QualityConfig, RetriesConfig,
               KubernetesConfig, CatalogConfig, StudentsFile, RunConfig, GEMConfig, SourceConfig]
# Fields read without `.name` or "name" in the source, each with the reason.
READ_OTHERWISE: dict[str, str] = {}


def _fields(model: type) -> dict[str, Any]:
    """Field name -> annotation, of a pydantic model or a dataclass."""
    if dataclasses.is_dataclass(model):
        hints = typing.get_type_hints(model)
        return {f.name: hints[f.name] for f in dataclasses.fields(model)}
    return {name: field.annotation for name, field in model.model_fields.items()}


def _models(model: type, seen: set[type]) -> Iterator[type]:
    if model in seen:
        return
    seen.add(model)
    yield model
    for annotation in _fields(model).values():
        stack = [annotation]
        while stack:
            t = stack.pop()
            if isinstance(t, type) and (issubclass(t, BaseModel) or dataclasses.is_dataclass(t)):
                yield from _models(t, seen)
            stack.extend(typing.get_args(t) if not isinstance(t, types.NoneType) else [])


def _source_text() -> str:
    """The non-test source, less the validators' decorators (naming a field there checks it, it does not use it)."""
    return "\n".join(line for d in ("gem_model", "gem_pipelines") for p in (REPO_ROOT / d).rglob("*.py")
                     for line in p.read_text().splitlines() if "field_validator(" not in line)


def _unread(roots: list[type], text: str, seen: set[type]) -> list[str]:
    """'Model.field' of every field (nested models included) that `text` never reads as `.field` or "field"."""
    return [f"{model.__name__}.{name}" for root in roots for model in _models(root, seen) for name in _fields(model)
            if f"{model.__name__}.{name}" not in READ_OTHERWISE
            and not re.search(rf"\.{name}\b|[\"']{name}[\"']", text)]


def test_unread_sees_a_field_no_code_reads() -> None:
    @dataclasses.dataclass
    class Inner:
        used_dim: int = 1
        never_read: int = 2

    class Outer(BaseModel):
        inner: Inner | None = None
        also_used: str = ""

    text = "cfg.inner.used_dim\nraw['also_used']\n@field_validator('never_read')\n"
    assert _unread([Outer], text, set()) == []  # a validator naming it would pass for a read: stripped below
    assert _unread([Outer], "\n".join(line for line in text.splitlines() if "field_validator(" not in line),
                   set()) == ["Inner.never_read"]


def test_every_config_field_is_read_by_code() -> None:
    seen: set[type] = set()
    unread = _unread(ROOT_MODELS, _source_text(), seen)
    assert {RunConfig, GEMConfig, SourceConfig} <= seen and len(seen) >= 35
    assert not unread, f"config fields no code reads (delete them, or justify in READ_OTHERWISE): {unread}"


# ------------------------------------------------------------------------------------------------
# Environment variables

NOT_ENV = {"GEM_MODEL_LAYERS": "a tuple of tests/test_layout.py"}


def test_every_gem_variable_in_the_tree_is_in_env_vars() -> None:
    names: set[str] = set()
    for d in ("gem_model", "gem_pipelines", "kernels", "bench", "tests", ".ci"):
        for p in (REPO_ROOT / d).rglob("*"):
            if p.is_file() and p.suffix in (".py", ".sh", ".yaml", ".toml", "") and "__pycache__" not in p.parts:
                names |= set(re.findall(r"\bGEM_[A-Z0-9_]*[A-Z0-9]\b", p.read_text(errors="ignore")))
    names |= set(re.findall(r"\bGEM_[A-Z0-9_]*[A-Z0-9]\b", (REPO_ROOT / "Makefile").read_text()))
    assert {"GEM_HOME", "GEM_DATA", "GEM_KERNEL_BACKEND"} <= names
    missing = sorted(names - set(ENV_VARS) - set(NOT_ENV))
    assert not missing, f"GEM_* names missing from gem_model.config.ENV_VARS: {missing}"


def _environ(node: ast.AST) -> bool:
    """`os.environ` or a bare `environ`."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (isinstance(node, ast.Name)
                                                                             and node.id == "environ")


def gem_reads(path: Path) -> list[str]:
    """The GEM_* variables a file reads from the environment itself: os.environ.get/[]/setdefault/pop,
    os.getenv, `in os.environ`, with the name spelt out or held by a module-level constant. Writes
    (`os.environ["GEM_HOME"] = ...`: a process handing its state to its children) are not reads."""
    tree = ast.parse(path.read_text())
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
              for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value.value, str)}

    def name(arg: ast.AST) -> str | None:
        value = arg.value if isinstance(arg, ast.Constant) else consts.get(arg.id) if isinstance(arg, ast.Name) else None
        return value if isinstance(value, str) and value.startswith("GEM_") else None

    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr in ("get", "setdefault", "pop") and _environ(f.value)) or (
                    isinstance(f, ast.Attribute) and f.attr == "getenv") or (isinstance(f, ast.Name) and f.id == "getenv"):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _environ(node.value):
            key = node.slice
        elif isinstance(node, ast.Compare) and any(_environ(c) for c in node.comparators):
            key = node.left
        if key is not None and (n := name(key)):
            found.append(n)
    return found


# kernels/ imports nothing of the project, so it reads its GEM_KERNEL_* itself (each listed in ENV_VARS).
READS_ITSELF = ("kernels",)


def test_gem_reads_are_seen(tmp_path: Path) -> None:
    # lower-case names: the scan of GEM_* names below would take upper-case ones for variables of ours
    src = tmp_path / "m.py"
    src.write_text("import os\nfrom os import environ, getenv\nB = 'GEM_b'\n"
                   "a = os.environ.get('GEM_a', 'x')\nb = os.environ[B]\nc = os.getenv('GEM_c')\n"
                   "d = 'GEM_d' in os.environ\ne = environ.get('HOME')\nos.environ['GEM_e'] = '1'\nf = getenv('GEM_f')\n")
    assert gem_reads(src) == ["GEM_a", "GEM_b", "GEM_c", "GEM_d", "GEM_f"]


def test_gem_variables_are_read_through_env() -> None:
    """Every GEM_* read goes through gem_model.config.env(), so its default is the one ENV_VARS states."""
    direct, kernels = {}, set()
    for d in ("gem_model", "gem_pipelines", *READS_ITSELF):
        for p in (REPO_ROOT / d).rglob("*.py"):
            rel = p.relative_to(REPO_ROOT).as_posix()
            if rel != "gem_model/config.py" and (names := gem_reads(p)):
                if rel.startswith(READS_ITSELF):
                    kernels |= set(names)
                else:
                    direct[rel] = names
    assert not direct, f"read GEM_* through gem_model.config.env(): {direct}"
    assert {"GEM_KERNEL_BACKEND", "GEM_KERNEL_AUTOTUNE"} <= kernels <= set(ENV_VARS)


def test_env_gives_the_default_when_unset_or_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEM_EXECUTOR", raising=False)
    assert env("GEM_EXECUTOR") == ENV_VARS["GEM_EXECUTOR"].default == "default"
    monkeypatch.setenv("GEM_EXECUTOR", "")
    assert env("GEM_EXECUTOR") == "default"
    monkeypatch.setenv("GEM_EXECUTOR", "k8s")
    assert env("GEM_EXECUTOR") == "k8s"
    with pytest.raises(KeyError):
        env("GEM_" + "NOT_A_VARIABLE")  # spelt in two: the scan above would find it


@pytest.mark.parametrize("name", ["GEM_DEVICE", "GEM_ENV", "GEM_EXECUTOR"])
def test_a_value_outside_a_variables_choices_is_refused_naming_it(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ENV_VARS[name].choices:
        monkeypatch.setenv(name, value)
        assert env(name) == value
    monkeypatch.setenv(name, "gpu")
    with pytest.raises(ConfigError, match=f"{name}='gpu': must be one of"):
        env(name)


def test_a_key_given_twice_in_a_spec_is_refused(tmp_path: Path) -> None:
    """Plain YAML keeps the last of two equal keys: a fail rate of 0.10 then 0.90 would load 0.9."""
    text = (ASSETS_DIR / "quality.yaml").read_text()
    assert load_quality(ASSETS_DIR / "quality.yaml").quarantine_fail_rate == 0.10
    twice = tmp_path / "quality.yaml"
    twice.write_text(text + "quarantine_fail_rate: 0.90\n")
    with pytest.raises(ConfigError, match=r"(?s)quality\.yaml: not valid YAML.*'quarantine_fail_rate' is given twice"):
        load_quality(twice)
    nested = tmp_path / "nested.yaml"
    nested.write_text("model_gate:\n  max_ne: 1.0\n  max_ne: 2.0\n")
    with pytest.raises(ConfigError, match="'max_ne' is given twice"):
        load_quality(nested)


def test_quality_thresholds_that_contradict_are_refused(tmp_path: Path) -> None:
    bad = {"freshness_hours:\n  eventz: 36\n": "freshness_hours.eventz",
           "freshness_hours:\n  training_examples: -5\n": "freshness_hours.training_examples",
           "quarantine_warn_rate: 0.5\nquarantine_fail_rate: 0.05\n": "quarantine_warn_rate 0.5 is above"}
    for i, (text, named) in enumerate(bad.items()):
        path = tmp_path / f"q{i}.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(named)):
            load_quality(path)


def test_a_preset_is_a_name_of_assets_models_or_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    from gem_model.models.synthetic_batches import preset_dims
    from gem_model.train.config import load_preset
    from gem_pipelines.catalog import config_files

    assert load_preset("tiny")["model"] == load_preset(ASSETS_DIR / "models" / "tiny.yaml")["model"]  # a Path: a file
    for given in ("../../x", "../../etc/passwd.yaml", "/etc/hostname", "tiny.yaml"):  # a string: a name, never a path
        with pytest.raises(ConfigError, match=rf"preset '{re.escape(given)}' must match"):
            load_preset(given)
        with pytest.raises(ValueError, match="must match"):
            preset_dims(given)  # the bench's plain-YAML reader too
    monkeypatch.setenv("GEM_MODEL_PRESET", "../models/tiny")
    with pytest.raises(ConfigError, match=r"GEM_MODEL_PRESET '\.\./models/tiny' must match"):
        config_files("foundation")  # the catalog's file list (hashed for code versions)
    with pytest.raises(ConfigError, match=r"preset 'huge' .*known: \['base', 'large', 'small', 'tiny'\]"):
        load_preset("huge")



def test_every_model_preset_has_its_students_preset() -> None:
    """GEM_MODEL_PRESET picks the foundation's preset and the students' and domain models' (students.yaml)."""
    models = sorted(p.stem for p in (ASSETS_DIR / "models").glob("*.yaml") if p.name != "students.yaml")
    assert {"tiny", "small", "base", "large"} <= set(models)
    for name in models:
        assert load_student_preset(name)["preset"] == name
