"""The Makefile checks the variables a user passes (DATA, GEM_SIMULATOR, DAYS, UI_PORT) before any target runs,
and a value is never run by the shell that checks it. `make -n` parses the Makefile and prints, running nothing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATA", "GEM_SIMULATOR", "DAYS", "UI_PORT", "MAKEFLAGS")}
    return subprocess.run(["make", "-n", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("assignment", "message"), [
    ("DATA=Douban", "DATA must match [a-z0-9_]+"),
    ("DATA=../x", "DATA must match [a-z0-9_]+"),
    ("GEM_SIMULATOR=../eval", "GEM_SIMULATOR must match [a-z0-9_]+"),
    ("DAYS=0", "DAYS must be a positive integer"),
    ("UI_PORT=3000;x", "UI_PORT must be a port number"),
])
def test_a_wrong_value_stops_make_naming_the_variable(assignment: str, message: str) -> None:
    out = _make("ui", assignment)
    assert out.returncode != 0 and message in out.stderr


@pytest.mark.parametrize("var", ["DATA", "GEM_SIMULATOR", "DAYS", "UI_PORT"])
def test_a_value_with_a_quote_is_refused_before_a_shell_sees_it(var: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    out = _make("ui", f"{var}=x'; touch {marker}; echo '")
    assert out.returncode != 0 and f"{var} must not contain a quote" in out.stderr
    assert not marker.exists()


def test_good_values_reach_the_command() -> None:
    out = _make("ui", "DATA=kuairand", "UI_PORT=3001")
    assert out.returncode == 0, out.stderr
    assert "-h 127.0.0.1 -p 3001" in out.stdout  # the UI binds the loopback address
