"""YAML as every spec in assets/ is read: PyYAML's safe loader, refusing a key given twice in one mapping (plain
YAML keeps the last one silently, so `quarantine_fail_rate: 0.10` then `0.90` would load 0.9). PyYAML only: the
GPU machine's scripts (gem_model/models/synthetic_batches.py) read it without pydantic."""

from __future__ import annotations

from typing import Any

import yaml


class _UniqueKeyLoader(yaml.SafeLoader):
    pass


def _mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges may override keys: YAML's own rule
            continue
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError("while reading a mapping", node.start_mark,
                                                    f"key {key!r} is given twice", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load_yaml(text: str) -> Any:
    """yaml.safe_load(text), but a key twice in one mapping raises yaml.YAMLError naming it and its line."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
