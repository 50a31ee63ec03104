"""Two processes ingest the same partition at once, N times: duplicate rows and lost rows per try.

    python bench/concurrent_writes.py --tries 20
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--impressions", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "gem"
        os.environ["GEM_HOME"] = str(home)
        from gem_pipelines.data.concurrency import concurrent_ingest, land

        date = dt.date(2026, 11, 2)
        land(home, "feed", date, impressions=args.impressions)
        dup = lost = bad_versions = 0
        for i in range(args.tries):
            r = concurrent_ingest(home, "feed", date)
            dup += r["duplicate_rows"]
            lost += r["conservation"]["missing"] != 0
            ok = all(len({v[t] for v in r["versions"]}) == 2 and {v[t] for v in r["versions"]} <= set(c)
                     for t, c in r["committed"].items())
            bad_versions += not ok
            print(f"try {i + 1}: rows {r['rows']} duplicates {r['duplicate_rows']} "
                  f"missing {r['conservation']['missing']} versions {r['versions']}")
        print(f"{args.tries} tries, 2 concurrent writers each: {dup} duplicate rows, {lost} tries losing rows, "
              f"{bad_versions} tries with a version not this writer's own commit")


if __name__ == "__main__":
    main()
