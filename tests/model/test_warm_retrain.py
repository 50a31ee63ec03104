"""A warm-started retrain (init_from) gives the ids its window meets for the first time a direction from
the window's PPMI-SVD aligned with the old basis (gem_model.train.item_svd.fold_in_item_svd): the old rows
stay where they were, an ad born after the first training gets a direction, in the table and in the
frozen topic buffer; the loaded weights are a candidate of the E-1 selection; train.warm_lr_frac scales
the warm run's rates; train.warm_days picks its days (by default those after the loaded model's window)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import numpy as np
import torch

from gem_model.models.gem import build_model
from gem_model.models.synthetic_batches import config_from_assets, synthetic_batch
from gem_model.train.item_svd import fold_in_item_svd, set_item_svd, start_item_table

N_TOPICS, PER_TOPIC = 4, 12
FIRST_AD = 1 + N_TOPICS * PER_TOPIC
NEW_AD = FIRST_AD + N_TOPICS  # ads FIRST_AD.. are shown in window 1, NEW_AD.. only in window 2


def _batch(cfg, g: torch.Generator, first_ad: int, rows: int = 64, length: int = 12):
    """Every history draws its items from one topic; the row's ad is that topic's ad (first_ad + topic)."""
    b = synthetic_batch(cfg, rows, g, min_len=length, max_len=length)
    j, col = cfg.target_pairs[0]
    topic = torch.randint(0, N_TOPICS, (rows,), generator=g)
    b.history[col] = 1 + topic.repeat_interleave(length) * PER_TOPIC + torch.randint(0, PER_TOPIC, (rows * length,), generator=g)
    b.sparse[:, j] = first_ad + topic
    return b


def test_fold_in_gives_new_ads_their_topic_and_keeps_old_rows():
    torch.manual_seed(0)
    cfg = dataclasses.replace(config_from_assets("tiny"), topic_dim=8)
    model = build_model(cfg)
    g = torch.Generator().manual_seed(1)
    set_item_svd(model, [_batch(cfg, g, FIRST_AD) for _ in range(8)], dim=8)
    j, _ = cfg.target_pairs[0]
    w = model.tables[cfg.sparse_features[j][1]].weight
    with torch.no_grad():  # training moved the old rows away from the SVD start: they must stay there
        w[1:NEW_AD] += 0.01 * torch.randn(NEW_AD - 1, w.shape[1], generator=g)
    table0, topic0 = w.detach().clone(), model.item_topic.clone()
    new = torch.arange(NEW_AD, NEW_AD + N_TOPICS)
    assert not topic0[new].any()

    # window 2: the old ads and N_TOPICS new ones, each shown with its topic's histories
    batches = [_batch(cfg, g, FIRST_AD if i % 2 else NEW_AD) for i in range(8)]
    info = fold_in_item_svd(model, batches, dim=8)
    assert info["rows"] == N_TOPICS and info["unreached"] == 0 and info["known"] == NEW_AD - 1
    table, topic = w.detach(), model.item_topic
    old = torch.ones(len(table), dtype=torch.bool)
    old[new] = False
    assert torch.equal(table[old], table0[old]) and torch.equal(topic[old], topic0[old])
    assert torch.allclose(topic[new].norm(dim=1), torch.ones(N_TOPICS), atol=1e-5)
    # each new ad is closest to its own topic's items, in the frozen buffer and in the trained table
    for vecs in (torch.nn.functional.normalize(topic, dim=1), torch.nn.functional.normalize(table, dim=1)):
        items = torch.nn.functional.normalize(vecs[1:FIRST_AD].reshape(N_TOPICS, PER_TOPIC, -1).mean(1), dim=1)
        cos = vecs[new] @ items.T
        assert torch.equal(cos.argmax(1), torch.arange(N_TOPICS)), cos
    assert torch.allclose(table[new].norm(dim=1), table0[1:NEW_AD].norm(dim=1).mean().expand(N_TOPICS), rtol=1e-4)


def test_fold_in_without_a_topic_buffer_needs_the_known_rows():
    torch.manual_seed(0)
    cfg = config_from_assets("tiny")
    model = build_model(cfg)
    g = torch.Generator().manual_seed(2)
    set_item_svd(model, [_batch(cfg, g, FIRST_AD) for _ in range(4)], dim=8)
    batches = [_batch(cfg, g, NEW_AD) for _ in range(4)]
    assert fold_in_item_svd(model, batches, dim=8)["rows"] == 0  # cannot tell old rows from new ones
    known = torch.zeros(cfg.tables["item"], dtype=torch.bool)
    known[1:NEW_AD] = True
    assert fold_in_item_svd(model, batches, dim=8, known=known)["rows"] == N_TOPICS


def _two_window_lake(root: Path, days: list[dt.date], born: dt.date, rows: int) -> list[int]:
    """The tests' synthetic world, where the ads with id % 10 == 3 are replaced from `born` on by new
    ads (id + 50000: never seen before). Returns the new ad ids shown on `born`."""
    import polars as pl

    from gem_model.data.synthetic import synthetic_day

    new_ids: set[int] = set()
    for i, d in enumerate(days):
        ex, orc = synthetic_day(d, rows, seed=3)
        if d >= born:
            ex = ex.with_columns(pl.when(pl.col("ad_id") % 10 == 3).then(pl.col("ad_id") + 50000)
                                 .otherwise(pl.col("ad_id")).alias("ad_id"))
            if d == born:
                new_ids |= set(ex.filter(pl.col("ad_id") > 50000)["ad_id"].to_list())
        mode = "overwrite" if i == 0 else "append"
        ex.write_delta(str(root / "training_examples"), mode=mode, delta_write_options={"partition_by": ["date"]})
        orc.write_delta(str(root / "oracle"), mode=mode, delta_write_options={"partition_by": ["date", "surface"]})
    return sorted(new_ids)


def _trained_before_the_births(tmp_path: Path, out: str) -> tuple[list[dt.date], str, list[int]]:
    """The tests' world of six days whose new ads are born on the fourth (`_two_window_lake`), and a tiny foundation
    trained on days 2-3 (selected on day 4) into tmp_path / out. Returns the days, the examples' uri, the new ids."""
    from gem_model.train.loop import train

    days = [dt.date(2026, 11, 1) + dt.timedelta(days=i) for i in range(6)]
    lake = tmp_path / "lake"
    new_ids = _two_window_lake(lake, days, born=days[3], rows=1500)
    train({"preset": "tiny", "model": {"topic_dim": 4}, "seed": 0, "device": "cpu", "out_dir": str(tmp_path / out),
           "data": {"train": [days[1].isoformat(), days[2].isoformat()], "valid": days[3].isoformat(), "lake": str(lake)},
           "train": {"torch_threads": 1, "max_steps": 3, "item_svd": {"dim": 4}, "calibrate": False}})
    return days, str(lake / "training_examples"), new_ids


def test_an_ad_born_after_the_first_training_gets_a_topic_vector_on_the_warm_retrain(gem_home, tmp_path):
    from gem_model.data.vocab import hash_int64
    from gem_model.models.registry import load_model
    from gem_model.train.loop import train

    days = [dt.date(2026, 11, 1) + dt.timedelta(days=i) for i in range(6)]
    lake = tmp_path / "lake"
    new_ids = _two_window_lake(lake, days, born=days[3], rows=1500)

    def config(out: str, first: int) -> dict:
        return {"preset": "tiny", "model": {"topic_dim": 4}, "seed": 0, "device": "cpu", "out_dir": str(tmp_path / out),
                "data": {"train": [days[first].isoformat(), days[first + 1].isoformat()],
                         "valid": days[first + 2].isoformat(), "lake": str(lake)},
                "train": {"torch_threads": 1, "max_steps": 3, "item_svd": {"dim": 4}, "calibrate": False}}

    train(config("first", 1))  # window d2-d3: none of the new ads
    summary = train(config("warm", 2), init_from=tmp_path / "first")  # window d3-d4: the new ads of d4
    assert summary["warm_start"]["loaded"] > 0
    first, _ = load_model(tmp_path / "first")
    warm, _ = load_model(tmp_path / "warm")
    rows = torch.from_numpy(hash_int64(np.array(new_ids, dtype=np.int64), first.cfg.tables["item"]))
    born = rows[first.item_topic[rows].norm(dim=1) == 0]  # a hash collision with an old id is not new
    assert len(rows) > 0 and len(born) >= 0.9 * len(rows)
    assert bool((warm.item_topic[born].norm(dim=1) > 0.99).all())
    old = first.item_topic.norm(dim=1) > 0
    assert int(old.sum()) > 100 and torch.equal(warm.item_topic[old], first.item_topic[old])  # the old basis kept

    # train.warm_lr_frac scales a warm start's whole schedule: its fresh optimizers move every weight by
    # about the rate at first, so at a tiny fraction the dense weights stay where the old model left them
    cfg = config("gentle", 2)
    cfg["train"]["warm_lr_frac"] = 1e-6
    train(cfg, init_from=tmp_path / "first")
    gentle, _ = load_model(tmp_path / "gentle")

    def moved(m: torch.nn.Module) -> float:
        ref = dict(first.named_parameters())
        return max(float((p.detach() - ref[n].detach()).abs().max()) for n, p in m.named_parameters() if "tables." not in n)
    assert moved(gentle) < 1e-4 and moved(warm) > 100 * moved(gentle)

    # the loaded weights are validated at step 0: a retrain whose steps only make E-1 worse keeps them
    cfg = config("wreck", 2)
    cfg["train"].update(lr=5.0, emb_lr=5.0, eval_every=1, warm_lr_frac=1.0)
    summary = train(cfg, init_from=tmp_path / "first")
    wreck, _ = load_model(tmp_path / "wreck")
    assert summary["valid_history"][0][0] == 0 and summary["best_step"] == 0
    assert all(s > summary["valid_history"][0][1] for _, s in summary["valid_history"][1:])
    assert moved(wreck) == 0.0

    # train.warm_days: "new" (the default) continues on the window's days after the loaded model's own (d4
    # alone), "window" trains on all of it again
    assert load_model(tmp_path / "warm")[1]["data"]["train"] == [days[3].isoformat()] * 2
    cfg = config("again", 2)
    cfg["train"]["warm_days"] = "window"
    train(cfg, init_from=tmp_path / "first")
    assert load_model(tmp_path / "again")[1]["data"]["train"] == [days[2].isoformat(), days[3].isoformat()]


def test_warm_days_new_keeps_the_window_when_nothing_in_it_is_new():
    from gem_model.train.loop import new_days

    window = ["2026-11-02", "2026-11-05"]
    assert new_days(window, ["2026-11-02", "2026-11-04"]) == ["2026-11-05", "2026-11-05"]
    assert new_days(window, ["2026-10-20", "2026-10-25"]) == window  # all of it is new
    assert new_days(window, window) == window  # nothing new: the window again
    assert new_days(window, None) == window  # no window recorded


def test_a_warm_start_from_a_model_without_directions_fits_them():
    """An old checkpoint trained without item_svd has an all-zero topic buffer: nothing to fold into, so
    the warm start fits the window's SVD as a cold one would; with directions it folds."""
    torch.manual_seed(0)
    cfg = dataclasses.replace(config_from_assets("tiny"), topic_dim=8)
    model = build_model(cfg)
    g = torch.Generator().manual_seed(3)
    info = start_item_table(model, [_batch(cfg, g, FIRST_AD) for _ in range(4)], dim=8, warm=True)
    assert "warm" not in info and info["rows"] == NEW_AD - 1 and bool(model.item_topic[1:NEW_AD].any(1).all())
    info = start_item_table(model, [_batch(cfg, g, NEW_AD) for _ in range(4)], dim=8, warm=True)
    assert info["warm"] == 1 and info["rows"] == N_TOPICS


def test_a_served_day_folds_in_the_ads_born_since_the_window_and_leaves_the_model_as_it_was(gem_home, tmp_path):
    """teacher_predictions scores E with the ids born after the teacher's window folded in from the logs
    between (gem_model.distill.serving_fold_in): their rows change inside the block, nothing after."""
    import polars as pl

    from gem_model.data.vocab import hash_int64
    from gem_model.distill.serving_fold_in import fold_window, serve_slices, serving_fold_in, with_serving
    from gem_model.distill.teacher import FOUNDATION, predict_teacher
    from gem_model.models.registry import load_model

    days, uri, new_ids = _trained_before_the_births(tmp_path, "m")
    model, config = load_model(tmp_path / "m")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rows = torch.from_numpy(hash_int64(np.array(new_ids, dtype=np.int64), model.cfg.tables["item"]))
    born = rows[model.item_topic[rows].norm(dim=1) == 0]
    assert len(rows) > 0 and len(born) >= 0.9 * len(rows)

    assert fold_window(model, config, days[5]) == (days[3], days[4]) and fold_window(model, config, days[3]) is None
    with serving_fold_in(model, config, days[3], uri=uri) as stats:  # the day after the window: nothing between
        assert stats is None
    # served in slices (serve_slices, 4 by default): from hour 12 on, d4's ads born that day were shown in
    # its first 12 hours, and get their direction from those rows
    assert serve_slices(model, config) == [(0, 6), (6, 12), (12, 18), (18, 24)]
    ex = pl.read_delta(uri).filter((pl.col("date") == days[3]) & (pl.col("ad_id") > 50000))
    shown = {h: torch.from_numpy(hash_int64(ex.filter(pl.col("hour_of_day") < h)["ad_id"].unique().to_numpy(),
                                            model.cfg.tables["item"])) for h in (12, 24)}
    with serving_fold_in(model, config, days[3], uri=uri, before_hour=12):
        has = model.item_topic.norm(dim=1) > 0.99
        assert float(has[shown[12]].float().mean()) > 0.9  # shown in the morning: folded
        assert not bool(has[born[~torch.isin(born, shown[12])]].any())  # shown only later that day: not yet
    assert len(shown[12]) < len(shown[24])
    # predict_teacher's passes share the days' counts (a cache): the same fold as reading them anew
    with serving_fold_in(model, config, days[5], uri=uri):
        fresh = model.item_topic.clone()
    cache: dict = {}
    for _ in range(2):
        with serving_fold_in(model, config, days[5], uri=uri, before_hour=6, cache=cache):
            cached = model.item_topic.clone()
    assert set(cache) == {(days[3], 24), (days[4], 24), (days[5], 6)}
    with serving_fold_in(model, config, days[5], uri=uri, cache=cache):
        assert torch.equal(model.item_topic, fresh)
    assert not torch.equal(cached, fresh)  # the morning of d6 adds bags
    # a later slice adds the hours since the previous one to its counts: the same fold as counting them anew
    with serving_fold_in(model, config, days[5], uri=uri, before_hour=12, cache=cache):
        extended = model.item_topic.clone()
    assert (days[5], 12) in cache and (days[5], 6) not in cache
    with serving_fold_in(model, config, days[5], uri=uri, before_hour=12):
        assert torch.equal(model.item_topic, extended) and not torch.equal(extended, cached)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with serving_fold_in(model, config, days[5], uri=uri) as stats:  # folds d4-d5's logs, not d6's
        assert stats["rows"] >= len(born) and bool((model.item_topic[born].norm(dim=1) > 0.99).all())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    off = with_serving(config, serve_fold_in=False)
    with serving_fold_in(model, off, days[5], uri=uri) as stats:
        assert stats is None
    # fold_lookback_days: the fold reads at least that many whole days, the window's included, so the day
    # after the window folds on as many logs as a later one; the window's ids keep their rows
    longer = with_serving(config, fold_lookback_days=3)
    assert fold_window(model, longer, days[3]) == (days[0], days[2])
    assert fold_window(model, longer, days[5]) == (days[2], days[4])
    known = model.item_topic.norm(dim=1) > 0
    with serving_fold_in(model, config, days[3], uri=uri, before_hour=12) as short:
        pass
    with serving_fold_in(model, longer, days[3], uri=uri, before_hour=12) as long:
        assert float((model.item_topic[shown[12]].norm(dim=1) > 0.99).float().mean()) > 0.9
        assert torch.equal(model.item_topic[known], before["item_topic"][known])
    assert long["bags"] > short["bags"] and long["known"] > short["known"]
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())

    def scored(fold_in: dict | None) -> pl.DataFrame:
        return predict_teacher(model, [days[5]], FOUNDATION, "v", uri=uri, fold_in=fold_in).join(
            pl.read_delta(uri).filter(pl.col("date") == days[5]).select("request_id", "ad_id"), on="request_id")

    plain, folded = scored(None), scored(config)
    assert plain["request_id"].to_list() == folded["request_id"].to_list()
    changed = (plain["p_click"] - folded["p_click"]).abs() > 1e-7
    is_new = plain["ad_id"] > 50000
    assert float(changed.filter(is_new).mean()) > 0.9  # the new ads are scored with their folded rows
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())

    # rows that all sit at one hour (an untimed dataset's noon): the empty slices are skipped, the day is
    # served as in one slice
    noon = str(tmp_path / "noon")
    pl.read_delta(uri).with_columns(pl.lit(12, pl.Int32).alias("hour_of_day")).write_delta(
        noon, delta_write_options={"partition_by": ["date"]})
    one = {**config, "train": {**config["train"], "item_svd": {**config["train"]["item_svd"], "serve_slices": 1}}}
    sliced, whole = (predict_teacher(model, [days[5]], FOUNDATION, "v", uri=noon, fold_in=f).sort("request_id")
                     for f in (config, one))
    assert sliced.height == whole.height > 0 and sliced["p_click"].equals(whole["p_click"])


def _calibrated_on_churn(tmp_path: Path, rows: int, window_end: int) -> tuple[list[dt.date], str, torch.nn.Module, dict]:
    """(days, training_examples uri, model, config): six days whose ads turn over on the fourth, and a tiny foundation
    trained on days[1..window_end], selected and calibrated on the day after."""
    from gem_model.models.registry import load_model
    from gem_model.train.loop import train

    days = [dt.date(2026, 11, 1) + dt.timedelta(days=i) for i in range(6)]
    lake = tmp_path / "lake"
    _two_window_lake(lake, days, born=days[3], rows=rows)
    train({"preset": "tiny", "model": {"topic_dim": 4}, "seed": 0, "device": "cpu", "out_dir": str(tmp_path / "m"),
           "data": {"train": [days[1].isoformat(), days[window_end].isoformat()],
                    "valid": days[window_end + 1].isoformat(), "lake": str(lake)},
           "train": {"torch_threads": 1, "max_steps": 3, "item_svd": {"dim": 4}, "calibrate": True}})
    return days, str(lake / "training_examples"), *load_model(tmp_path / "m")


def test_a_served_day_maps_each_fold_status_by_what_the_maps_days_left(gem_home, tmp_path, monkeypatch):
    """With a map, the fitting days are scored as served and split by fold status; the day's rows go
    through their status's map (gem_model.distill.serving_fold_in.status_maps)."""
    import polars as pl

    import gem_model.distill.teacher as teacher
    from gem_model.distill.serving_fold_in import with_serving

    days, uri, model, config = _calibrated_on_churn(tmp_path, rows=3000, window_end=2)
    assert model.calibrator.fit_day == days[3].isoformat()
    seen: list[pl.DataFrame] = []

    def spy(rows: pl.DataFrame, kind: str, by: str = "fold_status") -> dict[str, tuple[float, float]]:
        if by != "fold_status":
            return {}  # relevel_surfaces (on by default): tried below
        seen.append(rows)
        assert kind == "platt"  # the default of a model trained without the option
        return {"known": (1.0, 0.0), "folded": (1.0, 1.0)}  # a known map: the folded ads' odds times e

    monkeypatch.setattr(teacher, "status_maps", spy)
    # d6: the map is stale (fitted on d4), re-fitted on d5, which is scored folded up to d4
    shifted = teacher.predict_teacher(model, [days[5]], teacher.FOUNDATION, "v", uri=uri, recalibrate=True, fold_in=config)
    (rows,) = seen
    assert set(rows["fold_status"].unique()) == {"known", "folded"}  # d5's ads: the window's, and d4's new ones
    assert rows.height == pl.read_delta(uri).filter(pl.col("date") == days[4]).height
    monkeypatch.setattr(teacher, "status_maps", lambda rows, kind, by="fold_status": {})
    plain = teacher.predict_teacher(model, [days[5]], teacher.FOUNDATION, "v", uri=uri, recalibrate=True, fold_in=config)
    ads = pl.read_delta(uri).filter(pl.col("date") == days[5]).select("request_id", "ad_id")
    both = plain.join(shifted.select("request_id", pl.col("p_click").alias("s")), on="request_id").join(ads, on="request_id")
    odds = lambda p: p / (1 - p)  # noqa: E731
    new, old = both.filter(pl.col("ad_id") > 50000), both.filter(pl.col("ad_id") < 50000)
    assert new.height and old.height
    assert np.allclose(odds(new["s"].to_numpy()), np.e * odds(new["p_click"].to_numpy()), rtol=1e-4)
    assert np.allclose(old["s"].to_numpy(), old["p_click"].to_numpy(), rtol=1e-6)

    # relevel_surfaces (the default): then one shift per surface, fitted on the fitting days' rows as the status
    # maps left them; off, the status maps are the last step
    calls: list[tuple[str, pl.DataFrame]] = []
    surface = sorted(shifted["surface"].unique().to_list())[0]

    def spy_levels(rows: pl.DataFrame, kind: str, by: str = "fold_status") -> dict[str, tuple[float, float]]:
        calls.append((by, rows))
        return {"known": (1.0, 0.0), "folded": (1.0, 1.0)} if by == "fold_status" else {surface: (1.0, -1.0)}

    monkeypatch.setattr(teacher, "status_maps", spy_levels)
    leveled = teacher.predict_teacher(model, [days[5]], teacher.FOUNDATION, "v", uri=uri, recalibrate=True,
                                      fold_in=config)
    assert [by for by, _ in calls] == ["fold_status", "surface"]
    fit, fit_after = calls[0][1].sort("request_id"), calls[1][1].sort("request_id")
    folded = (fit["fold_status"] == "folded").to_numpy()
    assert folded.any() and np.allclose(odds(fit_after["p_click"].to_numpy()[folded]),
                                        np.e * odds(fit["p_click"].to_numpy()[folded]), rtol=1e-4)
    both = shifted.join(leveled.select("request_id", pl.col("p_click").alias("l")), on="request_id")
    on, off = both.filter(pl.col("surface") == surface), both.filter(pl.col("surface") != surface)
    assert on.height and off.height
    assert np.allclose(odds(on["l"].to_numpy()), odds(on["p_click"].to_numpy()) / np.e, rtol=1e-4)
    assert np.allclose(off["l"].to_numpy(), off["p_click"].to_numpy(), rtol=1e-6)
    calls.clear()
    kept = teacher.predict_teacher(model, [days[5]], teacher.FOUNDATION, "v", uri=uri, recalibrate=True,
                                   fold_in=with_serving(config, relevel_surfaces=False))
    assert [by for by, _ in calls] == ["fold_status"]
    assert kept.sort("request_id")["p_click"].equals(shifted.sort("request_id")["p_click"])


def test_a_map_fitted_like_served_folds_each_fitting_day_over_as_many_days_as_the_day_served(gem_home, tmp_path,
                                                                                               monkeypatch):
    """train.item_svd.fit_fold_like_served: the day served folds in the two days since the window, so its map's
    fitting day is scored with the two days before it folded in (the window's last included), not one."""
    import gem_model.distill.teacher as teacher
    from gem_model.distill.serving_fold_in import fold_window, with_serving

    days, uri, model, config = _calibrated_on_churn(tmp_path, rows=1500, window_end=2)
    folds: list[tuple[dt.date, tuple[dt.date, dt.date] | None]] = []
    real = teacher.serving_fold_in

    def spy(m: torch.nn.Module, cfg: dict, day: dt.date, **kw):  # noqa: ANN202
        folds.append((day, fold_window(m, cfg, day)))
        return real(m, cfg, day, **kw)

    monkeypatch.setattr(teacher, "serving_fold_in", spy)
    served = {}
    for like in (False, True):
        folds.clear()
        served[like] = teacher.predict_teacher(model, [days[5]], teacher.FOUNDATION, "v", uri=uri, recalibrate=True,
                                               fold_in=with_serving(config, fit_fold_like_served=like))
        assert {w for d, w in folds if d == days[5]} == {(days[3], days[4])}  # the day itself: as always
        assert {w for d, w in folds if d == days[4]} == {(days[2], days[3]) if like else (days[3], days[3])}
    assert not served[True]["p_click"].equals(served[False]["p_click"])  # another map


def test_days_served_behind_the_same_fitting_days_score_those_days_once(gem_home, tmp_path, monkeypatch):
    """Several days in one predict_teacher call whose maps are re-fitted on the same days (a student window before
    the map's days, served in slices) fit them once, and get what one call per day gives; with refit_cache the
    refit is kept for the next call while the logs and serving options stay as they were."""
    import polars as pl

    import gem_model.distill.teacher as teacher
    days, uri, model, config = _calibrated_on_churn(tmp_path, rows=1500, window_end=3)
    assert model.calibrator.fit_day == days[4].isoformat() and config["train"]["item_svd"]["serve_slices"] > 1
    refits, passes = [], []
    real_refit, real_predict = teacher.refit, teacher.predict
    monkeypatch.setattr(teacher, "refit", lambda cal, df, fit_days: refits.append(fit_days) or real_refit(cal, df, fit_days))
    monkeypatch.setattr(teacher, "predict", lambda *a, **k: passes.append(1) or real_predict(*a, **k))
    served = days[1:4]  # inside the window: each re-fits the stored map on d5 as served
    together = teacher.predict_teacher(model, served, teacher.FOUNDATION, "v", uri=uri, recalibrate=True, fold_in=config)
    assert refits == [[days[4]]]
    n_together = len(passes)
    apart = pl.concat([teacher.predict_teacher(model, [d], teacher.FOUNDATION, "v", uri=uri, recalibrate=True,
                                               fold_in=config) for d in served])
    assert refits == [[days[4]]] * 4 and len(passes) - n_together > n_together  # d5 scored once, not three times
    key = ["date", "request_id"]
    together, apart = together.sort(key), apart.sort(key)
    assert together.select(key).equals(apart.select(key))  # float64 rounding apart, as before the fits were shared
    for col in ("p_click", "p_conversion", "embedding"):
        a, b = (np.asarray(f[col].to_list(), dtype=np.float64) for f in (together, apart))
        assert np.allclose(a, b, rtol=1e-9, atol=1e-12, equal_nan=True), col

    # refit_cache (the teacher's version dir): one call's refit is kept and read back by the next (another
    # teacher_predictions partition), to the same predictions, until the logs change or the serving options do
    from gem_model.distill.refit_cache import SUBDIR
    from gem_model.distill.serving_fold_in import with_serving
    from gem_model.store.delta import overwrite_partition

    cache = tmp_path / "m"
    refits.clear()

    def served_day(d: dt.date, cfg: dict = config) -> pl.DataFrame:
        return teacher.predict_teacher(model, [d], teacher.FOUNDATION, "v", uri=uri, recalibrate=True, fold_in=cfg,
                                       refit_cache=cache).sort("request_id")

    first = served_day(days[1])
    assert refits == [[days[4]]] and len(list((cache / SUBDIR).glob("*.pt"))) == 1
    again = served_day(days[2])
    assert refits == [[days[4]]]  # read back, not fitted
    for got, d in ((first, days[1]), (again, days[2])):
        want = apart.filter(pl.col("date") == d).sort("request_id")
        assert got["request_id"].equals(want["request_id"])
        assert np.allclose(got["p_click"].to_numpy(), want["p_click"].to_numpy(), rtol=1e-9, atol=1e-12)
    served_day(days[2], with_serving(config, status_map="shift"))  # other serving options: fitted anew
    assert refits == [[days[4]]] * 2
    # a day of the logs re-written, even to the same rows (a re-ingest): new files, so fitted anew
    day0 = pl.read_delta(uri).filter(pl.col("date") == days[0])
    overwrite_partition(day0, uri, partition_by=["date"], lock_keys=[f"date={days[0]}"], predicate=f"date = '{days[0]}'")
    served_day(days[2])
    assert refits == [[days[4]]] * 3 and len(list((cache / SUBDIR).glob("*.pt"))) == 3
    assert not list((cache / SUBDIR).glob(".*"))  # no temporary file of gem_model.store.atomic left


def test_a_warm_start_into_a_model_with_more_inputs_starts_as_the_old_model(tmp_path):
    """An option that adds an input (model.topic_log_share, a dense feature) widens the dense input layer and
    the wide path: the warm start moves their old columns by name and zeros the new ones, so the retrain
    starts from the old model's predictions instead of a restarted input layer (and a gate that refuses it)."""
    from gem_model.train.loop import warm_start

    torch.manual_seed(0)
    cfg = dataclasses.replace(config_from_assets("tiny"), topic_dim=8)
    old = build_model(cfg)
    g = torch.Generator().manual_seed(5)
    set_item_svd(old, [_batch(cfg, g, FIRST_AD) for _ in range(4)], dim=8)
    with torch.no_grad():
        for w in old.wide.values():  # trained wide weights, not the start
            w.normal_()
    torch.save({"model": old.state_dict(), "model_config": cfg.to_dict()}, tmp_path / "checkpoint.pt")
    b = _batch(cfg, g, FIRST_AD, rows=16)
    old.eval()
    with torch.no_grad():
        want = old(b)

    torch.manual_seed(1)
    logged = build_model(dataclasses.replace(cfg, topic_log_share=True))
    assert logged.cfg.wide_inputs == [*cfg.wide_inputs, "topic_log_share"]
    counts, window = warm_start(logged, tmp_path)
    assert counts == {"loaded": len(old.state_dict()) - 1 - len(cfg.surfaces), "remapped": 1 + len(cfg.surfaces),
                      "skipped": 1} and window is None  # skipped: topic_stat_mean, which the old model lacks
    assert torch.equal(logged.dense[0].weight[:, :-1], old.dense[0].weight) and not logged.dense[0].weight[:, -1].any()
    seg = torch.repeat_interleave(torch.arange(16), b.offsets[1:] - b.offsets[:-1])
    assert logged.topic_stats(b, seg, 16)[:, 2].std() > 0  # the new input varies: its zero weight is what keeps it out
    # a dense feature added as well: it lands before the match statistics, which move, each read by name
    more = build_model(dataclasses.replace(cfg, topic_log_share=True, dense_features=[*cfg.dense_features, "added"]))
    assert warm_start(more, tmp_path)[0]["remapped"] == 1 + len(cfg.surfaces)
    extra = dataclasses.replace(b, dense=torch.cat([b.dense, torch.randn(16, 1, generator=g)], dim=1))
    logged.eval(), more.eval()
    with torch.no_grad():
        assert torch.allclose(logged(b), want, atol=1e-5) and torch.allclose(more(extra), want, atol=1e-5)


def test_a_domain_model_starts_with_the_ads_born_since_its_teachers_window_and_serves_from_its_own(gem_home, tmp_path):
    """train_domain_model(fold_in=<the foundation's config>): the ids first met between the foundation's window and
    the end of the student window get their direction before the domain model trains (a deep copy would keep
    them at zero for good), the old rows stay where they were, and the saved config gives the domain model its own
    window, so teacher_predictions folds in from there."""
    from gem_model.data.vocab import hash_int64
    from gem_model.distill import predict_teacher, save_domain_model, train_domain_model
    from gem_model.distill.serving_fold_in import fold_window
    from gem_model.distill.teacher import FOUNDATION
    from gem_model.models.registry import load_model

    days, uri, new_ids = _trained_before_the_births(tmp_path, "f")
    foundation, config = load_model(tmp_path / "f")
    student_days = (days[1], days[3])  # past the foundation's window by one day, the day the new ads are born
    tp = predict_teacher(foundation, student_days, FOUNDATION, "f", uri=uri, fold_in=config)
    rows = torch.from_numpy(hash_int64(np.array(new_ids, dtype=np.int64), foundation.cfg.tables["item"]))
    born = rows[foundation.item_topic[rows].norm(dim=1) == 0]
    assert len(rows) > 0 and len(born) >= 0.9 * len(rows)
    short = {"domain": {"max_steps": 3}}
    kept, kept_info = train_domain_model("social", foundation, teacher_predictions=tp, dates=student_days,
                                         preset="tiny", overrides=short, uri=uri)
    folded, info = train_domain_model("social", foundation, teacher_predictions=tp, dates=student_days,
                                      preset="tiny", overrides=short, uri=uri, fold_in=config)
    assert float(kept.item_topic[born].norm(dim=1).max()) == 0.0 and kept_info["ids_folded_in"] is None
    assert bool((folded.item_topic[born].norm(dim=1) > 0.99).all()) and info["ids_folded_in"]["rows"] >= len(born)
    old = foundation.item_topic.norm(dim=1) > 0
    assert torch.equal(folded.item_topic[old], foundation.item_topic[old])
    assert float(foundation.item_topic[born].norm(dim=1).max()) == 0.0  # the foundation is left as it was

    _, saved = load_model(save_domain_model(folded, info, version="v", root=tmp_path / "dm"))
    assert saved["data"]["train"] == [days[1].isoformat(), days[3].isoformat()]
    assert fold_window(folded, saved, days[5]) == (days[4], days[4])
    _, plain = load_model(save_domain_model(kept, kept_info, version="v", root=tmp_path / "dm_kept"))
    assert fold_window(kept, plain, days[5]) is None
