"""The Data Docs page view, with Jinja templates compiled once per process instead of once per build.

GX builds a new SiteBuilder, and with it a new Jinja Environment, on every `build_data_docs` call, so
its ~36 page templates are compiled again each time: about half the cost of rendering one ingest run's
pages. The compiled code is kept in a process-wide bytecode cache (keyed by template name and checked
against the template source's checksum by Jinja itself); rendering is GX's own. Imported by GX through
the site's `view` config (`validation.py`), which is why GX is imported at module level here.
"""

from __future__ import annotations

from typing import Any

from great_expectations.render.view import DefaultJinjaPageView
from jinja2 import BytecodeCache
from jinja2.bccache import Bucket


class _MemoryBytecodeCache(BytecodeCache):
    def __init__(self) -> None:
        self._code: dict[str, bytes] = {}

    def load_bytecode(self, bucket: Bucket) -> None:
        code = self._code.get(bucket.key)
        if code is not None:
            bucket.bytecode_from_string(code)

    def dump_bytecode(self, bucket: Bucket) -> None:
        self._code[bucket.key] = bucket.bytecode_to_string()


_BYTECODE = _MemoryBytecodeCache()


class CachedJinjaPageView(DefaultJinjaPageView):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.env.bytecode_cache = _BYTECODE
