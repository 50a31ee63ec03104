"""Schedules: land and ingest yesterday every day; maintain the lake every week.

"Yesterday" is the simulator's clock (the calendar window's last day E, moved by `make next-day`)
for a fixed window, and the wall clock's yesterday for an open (production) window.
"""


import datetime as dt

import dagster as dg

from gem_pipelines.jobs import lake_maintenance_job, land_and_ingest_job
from gem_pipelines.partitions import CALENDAR, SURFACES, date_partitions_def, multi_key
from gem_pipelines.sensors import last_ingested


def yesterday(scheduled: dt.datetime) -> dt.date:
    if CALENDAR.days == "open":
        return scheduled.astimezone(dt.UTC).date() - dt.timedelta(days=1)
    return CALENDAR.end()


def ingest_requests_for(day: dt.date, instance: dg.DagsterInstance | None = None) -> list[dg.RunRequest] | dg.SkipReason:
    """One run per surface for `day`, if `day` is a partition of the calendar and not ingested yet."""
    key = day.isoformat()
    if key not in date_partitions_def.get_partition_keys(current_time=dt.datetime.combine(
        day + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC
    )):
        return dg.SkipReason(f"{key} is outside the calendar window (assets/calendar.yaml)")
    keys = [multi_key(key, s) for s in SURFACES.names]
    todo = [k for k in keys if not last_ingested(instance, str(k))]
    if not todo:
        return dg.SkipReason(f"{key} is already ingested for every surface")
    return [
        dg.RunRequest(run_key=f"daily-{k}", partition_key=k, tags={"gem/trigger": "daily"}) for k in todo
    ]


@dg.schedule(job=land_and_ingest_job, cron_schedule="30 1 * * *", execution_timezone="UTC",
             description="At 01:30 UTC, land and ingest yesterday (the simulator's clock: the window's last day) "
             "for every surface not ingested yet.")
def daily_ingest_schedule(context: dg.ScheduleEvaluationContext):
    return ingest_requests_for(yesterday(context.scheduled_execution_time), context.instance)


weekly_maintenance_schedule = dg.ScheduleDefinition(
    name="weekly_maintenance_schedule",
    job=lake_maintenance_job,
    cron_schedule="0 3 * * 0",
    execution_timezone="UTC",
    description="Sundays 03:00 UTC: OPTIMIZE (compact small files) and VACUUM every lake table.",
)
