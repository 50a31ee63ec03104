"""A pytest plugin for bench/gpu_check.sh (`-p report_now`): print each test's outcome, and a failure's
traceback, the moment it is known. The device call kills pytest at its timeout, before pytest's own
summary: without this, the first GPU run's log held only dots, not which tests failed nor why."""

from __future__ import annotations

import sys

import pytest


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or report.outcome != "passed":
        secs = f"{report.duration:.1f}s"
        print(f"\n[{report.outcome.upper()} {report.when} {secs}] {report.nodeid}", file=sys.stderr, flush=True)
        if report.failed:
            print(report.longreprtext[-4000:], file=sys.stderr, flush=True)
