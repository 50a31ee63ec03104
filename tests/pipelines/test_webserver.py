"""Start dagster-webserver on the code location, ask GraphQL for the asset nodes and their checks,
then stop exactly the processes this test started (its own process group)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
QUERY = """
{ assetNodes { assetKey { path } groupName
    assetChecksOrError { ... on AssetChecks { checks { name blocking } } } } }
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, query: str) -> dict:
    req = urllib.request.Request(url, data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.mark.timeout(240)
def test_webserver_serves_asset_graph_and_checks(tmp_path: Path) -> None:
    port = _free_port()
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster"), "GEM_HOME": str(tmp_path / "gem"),
           "DAGSTER_DISABLE_TELEMETRY": "1"}
    (tmp_path / "dagster").mkdir()
    webserver = Path(sys.executable).parent / "dagster-webserver"
    proc = subprocess.Popen(
        [str(webserver), "-w", str(REPO / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: we stop exactly what we started
    )
    try:
        deadline = time.time() + 180
        data = None
        while time.time() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else "exited"
            try:
                data = _post(f"http://127.0.0.1:{port}/graphql", QUERY)
                if data.get("data", {}).get("assetNodes"):
                    break
            except OSError:
                pass
            time.sleep(1)
        assert data and data.get("data"), f"no GraphQL answer: {data}"
        nodes = {"/".join(n["assetKey"]["path"]): n for n in data["data"]["assetNodes"]}
        expected = {"raw_logs", "oracle", "events", "user_activity", "events_quarantine", "training_examples"}
        assert expected <= set(nodes)
        assert nodes["events"]["groupName"] == "ingest"
        checks = {c["name"]: c["blocking"] for c in nodes["events"]["assetChecksOrError"]["checks"]}
        assert checks.get("gx_suite") is True and "row_conservation" in checks
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
