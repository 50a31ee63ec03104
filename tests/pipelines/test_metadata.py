"""Readable reports in the UI: progress lines during long steps, tables instead of raw lists."""

from __future__ import annotations

import threading

from gem_pipelines.metadata import md_table, progress


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.beats = threading.Event()

    def info(self, text: str) -> None:
        self.lines.append(text)
        if sum("elapsed" in line for line in self.lines) >= 3:
            self.beats.set()


def test_progress_logs_while_nothing_finishes_and_after_each_unit() -> None:
    log = _Log()
    with progress(log, "distillation_report", total=4, every=0.02) as p:
        p.step("feed labels_only/none seed 0")
        assert log.beats.wait(30)  # the heartbeat speaks although no unit finished since
    assert log.lines[0] == "distillation_report: started, 4 units"
    assert "1/4 done" in log.lines[1] and "feed labels_only/none seed 0" in log.lines[1]
    assert log.lines[-1].startswith("distillation_report: finished after")


def test_md_table_escapes_pipes_and_formats_floats() -> None:
    md = md_table([{"a": "x|y", "b": 0.123456}], ["a", "b"]).value
    assert md.splitlines() == ["| a | b |", "|---|---|", "| x\\|y | 0.1235 |"]


def test_report_metadata_is_a_link_and_a_path_relative_to_gem_home(tmp_path, monkeypatch) -> None:
    import dagster as dg

    from gem_pipelines.metadata import report_metadata

    monkeypatch.setenv("GEM_HOME", str(tmp_path / "gem"))
    monkeypatch.setenv("GEM_REPORTS_URL", "http://127.0.0.1:3999")
    report = tmp_path / "gem" / "reports" / "foundation_eval.json"
    report.parent.mkdir(parents=True)
    report.write_text("{}")
    meta = report_metadata("report", report)
    assert meta["report"] == dg.MetadataValue.url("http://127.0.0.1:3999/foundation_eval.json")
    assert meta["report_path"] == dg.MetadataValue.path("reports/foundation_eval.json")  # moves with GEM_HOME
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    assert report_metadata("report", outside) == {"report": dg.MetadataValue.path(str(outside)),
                                                  "report_path": dg.MetadataValue.path(str(outside))}
