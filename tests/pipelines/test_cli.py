"""`make demo` / `make next-day` end on a setting to fix with its message alone, also where Dagster wrapped it while
loading the code location; any other error keeps its traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from dagster._core.errors import DagsterUserCodeLoadError  # what a failed code location load raises

from gem_model.config import ConfigError
from gem_pipelines.cli import run_main


def test_a_config_error_ends_the_command_with_its_message() -> None:
    def wrapped() -> None:
        try:
            raise ConfigError("GEM_DEVICE='gpu': must be one of auto, cpu, cuda")
        except ConfigError as e:
            raise DagsterUserCodeLoadError("Error occurred during the loading of Dagster definitions",
                                           user_exception=e, original_exc_info=sys.exc_info()) from e

    with pytest.raises(SystemExit, match=r"^error: GEM_DEVICE='gpu': must be one of auto, cpu, cuda$"):
        run_main(wrapped)
    with pytest.raises(ZeroDivisionError):
        run_main(lambda: 1 / 0)


@pytest.mark.parametrize(("variable", "message"), [
    ("GEM_DEVICE=gpu", "error: GEM_DEVICE='gpu': must be one of auto, cpu, cuda"),
    ("GEM_MODEL_PRESET=huge", "error: preset 'huge' (GEM_MODEL_PRESET or a run's preset)"),
    ("GEM_DATA=nope", "error: GEM_DATA='nope': no "),
])
def test_the_demo_refuses_a_wrong_variable_before_it_runs_anything(variable: str, message: str, gem_home) -> None:
    name, value = variable.split("=")
    env = {**os.environ, name: value, "DAGSTER_HOME": str(gem_home / "dagster")}
    proc = subprocess.run([sys.executable, "-m", "gem_pipelines.demo"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith(message), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (gem_home / "lake").exists()


def test_next_day_refuses_a_dataset(gem_home, monkeypatch) -> None:
    """A real log has no next day to simulate: the command says so before it moves any clock."""
    from gem_pipelines.next_day import main

    monkeypatch.setenv("GEM_DATA", "douban")
    with pytest.raises(SystemExit, match="GEM_DATA=douban is a dataset whose days come from its files"):
        main(["--days", "1"])
    assert not (gem_home / "clock.json").exists()
