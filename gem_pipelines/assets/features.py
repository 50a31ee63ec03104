"""Features group: the point-in-time join of events with cross-surface history."""


import datetime as dt

import dagster as dg
import polars as pl

from gem_model.config import load_features
from gem_model.store.paths import reports_dir
from gem_pipelines.data import lake as lake_io
from gem_pipelines.data.formats import training_examples_schema
from gem_pipelines.data.history import build_training_examples, leakage_report
from gem_pipelines.metadata import preview, suite_metadata
from gem_pipelines.partitions import date_partitions_def
from gem_pipelines.resources import LakeResource

_BY_DATE = dg.MultiToSingleDimensionPartitionMapping(partition_dimension_name="date")
LOOKBACK_DAYS = load_features().history.lookback_days

# Wait for every upstream partition's blocking checks (GX suites, conservation) before joining. Not
# only the latest day: re-ingesting day D rebuilds every partition whose histories read D.
AFTER_CHECKS = (
    dg.AutomationCondition.eager().without(dg.AutomationCondition.in_latest_time_window())
    & dg.AutomationCondition.all_deps_blocking_checks_passed()
)


@dg.asset(
    partitions_def=date_partitions_def,
    group_name="features",
    # histories read the day's activity, counters its impressions and clicks
    deps=[dg.AssetDep("user_activity", partition_mapping=_BY_DATE), dg.AssetDep("events", partition_mapping=_BY_DATE)],
    automation_condition=AFTER_CHECKS,
)
def activity_by_day(context: dg.AssetExecutionContext, lake: LakeResource) -> dg.MaterializeResult:
    """One day of user_activity and events across every surface: the unit of history (and of counters)
    that training_examples reads (Dagster maps a date x surface upstream to a date only by the same
    day, so the lookback window is stated between two daily assets)."""
    date = dt.date.fromisoformat(context.partition_key)
    rows = (lake_io.scan("user_activity", root=lake.uri()).filter(pl.col("date") == date)
            .group_by("surface").len().collect())
    impressions = lake_io.scan("events", root=lake.uri()).filter(pl.col("date") == date).select(pl.len()).collect()
    return dg.MaterializeResult(metadata={
        "rows": int(rows["len"].sum()) if rows.height else 0,
        "rows_by_surface": dg.MetadataValue.json({r["surface"]: int(r["len"]) for r in rows.iter_rows(named=True)}),
        "user_activity_version": lake_io.table_version("user_activity", root=lake.uri()),
        "impressions": int(impressions.item()),
        "events_version": lake_io.table_version("events", root=lake.uri()),
    })


@dg.asset(
    partitions_def=date_partitions_def,
    group_name="features",
    deps=[
        dg.AssetDep("events", partition_mapping=_BY_DATE),  # the day's impressions, every surface
        # histories: activity of D-lookback_days .. D (data/history.py), counters: events of the days
        # before D (data/counters.py); days before the window do not exist
        dg.AssetDep(activity_by_day, partition_mapping=dg.TimeWindowPartitionMapping(
            start_offset=-LOOKBACK_DAYS, allow_nonexistent_upstream_partitions=True)),
    ],
    automation_condition=AFTER_CHECKS,
    check_specs=[
        dg.AssetCheckSpec(
            "no_leakage",
            asset="training_examples",
            blocking=True,
            description="every hist_seconds_before > 0, histories oldest first, empty lists not nulls",
            partitions_def=date_partitions_def,
        ),
        dg.AssetCheckSpec("gx_suite", asset="training_examples", blocking=True, partitions_def=date_partitions_def,
                          description="GX suite assets/expectations/training_examples.json, before the Delta commit"),
    ],
)
def training_examples(context: dg.AssetExecutionContext, lake: LakeResource):
    """Each impression of the day with its user's last N activities strictly before it (jagged lists)."""
    date = dt.date.fromisoformat(context.partition_key)
    features = load_features()
    df = build_training_examples(date, features, root=lake.uri())
    report = leakage_report(df)
    clean = report["not_before_impression"] == 0 and report["unordered_histories"] == 0 and report["null_histories"] == 0
    if not clean:
        yield dg.AssetCheckResult(check_name="no_leakage", passed=False, metadata=report)
        raise dg.Failure(f"training_examples {date}: history leakage or disorder {report}; nothing written")
    from gem_pipelines.data.validation import validate_frame  # GX imports in ~3 s: only where a suite runs

    suite = validate_frame("training_examples", df, partition_key=context.partition_key,
                           docs_dir=reports_dir() / "data_docs") if df.height else None  # as ingest: none to check
    if suite and not suite.success:
        yield dg.AssetCheckResult(check_name="gx_suite", passed=False, metadata=suite_metadata(suite))
        raise dg.Failure(f"training_examples {date}: {suite.evaluated - suite.successful} expectation(s) of its GX "
                         "suite failed (the check's metadata lists them); nothing written")
    version = lake_io.write_partition(df, "training_examples", {"date": date}, training_examples_schema(features.context),
                                       root=lake.uri())
    lengths = df["hist_item_id"].list.len()
    yield dg.MaterializeResult(
        metadata={
            "rows": df.height,
            "delta_version": version,
            "mean_history_len": float(lengths.mean() or 0.0),
            "empty_histories": int((lengths == 0).sum()),
            "preview": preview(df),
        }
    )
    yield dg.AssetCheckResult(check_name="no_leakage", passed=True, metadata=report)
    yield dg.AssetCheckResult(check_name="gx_suite", passed=True,
                              metadata=suite_metadata(suite) if suite else {"note": "no rows to validate"})
