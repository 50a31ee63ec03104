"""The report of the simulated days (`make next-day`, `make week`): per day and surface, how the
models did on that day's E, which models retrained, and how long the day took.

Each day writes `reports/next_day/<E>.json`; `render` turns every day so far into
`reports/days_in_the_life.md` (tables, and every day's rows pooled per surface, by the ad's age and by
its fold status, with 95% bootstrap intervals) and `.png` (plots), and records an observation on each
`students` partition with its surface's table and links to both (the asset's page in the UI).
`python -m gem_pipelines.day_report` renders the recorded days again (a home written by an older version).

Measured on E from the lake alone (no model is loaded): the foundation's predictions are the
`teacher_predictions` rows of teacher `foundation` on E, joined with `events` (clicks) and `oracle`
(the true probabilities). Columns:
- `ne`: the foundation's click NE; `oracle_ne`: the oracle's on the same rows (the floor);
- `gap_closed`: (1 - ne) / (1 - oracle_ne), the share of the gap between the base rate and the
  oracle that the model closes;
- `calibration`: mean prediction / mean oracle probability (against the truth, not the day's clicks);
- `oracle_map_calibration`: the same ratio for the oracle's own probabilities behind a map fitted the
  way the served foundation version's was, on the same days (its metrics.json `calibration`): how far from 1
  a perfect model lands through the same fitting noise; `calibration_ok`: `calibration` no further
  from 1 than that (issue 24's yardstick; a map fitted on ~700 clicks cannot promise 0.97-1.03),
  summarised per surface by `calibration_table`;
- `new_ad_ne`: NE on impressions of ads first seen on E (first date the ad_id is in `events`), with
  their impressions and clicks (gem_model.eval.ad_age);
- `student_ne`, `student_gap_closed`: the surface's ACCEPTED student on E (its quality gate's rows).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
import polars as pl

from gem_model.store.paths import gem_home, models_dir, reports_dir, storage_options, table_uri
from gem_model.train.refresh import foundation_version_dir
from gem_pipelines.metadata import md_grid, pyplot

DAYS_DIR = "next_day"
REPORT = "days_in_the_life"
MODELS = ("foundation_model", "foundation_refresh", "domain_models", "students")


def accepted_versions() -> dict[str, str]:
    """'asset[/partition]' -> ACCEPTED version, for every model."""
    root = gem_home() / "models"
    return {f.parent.relative_to(root).as_posix(): f.read_text().strip() for f in sorted(root.glob("*/**/ACCEPTED"))
            if f.parent.relative_to(root).parts[0] in MODELS}


def _start(name: str, version: str) -> str:
    """How a new version began: warm (from the version it replaces) or cold, from its metrics.json."""
    asset, _, partition = name.partition("/")
    path = models_dir(asset, partition or None) / version / "metrics.json"
    if asset == "domain_models":
        return "from the teacher"  # a domain model starts as a copy of the ACCEPTED foundation
    if not path.is_file():
        return "?"
    doc = json.loads(path.read_text())
    warm = doc.get("train", {}).get("warm_start") if asset == "students" else doc.get("warm_start")
    # students record "warm" or why they started cold; the other models a bool
    return "warm" if (warm == "warm" if isinstance(warm, str) else warm) else "cold"


def retrained(before: dict[str, str], after: dict[str, str]) -> list[dict[str, str]]:
    """The models whose ACCEPTED version changed, and how each new version started."""
    return [{"model": name, "start": _start(name, v)} for name, v in sorted(after.items()) if before.get(name) != v]


def scored(days: list[dt.date]) -> pl.DataFrame:
    """request_id, surface, p_click (the foundation's), click and oracle_p (when the lake has an oracle)
    of `days`' impressions."""
    from gem_model.eval.metrics import read_oracle

    tp_uri, ev_uri = table_uri("teacher_predictions"), table_uri("events")
    preds = (pl.scan_delta(tp_uri, storage_options=storage_options(tp_uri))
             .filter(pl.col("date").is_in(days) & (pl.col("teacher") == "foundation"))
             .select("request_id", "surface", "p_click").collect())
    clicks = (pl.scan_delta(ev_uri, storage_options=storage_options(ev_uri)).filter(pl.col("date").is_in(days))
              .select("request_id", pl.col("click").cast(pl.Float64)).collect())
    df = preds.join(clicks, on="request_id", how="inner")
    oracle = read_oracle(days, uri=table_uri("oracle"), missing_ok=True)
    if oracle is None:
        return df
    return df.join(oracle.select("request_id", pl.col("p_click").alias("oracle_p")), on="request_id", how="left")


POOLED_BOOT = 200  # resamples behind the pooled tables' intervals (every day's rows: hundreds of thousands)


AGE_TITLES = {"new": "first seen on their E (the cold start)", "recent": "first seen 1-2 days before their E",
              "older": "first seen earlier"}
FOLD_TITLES = {"known": "logged in the window of the foundation that served them (`known`)",
               "folded": "first logged after that window, before their E (`folded`: placed by the serving fold-in)",
               "folded_today": "first logged earlier on their E (`folded_today`: from the day's earlier slices)",
               "unseen": "never logged before the slice of E they were scored in (`unseen`)"}


def served_fold_status(days: list[dt.date]) -> pl.DataFrame:
    """request_id, fold_status (gem_model.distill.serving_fold_in) of `days`' impressions, each day against the
    window of the foundation version that served it: are the ads born after a stale teacher's window served
    as well as those it trained on?"""
    from gem_model.distill.serving_fold_in import fold_status

    uri = table_uri("teacher_predictions")
    served = (pl.scan_delta(uri, storage_options=storage_options(uri))
              .filter(pl.col("date").is_in(days) & (pl.col("teacher") == "foundation"))
              .select("date", "teacher_version").unique().collect()
              .group_by("teacher_version").agg(pl.col("date").sort()).sort("teacher_version"))
    frames = []
    for version, served_days in served.iter_rows():  # one scan of the logs per version (fold_status reads them all)
        vdir = foundation_version_dir(version)
        config = vdir / "config.json" if vdir else None
        if config is not None and config.is_file():
            frames.append(fold_status(json.loads(config.read_text()), served_days))
    return pl.concat(frames) if frames else pl.DataFrame(schema={"request_id": pl.String, "fold_status": pl.String})


def pooled_table(days: list[dict[str, Any]]) -> str:
    """Per surface, and over every surface (`all`), every recorded day's rows together: NE, the
    oracle's, the share of the gap closed, with 95% intervals (`_pooled_cells`), and the calibration
    against the truth; then the same per ad age (gem_model.eval.ad_age): a stale model's bias on the ads
    born after its window shows there; then per fold status (`served_fold_status`): whether the fold-in
    serves those ads as well as the ones the teacher trained on."""
    from gem_model.eval.ad_age import AGE_BUCKETS, ad_ages, read_events

    dates = [dt.date.fromisoformat(d["day"]) for d in days]
    df = scored(dates)
    ages = [ad_ages(read_events(d, table_uri("events")), d).with_columns(day=pl.lit(d.isoformat())) for d in dates]
    df = df.join(pl.concat(ages), on="request_id", how="left").join(served_fold_status(dates), on="request_id",
                                                                      how="left")
    cols = ["surface", "days", "impressions", "clicks", "ne", "ne 95%", "oracle_ne", "gap_closed", "gap_closed 95%",
            "calibration"]
    present = set(df["fold_status"].drop_nulls().to_list())
    sections = [(None, ""), *((pl.col("ad_age") == a, f"Impressions of ads {AGE_TITLES[a]}") for a in AGE_BUCKETS),
                *((pl.col("fold_status") == s, f"Impressions of ads {FOLD_TITLES[s]}") for s in FOLD_TITLES if s in present)]
    out = []
    for where, title in sections:
        rows = df if where is None else df.filter(where)
        groups = [(s, rows.filter(pl.col("surface") == s)) for s in sorted(rows["surface"].unique().to_list())]
        grid = [[name, len(days), g.height, int(g["click"].sum()), *_pooled_cells(g)] for name, g in [*groups, ("all", rows)]]
        out.append((f"\n\n{title}:\n\n" if title else "") + md_grid(cols, grid, fmt=_f).value)
    if "oracle_p" in df.columns:
        out.append("\n\nCalibration against the truth (mean prediction / mean oracle p) per day and ad age, "
                   "every surface together:\n\n" + calibration_by_age(df))
    return "".join(out)


def calibration_by_age(df: pl.DataFrame) -> str:
    """Mean p_click / mean oracle_p of `df` (day, ad_age, p_click, oracle_p) per day, by ad age and all."""
    from gem_model.eval.ad_age import AGE_BUCKETS

    ratio = (pl.col("p_click").mean() / pl.col("oracle_p").mean()).alias("r")
    rows = []
    for day in sorted(df["day"].drop_nulls().unique().to_list()):
        d = df.filter(pl.col("day") == day)
        by_age = dict(d.group_by("ad_age").agg(ratio).iter_rows())
        rows.append([day, *(by_age.get(a) for a in AGE_BUCKETS), d.select(ratio).item()])
    return md_grid(["day", *AGE_BUCKETS, "all"], rows, fmt=_f).value


def _pooled_cells(rows: pl.DataFrame) -> list[Any]:
    """ne, its interval, oracle_ne, gap_closed and its interval, calibration (mean p / mean oracle p) of
    `rows` (click, p_click, oracle_p), one Poisson bootstrap for model and oracle alike (the gap's
    interval is paired); blanks where undefined."""
    from gem_model.eval.metrics import bootstrap_ne, interval, normalized_entropy

    y = rows["click"].to_numpy()
    if rows.height == 0 or y.sum() == 0:
        return [None] * 6
    preds = {"m": rows["p_click"].to_numpy()}
    if "oracle_p" in rows.columns and rows["oracle_p"].null_count() == 0:
        preds["o"] = rows["oracle_p"].to_numpy()
    boot = bootstrap_ne(y, preds, n_boot=POOLED_BOOT, chunk=10)
    ne = normalized_entropy(y, preds["m"])
    cells: list[Any] = [ne, _ci(interval(boot["m"])), None, None, None, None]
    if "o" in preds:
        o = normalized_entropy(y, preds["o"])
        gap = (1 - boot["m"]) / (1 - boot["o"])
        cells[2:] = [o, (1 - ne) / (1 - o) if o < 1 else None, _ci(interval(gap[np.isfinite(gap)])),
                     float(preds["m"].mean() / preds["o"].mean())]
    return cells


def _ci(bounds: tuple[float, float]) -> str:
    return f"[{bounds[0]:.4f}, {bounds[1]:.4f}]"


def surface_rows(day: dt.date) -> list[dict[str, Any]]:
    """Per surface: the foundation's NE, share of the oracle gap, calibration against the truth and
    new-ad NE on `day`, with the ACCEPTED student's NE (empty when `day` has no foundation predictions)."""
    from gem_model.eval.ad_age import ad_ages, read_events
    from gem_model.eval.metrics import normalized_entropy

    df = scored([day])
    if df.height == 0:
        return []
    df = df.join(ad_ages(read_events(day, table_uri("events")), day), on="request_id", how="left")
    mapped = oracle_map_calibration(day, df) if "oracle_p" in df.columns else {}
    rows = []
    for surface in sorted(df["surface"].unique().to_list()):
        s = df.filter(pl.col("surface") == surface)
        y, p = s["click"].to_numpy(), s["p_click"].to_numpy()
        row: dict[str, Any] = {"day": day.isoformat(), "surface": surface, "impressions": s.height,
                               "clicks": int(y.sum()), "ne": normalized_entropy(y, p), "oracle_ne": None,
                               "gap_closed": None, "calibration": None}
        if "oracle_p" in s.columns and s["oracle_p"].null_count() == 0:
            q = s["oracle_p"].to_numpy()
            row["oracle_ne"] = normalized_entropy(y, q)
            row["gap_closed"] = (1 - row["ne"]) / (1 - row["oracle_ne"]) if row["oracle_ne"] < 1 else None
            row["calibration"] = float(p.mean() / q.mean())
            if surface in mapped:
                row["oracle_map_calibration"] = mapped[surface]
                row["calibration_ok"] = abs(row["calibration"] - 1) <= abs(mapped[surface] - 1)
        new = s.filter(pl.col("ad_age") == "new")
        row.update(new_ad_impressions=new.height, new_ad_clicks=int(new["click"].sum()),
                   new_ad_ne=normalized_entropy(new["click"].to_numpy(), new["p_click"].to_numpy()))
        row.update(_student(surface, day))
        rows.append(row)
    return rows


def oracle_map_calibration(day: dt.date, rows: pl.DataFrame) -> dict[str, float]:
    """{surface: mean mapped oracle p / mean oracle p} on `rows` (request_id, surface, oracle_p of `day`),
    the map fitted like the one behind the foundation's predictions of `day` (the version that served it: the
    ACCEPTED one or that day's refresh), on the same days; {} when the foundation has no fitted map or a fitting
    day has no oracle."""
    from gem_model.eval.metrics import read_oracle
    from gem_model.models.calibration import fit_calibrator, refit_days

    tp_uri = table_uri("teacher_predictions")
    served = (pl.scan_delta(tp_uri, storage_options=storage_options(tp_uri))
              .filter((pl.col("date") == day) & (pl.col("teacher") == "foundation"))
              .select("teacher_version").unique().collect()["teacher_version"].to_list())
    vdir = foundation_version_dir(served[0]) if len(served) == 1 else None
    path = vdir / "metrics.json" if vdir else None
    cal = (json.loads(path.read_text()).get("calibration") or {}) if path and path.is_file() else {}
    if not cal.get("fit_day"):
        return {}
    # the days the served map was fitted on: the model's own, or those a stale one was re-fitted on
    fit_days = refit_days(day, cal["fit_day"]) or [dt.date.fromisoformat(d) for d in cal["fit_day"].split(",")]
    oracle = read_oracle(fit_days, uri=table_uri("oracle"), missing_ok=True)
    if oracle is None:
        return {}
    ev_uri = table_uri("events")
    clicks = (pl.scan_delta(ev_uri, storage_options=storage_options(ev_uri)).filter(pl.col("date").is_in(fit_days))
              .select("request_id", pl.col("click").cast(pl.Float64)).collect())
    fit_rows = oracle.join(clicks, on="request_id", how="inner").with_columns(
        click_mask=pl.lit(True), conversion=pl.lit(0.0), conversion_mask=pl.lit(False))
    surfaces = sorted(rows["surface"].unique().to_list())
    mapper = fit_calibrator(fit_rows, surfaces, min_positives=int(cal["min_positives"]), fit_day=cal["fit_day"],
                            shrink_positives=float(cal.get("shrink_positives") or 0.0), prior=cal.get("prior") or "pooled",
                            level_positives=cal.get("level_positives"))
    out = {}
    for surface in surfaces:
        q = rows.filter(pl.col("surface") == surface)["oracle_p"].drop_nulls().to_numpy()
        if len(q):
            out[surface] = float(mapper.apply_probs(q, [surface] * len(q)).mean() / q.mean())
    return out


def _student(surface: str, day: dt.date) -> dict[str, Any]:
    """The ACCEPTED student's click NE on `day`, from its quality gate's rows when it was gated on `day`."""
    from gem_pipelines.quality_gate import accepted_rows

    rows = [r for r in accepted_rows("students", day.isoformat(), surface) or []
            if r.get("task") == "click" and r.get("surface") == surface]
    if not rows:
        return {"student_ne": None, "student_gap_closed": None}
    ne, o = rows[0]["ne"], rows[0].get("oracle_ne")
    return {"student_ne": ne, "student_gap_closed": (1 - ne) / (1 - o) if o is not None and o < 1 else None}


def write_day(day: dt.date, summary: dict[str, Any], models: list[dict[str, str]], wall_s: float) -> Path:
    """Keep one simulated day's record (what `render` reads)."""
    from gem_model.store.atomic import write_json

    return write_json(reports_dir() / DAYS_DIR / f"{day.isoformat()}.json",
                      {"day": day.isoformat(), "wall_s": round(wall_s, 1), "retrained": models,
                       "failed": summary.get("failed", []), "rejected": summary.get("rejected", []),
                       "stale": summary.get("stale", []),
                       "surfaces": surface_rows(day)})


def load_days() -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((reports_dir() / DAYS_DIR).glob("*.json"))]


def _f(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    return f"{v:.4f}" if isinstance(v, float) else str(v)


SURFACE_COLS = ("day", "surface", "ne", "oracle_ne", "gap_closed", "calibration", "oracle_map_calibration",
                "calibration_ok", "new_ad_ne",
                "new_ad_impressions", "new_ad_clicks", "student_ne", "student_gap_closed")


def surface_table(days: list[dict[str, Any]], surface: str | None = None) -> str:
    rows = [[r.get(c) for c in SURFACE_COLS] for d in days for r in d["surfaces"]
            if surface is None or r["surface"] == surface]
    return md_grid(SURFACE_COLS, rows, fmt=_f).value


def calibration_table(days: list[dict[str, Any]]) -> str:
    """Per surface over the judged days: cells within the yardstick, the median distance from 1 of the
    model's calibration and of the oracle's behind the same map, and the mean of their ratio: the
    model's own drift from its fitting days once the fitting clicks' noise (shared by both) is divided out."""
    rows = []
    for surface in sorted({r["surface"] for d in days for r in d["surfaces"]}):
        rs = [r for d in days for r in d["surfaces"] if r["surface"] == surface and r.get("calibration_ok") is not None]
        if rs:
            ratio = [r["calibration"] / r["oracle_map_calibration"] for r in rs]
            rows.append([surface, f"{sum(r['calibration_ok'] for r in rs)} of {len(rs)}",
                         float(np.median([abs(r["calibration"] - 1) for r in rs])),
                         float(np.median([abs(r["oracle_map_calibration"] - 1) for r in rs])),
                         float(np.mean(ratio)), f"{min(ratio):.3f}-{max(ratio):.3f}"])
    return md_grid(["surface", "cells ok", "median distance from 1", "the oracle's behind the map",
                    "mean calibration / oracle's", "range"], rows, fmt=_f).value


def day_table(days: list[dict[str, Any]]) -> str:
    rows = [[d["day"], f"{d['wall_s']:.0f}", ", ".join(f"{m['model']} ({m['start']})" for m in d["retrained"]) or "none",
             ", ".join(d.get("rejected", [])) or "none", len(d["failed"])] for d in days]
    return md_grid(["day (E)", "wall time (s)", "retrained (start)", "refused by a gate", "failed runs"], rows,
                   fmt=str).value


def plot(days: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    panels = (("ne", "foundation NE (dashed: oracle)"), ("gap_closed", "share of the oracle gap closed"),
              ("calibration", "mean prediction / mean oracle p (dashed: the oracle's behind the same map)"), ("new_ad_ne", "NE on ads first seen on E"))
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    surfaces = sorted({r["surface"] for d in days for r in d["surfaces"]})
    for ax, (col, title) in zip(axes.flat, panels, strict=True):
        for i, surface in enumerate(surfaces):
            rs = [r for d in days for r in d["surfaces"] if r["surface"] == surface]
            xs, ys = [r["day"][5:] for r in rs], [np.nan if r.get(col) is None else r[col] for r in rs]
            ax.plot(xs, ys, marker="o", color=f"C{i}", label=surface)
            ref = {"ne": "oracle_ne", "calibration": "oracle_map_calibration"}.get(col)
            if ref:
                ax.plot(xs, [np.nan if r.get(ref) is None else r[ref] for r in rs], ls="--", marker="x", color=f"C{i}")
        if col == "calibration":
            ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(title, fontsize=10)
        ax.tick_params(labelsize=8)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def render(instance: dg.DagsterInstance | None = None) -> Path:
    """Write the markdown report and its plot from every recorded day; with an instance, link them
    from each `students` partition's page (an observation carrying that surface's table)."""
    from gem_pipelines.reports import report_links

    days = load_days()
    out = reports_dir() / f"{REPORT}.md"
    png = out.with_suffix(".png")
    if days:
        plot(days, png)
    judged = [r["calibration_ok"] for d in days for r in d["surfaces"] if r.get("calibration_ok") is not None]
    out.write_text(f"# Days in the life\n\nOne row per simulated day (E: the window's last day, every model's "
                   f"evaluation day). Columns: gem_pipelines/day_report.py.\n\n{day_table(days)}\n\n"
                   f"## Per surface on E\n\nCalibration no further from 1 than the oracle's behind the same map: "
                   f"{sum(judged)} of {len(judged)} (day, surface) cells.\n\n{calibration_table(days)}\n\n"
                   f"{surface_table(days)}\n\n"
                   f"## Every day's rows pooled\n\n{pooled_table(days) if days else ''}\n\n"
                   f"![plots]({png.name})\n")
    if instance is not None and days:
        links = {f"{name}_{k}": v for name, f in (("report", out), ("plot", png)) for k, v in report_links(f).items()}
        for surface in sorted({r["surface"] for r in days[-1]["surfaces"]}):
            instance.report_runless_asset_event(dg.AssetObservation(
                "students", partition=surface, description=f"days in the life up to E = {days[-1]['day']}",
                metadata={"days": dg.MetadataValue.md(surface_table(days, surface)), **links}))
    return out


if __name__ == "__main__":  # the recorded days' report rendered again by this code (GEM_HOME: a home after `make week`)
    print(render())
