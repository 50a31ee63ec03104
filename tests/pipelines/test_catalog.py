"""Every asset carries kinds, owners and a code version; lake tables their column schema and URI."""

from __future__ import annotations

import dagster as dg

from gem_model.store.paths import table_uri
from gem_pipelines.catalog import lake_schemas
from gem_pipelines.definitions import defs


def test_every_asset_is_catalogued() -> None:
    graph = defs.resolve_asset_graph()
    schemas = lake_schemas()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {"events", "training_examples"} <= set(schemas) <= keys
    for key in graph.get_all_asset_keys():
        node, name = graph.get(key), key.to_user_string()
        assert node.kinds and node.owners and node.code_version, name
        if name in schemas:
            cols = node.metadata["dagster/column_schema"]
            assert isinstance(cols, dg.TableSchema)
            assert [(c.name, c.type) for c in cols.columns] == [(c, str(t)) for c, t in schemas[name].items()]
            assert node.metadata["dagster/uri"] == table_uri(name)


def test_every_check_is_described_and_named_as_in_the_readme() -> None:
    from gem_model.config import REPO_ROOT
    from gem_pipelines.settings import QUALITY

    graph = defs.resolve_asset_graph()
    readme = (REPO_ROOT / "README.md").read_text()
    keys = graph.asset_check_keys
    assert {k.name for k in keys} >= {"gx_suite", "quality_gate", "freshness_check"}
    for key in keys:
        description = graph.get_check_spec(key).description or ""
        assert len(description) > 20 and "Evaluates freshness for targeted asset" not in description, key
        assert f"`{key.name}`" in readme, f"README does not name the check {key.name}"
    fresh = {k.asset_key.to_user_string(): graph.get_check_spec(k).description for k in keys if k.name == "freshness_check"}
    assert set(fresh) == {"events", "training_examples"}
    for name, description in fresh.items():
        hours = f"{getattr(QUALITY.freshness_hours, name):g} h"
        assert f"last {hours}" in description and "make next-day" in description and "clock" in description, name


def _copy_assets(tmp_path):
    import shutil

    from gem_model.config import ASSETS_DIR

    dest = tmp_path / "assets"
    shutil.copytree(ASSETS_DIR, dest, ignore=shutil.ignore_patterns("sources"))
    return dest


def test_code_version_follows_the_config_each_group_reads(tmp_path, monkeypatch) -> None:
    from gem_pipelines.catalog import code_version, config_files

    monkeypatch.delenv("GEM_DATA", raising=False)
    monkeypatch.setenv("GEM_MODEL_PRESET", "small")
    assets = _copy_assets(tmp_path)
    modules = {"ingest": "gem_pipelines.assets.ingest", "features": "gem_pipelines.assets.features",
               "foundation": "gem_pipelines.assets.foundation", "students": "gem_pipelines.assets.students"}
    before = {g: code_version(m, g, assets) for g, m in modules.items()}
    assert assets / "models" / "small.yaml" in config_files("foundation", assets)
    assert assets / "expectations" / "events.json" in config_files("ingest", assets)
    # features.yaml: read by features, foundation and students, not by ingest
    f = assets / "features.yaml"
    f.write_text(f.read_text() + "\n# an edit\n")
    after = {g: code_version(m, g, assets) for g, m in modules.items()}
    assert [g for g in modules if after[g] != before[g]] == ["features", "foundation", "students"]
    # students.yaml: the students group alone
    s = assets / "models" / "students.yaml"
    s.write_text(s.read_text().replace("kd_weight: 1.0", "kd_weight: 0.5", 1))
    again = {g: code_version(m, g, assets) for g, m in modules.items()}
    assert [g for g in modules if again[g] != after[g]] == ["students"]
    # the preset the foundation trains (GEM_MODEL_PRESET) counts, the others do not
    t = assets / "models" / "tiny.yaml"
    t.write_text(t.read_text() + "\n# an edit\n")
    assert code_version(modules["foundation"], "foundation", assets) == again["foundation"]
    monkeypatch.setenv("GEM_MODEL_PRESET", "tiny")
    assert code_version(modules["foundation"], "foundation", assets) != again["foundation"]


def test_features_code_version_covers_the_counters() -> None:
    from gem_model.config import REPO_ROOT
    from gem_pipelines.catalog import _LIBRARY

    files = {(REPO_ROOT / rel).resolve() for rel in _LIBRARY["features"]}
    assert (REPO_ROOT / "gem_pipelines/data/counters.py").resolve() in files
    assert (REPO_ROOT / "gem_pipelines/data/history.py").resolve() in files


def test_catalog_refuses_unknown_keys_and_names(tmp_path) -> None:
    import pytest
    import yaml

    from gem_model.config import ASSETS_DIR, ConfigError
    from gem_pipelines.catalog import annotate
    from gem_pipelines.definitions import defs

    assets = list(defs.assets or [])
    raw = yaml.safe_load((ASSETS_DIR / "catalog.yaml").read_text())
    for key, doc in [("ownrs", {**raw, "ownrs": {}}),  # top-level typo
                     ("kinds.evnts", {**raw, "kinds": {**raw["kinds"], "evnts": ["delta"]}}),
                     ("owners.ingst", {**raw, "owners": {**raw["owners"], "ingst": ["team:x"]}})]:
        path = tmp_path / f"{key}.yaml"
        path.write_text(yaml.safe_dump(doc))
        with pytest.raises(ConfigError) as err:
            annotate(assets, path)
        assert str(path) in str(err.value) and key in str(err.value)
