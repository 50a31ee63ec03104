"""The partition mappings state what each asset reads: training_examples[D] reads the events of D and
the user_activity of D-lookback_days..D (data/history.py), so re-ingesting a day reaches every
partition whose histories read it; days without a role have no teacher_predictions partition."""

from __future__ import annotations

import datetime as dt

import dagster as dg

from gem_model.config import load_features
from gem_pipelines.definitions import defs
from gem_pipelines.partitions import CALENDAR, SURFACES

LOOKBACK = load_features().history.lookback_days
DATES = [d.isoformat() for d in CALENDAR.dates()]
TE, ABD = dg.AssetKey("training_examples"), dg.AssetKey("activity_by_day")


def _day(i: int) -> str:
    return (CALENDAR.start + dt.timedelta(days=i)).isoformat()


def test_training_examples_reads_the_lookback_window_of_activity() -> None:
    graph = defs.resolve_asset_graph()
    last = DATES[-1]
    parents = graph.get_parents_partitions(TE, last).parent_partitions
    by_asset: dict[str, set[str]] = {}
    for p in parents:
        by_asset.setdefault(p.asset_key.to_user_string(), set()).add(str(p.partition_key))
    first = max(0, len(DATES) - 1 - LOOKBACK)
    assert by_asset["activity_by_day"] == set(DATES[first:])  # D-lookback..D, clipped to the window
    assert by_asset["events"] == {f"{last}|{s}" for s in SURFACES.names}  # the day itself, every surface
    # and activity_by_day[D] is the user_activity of D on every surface
    abd = {str(p.partition_key) for p in graph.get_parents_partitions(ABD, DATES[1]).parent_partitions}
    assert abd == {f"{DATES[1]}|{s}" for s in SURFACES.names}


def _with_condition(condition: dg.AutomationCondition) -> dg.Definitions:
    assets = [
        a.map_asset_specs(lambda spec: spec.replace_attributes(automation_condition=condition))
        if isinstance(a, dg.AssetsDefinition) and {ABD, TE} & set(a.keys) else a
        for a in defs.assets  # type: ignore[union-attr]
    ]
    return dg.Definitions(assets=assets, resources=defs.resources)


def test_reingesting_a_day_reaches_every_partition_whose_histories_read_it() -> None:
    """`any_deps_updated` (what eager automation and the UI's "upstream changed" follow) after one
    surface of day 1 is ingested again: activity_by_day[1] and training_examples[1..1+lookback]."""
    world = _with_condition(dg.AutomationCondition.any_deps_updated())
    when = dt.datetime.combine(CALENDAR.end() + dt.timedelta(days=1), dt.time(5), tzinfo=dt.UTC)
    with dg.instance_for_test() as instance:
        result = dg.evaluate_automation_conditions(defs=world, instance=instance, evaluation_time=when)
        assert result.total_requested == 0
        instance.report_runless_asset_event(dg.AssetMaterialization("user_activity", partition=f"{_day(1)}|feed"))
        result = dg.evaluate_automation_conditions(defs=world, instance=instance, evaluation_time=when,
                                                   cursor=result.cursor)
        assert result.get_requested_partitions(ABD) == {_day(1)}
        reached = {d for d in DATES if _day(1) <= d <= _day(1 + LOOKBACK)}
        assert result.get_requested_partitions(TE) == reached
        assert len(reached) > 1  # the window reaches past the day itself (the old mapping stopped there)


def test_days_without_a_role_have_no_model_partitions() -> None:
    graph = defs.resolve_asset_graph()
    tp = graph.get(dg.AssetKey("teacher_predictions")).partitions_def
    assert tp is not None and tp.get_partition_keys() == DATES[1:]  # the warm-up day only feeds histories
    assert graph.get(TE).partitions_def.get_partition_keys() == DATES  # type: ignore[union-attr]
