"""A real headless Chromium drives `dagster dev`: open the lineage, launch one `events` partition by
clicks, wait for the run, read that partition's check results, and follow the check's Data Docs link
with the network cut off (only 127.0.0.1 answers), so the report is shown to be readable offline.

Needs Debian's `chromium` (/usr/bin/chromium: `make test` installs it through apt as root, `.ci/run` before it)
and the pip `playwright` package pointed at it: Playwright's own browser download does not work offline.
Without chromium the test is reported as not run, naming `apt-get install chromium`.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.pipelines.conftest import small_assets

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("GEM_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
DATE, SURFACE = "2026-11-02", "feed"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _restore_sigint() -> None:
    # a background child inherits SIGINT ignored; dagster dev then cannot be stopped politely
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop(proc: subprocess.Popen) -> None:
    """Stop exactly the process group this test started: SIGINT (dagster dev shuts its children
    down), then SIGKILL whatever is left."""
    for sig, wait in ((signal.SIGINT, 60), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def test_make_installs_chromium_through_apt_only_when_missing(tmp_path: Path) -> None:
    """`make chromium` (a step of `make test`): apt-get install when the browser is missing, nothing when not."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "apt.log"}\n')
    (stub / "apt-get").chmod(0o755)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}"}
    for present in (True, False):
        browser = tmp_path / ("chromium" if present else "absent")
        browser.write_text("")
        browser.chmod(0o755 if present else 0o644)  # not executable: missing
        out = subprocess.run(["make", "-s", "chromium", f"CHROMIUM={browser}"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        log = tmp_path / "apt.log"
        if present:
            assert out.stdout == "" and not log.exists()
        elif os.getuid() == 0:  # apt-get needs root: otherwise make leaves it to the skip below
            assert log.read_text().splitlines() == ["install -y -qq chromium"]
            assert out.stdout.count("\n") == 1 and "apt-get install chromium" in out.stdout
        else:
            assert out.stdout == "" and not log.exists()


@pytest.mark.timeout(600)
def test_launch_an_events_partition_from_the_ui_and_read_its_checks(tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.skip(f"not run: no {CHROMIUM}; apt-get install chromium (make test does, as root)")
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=60_000)  # as page.set_default_timeout below: on 2 busy cores the UI takes its time

    from gem_pipelines.reports import serve

    home, ui_port, reports_port = tmp_path / "gem", _free_port(), _free_port()
    env = {**os.environ, "GEM_HOME": str(home), "DAGSTER_HOME": str(home / "dagster"),
           "GEM_ASSETS_DIR": str(small_assets(tmp_path / "assets", impressions=300)),
           "GEM_REPORTS_URL": f"http://127.0.0.1:{reports_port}", "GEM_MODEL_PRESET": "tiny",
           "WANDB_MODE": "disabled", "DAGSTER_DISABLE_TELEMETRY": "1", "PYTHONPATH": str(REPO)}
    env.pop("GEM_LAKE_URI", None)
    # the partition's raw files land first (as the landing sensor would see them); the UI run ingests them
    subprocess.run([sys.executable, "-c", "import datetime as dt, pathlib, sys; "
                    "from gem_pipelines.data.concurrency import land; "
                    f"land(pathlib.Path(sys.argv[1]), {SURFACE!r}, dt.date.fromisoformat({DATE!r}), impressions=300)",
                    str(home)], env=env, check=True, cwd=REPO, timeout=120)
    subprocess.run([sys.executable, "-c", "from gem_pipelines.instance import dagster_home; dagster_home()"],
                   env=env, check=True, cwd=REPO, timeout=120)
    log = open(tmp_path / "dagster_dev.log", "wb")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster"), "dev", "-w", str(REPO / "workspace.yaml"),
         "-h", "127.0.0.1", "-p", str(ui_port)],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True, preexec_fn=_restore_sigint,
    )
    reports = serve(home / "reports", env["GEM_REPORTS_URL"])
    threading.Thread(target=reports.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{ui_port}"
    try:
        deadline = time.time() + 240
        while True:
            assert proc.poll() is None, (tmp_path / "dagster_dev.log").read_text()[-3000:]
            assert time.time() < deadline, "dagster dev did not answer"
            try:
                with urllib.request.urlopen(f"{base}/server_info", timeout=5):
                    break
            except OSError:
                time.sleep(2)

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            # offline: nothing beyond 127.0.0.1 is reachable (CDNs included)
            page.route(re.compile(r"^https?://(?!127\.0\.0\.1[:/]).*"), lambda route: route.abort())
            # the "Join the Dagster community" dialog, dismissed as its Skip button would (browser storage)
            page.add_init_script("window.localStorage.setItem('communityNux', JSON.stringify('1'))")

            # the lineage: every group of the graph is there
            page.goto(f"{base}/asset-groups")
            expect(page.get_by_text("Global asset lineage")).to_be_visible()
            expect(page.get_by_text("Join the Dagster community")).to_have_count(0)
            for group in ("ingest", "features", "foundation", "students"):
                expect(page.get_by_text(group, exact=True).first).to_be_visible()

            # launch one events partition by clicks
            page.goto(f"{base}/assets/events")
            page.get_by_role("button", name="Materialize…").first.click()
            dialog_title = page.get_by_text("Launch runs to materialize")
            while not dialog_title.is_visible():  # "also materializes ..." / "upstream not materialized" notes
                confirm = page.get_by_role("button", name="Confirm")
                if confirm.is_visible():
                    confirm.click()
                page.wait_for_timeout(500)
            date_box = page.get_by_placeholder("ex: 2026-11-01", exact=False)
            date_box.fill(DATE)
            date_box.press("Enter")
            page.get_by_text("Select a partition or create one").click()
            page.get_by_text(SURFACE, exact=True).first.click()
            dialog_title.click()  # close the drop-down
            page.get_by_role("button", name="Launch 1 run").click()
            expect(page.get_by_text("Launched run")).to_be_visible()

            # wait for the run: open it from the Runs page
            page.goto(f"{base}/runs")
            page.locator("a[href^='/runs/']").first.click()
            expect(page).to_have_url(re.compile(r"/runs/[0-9a-f-]+"))
            expect(page.get_by_text("Success", exact=True).first).to_be_visible(timeout=240_000)

            # that partition's check results, read from the page
            results = {}
            for check in ("gx_suite", "row_conservation"):
                page.goto(f"{base}/assets/events?view=checks&checkDetail={check}")
                expect(page.get_by_text(f"{DATE}|{SURFACE}", exact=True).first).to_be_visible()
                results[check] = page.inner_text("body")
                assert re.search(r"Evaluation result\s+Passed", results[check]), results[check][:3000]
            assert re.search(r"missing\s+0\b", results["row_conservation"])
            page.goto(f"{base}/assets/events?view=checks&checkDetail=gx_suite")
            link = page.locator(f"a[href*='/data_docs/validations/events/events__{DATE}_{SURFACE}/']").first
            href = link.get_attribute("href")
            assert href.startswith(env["GEM_REPORTS_URL"]), href

            # the check's Data Docs link: the partition's own page, readable with the network cut off, and
            # asking for nothing beyond 127.0.0.1 (GX's own pages loaded about 14 files from public hosts)
            external: list[str] = []
            page.on("request", lambda r: external.append(r.url) if not r.url.startswith(("http://127.0.0.1",
                                                                                          "data:")) else None)
            page.goto(href)
            expect(page.get_by_text(f"Expectation Validation Result: {DATE}|{SURFACE}")).to_be_visible()
            results_table = page.locator("#results")
            expect(results_table).to_contain_text("\u2714 passed")  # the status, as text: no icon font to load
            expect(results_table).to_contain_text("0 unexpected (0%)")  # observed values
            expect(results_table).to_contain_text(re.compile(r"observed \d+"))  # the row count
            assert not external, external
            page.goto(f"{env['GEM_REPORTS_URL']}/data_docs/index.html")
            expect(page.locator("#validations")).to_contain_text(f"{DATE}|{SURFACE}")
            browser.close()
    finally:
        reports.shutdown()
        _stop(proc)
        log.close()
