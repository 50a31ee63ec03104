"""Importers of public multi-domain datasets into landing/ (plain functions, no Dagster).

`import_dataset(name)` reads assets/sources/<name>/source.yaml, the dataset's files (the shared
sample, or GEM_SOURCE_DIR for a full download) and writes landing/<surface>/<date>/feed.jsonl for
every partition of the dataset's calendar, so ingest (`source: landing`) runs unchanged. A spec
(gem_pipelines/sources/spec.py) describes most layouts; taobao, aliccp and mind_tsv keep a module.
"""

from __future__ import annotations

import json
from pathlib import Path

from gem_model.config import (
    ASSETS_DIR,
    SIM,
    SOURCES_DIR,
    ConfigError,
    dataset_name,
    load_calendar,
    load_features,
    load_surfaces,
)
from gem_model.store.atomic import write_text
from gem_model.store.paths import gem_home
from gem_pipelines.sources.accounting import write_accounting
from gem_pipelines.sources.aliccp import read_tianchi
from gem_pipelines.sources.common import (
    ImportResult,
    SourceConfig,
    check_surfaces,
    load_source,
    side_files,
    source_dir,
    source_files,
    write_landing,
)
from gem_pipelines.sources.mind_tsv import read_mind_tsv
from gem_pipelines.sources.spec import import_spec
from gem_pipelines.sources.taobao import read_taobao

# source.yaml `importer` -> the module for a layout no spec expresses: (impressions, history, notes)
READERS = {"taobao": read_taobao, "aliccp": read_tianchi, "mind_tsv": read_mind_tsv}


def _fingerprint(name: str, cfg: SourceConfig, src: Path) -> dict[str, object]:
    """What an import depends on: the dataset's specs and the source files (size, mtime)."""
    specs = {p.name: p.read_text() for p in sorted((SOURCES_DIR / name).glob("*.yaml"))}
    paths = [p for _, p in source_files(cfg, src)] + side_files(cfg, src)
    files = {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in paths}
    return {"specs": specs, "files": files, "source_dir": str(src)}


def check_context(name: str, cfg: SourceConfig) -> None:
    """source.yaml `context` names exactly the features.yaml features marked `context: true` (their kind)."""
    own = SOURCES_DIR / name / "features.yaml"
    path = own if own.is_file() else ASSETS_DIR / "features.yaml"
    declared = set(load_features(path).context)
    if set(cfg.context) != declared:
        where = "" if own.is_file() else f" (a dataset's context features go in its own {own}, a copy of {path})"
        raise ConfigError(
            f"{name}: source.yaml `context` maps {sorted(cfg.context)} but {path} marks {sorted(declared)} `context: true`: "
            f"each context column needs both (where the log holds it, and its kind as a dense or sparse feature){where}")


def run_importer(name: str, home: Path, src: Path, cfg: SourceConfig | None = None) -> ImportResult:
    """Import dataset `name` from `src` into <home>/landing. A timed dataset (source.yaml `time`) takes
    its window from its data (the importer writes imports/<name>/calendar.yaml); the others read
    their calendar.yaml."""
    cfg = cfg or load_source(name)
    check_context(name, cfg)
    surfaces = load_surfaces(SOURCES_DIR / name / "surfaces.yaml")
    check_surfaces(cfg, surfaces, SOURCES_DIR / name / "source.yaml")
    calendar = None if cfg.time else load_calendar(SOURCES_DIR / name / "calendar.yaml")
    if cfg.importer == "spec":
        return import_spec(src, cfg, surfaces, calendar, home, dataset=name)
    rows, history, notes = READERS[cfg.importer](src, cfg, calendar)
    return write_landing(name, src, rows, history, surfaces, calendar, home, notes=notes)


def import_dataset(name: str, home: Path | None = None, *, force: bool = False) -> ImportResult | None:
    """Import dataset `name` into <home>/landing (default $GEM_HOME). Returns None when the landing
    files are already those of the same specs and source files (re-running the demo is cheap)."""
    cfg = load_source(name)
    home = home or gem_home()
    src = source_dir(cfg)
    stamp = home / "imports" / name / "fingerprint.json"
    fp = _fingerprint(name, cfg, src)
    if not force and stamp.is_file() and json.loads(stamp.read_text()) == fp:
        return None
    # no stamp while landing/ is rewritten: an import that fails midway is redone in full next time
    stamp.unlink(missing_ok=True)
    result = run_importer(name, home, src, cfg)
    write_text(stamp, json.dumps(fp))
    return result


def before_ingest() -> str | None:
    """Demo hook: with GEM_DATA naming a dataset, import it into landing/ first (None for `sim`)."""
    name = dataset_name()
    if name == SIM:
        return None
    result = import_dataset(name)
    if result is None:
        return f"{name}: landing/ already holds this import (imports/{name}/manifest.json)"
    rows = sum(result.files.values())
    return f"{name}: imported {rows} rows of {len(result.files)} files from {result.source_dir} into landing/"


def after_ingest() -> str | None:
    """Demo hook: per source file, rows read = imported + quarantined, recounted from the lake."""
    name = dataset_name()
    return None if name == SIM else f"row accounting:       {write_accounting(name)}"


def after_models() -> str | None:
    """Demo hook: the real-data report (no oracle: bootstrap intervals), after the models."""
    name = dataset_name()
    if name == SIM:
        return None
    from gem_pipelines.sources.report import write_real_report

    return f"real-data report:     {write_real_report(name)}"
