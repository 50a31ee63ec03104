"""The Data Docs page view, with Jinja templates compiled once per process instead of once per build, and
a site builder that copies GX's static assets once per process and site instead of on every build.

GX builds a new SiteBuilder, and with it a new Jinja Environment, on every `build_data_docs` call, so
its ~36 page templates are compiled again each time: about half the cost of rendering one ingest run's
pages. The compiled code is kept in a process-wide bytecode cache (keyed by template name and checked
against the template source's checksum by Jinja itself); rendering is GX's own. Imported by GX through
the site's `view` config (`validation.py`), which is why GX is imported at module level here.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from great_expectations.render.renderer.site_builder import SiteBuilder
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


_STATIC_COPIED: set[Path] = set()  # sites whose static/ this process has written
_STATIC_LOCK = threading.Lock()


class StaticOnceSiteBuilder(SiteBuilder):
    """GX's SiteBuilder, except that `build` copies the static assets (4 MB of fonts, styles and images from
    the installed GX, a fifth of a small run's Data Docs time) only when this process has not copied them into
    this site yet or the site's `static/` folder is gone. Pages are rendered by GX as before."""

    def build(self, resource_identifiers: Any = None, build_index: bool = True) -> Any:
        for section_builder in self.site_section_builders.values():
            section_builder.build(resource_identifiers=resource_identifiers)
        site = Path(self.store_backend["base_directory"]).resolve()
        with _STATIC_LOCK:
            if site not in _STATIC_COPIED or not (site / "static").is_dir():
                self.target_store.copy_static_assets()
                _STATIC_COPIED.add(site)
        _, index_links = self.site_index_builder.build(build_index=build_index)
        return self.get_resource_url(only_if_exists=False), index_links
