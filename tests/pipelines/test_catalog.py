"""Every asset carries kinds, owners and a code version; lake tables their column schema and URI."""

from __future__ import annotations

import dagster as dg

from gem_model.paths import table_uri
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
