"""Shared by the importer tests: the samples' folder, importing into a tmp GEM_HOME, and recounting
every source row through the unchanged parsers and row rules (no Delta, no GX: seconds)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import polars as pl

from gem_model.config import SOURCES_DIR, CalendarConfig, load_calendar, load_surfaces
from gem_pipelines.data.normalize import NormalizedPartition, normalize_partition
from gem_pipelines.data.parsers import stage_partition
from gem_pipelines.sources import run_importer
from gem_pipelines.sources.common import ImportResult, SourceConfig, load_source
from tests.conftest import shared_real


def need(sub: str) -> Path:
    """../shared/data/real/<sub>; the test is reported not run on a clone without ../shared."""
    return shared_real(sub)


def run_demo_slice(dataset: str, source_dir: Path, assets_dir: Path, home: Path) -> None:
    """`GEM_DATA=<dataset> python -m gem_pipelines.demo` (what `make demo DATA=<dataset>` runs) on a slice of
    the sample, with the test's assets and the tiny preset; fails with the demo's output."""
    env = {**os.environ, "GEM_DATA": dataset, "GEM_SOURCE_DIR": str(source_dir), "GEM_HOME": str(home),
           "DAGSTER_HOME": str(home / "dagster"), "GEM_ASSETS_DIR": str(assets_dir),
           "GEM_MODEL_PRESET": "tiny", "WANDB_MODE": "disabled", "DAGSTER_DISABLE_TELEMETRY": "1"}
    env.pop("GEM_LAKE_URI", None)
    proc = subprocess.run([sys.executable, "-m", "gem_pipelines.demo"], env=env, capture_output=True, text=True,
                          timeout=580)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def run_import(dataset: str, home: Path, src: Path | None = None, cfg: SourceConfig | None = None) -> ImportResult:
    cfg = cfg or load_source(dataset)
    return run_importer(dataset, home, src or need(Path(cfg.default_dir).name), cfg)


def dataset_calendar(dataset: str, home: Path) -> CalendarConfig:
    """The dataset's calendar.yaml, or the window its import derived from the data (timed datasets)."""
    own = SOURCES_DIR / dataset / "calendar.yaml"
    return load_calendar(own if own.is_file() else home / "imports" / dataset / "calendar.yaml")


def normalize_all(dataset: str, home: Path) -> dict[tuple[dt.date, str], NormalizedPartition]:
    surfaces = load_surfaces(SOURCES_DIR / dataset / "surfaces.yaml")
    calendar = dataset_calendar(dataset, home)
    out = {}
    for day in calendar.dates():
        for s in surfaces.surfaces:
            stage = stage_partition(s.format, home / "landing" / s.name / day.isoformat())
            out[(day, s.name)] = normalize_partition(stage, s, day)
    return out


def account(dataset: str, home: Path, parts: dict[tuple[dt.date, str], NormalizedPartition]) -> pl.DataFrame:
    """Per source file: read (lineage rows), imported (events rows), quarantined, with reasons."""
    lineage = pl.read_parquet(home / "imports" / dataset / "lineage.parquet").filter(pl.col("kind") == "row")
    events = pl.concat([p.events.select("request_id") for p in parts.values()])
    quarantine = pl.concat([p.quarantine.select("surface", "date", "source_file", "line_no", "reason")
                            for p in parts.values()]).rename({"line_no": "feed_line", "source_file": "feed_file"})
    q = lineage.join(quarantine, on=["surface", "date", "feed_file", "feed_line"], how="inner")
    kept = lineage.join(quarantine, on=["surface", "date", "feed_file", "feed_line"], how="anti")  # copies share ids
    imported = kept.join(events, on="request_id", how="semi").group_by("source_file").len("imported")
    return (
        lineage.group_by("source_file").len("read")
        .join(imported, on="source_file", how="left")
        .join(q.group_by("source_file").len("quarantined"), on="source_file", how="left")
        .fill_null(0)
        .sort("source_file")
    )  # fmt: skip


def data_rows(path: Path, header: bool = True) -> int:
    """Rows of a source file counted independently of the importer: lines, minus the header."""
    data = path.read_bytes()
    n = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
    return n - (1 if header else 0)
