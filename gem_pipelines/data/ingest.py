"""One partition, raw files to lake: stage -> row rules -> suites -> Delta commits.

The blocking suites run before any commit: if one fails, nothing is written and the tables keep their
previous versions. The quarantine suite (reported, not blocking) and the run's Data Docs pages run while
the commits are written.
"""

from __future__ import annotations

import datetime as dt
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gem_model.config import Surface, load_features
from gem_pipelines.data import lake
from gem_pipelines.data.formats import QUARANTINE_SCHEMA, USER_ACTIVITY_SCHEMA, events_schema
from gem_pipelines.data.normalize import NormalizedPartition, normalize_partition
from gem_pipelines.data.parsers import count_raw_records, stage_partition

if TYPE_CHECKING:
    from gem_pipelines.data.validation import SuiteResult

BLOCKING_SUITES = ("events", "user_activity")


class SuiteFailed(RuntimeError):
    """A blocking Great Expectations suite failed; nothing was committed."""

    def __init__(self, partition_key: str, results: dict[str, SuiteResult]):
        failed = {t: r.failed_expectations for t, r in results.items() if not r.success}
        super().__init__(f"partition {partition_key}: blocking suites failed, tables left unchanged: {failed}")
        self.results = results


@dataclass
class IngestResult:
    partition_key: str
    normalized: NormalizedPartition
    suites: dict[str, SuiteResult]
    versions: dict[str, int] = field(default_factory=dict)

    @property
    def quarantine_rate(self) -> float:
        n = self.normalized.raw_records
        return self.normalized.quarantine.height / n if n else 0.0


def ingest_partition(
    surface: Surface,
    date: dt.date,
    landing_root: Path,
    *,
    docs_dir: Path | None = None,
    lake_root: str | None = None,
    validate: bool = True,
) -> IngestResult:
    from gem_pipelines.data.validation import build_docs, validate_frame

    key = f"{date.isoformat()}|{surface.name}"
    context = load_features().context  # the log's own columns, as the suites read them (validation.py)
    stage = stage_partition(surface.format, landing_root / surface.name / date.isoformat(), list(context))
    norm = normalize_partition(stage, surface, date, context)
    frames = {"events": norm.events, "user_activity": norm.user_activity, "events_quarantine": norm.quarantine}
    suites: dict[str, SuiteResult] = {}

    def run_suites(*tables: str) -> None:
        for table in tables:
            if frames[table].height:
                suites[table] = validate_frame(table, frames[table], partition_key=key, docs_dir=docs_dir, build=False)

    if validate:
        run_suites(*BLOCKING_SUITES)
        if any(not suites[t].success for t in BLOCKING_SUITES if t in suites):
            run_suites("events_quarantine")  # a failed partition has its pages too: that is where to look
            build_docs(list(suites.values()), docs_dir)
            raise SuiteFailed(key, suites)
    part = {"date": date, "surface": surface.name}
    schemas = {"events": events_schema(context), "user_activity": USER_ACTIVITY_SCHEMA, "events_quarantine": QUARANTINE_SCHEMA}
    for table, frame in frames.items():  # every refusal (a schema, an old lake's) before any commit: none half-done
        lake.check_write(frame, table, part, schemas[table], root=lake_root)
    # Three independent commits; delta-rs releases the GIL, so write them side by side, and meanwhile run
    # the non-blocking quarantine suite and render the run's Data Docs (pure Python) on this thread. A write
    # that still fails (I/O, a schema changed by another version meanwhile) raises here and may leave the other
    # tables committed: re-running the partition rewrites all three, each partition-exact, so that is the recovery.
    with ThreadPoolExecutor(max_workers=len(frames)) as pool:
        futures = {t: pool.submit(lake.write_partition, frames[t], t, part, schemas[t], root=lake_root, checked=True)
                   for t in frames}
        if validate:
            run_suites("events_quarantine")
            build_docs(list(suites.values()), docs_dir)  # once per run: rendering costs more than a suite
        versions = {t: f.result() for t, f in futures.items()}
    return IngestResult(key, norm, suites, versions)


def conservation(surface: Surface, date: dt.date, landing_root: Path, *, lake_root: str | None = None) -> dict[str, int]:
    """Recount one partition independently: raw lines/rows in the files vs rows in the tables."""
    raw = count_raw_records(surface.format, landing_root / surface.name / date.isoformat())
    events = lake.read_partition("events", date, surface.name, columns=["click", "conversion"], root=lake_root)
    activity = lake.read_partition("user_activity", date, surface.name, columns=["source"], root=lake_root)
    quarantined = lake.read_partition("events_quarantine", date, surface.name, columns=["reason"], root=lake_root).height
    organic = activity.filter(activity["source"] == "organic").height
    merged = 0
    if surface.format == "event_stream":
        merged = int(events["click"].fill_null(0).sum()) + int(events["conversion"].fill_null(0).sum())
    accounted = events.height + merged + organic + quarantined
    return {
        "raw_records": raw,
        "impressions": events.height,
        "merged_label_events": merged,
        "organic": organic,
        "quarantined": quarantined,
        "accounted": accounted,
        "missing": raw - accounted,
    }
