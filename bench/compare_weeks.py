"""Two runs of the same simulated days (two finished `make week` homes of one world, e.g. two commits), row for
row: the foundation's predictions as each served them (`teacher_predictions`), click NE per surface and on the ads
first seen on their day, the paired 95% interval of the difference, the share of the oracle gap closed and the
calibration against the truth. Nothing is trained or re-scored.

    GEM_SIMULATOR=eval python bench/compare_weeks.py --a <home> --b <home> --days <D> [<D> ...] [--n-boot 500]

diff = NE(a) - NE(b). The two homes must hold the same impressions and clicks on those days (the simulator is a
function of its seed and the date): the script stops otherwise.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import os
import sys
from pathlib import Path

import polars as pl

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gem_model.eval.ad_age import AGE_BUCKETS, ALL, ad_ages, read_events  # noqa: E402
from gem_model.store.paths import table_uri  # noqa: E402
from gem_pipelines.day_report import scored  # noqa: E402

_spec = importlib.util.spec_from_file_location("serving_fold_in_bench", Path(__file__).with_name("serving_fold_in.py"))
serving_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serving_bench)


def served(home: Path, days: list[dt.date]) -> pl.DataFrame:
    """request_id, surface, p_click, click, oracle_p and ad_age of `days` in `home` (its lake, as served)."""
    os.environ["GEM_HOME"] = str(home)  # table_uri reads it on each call
    ages = pl.concat([ad_ages(read_events(d, table_uri("events")), d) for d in days])
    return scored(days).join(ages, on="request_id", how="left")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--a", required=True, type=Path, help="the candidate's GEM_HOME")
    p.add_argument("--b", required=True, type=Path, help="the reference's GEM_HOME")
    p.add_argument("--days", required=True, nargs="+", help="the days E compared (both homes recorded them)")
    p.add_argument("--n-boot", type=int, default=500)
    a = p.parse_args(argv)
    days = sorted(dt.date.fromisoformat(d) for d in a.days)
    ref = served(a.b, days).select("request_id", pl.col("p_click").alias("b"), pl.col("click").alias("click_b"))
    cand = served(a.a, days).rename({"p_click": "a"})
    df = cand.join(ref, on="request_id", how="inner")
    if not (df.height == cand.height == ref.height) or (df["click"] != df["click_b"]).any():
        raise SystemExit(f"the homes differ in their impressions or clicks on {a.days}: {cand.height} and "
                         f"{ref.height} rows, {df.height} in both")
    print(f"click NE as served, {len(days)} day(s) pooled ({days[0]}..{days[-1]}); a: --a, b: --b; "
          "diff = a - b [95% paired interval]; gap = share of the oracle gap closed; cal = mean p / mean oracle p\n")
    serving_bench.print_paired(df, "a", "b", a.n_boot, (AGE_BUCKETS[0], ALL))  # new that day, every row
    return 0


if __name__ == "__main__":
    sys.exit(main())
