"""HTML pages of the model reports, written beside their JSON under $GEM_HOME/reports: the "report" link of
foundation_model and distillation_report opens these (served by gem_pipelines.reports), with the tables and
plots of the asset's metadata, and a link to the JSON they are rendered from."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from gem_model.store.atomic import write_text
from gem_pipelines.html import esc, page, table
from gem_pipelines.metadata import (
    CALIBRATOR_COLS,
    METRIC_COLS,
    SEED_COLS,
    calibrator_rows,
    distillation_png,
    distillation_rows,
    loss_curve_png,
    metric_rows,
    seed_rows,
)

GAP_NOTE = ("gap = NE minus the oracle's NE (0: as good as the true click probabilities); gap closed = the share "
            "of the base-rate-to-oracle gap closed, (1 - NE) / (1 - oracle NE). Real logs have no oracle: no gap.")


def _img(data: bytes, alt: str) -> str:
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'


def _write(json_path: Path, title: str, body: str) -> Path:
    out = json_path.with_suffix(".html")
    link = f'<p class="muted">Rendered from <a href="{esc(json_path.name)}">{esc(json_path.name)}</a>.</p>'
    return write_text(out, page(title, body + link))


def foundation_page(json_path: str | Path, loss_curve: list[Any] | None = None,
                    calibrator: dict[str, Any] | None = None) -> Path:
    """`foundation_eval.html` beside `foundation_eval.json` (its rows): per-seed and per-surface metrics, the
    calibrator and the training loss."""
    json_path = Path(json_path)
    rows = json.loads(json_path.read_text())["rows"]
    body = (f"<p>Every model on day E (the evaluation day), per surface, task and seed. {esc(GAP_NOTE)}</p>"
            + "<h2>Seeds</h2>" + table(SEED_COLS, seed_rows(rows))
            + "<h2>Per surface</h2>" + table(METRIC_COLS, metric_rows(rows), table_id="per_surface"))
    if calibrator:
        body += ("<h2>Calibrator</h2><p>The post-hoc map of each head, fitted on the days after training up to E-1 "
                 f"({esc(', '.join(f'{k} {calibrator[k]}' for k in ('fit_day', 'min_positives') if k in calibrator))})"
                 ".</p>" + table(CALIBRATOR_COLS, calibrator_rows(calibrator)))
    if loss_curve is not None:
        body += "<h2>Training loss</h2>" + _img(loss_curve_png(loss_curve), "training loss by step")
    return _write(json_path, "Foundation model evaluation", body)


def distillation_page(json_path: str | Path) -> Path:
    """`distillation_report.html` beside `distillation_report.json`: the student selected per surface, click NE
    of every arm and path (seed means), and the plot of E."""
    json_path = Path(json_path)
    doc = json.loads(json_path.read_text())
    rows = doc.get("rows", [])
    selected = [[s, v.get("arm"), v.get("path"), "yes" if v.get("kept_accepted") else "no"]
                for s, v in sorted((doc.get("selected") or {}).items())]
    cols, cells = distillation_rows(rows)
    body = ("<p>Every transfer arm and path on E-1 (split validation, where the student is selected) and E "
            f"(split evaluation). {esc(GAP_NOTE)} kd_effectiveness is the share of standard KD's gain over "
            "labels_only that an arm reaches.</p>"
            + (f"<p>The teachers are those of the selection made on {esc(str(doc['selection'].get('on')))}: it stands, and "
               "only labels_only (the floor of each student's gate) trained on these days.</p>"
               if doc.get("arms") == ["labels_only"] and (doc.get("selection") or {}).get("on") else "")
            + "<h2>Selected students</h2>" + table(["surface", "arm", "path", "kept the ACCEPTED pair"], selected)
            + "<h2>Click NE by arm and path</h2>" + (table(cols, cells, table_id="arms") if cols else "<p>(no rows)</p>")
            + "<h2>Click NE on E</h2>" + _img(distillation_png(rows), "click NE on E per surface, arm and path"))
    return _write(json_path, "Distillation report", body)
