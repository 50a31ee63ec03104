"""Closed vocabularies (enums, surfaces, actions) and the collision rate of the hashed open ones.

A feature with `vocab:` in features.yaml maps value i of its vocabulary to row i + 1 of its table
(row 0 = null or a value outside the vocabulary): small vocabularies never collide, and the rows
of existing values do not move when a value is appended (a warm start keeps them). Open
vocabularies (user, ad, advertiser ids) are hashed; `collision_rates` says how often two distinct
ids of a window share a row.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from gem_model.config import FeaturesConfig, SurfacesConfig
from gem_model.data.normalization import window_scan

NULL_BUCKET = 0  # hashed ids land in 1..buckets-1; bucket 0 means null / missing

# Hashing: deterministic across processes, platforms and library versions.


def hash_int64(values: np.ndarray, buckets: int) -> np.ndarray:
    """splitmix64 finaliser of int64 ids -> [1, buckets) (0 is reserved for null)."""
    with np.errstate(over="ignore"):
        z = np.asarray(values, dtype=np.int64).view(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(buckets - 1)).astype(np.int64) + 1


@lru_cache(maxsize=65536)
def hash_string(value: str, buckets: int) -> int:
    """blake2b-64 of the UTF-8 string -> [1, buckets)."""
    h = int.from_bytes(hashlib.blake2b(value.encode(), digest_size=8).digest(), "little")
    return h % (buckets - 1) + 1


def hash_array(arr: pa.Array, buckets: int) -> np.ndarray:
    """Hash an Arrow int or string array into [0, buckets); nulls -> 0."""
    if pa.types.is_integer(arr.type):
        out = hash_int64(arr.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64), buckets)
    else:
        enc = pc.dictionary_encode(arr.cast(pa.large_string()) if not pa.types.is_dictionary(arr.type) else arr)
        lut = np.array([hash_string(s, buckets) for s in enc.dictionary.to_pylist()] + [NULL_BUCKET], np.int64)
        idx = enc.indices.fill_null(len(lut) - 1).to_numpy(zero_copy_only=False).astype(np.int64)
        out = lut[idx]
    if arr.null_count:
        out[np.asarray(arr.is_null())] = NULL_BUCKET
    return out


def vocab_values(vocab: Sequence[str] | str, surfaces: SurfacesConfig) -> list[str]:
    """The values of a `vocab:` entry ("surfaces" = surfaces.yaml names in order)."""
    return list(surfaces.names) if vocab == "surfaces" else list(vocab)


def check_fits(name: str, values: Sequence[str], buckets: int) -> None:
    if len(values) + 1 > buckets:
        raise ValueError(f"{name}: vocabulary of {len(values)} values does not fit {buckets} rows (1 is for unknown)")
    if len(set(values)) != len(values):
        raise ValueError(f"{name}: vocabulary has duplicates: {list(values)}")


def lookup(arr: pa.Array, values: Sequence[str]) -> np.ndarray:
    """Row of each value: index in `values` + 1; null and unknown values -> 0."""
    idx = pc.index_in(arr.cast(pa.string()), value_set=pa.array(list(values), pa.string()))
    return (idx.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64) + 1)


def collision_rates(
    uri: str, dates: Sequence[Any], surfaces: Sequence[str] | None, features: FeaturesConfig,
    storage_options: dict[str, str] | None = None,
) -> dict[str, dict[str, float]]:
    """Per hashed (open-vocabulary) feature of the window: distinct ids, and the fraction of them
    that share their row with another id of the window."""
    lf = window_scan(uri, dates, surfaces, storage_options)
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
