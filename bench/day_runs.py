"""Where a simulated day's wall time goes: every run of the instance since `--since-hours` ago, with its
duration, then the seconds summed per asset. The rest of a day's wall time (outside runs) is the
automation's evaluations and the process start.

    GEM_HOME=<home> python bench/day_runs.py [--since-hours H]
"""

from __future__ import annotations

import argparse
import datetime
import time
from collections import defaultdict

import dagster as dg

from gem_pipelines.instance import get_instance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--since-hours", type=float, default=0.5, help="runs created this recently (default 0.5)")
    args = parser.parse_args()
    instance = get_instance()
    since = time.time() - args.since_hours * 3600
    records = instance.get_run_records(dg.RunsFilter(created_after=datetime.datetime.fromtimestamp(since, datetime.UTC)))
    rows = []
    for rec in records:
        run = rec.dagster_run
        stats = instance.get_run_stats(run.run_id)
        secs = (stats.end_time or time.time()) - (stats.start_time or rec.create_timestamp.timestamp())
        assets = ",".join(sorted(k.to_user_string() for k in run.asset_selection or [])) or run.job_name
        rows.append((rec.create_timestamp.timestamp(), secs, assets, run.tags.get("dagster/partition", ""),
                     run.status.value))
    rows.sort()
    per_asset: dict[str, float] = defaultdict(float)
    for _, secs, assets, pk, status in rows:
        print(f"{secs:7.1f}s  {status:<8} {assets}[{pk}]")
        per_asset[assets] += secs
    print(f"\n{sum(r[1] for r in rows):7.1f}s in {len(rows)} runs; per asset:")
    for assets, secs in sorted(per_asset.items(), key=lambda kv: -kv[1]):
        print(f"{secs:7.1f}s  {assets}")


if __name__ == "__main__":
    main()
