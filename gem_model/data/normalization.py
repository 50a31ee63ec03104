"""Dense-feature normalisation statistics of the training window, stored with the checkpoint.

The model standardises its dense inputs with fixed (mean, std) buffers computed once over the
training window, exactly as the Encoder transforms them (log1p where features.yaml says so, nulls
as 0), so evaluation and serving use the training window's statistics, not running ones that lag the data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from gem_model.config import DenseFeature, FeaturesConfig
from gem_model.data.own_surface import own_surface_view

MIN_STD = 1e-6


def window_scan(uri: str, dates: Sequence[Any], surfaces: Sequence[str] | None,
                storage_options: dict[str, str] | None = None) -> pl.LazyFrame:
    """The rows of `dates` (and of `surfaces` when given) of the table at `uri`."""
    lf = pl.scan_delta(uri, storage_options=storage_options or {}).filter(pl.col("date").is_in(list(dates)))
    return lf.filter(pl.col("surface").is_in(list(surfaces))) if surfaces else lf


def dense_expr(f: DenseFeature) -> pl.Expr:
    """The Encoder's transform of one dense column, as a polars expression."""
    x = pl.col(f.name).cast(pl.Float64).fill_null(0.0)
    return (x.clip(lower_bound=0.0).log1p() if f.transform == "log1p" else x).alias(f.name)


def dense_stats(
    uri: str, dates: Sequence[Any], surfaces: Sequence[str] | None, features: FeaturesConfig,
    storage_options: dict[str, str] | None = None, own_surface: str | None = None,
) -> tuple[list[float], list[float]]:
    """(mean, std) of every dense feature over the window's rows (population std, floored), as a model
    of `own_surface` alone reads them when given (gem_model.data.own_surface)."""
    lf = window_scan(uri, dates, surfaces, storage_options)
    if own_surface:
        lf = own_surface_view(lf, own_surface)
    x = lf.select([dense_expr(f) for f in features.dense])
    row = x.select(pl.all().mean().name.prefix("m_"), pl.all().std(ddof=0).name.prefix("s_")).collect().row(0)
    n = len(features.dense)
    mean = [float(v or 0.0) for v in row[:n]]
    std = [max(float(v or 0.0), MIN_STD) for v in row[n:]]
    return mean, std


def base_rates(
    uri: str, dates: Sequence[Any], surfaces: Sequence[str] | None, storage_options: dict[str, str] | None = None,
) -> dict[str, dict[str, float]]:
    """{surface: {task: positive rate}} over the window's labelled rows (a task with none is left out)."""
    lf = window_scan(uri, dates, surfaces, storage_options)
    df = lf.group_by("surface").agg(pl.col("click").cast(pl.Float64).mean(),
                                    pl.col("conversion").cast(pl.Float64).mean()).collect()
    return {r["surface"]: {t: float(r[t]) for t in ("click", "conversion") if r[t] is not None}
            for r in df.iter_rows(named=True)}
