"""Shared test setup: every test gets its own GEM_HOME; W&B is disabled; Triton runs interpreted."""

from __future__ import annotations

import os

# Read when @triton.jit decorates a kernel, so it must be set before `kernels` is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_environ():
    """Each test leaves os.environ as it found it. Code under test sets variables for its process
    (gem_pipelines.evaluate.use_eval_world sets GEM_SIMULATOR=eval, W&B's resource its mode) and
    `monkeypatch.delenv` of an absent variable records nothing to undo: one such leak once put every
    later end-to-end subprocess (they copy os.environ) in the 32x larger evaluation world."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def gem_home(tmp_path, monkeypatch):
    home = tmp_path / "gem"
    home.mkdir()
    monkeypatch.setenv("GEM_HOME", str(home))
    monkeypatch.delenv("GEM_LAKE_URI", raising=False)
    return home
