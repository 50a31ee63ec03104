"""Ingest group: land raw logs (and the oracle), then parse, validate and commit the lake tables."""


import dagster as dg

from gem_model.store.paths import reports_dir
from gem_pipelines.data import lake as lake_io
from gem_pipelines.data.formats import ORACLE_SCHEMA, REASONS
from gem_pipelines.data.ingest import SuiteFailed, conservation, ingest_partition
from gem_pipelines.metadata import md_table, preview, suite_metadata
from gem_pipelines.partitions import SURFACES, date_surface_partitions_def, split_key
from gem_pipelines.resources import LakeResource, SimulatorResource
from gem_pipelines.settings import QUARANTINE_FAIL_RATE, QUARANTINE_WARN_RATE

GROUP = "ingest"


@dg.multi_asset(
    specs=[
        dg.AssetSpec("raw_logs", description="One day of one surface's raw files in landing/, as emitted."),
        dg.AssetSpec(
            "oracle",
            description="True click/conversion probabilities of every simulated impression (models never read it).",
            skippable=True,
        ),
    ],
    partitions_def=date_surface_partitions_def,
    group_name=GROUP,
    can_subset=False,
)
def raw_logs(context: dg.AssetExecutionContext, lake: LakeResource, simulator: SimulatorResource):
    """Land one partition: run the simulator, or accept files already dropped in landing/."""
    date, surface = split_key(context)
    directory = simulator.partition_dir(surface, date)
    if simulator.source == "landing":
        files = sorted(p.name for p in directory.glob("*")) if directory.is_dir() else []
        if not files:
            raise dg.Failure(f"no raw files in {directory} for partition {context.partition_key}")
        yield dg.MaterializeResult(asset_key="raw_logs", metadata={"files": files, "directory": str(directory)})
        return
    from gem_pipelines.data.simulator import simulate_partition

    sim = simulate_partition(simulator.config(), SURFACES, surface, date, simulator.landing_root())
    yield dg.MaterializeResult(
        asset_key="raw_logs",
        metadata={
            "directory": dg.MetadataValue.path(str(directory)),
            "files": [p.name for p in sim.files],
            "impressions": sim.n_impressions,
            "organic_records": sim.n_organic,
            "click_events": sim.n_click_events,
            "conversion_events": sim.n_conversion_events,
            "injected_corruption": md_table([{"reason": k, "records": v} for k, v in sim.n_corrupted.items() if v],
                                            ["reason", "records"]),
        },
    )
    from gem_pipelines.data.validation import validate_frame

    # Not an asset check: with `source: landing` (real logs) there is no oracle, and a check must report every run.
    suite = validate_frame("oracle", sim.oracle, partition_key=context.partition_key,
                           docs_dir=reports_dir() / "data_docs")
    if not suite.success:
        raise dg.Failure(f"oracle {context.partition_key}: its GX suite failed; the raw files are landed, the oracle "
                         "is not written", metadata=suite_metadata(suite))
    version = lake_io.write_partition(
        sim.oracle, "oracle", {"date": date, "surface": surface}, ORACLE_SCHEMA, root=lake.uri()
    )
    yield dg.MaterializeResult(
        asset_key="oracle", metadata={"rows": sim.oracle.height, "delta_version": version, **suite_metadata(suite)}
    )


_P = {"partitions_def": date_surface_partitions_def}  # results recorded per partition, as the UI shows them
SUITES = ("events", "user_activity")  # the ingested tables with a blocking GX suite
INGEST_CHECKS = [
    *(dg.AssetCheckSpec("gx_suite", asset=t, blocking=True, description=f"GX suite assets/expectations/{t}.json", **_P)
      for t in SUITES),
    dg.AssetCheckSpec(
        "row_conservation",
        asset="events",
        blocking=True,
        **_P,
        description="raw records = impressions + merged click/conversion events + organic activity + quarantined",
    ),
    dg.AssetCheckSpec(
        "quarantine_rate",
        asset="events_quarantine",
        description=f"warn above {QUARANTINE_WARN_RATE:.0%}, fail above {QUARANTINE_FAIL_RATE:.0%} of raw records",
        **_P,
    ),
]


@dg.multi_asset(
    specs=[
        dg.AssetSpec("events", deps=["raw_logs"], description="One row per ad impression, unified schema."),
        dg.AssetSpec("user_activity", deps=["raw_logs"], description="Organic and paid activity, all surfaces."),
        dg.AssetSpec(
            "events_quarantine",
            deps=["raw_logs"],
            description="Every raw record that failed parsing or validation, with a reason: "
            + ", ".join(REASONS),
        ),
    ],
    check_specs=INGEST_CHECKS,
    partitions_def=date_surface_partitions_def,
    group_name=GROUP,
    can_subset=False,
    pool="ingest",
)
def ingest(context: dg.AssetExecutionContext, lake: LakeResource, simulator: SimulatorResource):
    """Parse, normalise and validate one partition's raw files, then commit the three tables."""
    date, surface_name = split_key(context)
    surface = SURFACES.get(surface_name)
    docs = reports_dir() / "data_docs"
    before = {t: lake_io.table_version(t, root=lake.uri()) for t in ("events", "user_activity", "events_quarantine")}
    try:
        result = ingest_partition(surface, date, simulator.landing_root(), docs_dir=docs, lake_root=lake.uri())
    except SuiteFailed as failed:
        for table, suite in failed.results.items():
            if table in SUITES:
                yield dg.AssetCheckResult(
                    asset_key=table, check_name="gx_suite", passed=suite.success, metadata=suite_metadata(suite)
                )
        raise dg.Failure(str(failed), metadata={"previous_versions": dg.MetadataValue.json(before)}) from failed
    norm = result.normalized
    per_table = {
        "events": (norm.events, {"click_rate": float(norm.events["click"].mean() or 0.0)}),
        "user_activity": (norm.user_activity, {"organic_rows": norm.organic.height}),
        "events_quarantine": (norm.quarantine, {"by_reason": md_table(
            [{"reason": k, "records": v, "meaning": REASONS[k]} for k, v in norm.reasons.items()],
            ["reason", "records", "meaning"])}),
    }
    for table, (df, extra) in per_table.items():
        yield dg.MaterializeResult(
            asset_key=table,
            metadata={"rows": df.height, "quarantined_rows": norm.quarantine.height,
                      "delta_version": result.versions[table], **extra, "preview": preview(df)},
        )
    for table in SUITES:
        suite = result.suites.get(table)
        yield dg.AssetCheckResult(
            asset_key=table,
            check_name="gx_suite",
            passed=suite.success if suite else True,
            metadata=suite_metadata(suite) if suite else {"note": "no rows to validate"},
        )
    counts = conservation(surface, date, simulator.landing_root(), lake_root=lake.uri())
    yield dg.AssetCheckResult(
        asset_key="events",
        check_name="row_conservation",
        passed=counts["missing"] == 0,
        metadata={k: int(v) for k, v in counts.items()},
    )
    rate = result.quarantine_rate
    status = "ok" if rate <= QUARANTINE_WARN_RATE else "warn" if rate <= QUARANTINE_FAIL_RATE else "fail"
    yield dg.AssetCheckResult(
        asset_key="events_quarantine",
        check_name="quarantine_rate",
        passed=status == "ok",
        severity=dg.AssetCheckSeverity.ERROR if status == "fail" else dg.AssetCheckSeverity.WARN,
        metadata={"rate": rate, "status": status, "warn_above": QUARANTINE_WARN_RATE, "fail_above": QUARANTINE_FAIL_RATE},
    )

