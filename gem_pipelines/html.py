"""Self-contained HTML pages (one inline stylesheet, no scripts, no external URL) for the reports the UI links
to: they read the same offline, from a file or from `python -m gem_pipelines.reports`."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; } caption { text-align: left; font-weight: 600; }
td, th { border: 1px solid #ccc; padding: 4px 10px; text-align: left; vertical-align: top; }
th { white-space: nowrap; } td { overflow-wrap: break-word; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.failed td { background: #fde2e2; } .ok { color: #176b2c; } .failed-text { color: #b00020; }
code, .mono { font-family: ui-monospace, monospace; font-size: 0.9em; word-break: break-word; }
.muted { color: #666; }
"""


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def page(title: str, body: str) -> str:
    """A whole document: `body` is HTML already escaped by its builder."""
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{_STYLE}</style></head>\n<body>\n<h1>{esc(title)}</h1>\n{body}\n</body></html>\n")


def cell(v: Any) -> str:
    """A table cell's text (HTML and markdown alike): floats to 4 places, None empty."""
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:.4f}"  # NaN: no positives to score, say
    return "" if v is None else str(v)


def table(cols: Sequence[str], rows: Iterable[Sequence[Any]], *, row_class: Sequence[str] = (),
          raw: frozenset[str] = frozenset(), table_id: str = "") -> str:
    """An HTML table; cells are escaped except in the columns named in `raw` (already HTML). Numbers are
    right-aligned, floats to 4 places."""

    def td(c: str, v: Any) -> str:
        text = v if c in raw else esc(cell(v))
        num = isinstance(v, int | float) and not isinstance(v, bool)
        return f'<td class="num">{text}</td>' if num else f"<td>{text}</td>"

    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body = [(f'<tr class="{row_class[i]}">' if i < len(row_class) and row_class[i] else "<tr>")
            + "".join(td(c, v) for c, v in zip(cols, row, strict=True)) + "</tr>" for i, row in enumerate(rows)]
    ident = f' id="{esc(table_id)}"' if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>\n" + "\n".join(body) + "\n</tbody></table>"
