"""Links from the Dagster UI to the reports under $GEM_HOME/reports, and the server behind them.

A browser does not follow file:// links from an http page, and frozen absolute paths break when
GEM_HOME moves, so metadata links to `<GEM_REPORTS_URL>/<path relative to reports/>` (default
http://127.0.0.1:3001, served by `python -m gem_pipelines.reports`, which `make ui` starts beside
`dagster dev`) and also records the path relative to GEM_HOME.
"""

from __future__ import annotations

import functools
import http.server
from pathlib import Path
from urllib.parse import quote, urlparse

import dagster as dg

from gem_model.config import env
from gem_model.store.paths import gem_home, reports_dir


def reports_url() -> str:
    return env("GEM_REPORTS_URL").rstrip("/")  # type: ignore[union-attr]


def report_links(path: str | Path) -> dict[str, dg.MetadataValue]:
    """{"<name>": url to the served report, "<name>_path": path relative to GEM_HOME} for a report file."""
    path = Path(path).resolve()
    try:
        rel = path.relative_to(reports_dir())
    except ValueError:  # written outside GEM_HOME/reports (a test's own docs_dir): only the path
        return {"path": dg.MetadataValue.path(str(path))}
    return {"url": dg.MetadataValue.url(f"{reports_url()}/{quote(rel.as_posix())}"),
            "path": dg.MetadataValue.path(path.relative_to(gem_home()).as_posix())}


def serve(directory: Path | None = None, url: str | None = None) -> http.server.ThreadingHTTPServer:
    """A static server of `directory` (default $GEM_HOME/reports) on the host/port of `url`."""
    parsed = urlparse(url or reports_url())
    if parsed.hostname not in ("127.0.0.1", "localhost"):
        raise ValueError(f"reports are served on 127.0.0.1 only, not {parsed.hostname!r}")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory or reports_dir()))
    return http.server.ThreadingHTTPServer(("127.0.0.1", parsed.port or 80), handler)


if __name__ == "__main__":
    server = serve()
    print(f"serving {reports_dir()} at {reports_url()}", flush=True)
    server.serve_forever()
