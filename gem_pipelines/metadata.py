"""Dagster metadata builders shared by the assets: previews, suite summaries, plots."""

from __future__ import annotations

import base64
import io
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
import polars as pl
import polars.selectors as cs

from gem_pipelines.html import cell
from gem_pipelines.reports import report_links

if TYPE_CHECKING:
    from gem_pipelines.data.validation import SuiteResult


def preview(df: pl.DataFrame, n: int = 5) -> dg.MetadataValue:
    """A small markdown table of the first rows (lists and long strings shortened)."""
    head = df.head(n).with_columns(cs.string().str.slice(0, 60),
                                   cs.list().list.len().cast(pl.String) + pl.lit(" items"))
    return md_grid(head.columns, head.iter_rows(), fmt=lambda v: "" if v is None else str(v))


def suite_metadata(suite: SuiteResult) -> dict[str, Any]:
    # scalars only; file locations go in as links below (absolute paths would freeze GEM_HOME into the log)
    meta: dict[str, Any] = {k: v for k, v in suite.to_metadata().items()
                            if isinstance(v, (int, float, str, bool)) and k not in ("page", "docs_index")}
    if suite.failed_expectations:
        meta["failed_expectations"] = md_table(suite.failed_expectations, ["expectation", "column", "observed"])
    if suite.page:  # the partition's own Data Docs page, served (see gem_pipelines.reports)
        meta.update(report_metadata("data_docs", suite.page))
    return meta


def report_metadata(key: str, path: str | Path) -> dict[str, dg.MetadataValue]:
    """{key: the served report's URL (a link the UI opens), key_path: its path relative to GEM_HOME}; a file
    outside $GEM_HOME/reports has only its path. Never a frozen absolute path under GEM_HOME."""
    links = report_links(path)
    return {key: links.get("url", links["path"]), f"{key}_path": links["path"]}


def md_table(rows: list[dict[str, Any]], cols: list[str]) -> dg.MetadataValue:
    """Rows of dicts as a markdown table of `cols` (pipes escaped, floats to 4 places)."""
    return md_grid(cols, [[r.get(c) for c in cols] for r in rows])


def md_grid(cols: Sequence[str], rows: Iterable[Sequence[Any]], fmt: Callable[[Any], str] = cell) -> dg.MetadataValue:
    """A header and rows of cells as a markdown table (pipes escaped; by default floats to 4 places)."""
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v).replace("|", "\\|") for v in row) + " |" for row in rows]
    return dg.MetadataValue.md("\n".join(lines))


def pyplot() -> Any:
    """matplotlib.pyplot on the headless Agg backend (steps run without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png(fig: Any) -> bytes:
    """The figure as PNG bytes; the figure is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    pyplot().close(fig)
    return buf.getvalue()


# In every table: gap = NE minus the oracle's NE (0: as good as the true probabilities); gap closed = the share
# of the base-rate-to-oracle gap closed, (1 - NE) / (1 - oracle NE) (NE of the base rate is 1).
METRIC_COLS = ["model", "surface", "task", "seed", "ne", "ne 95%", "oracle_ne", "gap", "gap closed", "auc",
               "calibration", "calibration_raw", "n"]


def gap(ne: float | None, oracle_ne: float | None) -> float | None:
    return ne - oracle_ne if ne is not None and oracle_ne is not None else None


def gap_closed(ne: float | None, oracle_ne: float | None) -> str:
    ok = ne is not None and oracle_ne is not None and oracle_ne < 1 and not math.isnan(ne)
    return f"{(1 - ne) / (1 - oracle_ne):.0%}" if ok else ""


def metric_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """Per-surface metric rows as cells of METRIC_COLS (real logs have no oracle: no gap)."""
    extra = {"gap": lambda r: gap(r.get("ne"), r.get("oracle_ne")),
             "gap closed": lambda r: gap_closed(r.get("ne"), r.get("oracle_ne")),
             # only where positives are few (gem_model.eval.metrics.FEW_POSITIVES)
             "ne 95%": lambda r: "[{:.4f}, {:.4f}]".format(*r["ne_interval"]) if r.get("ne_interval") else None}
    return [[extra[c](r) if c in extra else r.get(c) for c in METRIC_COLS] for r in rows]


def metric_table(rows: list[dict[str, Any]]) -> dg.MetadataValue:
    """Per-surface metric rows as a markdown table, with the gap to the oracle."""
    return md_grid(METRIC_COLS, metric_rows(rows))


CALIBRATOR_COLS = ["surface", "task", "fitted", "a", "b", "positives", "own_weight", "why"]


def calibrator_rows(cal: dict[str, Any] | None) -> list[list[Any]]:
    """The post-hoc map of each (surface, task) (`Calibrator.metadata()`): fitted or identity, and why."""
    return [[surface, task, *(head.get(c) for c in CALIBRATOR_COLS[2:-1]), head.get("why", "")]
            for surface, tasks in ((cal or {}).get("heads") or {}).items() for task, head in tasks.items()]


def calibrator_table(cal: dict[str, Any] | None) -> dg.MetadataValue:
    """The calibrator as a markdown table, after a line of its settings; a sentence when there is none."""
    if not cal:
        return dg.MetadataValue.md("No calibrator: the model's raw probabilities are served.")
    settings = ", ".join(f"{k} {cal[k]}" for k in ("fit_day", "min_positives", "shrink_positives", "prior", "level_positives") if k in cal)
    table = md_grid(CALIBRATOR_COLS, calibrator_rows(cal)).value
    return dg.MetadataValue.md(f"Fitted on {settings}.\n\n{table}")


SEED_COLS = ["seed", "model", "click ne (mean over surfaces)", "gap", "auc"]


def seed_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """Per (seed, model): the click task's NE, gap and AUC averaged over surfaces: how far seeds differ."""
    click = [r for r in rows if r.get("task") == "click" and r.get("ne") is not None]
    if not click:
        return []
    df = (pl.DataFrame([{"seed": r["seed"], "model": r["model"], "ne": r["ne"], "auc": r.get("auc"),
                         "gap": gap(r["ne"], r.get("oracle_ne"))} for r in click], infer_schema_length=None)
          .group_by("seed", "model").agg(pl.col("ne", "gap", "auc").mean())
          .sort("seed", "model"))
    return [list(row) for row in df.iter_rows()]


def seeds_table(rows: list[dict[str, Any]]) -> dg.MetadataValue:
    return md_grid(SEED_COLS, seed_rows(rows))


def loss_curve_png(curve: list[Any]) -> bytes:
    """Training loss by step. `curve` is [[step, loss], ...] or [{"step", "loss"}]."""
    pts = [(c["step"], c["loss"]) if isinstance(c, dict) else (c[0], c[1]) for c in curve]
    fig, ax = pyplot().subplots(figsize=(6, 3))
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts])
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.grid(alpha=0.3)
    return png(fig)


def loss_curve_plot(curve: list[Any]) -> dg.MetadataValue:
    return _png_md(loss_curve_png(curve))


def _png_md(data: bytes) -> dg.MetadataValue:
    """An inline base64 PNG the Dagster UI renders."""
    return dg.MetadataValue.md(f"![plot](data:image/png;base64,{base64.b64encode(data).decode()})")


def distillation_rows(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Click-task rows of the distillation report, seed means per (arm, path, split, surface), with the gap."""
    if not rows:
        return [], []
    frame = pl.DataFrame(rows, infer_schema_length=None)
    # on E: the gain over labels_only and the effectiveness with their paired bootstrap intervals
    # (gem_model.distill.kd_intervals; the same value on every seed's row, hence first())
    ci = [pl.col(c).drop_nulls().first() for c in ("kd_gain", "kd_gain_lo", "kd_gain_hi", "kd_effectiveness_lo",
                                                  "kd_effectiveness_hi", "kd_report") if c in frame.columns]
    df = (
        frame.filter(pl.col("task") == "click")
        .group_by("arm", "path", "split", "surface")
        .agg(pl.col("ne").mean(), pl.col("ne").std().alias("ne_std"), pl.col("oracle_ne").mean(),
             (pl.col("ne") - pl.col("oracle_ne")).mean().alias("gap"),
             pl.col("kd_effectiveness").mean(), *ci, pl.len().alias("seeds"))
        .sort("split", "surface", "arm", "path")
    )
    return df.columns, [list(row) for row in df.iter_rows()]


def distillation_table(rows: list[dict[str, Any]]) -> dg.MetadataValue:
    """Click-task rows of the distillation report (seed means) as a markdown table."""
    cols, cells = distillation_rows(rows)
    return md_grid(cols, cells) if cols else dg.MetadataValue.md("(no rows)")


def distillation_png(rows: list[dict[str, Any]]) -> bytes:
    """Bar chart: evaluation-day click NE per surface for each (arm, path), with the oracle floor."""
    fig, ax = pyplot().subplots(figsize=(8, 3.5))
    if rows:
        df = (
            pl.DataFrame(rows, infer_schema_length=None)
            .filter((pl.col("task") == "click") & (pl.col("split") == "evaluation") & pl.col("ne").is_not_null())
            .group_by("arm", "path", "surface")
            .agg(pl.col("ne").mean(), pl.col("oracle_ne").mean())
            .sort("surface", "arm", "path")
        )
        surfaces = df["surface"].unique(maintain_order=True).to_list()
        combos = df.select("arm", "path").unique(maintain_order=True).rows()
        width = 0.8 / max(len(combos), 1)
        for i, (arm, path) in enumerate(combos):
            sub = dict(df.filter((pl.col("arm") == arm) & (pl.col("path") == path)).select("surface", "ne").iter_rows())
            ax.bar([j + i * width for j in range(len(surfaces))], [sub.get(s, 0.0) for s in surfaces], width,
                   label=f"{arm}/{path}")
        floor = dict(df.group_by("surface").agg(pl.col("oracle_ne").mean()).iter_rows())
        for j, s in enumerate(surfaces):
            if floor.get(s) is not None:  # real logs have no oracle floor
                ax.hlines(floor[s], j - 0.1, j + 0.9, colors="k", linestyles="dashed")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(surfaces))], surfaces)
        ax.set_ylabel("click NE (E)")
        lo = min(v for v in (df["oracle_ne"].min(), df["ne"].min()) if v is not None)
        ax.set_ylim(lo - 0.02, max(df["ne"].max(), 1.0) + 0.01)
        ax.legend(fontsize=7, ncol=2)
    return png(fig)


def distillation_plot(rows: list[dict[str, Any]]) -> dg.MetadataValue:
    return _png_md(distillation_png(rows))


class progress:  # noqa: N801  (used as a context manager, like contextlib's)
    """Log a line at least every `every` seconds during a long step (`step(text)`: a unit finished; a daemon
    thread repeats the latest status meanwhile), so the UI's log never goes quiet."""

    def __init__(self, log: Any, name: str, total: int | None = None, every: float = 30.0) -> None:
        self.log, self.name, self.total, self.every = log, name, total, every
        self.done, self.last = 0, "started"
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def __enter__(self) -> progress:
        self.log.info(f"{self.name}: started" + (f", {self.total} units" if self.total else ""))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.log.info(f"{self.name}: {'finished' if exc[0] is None else 'failed'} after {self._elapsed()}")

    def _elapsed(self) -> str:
        return f"{time.monotonic() - self._t0:.0f} s"

    def _status(self) -> str:
        of = f"/{self.total}" if self.total else ""
        return f"{self.name}: {self.done}{of} done, {self._elapsed()} elapsed; last: {self.last}"

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            self.log.info(self._status())

    def step(self, text: str) -> None:
        self.done += 1
        self.last = text
        self.log.info(self._status())
