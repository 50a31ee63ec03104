"""Dagster metadata builders shared by the assets: previews, suite summaries, plots."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
import polars as pl

from gem_pipelines.reports import report_links

if TYPE_CHECKING:
    from gem_pipelines.data.validation import SuiteResult


def preview(df: pl.DataFrame, n: int = 5) -> dg.MetadataValue:
    """A small markdown table of the first rows (lists and long strings shortened)."""
    head = df.head(n).with_columns(
        [pl.col(c).cast(pl.String).str.slice(0, 60) for c, t in df.schema.items() if t == pl.String]
        + [
            pl.col(c).list.len().cast(pl.String).alias(c) + pl.lit(" items")
            for c, t in df.schema.items()
            if isinstance(t, pl.List)
        ]
    )
    cols = head.columns
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in head.iter_rows():
        lines.append("| " + " | ".join("" if v is None else str(v).replace("|", "\\|") for v in row) + " |")
    return dg.MetadataValue.md("\n".join(lines))


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
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(c)).replace("|", "\\|") for c in cols) + " |" for r in rows]
    return dg.MetadataValue.md("\n".join(lines))


def png_markdown(fig: Any) -> dg.MetadataValue:
    """A matplotlib figure as an inline base64 PNG the Dagster UI renders."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    data = base64.b64encode(buf.getvalue()).decode()
    return dg.MetadataValue.md(f"![plot](data:image/png;base64,{data})")


def metric_table(rows: list[dict[str, Any]]) -> dg.MetadataValue:
    """Per-surface metric rows as a markdown table, with the gap to the oracle floor."""
    cols = ["model", "surface", "task", "seed", "ne", "oracle_ne", "gap", "auc", "calibration", "calibration_raw", "n"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        gap = (r["ne"] / r["oracle_ne"] - 1) if r.get("oracle_ne") else None
        vals = {**r, "gap": f"{gap:+.1%}" if gap is not None else ""}
        lines.append("| " + " | ".join(_fmt(vals.get(c)) for c in cols) + " |")
    return dg.MetadataValue.md("\n".join(lines))


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def loss_curve_plot(curve: list[Any]) -> dg.MetadataValue:
    """Training loss by step as an inline PNG. `curve` is [[step, loss], ...] or [{"step", "loss"}]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(c["step"], c["loss"]) if isinstance(c, dict) else (c[0], c[1]) for c in curve]
    fig, ax = plt.subplots(figsize=(6, 3))
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts])
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.grid(alpha=0.3)
    value = png_markdown(fig)
    plt.close(fig)
    return value


def distillation_table(rows: list[dict[str, Any]]) -> dg.MetadataValue:
    """Click-task rows of the distillation report (seed means) as a markdown table."""
    import polars as pl

    if not rows:
        return dg.MetadataValue.md("(no rows)")
    frame = pl.DataFrame(rows, infer_schema_length=None)
    # on E: the gain over labels_only and the effectiveness with their paired bootstrap intervals
    # (gem_model.distill.kd_intervals; the same value on every seed's row, hence first())
    ci = [pl.col(c).drop_nulls().first() for c in ("kd_gain", "kd_gain_lo", "kd_gain_hi", "kd_effectiveness_lo",
                                                  "kd_effectiveness_hi", "kd_report") if c in frame.columns]
    df = (
        frame.filter(pl.col("task") == "click")
        .group_by("arm", "path", "split", "surface")
        .agg(pl.col("ne").mean(), pl.col("ne").std().alias("ne_std"), pl.col("oracle_ne").mean(),
             pl.col("kd_effectiveness").mean(), *ci, pl.len().alias("seeds"))
        .sort("split", "surface", "arm", "path")
    )
    cols = df.columns
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in df.iter_rows()]
    return dg.MetadataValue.md("\n".join(lines))


def distillation_plot(rows: list[dict[str, Any]]) -> dg.MetadataValue:
    """Bar chart: evaluation-day click NE per surface for each (arm, path), with the oracle floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import polars as pl

    fig, ax = plt.subplots(figsize=(8, 3.5))
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
    value = png_markdown(fig)
    plt.close(fig)
    return value


class progress:  # noqa: N801  (used as a context manager, like contextlib's)
    """Log a line at least every `every` seconds during a long step: what finished last, how long so far.

    `progress.step(text)` records (and logs) a finished unit of work; a daemon thread repeats the
    latest status when nothing finished for `every` seconds, so the UI's log never goes quiet.
    """

    def __init__(self, log: Any, name: str, total: int | None = None, every: float = 30.0) -> None:
        import threading
        import time

        self.log, self.name, self.total, self.every = log, name, total, every
        self.done, self.last = 0, "started"
        self._t0, self._time = time.monotonic(), time.monotonic
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
        return f"{self._time() - self._t0:.0f} s"

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
