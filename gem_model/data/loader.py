"""Batches from the `training_examples` Delta table: bounded memory, seeded shuffle, sharded, resumable.

Reading: one lazy `pl.scan_delta` per day (Delta partition pruning on `date`, a filter on `surface`),
streamed with `collect_batches` in chunks of `chunk_rows`. Histories are truncated to the most recent
`max_len` entries in the scan (`list.tail`) and reach the model as Arrow list offsets + flat values:
no padding anywhere. Chunks fill a shuffle buffer of at most `shuffle_buffer` rows (+ one chunk),
which is permuted with a generator seeded by (seed, epoch) and cut into batches. With `interleave_days`
the days' chunks arrive in turn (one chunk of each day), so a buffer smaller than a day still mixes days.

Sharding: every rank reads the same deterministic stream and keeps global batch `g` when
`g % world_size == rank`; a last incomplete round of batches is dropped so that all ranks take
the same number of steps (DDP needs that). Only the kept batches are converted to tensors.

Resuming: `position` counts the batches this rank has yielded in the current epoch; a new iterator
skips that many (cheaply: skipped batches are never materialised). `global_position` counts global
batches (every rank's), so a checkpoint written under one world size resumes under another: the new
ranks start their rounds at that global batch.

Loading happens in the main process (polars under `fork` can hang).
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import torch

from gem_model.config import FeaturesConfig, SurfacesConfig, load_features, load_surfaces
from gem_model.data.batch import TASKS, Batch  # noqa: F401  (re-exported: the batch type lives in gem_model.data.batch)
from gem_model.data.own_surface import own_surface_view
from gem_model.data.vocab import check_fits, hash_array, lookup, vocab_values
from gem_model.store.paths import storage_options as env_storage_options
from gem_model.store.paths import table_uri

# ------------------------------------------------------------------------------------------------
# Batches.


@dataclass
class Chunk:
    """The numpy form of a set of rows; `take` gathers rows, jagged columns included."""

    dense: np.ndarray
    sparse: np.ndarray
    offsets: np.ndarray
    history: dict[str, np.ndarray]
    surface_idx: np.ndarray
    labels: np.ndarray
    label_mask: np.ndarray
    request_ids: np.ndarray  # object array of str

    def __len__(self) -> int:
        return int(self.dense.shape[0])

    def take(self, idx: np.ndarray) -> Chunk:
        starts = self.offsets[idx]
        lengths = self.offsets[idx + 1] - starts
        new_off = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(lengths, out=new_off[1:])
        gather = np.repeat(starts - new_off[:-1], lengths) + np.arange(new_off[-1], dtype=np.int64)
        return Chunk(**{f: getattr(self, f)[idx] for f in _ROW_FIELDS}, offsets=new_off,
                     history={k: v[gather] for k, v in self.history.items()})

    @staticmethod
    def concat(chunks: Sequence[Chunk]) -> Chunk:
        if len(chunks) == 1:
            return chunks[0]
        offs, base = [np.zeros(1, dtype=np.int64)], 0
        for c in chunks:
            offs.append(c.offsets[1:] + base)
            base += int(c.offsets[-1])
        return Chunk(**{f: np.concatenate([getattr(c, f) for c in chunks]) for f in _ROW_FIELDS},
                     offsets=np.concatenate(offs),
                     history={k: np.concatenate([c.history[k] for c in chunks]) for k in chunks[0].history})

    def to_batch(self, pin_memory: bool = False) -> Batch:
        """Tensors (views of the arrays; page-locked copies with `pin_memory`), with `max_len`."""
        lengths = np.diff(self.offsets)
        batch = Batch(
            **{f: torch.from_numpy(getattr(self, f)) for f in _ROW_FIELDS[:-1]},
            offsets=torch.from_numpy(self.offsets),
            history={k: torch.from_numpy(v) for k, v in self.history.items()},
            request_ids=self.request_ids.tolist(),
            max_len=int(lengths.max()) if len(lengths) else 0,
        )
        return batch.pin_memory() if pin_memory else batch


# one entry per row (request_ids last: the one that is not a tensor in a Batch)
_ROW_FIELDS = ("dense", "sparse", "surface_idx", "labels", "label_mask", "request_ids")


class Encoder:
    """Turns rows of `training_examples` into a `Chunk` following features.yaml and surfaces.yaml."""

    def __init__(self, features: FeaturesConfig, surfaces: SurfacesConfig, max_len: int | None = None):
        self.features = features
        self.surfaces = surfaces
        self.max_len = min(max_len or features.history.max_len, features.history.max_len)
        self.surface_index = {s: i for i, s in enumerate(surfaces.names)}
        self.has_conversion = np.array(["conversion" in s.tasks for s in surfaces.surfaces], dtype=bool)
        # closed vocabularies (enums, surfaces, actions): looked up, never hashed
        self.vocab: dict[str, list[str]] = {}
        for f in [*features.sparse, *features.history.columns]:
            if f.vocab is not None:
                self.vocab[f.name] = vocab_values(f.vocab, surfaces)
                check_fits(f.name, self.vocab[f.name], int(f.buckets or 0))

    def _ids(self, name: str, arr: pa.Array, buckets: int) -> np.ndarray:
        return lookup(arr, self.vocab[name]) if name in self.vocab else hash_array(arr, buckets)

    @property
    def columns(self) -> list[str]:
        """The only columns ever read (never oracle columns, never timestamps of labels)."""
        cols = ["request_id", "surface", "click", "conversion"]
        cols += [f.name for f in self.features.dense] + [f.name for f in self.features.sparse]
        cols += [c.name for c in self.features.history.columns]
        return list(dict.fromkeys(cols))

    def select(self, lf: pl.LazyFrame) -> pl.LazyFrame:
        """Project the needed columns and keep the most recent `max_len` history entries."""
        hist = [c.name for c in self.features.history.columns]
        return lf.select(
            [pl.col(c) for c in self.columns if c not in hist]
            + [pl.col(c).list.tail(self.max_len) for c in hist]
        )

    def encode(self, df: pl.DataFrame) -> Chunk:
        df = df.rechunk()
        n = df.height
        dense = np.zeros((n, len(self.features.dense)), dtype=np.float32)
        for j, f in enumerate(self.features.dense):
            x = df[f.name].cast(pl.Float64).fill_null(0.0).to_numpy()
            if f.transform == "log1p":
                x = np.log1p(np.clip(x, 0.0, None))
            dense[:, j] = x
        sparse = np.zeros((n, len(self.features.sparse)), dtype=np.int64)
        for j, f in enumerate(self.features.sparse):
            sparse[:, j] = self._ids(f.name, df[f.name].to_arrow(), f.buckets)

        offsets = None
        history: dict[str, np.ndarray] = {}
        for c in self.features.history.columns:
            arr = df[c.name].to_arrow()
            arr = arr.fill_null(pa.scalar([], type=arr.type)) if arr.null_count else arr
            off = np.asarray(arr.offsets, dtype=np.int64)
            off = off - off[0]
            if offsets is None:
                offsets = off
            elif not np.array_equal(offsets, off):
                raise ValueError(f"{c.name}: list lengths differ from the other history columns")
            values = arr.flatten()
            if c.source == "ts":
                history[c.name] = values.fill_null(0.0).to_numpy(zero_copy_only=False).astype(np.float32)
            else:
                history[c.name] = self._ids(c.name, values, int(c.buckets or 2))
        if offsets is None:
            offsets = np.zeros(n + 1, dtype=np.int64)

        surf = df["surface"].to_list()
        surface_idx = np.fromiter((self.surface_index[s] for s in surf), dtype=np.int64, count=n)
        click = df["click"].cast(pl.Float32)
        conv = df["conversion"].cast(pl.Float32)
        labels = np.stack([click.fill_null(0).to_numpy(), conv.fill_null(0).to_numpy()], 1).astype(np.float32)
        mask = np.stack(
            [click.is_not_null().to_numpy(), conv.is_not_null().to_numpy() & self.has_conversion[surface_idx]], 1
        )
        rids = np.asarray(df["request_id"].to_list(), dtype=object)
        return Chunk(dense, sparse, offsets, history, surface_idx, labels, mask.astype(bool), rids)


def date_range(start: dt.date | str, end: dt.date | str) -> list[dt.date]:
    s, e = (d if isinstance(d, dt.date) else dt.date.fromisoformat(str(d)) for d in (start, end))
    return [s + dt.timedelta(days=i) for i in range((e - s).days + 1)]


class ExampleStream:
    """An iterable over `Batch`es of `training_examples` for dates [start, end] and some surfaces."""

    def __init__(
        self,
        start: dt.date | str,
        end: dt.date | str | None = None,
        surfaces: Sequence[str] | None = None,
        *,
        batch_size: int = 1024,
        features: FeaturesConfig | None = None,
        surfaces_config: SurfacesConfig | None = None,
        uri: str | None = None,
        storage_options: dict[str, str] | None = None,
        shuffle: bool = True,
        shuffle_buffer: int = 65536,
        chunk_rows: int = 16384,
        interleave_days: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool | None = None,
        max_len: int | None = None,
        pin_memory: bool = False,
        own_surface: bool = False,
        where: pl.Expr | None = None,
    ):
        self.where = where  # a row filter on training_examples' columns (e.g. the hours of a day served so far)
        self.pin_memory = pin_memory  # page-locked batches for non_blocking copies to CUDA
        self.features = features or load_features()
        self.surfaces_config = surfaces_config or load_surfaces()
        self.dates = date_range(start, end if end is not None else start)
        self.surfaces = list(surfaces) if surfaces else list(self.surfaces_config.names)
        if unknown := set(self.surfaces) - set(self.surfaces_config.names):
            raise ValueError(f"unknown surfaces {sorted(unknown)}; known: {self.surfaces_config.names}")
        if own_surface and len(self.surfaces) != 1:
            raise ValueError(f"own_surface reads one surface's data: got surfaces {self.surfaces}")
        self.own_surface = self.surfaces[0] if own_surface else None  # gem_model.data.own_surface
        self.encoder = Encoder(self.features, self.surfaces_config, max_len)
        self.uri = uri or table_uri("training_examples")
        self.storage_options = storage_options if storage_options is not None else env_storage_options()
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.shuffle_buffer = max(shuffle_buffer, batch_size)
        self.chunk_rows = chunk_rows
        self.interleave_days = interleave_days
        self.seed = seed
        self.rank, self.world_size = rank, world_size
        self.drop_last = shuffle if drop_last is None else drop_last
        self.epoch = 0
        self.position = 0  # batches yielded by this rank in the current epoch
        self.offset = 0  # global batches skipped before this rank's rounds start (resume across world sizes)

    # -- resumable position --------------------------------------------------------------------
    @property
    def global_position(self) -> int:
        """Global batches (all ranks together) consumed in the current epoch: independent of world size."""
        return self.offset + self.position * self.world_size

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "global_position": self.global_position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume at `global_position` (state_dict's, or loop.load_checkpoint's): any world size."""
        self.epoch = int(state["epoch"])
        self.offset, self.position = int(state["global_position"]), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position, self.offset = epoch, 0, 0

    # -- reading ---------------------------------------------------------------------------------
    def _scan(self, day: dt.date) -> pl.LazyFrame:
        lf = pl.scan_delta(self.uri, storage_options=self.storage_options)
        lf = lf.filter(pl.col("date") == day, pl.col("surface").is_in(self.surfaces))
        if self.where is not None:
            lf = lf.filter(self.where)
        if self.own_surface:
            lf = own_surface_view(lf, self.own_surface)
        return self.encoder.select(lf)

    def count_rows(self) -> int:
        """Rows in the window (cheap: Delta pruning + parquet statistics)."""
        return sum(int(self._scan(d).select(pl.len()).collect().item()) for d in self.dates)

    def _day_chunks(self, day: dt.date) -> Iterator[Chunk]:
        for df in self._scan(day).collect_batches(chunk_size=self.chunk_rows, maintain_order=True):
            if df.height:
                yield self.encoder.encode(df)

    def _chunks(self, rng: np.random.Generator) -> Iterator[Chunk]:
        days = list(self.dates)
        if self.shuffle:
            days = [days[i] for i in rng.permutation(len(days))]
        if not (self.shuffle and self.interleave_days):
            for d in days:
                yield from self._day_chunks(d)
            return
        # a day's rows are stored in time order and a day can outgrow the buffer: one chunk of each day in
        # turn, so that no stretch of steps trains on one day alone (the model drifts toward that day)
        live = [self._day_chunks(d) for d in days]
        while live:
            for it in list(live):
                chunk = next(it, None)
                if chunk is None:
                    live.remove(it)
                else:
                    yield chunk

    def _global_batches(self) -> Iterator[tuple[Chunk, np.ndarray]]:
        """(chunk, row indices) of every global batch of the epoch, in a seeded order."""
        rng = np.random.default_rng([self.seed, self.epoch])
        buf: list[Chunk] = []
        rows = 0
        for chunk in self._chunks(rng):
            buf.append(chunk)
            rows += len(chunk)
            if rows >= self.shuffle_buffer:
                pool = Chunk.concat(buf)
                order = rng.permutation(len(pool)) if self.shuffle else np.arange(len(pool))
                n_full = len(pool) // self.batch_size
                for i in range(n_full):
                    yield pool, order[i * self.batch_size : (i + 1) * self.batch_size]
                rest = order[n_full * self.batch_size :]
                buf = [pool.take(np.sort(rest))] if len(rest) else []
                rows = len(rest)
        if rows:
            pool = Chunk.concat(buf)
            order = rng.permutation(len(pool)) if self.shuffle else np.arange(len(pool))
            for i in range(0, len(pool), self.batch_size):
                idx = order[i : i + self.batch_size]
                if len(idx) < self.batch_size and self.drop_last:
                    break
                yield pool, idx

    def __iter__(self) -> Iterator[Batch]:
        skip = self.position
        mine = 0  # batches of this rank seen so far in the epoch
        pending: tuple[Chunk, np.ndarray] | None = None
        # rounds of world_size batches start at the resumed global position
        for g, (pool, idx) in enumerate(itertools.islice(self._global_batches(), self.offset, None)):
            if g % self.world_size == self.rank:
                pending = (pool, idx)
            if g % self.world_size == self.world_size - 1 and pending is not None:
                pool, idx = pending
                pending = None
                mine += 1
                if mine > skip:
                    self.position = mine
                    yield pool.take(idx).to_batch(self.pin_memory)
