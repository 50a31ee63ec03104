"""A single-surface model's view of `training_examples`: its surface's history and counters only."""

from __future__ import annotations

import polars as pl
import pytest

from gem_model.config import FeaturesConfig, load_features
from gem_model.data.loader import ExampleStream
from gem_model.data.normalization import dense_stats
from gem_model.data.own_surface import own_surface_view
from gem_model.store.paths import table_uri

pytestmark = pytest.mark.timeout(120)


def test_view_keeps_own_history_and_reads_counters_on_one_surface():
    rows = pl.LazyFrame({
        "surface": ["book", "music"],
        "hist_item_id": [[1, 2, 3, 4], [5]],
        "hist_action": [["click", "view", "click", "view"], ["view"]],
        "hist_surface": [["book", "movie", "book", "music"], ["movie"]],
        "hist_seconds_before": [[40.0, 30.0, 20.0, 10.0], [5.0]],
        "user_impressions_before": [3.0, 0.0],
        "user_click_logit_before": [0.4, 0.0],
        "user_all_impressions_before": [9.0, 7.0],
        "user_all_click_logit_before": [1.2, -0.8],
        "user_other_impressions_before": [6.0, 7.0],
        "user_other_click_logit_before": [0.8, -0.8],
        "ad_click_logit_before": [0.1, 0.2],
        "ad_other_impressions_before": [4.0, 2.0],
        "ad_other_click_logit_before": [0.5, -0.3],
        "ad_today_impressions_before": [2.0, 0.0],
        "ad_today_click_logit_before": [0.3, 0.0],
        "ad_all_today_impressions_before": [5.0, 1.0],
        "ad_all_today_click_logit_before": [0.6, -0.1],
    })
    out = own_surface_view(rows, "book").collect()
    assert out.columns == rows.collect_schema().names()  # same columns: the model's inputs keep their shape
    assert out["hist_item_id"].to_list() == [[1, 3], []]  # order kept, other surfaces' entries gone
    assert out["hist_action"].to_list() == [["click", "click"], []]
    assert out["hist_surface"].to_list() == [["book", "book"], []]
    assert out["hist_seconds_before"].to_list() == [[40.0, 20.0], []]
    assert out["user_all_impressions_before"].to_list() == [3.0, 0.0]
    assert out["user_all_click_logit_before"].to_list() == [0.4, 0.0]
    assert out["user_other_impressions_before"].to_list() == [0.0, 0.0]  # no other surface: no evidence
    assert out["user_other_click_logit_before"].to_list() == [0.0, 0.0]
    assert out["ad_click_logit_before"].to_list() == [0.1, 0.2]
    assert out["ad_other_impressions_before"].to_list() == [0.0, 0.0]  # the ad elsewhere: not its to read
    assert out["ad_other_click_logit_before"].to_list() == [0.0, 0.0]
    assert out["ad_all_today_impressions_before"].to_list() == [2.0, 0.0]  # today on its surface alone
    assert out["ad_all_today_click_logit_before"].to_list() == [0.3, 0.0]


def test_stream_reads_only_its_surface_history(lake):
    with pytest.raises(ValueError, match="one surface"):
        ExampleStream("2026-11-02", "2026-11-02", ["feed", "shops"], own_surface=True)
    full = ExampleStream("2026-11-02", "2026-11-02", ["shops"], shuffle=False, batch_size=100_000, max_len=8)
    own = ExampleStream("2026-11-02", "2026-11-02", ["shops"], shuffle=False, batch_size=100_000, max_len=8,
                        own_surface=True)
    b_full, b_own = next(iter(full)), next(iter(own))
    assert b_full.request_ids == b_own.request_ids
    shops = own.encoder.vocab["hist_surface"].index("shops") + 1  # closed vocabulary: value i -> row i + 1
    assert (b_own.history["hist_surface"] == shops).all()
    assert (b_full.history["hist_surface"] != shops).any()  # the lake's histories do cross surfaces
    src = pl.read_delta(table_uri("training_examples")).filter(pl.col("surface") == "shops",
                                                                 pl.col("date") == pl.date(2026, 11, 2))
    want = {r["request_id"]: min(sum(s == "shops" for s in r["hist_surface"] or []), 8) for r in src.to_dicts()}
    lengths = (b_own.offsets[1:] - b_own.offsets[:-1]).tolist()
    assert lengths == [want[r] for r in b_own.request_ids]


def test_dense_stats_see_the_view(tmp_path):
    """Standardisation statistics come from the view the model reads, not from the raw columns."""
    import datetime as dt

    day = dt.date(2026, 11, 2)
    pl.DataFrame({
        "date": [day] * 3, "surface": ["book", "book", "movie"],
        "user_click_logit_before": [1.0, 3.0, 50.0], "user_all_click_logit_before": [10.0, 30.0, 50.0],
    }).write_delta(str(tmp_path / "t"))
    raw = load_features().model_dump()
    raw["dense"] = [{"name": "user_all_click_logit_before", "transform": "none"}]
    feats = FeaturesConfig.model_validate(raw)
    assert dense_stats(str(tmp_path / "t"), [day], ["book"], feats) == ([20.0], [10.0])
    assert dense_stats(str(tmp_path / "t"), [day], ["book"], feats, own_surface="book") == ([2.0], [1.0])
