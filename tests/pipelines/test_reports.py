"""The model reports a user reads: the "report" links open HTML pages (tables, plots) rendered from the JSON
reports, served over HTTP; the calibrator and seeds are markdown tables; one word for one thing ("gap")."""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from pathlib import Path

import polars as pl
import pytest

from gem_pipelines.metadata import calibrator_table, metric_table, seeds_table
from gem_pipelines.report_pages import distillation_page, foundation_page

EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.I)


def _row(model: str, surface: str, seed: int, ne: float, oracle_ne: float | None, task: str = "click") -> dict:
    return {"model": model, "surface": surface, "task": task, "seed": seed, "ne": ne, "oracle_ne": oracle_ne,
            "gap": None, "auc": 0.7, "calibration": 1.01, "calibration_raw": 1.1, "n": 1000}


ROWS = [_row("foundation", "feed", 0, 0.90, 0.80), _row("foundation", "feed", 1, 0.94, 0.80),
        _row("foundation", "reels", 0, 0.95, None)]
CALIBRATOR = {"fit_day": "2026-11-06", "min_positives": 50, "shrink_positives": 0.0, "prior": "pooled",
              "heads": {"feed": {"click": {"a": 1.1, "b": -0.2, "fitted": True, "positives": 300},
                                 "conversion": {"a": 1.0, "b": 0.0, "fitted": False, "positives": 3,
                                                "why": "identity: 3 positives < 50"}}}}


def _cells(html: str, table_id: str) -> tuple[list[str], list[list[str]]]:
    block = re.search(rf'<table id="{table_id}">(.*?)</table>', html, re.S).group(1)
    head = re.findall(r"<th>(.*?)</th>", block)
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", tr) for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", block, re.S)[1:]]
    return head, rows


def test_foundation_report_page_has_tables_plot_and_the_gap(tmp_path: Path) -> None:
    report = tmp_path / "foundation_eval.json"
    report.write_text(json.dumps({"rows": ROWS}))
    page = foundation_page(report, loss_curve=[[0, 0.7], [10, 0.5]], calibrator=CALIBRATOR)
    assert page == tmp_path / "foundation_eval.html"
    html = page.read_text()
    assert "<script" not in html and not EXTERNAL.search(html)
    assert html.count('src="data:image/png;base64,') == 1 and 'href="foundation_eval.json"' in html
    head, rows = _cells(html, "per_surface")
    by = dict(zip(head, rows[0], strict=True))
    assert by["gap"] == "0.1000" and by["gap closed"] == "50%"  # 0.90 - 0.80; (1 - 0.90) / (1 - 0.80)
    assert dict(zip(head, rows[2], strict=True))["gap"] == ""  # no oracle: no gap
    assert "identity: 3 positives &lt; 50" in html  # the calibrator's unfitted head says why


def test_distillation_report_page(tmp_path: Path) -> None:
    rows = [{**_row("student", "feed", seed, ne, 0.8), "arm": arm, "path": "none", "split": split,
             "kd_effectiveness": None}
            for seed in (0, 1) for split in ("validation", "evaluation")
            for arm, ne in (("labels_only", 0.95), ("standard_kd", 0.91))]
    report = tmp_path / "distillation_report.json"
    report.write_text(json.dumps({"rows": rows, "selected": {"feed": {"arm": "standard_kd", "path": "none",
                                                                       "kept_accepted": False}}}))
    html = distillation_page(report).read_text()
    assert "<script" not in html and not EXTERNAL.search(html) and 'src="data:image/png;base64,' in html
    head, cells = _cells(html, "arms")
    assert {"arm", "path", "split", "surface", "ne", "oracle_ne", "gap"} <= set(head)
    kd = [dict(zip(head, c, strict=True)) for c in cells if "standard_kd" in c and "evaluation" in c]
    assert kd and kd[0]["gap"] == "0.1100" and kd[0]["seeds"] == "2"
    assert "<td>standard_kd</td><td>none</td><td>no</td>" in html  # the selected student
    assert "selection made on" not in html
    # a day between teacher changes: the labels-only floor alone, the earlier selection named
    report.write_text(json.dumps({"rows": [r for r in rows if r["arm"] == "labels_only"], "arms": ["labels_only"],
                                  "selection": {"on": "2026-11-05", "arms": ["labels_only", "standard_kd"]},
                                  "selected": {"feed": {"arm": "standard_kd", "path": "none", "kept_accepted": True}}}))
    html = distillation_page(report).read_text()
    assert "the selection made on 2026-11-05: it stands" in html and "<td>standard_kd</td><td>none</td><td>yes</td>" in html


def test_served_report_link_opens_the_html_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gem_pipelines.metadata import report_metadata
    from gem_pipelines.reports import serve

    home = tmp_path / "gem"
    (home / "reports").mkdir(parents=True)
    monkeypatch.setenv("GEM_HOME", str(home))
    report = home / "reports" / "foundation_eval.json"
    report.write_text(json.dumps({"rows": ROWS}))
    server = serve(home / "reports", "http://127.0.0.1:0")
    monkeypatch.setenv("GEM_REPORTS_URL", f"http://127.0.0.1:{server.server_address[1]}")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        meta = report_metadata("report", foundation_page(report))
        assert meta["report_path"].path == "reports/foundation_eval.html"
        with urllib.request.urlopen(meta["report"].url, timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("text/html")
            assert '<table id="per_surface">' in resp.read().decode()
    finally:
        server.shutdown()


def test_calibrator_and_seeds_are_markdown_tables() -> None:
    cal = calibrator_table(CALIBRATOR).value
    assert cal.startswith("Fitted on fit_day 2026-11-06") and "| surface | task | fitted |" in cal
    assert "| feed | conversion | False |" in cal and cal.count("\n| feed |") == 2
    assert calibrator_table(None).value.startswith("No calibrator")
    seeds = seeds_table(ROWS).value.splitlines()
    assert seeds[0] == "| seed | model | click ne (mean over surfaces) | gap | auc |"
    assert seeds[2].startswith("| 0 | foundation | 0.9250 | 0.1000 |")  # mean of 0.90 and 0.95; gap where known
    header = metric_table(ROWS).value.splitlines()[0]
    assert " gap | gap closed " in header
    no_positives = metric_table([_row("foundation", "shops", 0, float("nan"), 0.7)]).value.splitlines()[2]
    assert no_positives.startswith("| foundation | shops | click | 0 | n/a |  | 0.7000 | n/a |  | 0.7000 |")
    few = metric_table([{**_row("student", "shops", 0, 1.2, 0.9), "ne_interval": (1.05, 1.38)}]).value.splitlines()[2]
    assert few.startswith("| student | shops | click | 0 | 1.2000 | [1.0500, 1.3800] |")  # where positives are few


def test_calibration_by_age_is_mean_prediction_over_mean_truth_per_day_and_age() -> None:
    from gem_pipelines.day_report import calibration_by_age

    df = pl.DataFrame({"day": ["2026-11-09"] * 4 + ["2026-11-10"] * 2,
                       "ad_age": ["new", "new", "older", "recent", "older", None],
                       "p_click": [0.02, 0.04, 0.01, 0.05, 0.03, 0.01],
                       "oracle_p": [0.01, 0.02, 0.02, 0.05, 0.01, 0.01]})
    rows = [line.split("|")[1:-1] for line in calibration_by_age(df).splitlines()[2:]]
    assert [[c.strip() for c in r] for r in rows] == [
        ["2026-11-09", "2.0000", "1.0000", "0.5000", f"{0.12 / 0.10:.4f}"],
        ["2026-11-10", "", "", "3.0000", "2.0000"],  # an age with no rows is blank; a row without an age counts in all
    ]
