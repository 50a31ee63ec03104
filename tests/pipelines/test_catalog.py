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
    assert set(schemas) <= keys
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
        hours = f"{QUALITY.freshness_hours[name]:g} h"
        assert f"last {hours}" in description and "make next-day" in description and "clock" in description, name
