"""Shared test setup: every test gets its own GEM_HOME; W&B is disabled; Triton runs interpreted; tests of the
real-data samples in ../shared/data/real/ are reported as not run (one line) on a clone without them."""

from __future__ import annotations

import os
from pathlib import Path

# Read when @triton.jit decorates a kernel, so it must be set before `kernels` is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")
# `make test` runs two pytest-xdist workers on CI's two cores, each with torch's default threads: with one
# thread each the suite took 1,018 s, with two 827 s (a worker is often in Python, not in torch).

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


REPO = Path(__file__).resolve().parents[1]
# One reason for every such test, raised from one line below, so pytest's -ra summary groups them in one line.
SHARED_MISSING = "not run: the real-data samples ../shared/data/real/ are not beside this clone (CI has them)"


def shared_dir() -> Path:
    """../shared beside the clone; GEM_SHARED_DIR overrides it (a missing folder shows what a bare clone runs)."""
    return Path(os.environ.get("GEM_SHARED_DIR") or REPO.parent / "shared")


def shared_real(sub: str = "") -> Path:
    """../shared/data/real/<sub>. Skips the calling test when the samples folder is absent altogether (a clone
    from a public host); fails when the folder is there but `sub` is not (a broken copy is not a bare clone)."""
    real = shared_dir() / "data" / "real"
    if not real.is_dir():
        pytest.skip(SHARED_MISSING)
    path = real / sub
    if not path.exists():
        pytest.fail(f"{path}: missing from the shared real-data samples ({real} is there)")
    return path


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """A skip for missing samples is reported at this file, not at each test (pytest puts a skip raised in a
    fixture at the test's line), so that -ra shows them all in one line."""
    report = yield
    if report.skipped and isinstance(report.longrepr, tuple) and SHARED_MISSING in report.longrepr[2]:
        report.longrepr = ("tests/conftest.py", shared_real.__code__.co_firstlineno, report.longrepr[2])
    return report


@pytest.fixture(scope="session")
def shared_samples() -> Path:
    """The folder of the real-data samples (../shared/data/real); a test or fixture using it is skipped, with one
    summary line for all of them, on a clone without it. Session-scoped so module fixtures can use it."""
    return shared_real()


# The test files on the session's demo world (tests/pipelines/conftest.py: demo_world): one xdist scope,
# so the demo is built once. pytest_collection_modifyitems fails when a file joins or leaves them unlisted.
DEMO_WORLD_FILES = {f"tests/pipelines/{f}.py" for f in ("test_demo_runs", "test_end_to_end", "test_next_day",
                                                        "test_reingest", "test_resume_training")}


def _scope(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    return "demo_world" if path in DEMO_WORLD_FILES else path


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`make test` runs two xdist workers, a scope at a time on each: a test file, or all the demo world's
    files, so module and demo fixtures are built once (xdist's loadgroup ignores marks under pytest 9)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFileAndDemoWorld(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return ByFileAndDemoWorld(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The demo world's scope first, then the other slow files: the other worker drains the short tests
    meanwhile. A stable sort by whole files keeps a file's tests together (module fixtures set up once)."""
    for item in items:
        uses_demo = "demo_world" in item.fixturenames
        if uses_demo != (_scope(item.nodeid) == "demo_world"):
            pytest.fail(f"{item.nodeid}: list its file in DEMO_WORLD_FILES (tests/conftest.py) iff it uses demo_world")
    slow = {_scope(i.nodeid) for i in items if i.get_closest_marker("slow")}
    items.sort(key=lambda item: (_scope(item.nodeid) != "demo_world", _scope(item.nodeid) not in slow))
