"""The Delta batch stream: jagged history straight from Arrow, masks, shuffling, sharding, resume."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from gem_model.config import load_features
from gem_model.data.loader import Encoder, ExampleStream
from gem_model.data.vocab import hash_array, hash_int64, hash_string
from gem_model.store.paths import table_uri

pytestmark = pytest.mark.timeout(120)


def _stream(**kw) -> ExampleStream:
    kw.setdefault("batch_size", 256)
    return ExampleStream("2026-11-02", kw.pop("end", "2026-11-03"), kw.pop("surfaces", None), **kw)


def test_hashing_is_deterministic_and_in_range():
    ids = np.array([0, 1, 2, -5, 2**62], dtype=np.int64)
    h = hash_int64(ids, 1000)
    assert ((h >= 1) & (h < 1000)).all()
    np.testing.assert_array_equal(h, hash_int64(ids, 1000))

    def splitmix(x: int, buckets: int) -> int:  # a pure-Python reference: no library version involved
        m = (1 << 64) - 1
        z = (x + 0x9E3779B97F4A7C15) & m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return (z ^ (z >> 31)) % (buckets - 1) + 1

    for x in (0, 1, 12345, 2**62):
        assert hash_int64(np.array([x]), 8192)[0] == splitmix(x, 8192)
    assert hash_string("feed", 16) == hash_string("feed", 16) and 1 <= hash_string("feed", 16) < 16
    import pyarrow as pa

    out = hash_array(pa.array(["a", None, "b", "a"]), 64)
    assert out[1] == 0 and out[0] == out[3]


def test_batches_shapes_and_jagged_history(lake):
    feats = load_features()
    s = _stream(shuffle=False, max_len=8)
    batches = list(s)
    b = batches[0]
    B = len(b)
    assert b.dense.shape == (B, len(feats.dense)) and b.dense.dtype == torch.float32
    assert b.sparse.shape == (B, len(feats.sparse)) and b.sparse.dtype == torch.int64
    assert b.offsets.shape == (B + 1,) and b.offsets.dtype == torch.int64 and int(b.offsets[0]) == 0
    L = int(b.offsets[-1])
    for c in feats.history.columns:
        assert b.history[c.name].shape == (L,)
    assert b.history["hist_seconds_before"].dtype == torch.float32
    assert b.labels.shape == (B, 2) and b.label_mask.shape == (B, 2) and b.label_mask.dtype == torch.bool
    assert len(b.request_ids) == B
    # history = the most recent max_len entries of the source lists, oldest first
    src = pl.read_delta(table_uri("training_examples")).filter(pl.col("request_id").is_in(b.request_ids[:20]))
    src = {r["request_id"]: r for r in src.to_dicts()}
    lengths = (b.offsets[1:] - b.offsets[:-1]).tolist()
    for i, rid in enumerate(b.request_ids[:20]):
        full = src[rid]["hist_item_id"]
        assert lengths[i] == min(len(full), 8)
        got = b.history["hist_item_id"][b.offsets[i] : b.offsets[i + 1]].numpy()
        rows = next(c.buckets for c in load_features().history.columns if c.name == "hist_item_id")
        want = hash_int64(np.array(full[-8:] if full else [], dtype=np.int64), rows) if full else np.zeros(0)
        np.testing.assert_array_equal(got, want)
        secs = b.history["hist_seconds_before"][b.offsets[i] : b.offsets[i + 1]].numpy()
        np.testing.assert_allclose(secs, np.array(src[rid]["hist_seconds_before"][-8:], dtype=np.float32))
    assert sum(len(x) for x in batches) == s.count_rows()


def test_label_masks(lake):
    b = next(iter(_stream(shuffle=False, batch_size=2000)))
    reels = ["feed", "reels", "marketplace", "shops"].index("reels")
    is_reels = b.surface_idx == reels
    assert is_reels.any()
    assert not b.label_mask[is_reels, 1].any()  # reels logs no conversions
    assert b.label_mask[~is_reels, 1].all() and b.label_mask[:, 0].all()


def test_never_reads_oracle_columns(lake, monkeypatch):
    """Even if a training table carried oracle probabilities, the loader would not read them."""
    leak = pl.read_delta(table_uri("training_examples")).with_columns(
        pl.lit(0.5).alias("p_click"), pl.lit(0.1).alias("p_conversion")
    )
    leak.write_delta(table_uri("leaky_examples"), mode="overwrite", delta_write_options={"partition_by": ["date"]})
    seen: list[list[str]] = []
    orig = Encoder.encode

    def spy(self, df):
        seen.append(df.columns)
        return orig(self, df)

    monkeypatch.setattr(Encoder, "encode", spy)
    batches = list(_stream(uri=table_uri("leaky_examples")))
    assert batches and seen
    for cols in seen:
        assert not {"p_click", "p_conversion"} & set(cols)
    oracle_like = {"p_click", "p_conversion", "oracle"}
    assert not oracle_like & set(Encoder(load_features(), batches[0] and _stream().surfaces_config).columns)
    for b in batches:
        assert not oracle_like & set(vars(b))
        assert not oracle_like & set(b.history)


def test_surface_filter(lake):
    s = _stream(surfaces=["shops"])
    idx = torch.cat([b.surface_idx for b in s])
    assert set(idx.tolist()) == {3}


def test_shuffle_is_seeded(lake):
    ids = lambda s: [r for b in s for r in b.request_ids]  # noqa: E731
    a, b = ids(_stream(seed=1)), ids(_stream(seed=1))
    assert a == b
    c = ids(_stream(seed=2))
    assert c != a and len(set(c) & set(a)) > 0.9 * len(a)  # drop_last drops different rows
    s = _stream(seed=1)
    s.set_epoch(1)
    assert ids(s) != a


def test_shuffle_buffer_is_bounded(lake, monkeypatch):
    from gem_model.data import loader as data_mod

    sizes: list[int] = []
    orig = data_mod.Chunk.concat

    def spy(chunks):
        out = orig(chunks)
        sizes.append(len(out))
        return out

    monkeypatch.setattr(data_mod.Chunk, "concat", staticmethod(spy))
    list(_stream(shuffle_buffer=1000, chunk_rows=500, batch_size=100))
    assert sizes and max(sizes) <= 1000 + 500


def test_interleaved_days_mix_every_buffer_and_keep_every_row(lake):
    day_of = dict(pl.read_delta(table_uri("training_examples")).select("request_id", pl.col("date").cast(pl.Utf8)).iter_rows())

    def days_per_batch(**kw) -> tuple[list[int], list[str]]:
        batches = list(_stream(shuffle_buffer=400, chunk_rows=200, batch_size=100, drop_last=False, seed=4, **kw))
        rows = [r for b in batches for r in b.request_ids]
        return [len({day_of[r] for r in b.request_ids}) for b in batches], rows

    blocked, rows_blocked = days_per_batch()
    mixed, rows_mixed = days_per_batch(interleave_days=True)
    assert blocked[0] == 1  # a buffer smaller than a day: the first batches are one day's
    assert all(n == 2 for n in mixed[:4])  # every buffer holds a chunk of each day
    assert sorted(rows_mixed) == sorted(rows_blocked) and len(set(rows_mixed)) == len(rows_mixed)


def test_sharding_is_disjoint_and_even(lake):
    full = [r for b in _stream(seed=3) for r in b.request_ids]
    r0 = [r for b in _stream(seed=3, rank=0, world_size=2) for r in b.request_ids]
    r1 = [r for b in _stream(seed=3, rank=1, world_size=2) for r in b.request_ids]
    assert len(r0) == len(r1) > 0
    assert not set(r0) & set(r1)
    assert set(r0) | set(r1) <= set(full)


def test_resume_position(lake):
    s = _stream(seed=5)
    it = iter(s)
    first = [next(it).request_ids for _ in range(3)]
    state = s.state_dict()
    assert state == {"epoch": 0, "position": 3, "global_position": 3}  # global: any world size resumes it
    rest = [b.request_ids for b in it]
    s2 = _stream(seed=5)
    s2.load_state_dict(state)
    assert [b.request_ids for b in s2] == rest
    assert first[0] != rest[0]


def test_batches_carry_max_len_computed_on_the_host():
    """max_len travels with the batch (the model never reads the offsets back from the device)."""
    from gem_model.data.loader import Chunk

    offsets = np.array([0, 3, 3, 10, 11], dtype=np.int64)
    hist = {"hist_item_id": np.arange(11, dtype=np.int64)}
    chunk = Chunk(np.zeros((4, 2), np.float32), np.zeros((4, 1), np.int64), offsets, hist, np.zeros(4, np.int64),
                  np.zeros((4, 2), np.float32), np.ones((4, 2), bool), np.array(list("abcd"), dtype=object))
    batch = chunk.to_batch()
    assert batch.max_len == 7 and isinstance(batch.max_len, int)
    assert chunk.take(np.array([0, 3])).to_batch().max_len == 3
    assert chunk.take(np.array([1])).to_batch().max_len == 0


def test_stream_batches_carry_max_len(lake):
    batches = list(_stream(max_len=8))
    assert batches
    for b in batches:
        assert b.max_len == int((b.offsets[1:] - b.offsets[:-1]).max())
        assert b.max_len <= 8
