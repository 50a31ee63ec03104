"""Dagster metadata builders shared by the assets: previews, suite summaries, plots."""

from __future__ import annotations

import base64
import io
from typing import TYPE_CHECKING, Any

import dagster as dg
import polars as pl

if TYPE_CHECKING:
    from gem_pipelines.data.validation import SuiteResult


def preview(df: pl.DataFrame, n: int = 5) -> dg.MetadataValue:
    """A small markdown table of the first rows (lists and long strings shortened)."""
    head = df.head(n).with_columns(
        [pl.col(c).cast(pl.String).str.slice(0, 60) for c, t in df.schema.items() if t == pl.String]
        + [
            pl.col(c).list.len().cast(pl.String).alias(c) + pl.lit(" items")
            for c, t in df.schema.items()
            if isinstance(t, pl.List)
        ]
    )
    cols = head.columns
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in head.iter_rows():
        lines.append("| " + " | ".join("" if v is None else str(v).replace("|", "\\|") for v in row) + " |")
    return dg.MetadataValue.md("\n".join(lines))


def suite_metadata(suite: SuiteResult) -> dict[str, Any]:
    meta: dict[str, Any] = {k: v for k, v in suite.to_metadata().items() if isinstance(v, (int, float, str, bool))}
    meta["result"] = dg.MetadataValue.json(suite.to_metadata())
    if suite.docs_index:
        meta["data_docs"] = dg.MetadataValue.path(suite.docs_index)
    return meta


def png_markdown(fig: Any) -> dg.MetadataValue:
    """A matplotlib figure as an inline base64 PNG the Dagster UI renders."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    data = base64.b64encode(buf.getvalue()).decode()
    return dg.MetadataValue.md(f"![plot](data:image/png;base64,{data})")
