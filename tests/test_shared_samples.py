"""The real-data samples helper (tests/conftest.py): skipped with one reason when ../shared is absent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, SHARED_MISSING

_PROBE = '''
from tests.conftest import shared_real

def test_a(shared_samples):
    assert shared_samples.is_dir()

def test_b():
    assert shared_real("").is_dir()
'''


def _run(tmp_path: Path, shared: Path) -> subprocess.CompletedProcess:
    probe = tmp_path / "probe" / "test_probe.py"  # outside the repo: the shared conftest is loaded as a plugin
    probe.parent.mkdir()
    probe.write_text(_PROBE)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), str(probe)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "GEM_SHARED_DIR": str(shared)})


def test_without_shared_samples_their_tests_are_one_not_run_line(tmp_path: Path) -> None:
    out = _run(tmp_path, tmp_path / "nonexistent").stdout
    assert "2 skipped" in out, out
    lines = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert len(lines) == 1 and SHARED_MISSING in lines[0] and lines[0].startswith("SKIPPED [2]"), out


def test_with_shared_samples_their_tests_run(tmp_path: Path) -> None:
    (tmp_path / "shared" / "data" / "real").mkdir(parents=True)
    out = _run(tmp_path, tmp_path / "shared").stdout
    assert "2 passed" in out and "skipped" not in out, out
