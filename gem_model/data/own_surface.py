"""What a single-surface model may read: its own surface's data and nothing of the others.

The foundation's single-surface baseline must not read the user's history on other surfaces (hist_*) nor the
counters over every surface (schemas.CROSS_SURFACE_COUNTERS), or the comparison measures nothing of what learning
across surfaces adds. Its view keeps its own surface's history entries and reads each cross-surface counter as its
one-surface counterpart ("every other surface": 0); the model's inputs keep their shape.
"""

from __future__ import annotations

import polars as pl

from gem_model.store.schemas import CROSS_SURFACE_COUNTERS, HISTORY_COLUMNS


def own_surface_view(lf: pl.LazyFrame, surface: str) -> pl.LazyFrame:
    """`training_examples` rows as a model of `surface` alone sees them (the same columns)."""
    names = set(lf.collect_schema().names())
    keep = pl.col("hist_surface").list.eval((pl.element() == surface).arg_true())
    history = [pl.col(c).list.gather(keep) for c in HISTORY_COLUMNS if c in names] if "hist_surface" in names else []
    counters = [(pl.col(own) if own else pl.lit(0.0)).alias(cross)
                for cross, own in CROSS_SURFACE_COUNTERS.items() if cross in names]
    return lf.with_columns(*history, *counters)
