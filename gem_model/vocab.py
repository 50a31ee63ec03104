"""Closed vocabularies (enums, surfaces, actions) and the collision rate of the hashed open ones.

A feature with `vocab:` in features.yaml maps value i of its vocabulary to row i + 1 of its table
(row 0 = null or a value outside the vocabulary): small vocabularies never collide, and the rows
of existing values do not move when a value is appended (a warm start keeps them). Open
vocabularies (user, ad, advertiser ids) are hashed; `collision_rates` says how often two distinct
ids of a window share a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from gem_model.config import FeaturesConfig, SurfacesConfig

UNKNOWN = 0  # row of null and out-of-vocabulary values


def vocab_values(vocab: Sequence[str] | str, surfaces: SurfacesConfig) -> list[str]:
    """The values of a `vocab:` entry ("surfaces" = surfaces.yaml names in order)."""
    return list(surfaces.names) if vocab == "surfaces" else list(vocab)


def check_fits(name: str, values: Sequence[str], buckets: int) -> None:
    if len(values) + 1 > buckets:
        raise ValueError(f"{name}: vocabulary of {len(values)} values does not fit {buckets} rows (1 is for unknown)")
    if len(set(values)) != len(values):
        raise ValueError(f"{name}: vocabulary has duplicates: {list(values)}")


def lookup(arr: pa.Array | pa.ChunkedArray, values: Sequence[str]) -> np.ndarray:
    """Row of each value: index in `values` + 1; null and unknown values -> 0."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if len(arr) == 0:
        return np.zeros(0, dtype=np.int64)
    idx = pc.index_in(arr.cast(pa.string()), value_set=pa.array(list(values), pa.string()))
    return (idx.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64) + 1)


def collision_rates(
    uri: str, dates: Sequence[Any], surfaces: Sequence[str] | None, features: FeaturesConfig,
    storage_options: dict[str, str] | None = None,
) -> dict[str, dict[str, float]]:
    """Per hashed (open-vocabulary) feature of the window: distinct ids, and the fraction of them
    that share their row with another id of the window."""
    from gem_model.data import hash_array  # data imports this module

    lf = pl.scan_delta(uri, storage_options=storage_options or {}).filter(pl.col("date").is_in(list(dates)))
    if surfaces:
        lf = lf.filter(pl.col("surface").is_in(list(surfaces)))
    out: dict[str, dict[str, float]] = {}
    cols = [(f.name, f.buckets, False) for f in features.sparse if f.vocab is None]
    cols += [(c.name, int(c.buckets or 2), True) for c in features.history.columns
             if c.vocab is None and c.source != "ts"]
    for name, buckets, is_list in cols:
        expr = pl.col(name).explode() if is_list else pl.col(name)
        ids = lf.select(expr.drop_nulls().unique()).collect()[name].to_arrow()
        rows = hash_array(ids, buckets)
        _, counts = np.unique(rows, return_counts=True)
        shared = int(counts[counts > 1].sum())
        out[name] = {"ids": int(len(ids)), "buckets": int(buckets),
                     "collision_rate": shared / len(ids) if len(ids) else 0.0}
    return out
