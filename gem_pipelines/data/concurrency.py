"""Two ingests of one partition at once, in separate processes: the check behind deliverable "no
collisions" (tests/data/test_concurrent_writes.py runs a few tries, bench/concurrent_writes.py 20)."""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

from gem_model.config import load_simulator, load_surfaces
from gem_model.store.delta import WRITE_ID_KEY
from gem_model.store.paths import table_uri

TABLES = ("events", "user_activity", "events_quarantine")


def _ingest_worker(home: str, surface: str, date: str, start: Any, out: Any) -> None:
    os.environ["GEM_HOME"] = home
    from gem_pipelines.data.ingest import ingest_partition

    start.wait()  # both processes released together, so their writes overlap
    result = ingest_partition(load_surfaces().get(surface), dt.date.fromisoformat(date), Path(home) / "landing",
                              validate=False)
    out.put(result.versions)


def land(home: Path, surface: str, date: dt.date, impressions: int = 400) -> None:
    """Simulate one small partition into `home`/landing."""
    from gem_pipelines.data.simulator import simulate_partition

    simulate_partition(load_simulator(impressions_per_day=impressions), load_surfaces(), surface, date,
                       home / "landing")


def concurrent_ingest(home: Path, surface: str, date: dt.date, writers: int = 2) -> dict[str, Any]:
    """Ingest the same partition from `writers` processes at once; report what the lake then holds."""
    from deltalake import DeltaTable

    from gem_pipelines.data import lake
    from gem_pipelines.data.ingest import conservation

    ctx = mp.get_context("spawn")  # polars under fork can hang
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_ingest_worker, args=(str(home), surface, date.isoformat(), start, out))
             for _ in range(writers)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:  # the results are a few ints: joining before reading the queue cannot block on it
        p.join(timeout=300)
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"a writer failed: exit codes {[p.exitcode for p in procs]}")
    versions = [out.get(timeout=10) for _ in procs]
    root = str(home / "lake")
    events = lake.read_partition("events", date, surface, columns=["request_id"], root=root)
    history = {t: DeltaTable(table_uri(t, root)).history() for t in TABLES}
    return {
        "versions": versions,  # per writer: {table: the version its own commit created}
        "rows": events.height,
        "duplicate_rows": events.height - events["request_id"].n_unique(),
        "conservation": conservation(load_surfaces().get(surface), date, home / "landing", lake_root=root),
        # versions written by this project's writers, per table, as the table history records them
        "committed": {t: sorted(h["version"] for h in history[t] if WRITE_ID_KEY in h) for t in TABLES},
    }
