"""Schedules: land and ingest yesterday every day; maintain the lake every week."""


import datetime as dt

import dagster as dg

from gem_pipelines.jobs import lake_maintenance_job, land_and_ingest_job
from gem_pipelines.partitions import SURFACES, date_partitions_def, multi_key


def ingest_requests_for(day: dt.date) -> list[dg.RunRequest] | dg.SkipReason:
    """One run per surface for `day`, if `day` is a partition of the calendar."""
    key = day.isoformat()
    if key not in date_partitions_def.get_partition_keys(current_time=dt.datetime.combine(
        day + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC
    )):
        return dg.SkipReason(f"{key} is outside the calendar window (assets/calendar.yaml)")
    return [
        dg.RunRequest(run_key=f"daily-{key}-{s}", partition_key=multi_key(key, s), tags={"gem/trigger": "daily"})
        for s in SURFACES.names
    ]


@dg.schedule(job=land_and_ingest_job, cron_schedule="30 1 * * *", execution_timezone="UTC")
def daily_ingest_schedule(context: dg.ScheduleEvaluationContext):
    """At 01:30 UTC, land and ingest yesterday for every surface."""
    yesterday = context.scheduled_execution_time.astimezone(dt.UTC).date() - dt.timedelta(days=1)
    return ingest_requests_for(yesterday)


weekly_maintenance_schedule = dg.ScheduleDefinition(
    job=lake_maintenance_job, cron_schedule="0 3 * * 0", execution_timezone="UTC"
)
